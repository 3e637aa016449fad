package pack

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/memplan/memplan/engine"
	"github.com/memplan/memplan/hw"
	"github.com/memplan/memplan/units"
)

// Schema names the JSON layout of a Result.
const Schema = "memplan.pack/v1"

// Policy is how a scheduler decides that a set of jobs fits one GPU.
type Policy uint8

const (
	// WholeGPU gives every job a GPU of its own: Kubernetes' device
	// plugin (nvidia.com/gpu is an integer resource; containers do not
	// share a GPU).
	WholeGPU Policy = iota
	// Static counts one number per job: the size the user declared
	// (Job.Request, as HAMi's nvidia.com/gpumem), else the static
	// model_size (Envelope.ModelSize); it counts no CUDA context.
	Static
	// Peaks counts each process's peak: its CUDA context plus the caching
	// allocator's reserved peak (Envelope.Peak). Safe without any
	// cooperation from the jobs.
	Peaks
	// Curve reads each process's curve through the caching allocator: it
	// runs every process under a per-process limit
	// (torch.cuda.set_per_process_memory_fraction, Envelope.Fraction) at
	// the smallest the allocator survives, and counts context plus limit
	// (Envelope.Cap).
	Curve
	numPolicies
)

var policyNames = [numPolicies]string{"whole-gpu", "static", "peaks", "curve"}

func (p Policy) String() string {
	if p < numPolicies {
		return policyNames[p]
	}
	return "policy(" + strconv.Itoa(int(p)) + ")"
}

// MarshalJSON writes the policy's name.
func (p Policy) MarshalJSON() ([]byte, error) { return json.Marshal(p.String()) }

// UnmarshalJSON reads a policy's name.
func (p *Policy) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return err
	}
	q, err := ParsePolicy(s)
	*p = q
	return err
}

// Policies lists every policy, in the order reports show them.
func Policies() []Policy { return []Policy{WholeGPU, Static, Peaks, Curve} }

// ParsePolicy reads a policy's name.
func ParsePolicy(s string) (Policy, error) {
	if i := slices.Index(policyNames[:], s); i >= 0 {
		return Policy(i), nil
	}
	return 0, fmt.Errorf("unknown policy %q (want %s)", cut(s), strings.Join(policyNames[:], ", "))
}

// Pool is Count GPUs of one kind, NodeGPUs to a node (0: the catalog's
// server for the GPU, else the whole pool is one node). GPU i is on node
// i / Node().
type Pool struct {
	GPU      *hw.GPU
	Count    int
	NodeGPUs int
}

// Node is how many GPUs one node of the pool has: NodeGPUs, or the
// catalog's server, but no more than the pool's GPUs. A pool of 2 H100s
// is one node of 2, the pool NodeGPUs 2 gives: 2 of a server's 8 GPUs are
// all the pool has of it, so a same-node gang of more ranks has no node
// here.
func (p Pool) Node() int {
	n := max(p.Count, 1)
	switch {
	case p.NodeGPUs > 0:
		return min(p.NodeGPUs, n)
	case p.GPU != nil && p.GPU.Node != nil && p.GPU.Node.GPUs > 0:
		return min(p.GPU.Node.GPUs, n)
	}
	return n
}

// maxPool bounds the GPUs of a pool.
const maxPool = 100000

// ParsePool reads "8xh100" (or "h100", one GPU).
func ParsePool(s string) (Pool, error) {
	n, name := 1, strings.TrimSpace(s)
	if i := strings.IndexAny(name, "x×"); i > 0 {
		if c, err := strconv.Atoi(strings.TrimSpace(name[:i])); err == nil {
			n, name = c, strings.TrimSpace(strings.TrimPrefix(strings.TrimPrefix(name[i:], "x"), "×"))
		}
	}
	if n < 1 || n > maxPool {
		return Pool{}, fmt.Errorf("GPU count must be between 1 and %d, got %d", maxPool, n)
	}
	g, err := hw.Lookup(name)
	if err != nil {
		return Pool{}, err
	}
	return Pool{GPU: g, Count: n}, nil
}

// Capacity is what one GPU of the pool holds (its total_memory: the CUDA
// context of each process is counted by the jobs).
func (p Pool) Capacity() units.Bytes { return p.GPU.Capacity() }

// Options of Pack and Simulate. The zero value compares every policy with
// no margin.
type Options struct {
	// Policies to compare (nil: all).
	Policies []Policy
	// Margin is memory every policy but whole-gpu leaves free on each GPU.
	Margin units.Bytes
}

func (o *Options) policies() []Policy {
	if len(o.Policies) == 0 {
		return Policies()
	}
	return o.Policies
}

// Status of a GPU: what its processes do when they run as the policy runs
// them.
type Status string

const (
	// OK: the processes' reachable memory (Cap under curve, Peak
	// otherwise) fits.
	OK Status = "ok"
	// AtRisk: it fits only if the caching allocators give memory back to
	// each other, which they do not (a process whose allocation fails
	// frees its own cache, not another's).
	AtRisk Status = "at-risk"
	// OOM: even their allocated peaks (no cache at all) exceed the
	// capacity; phases that drift meet at those peaks, so a process runs
	// out of memory.
	OOM Status = "oom"
)

// GPUResult is one GPU of an assignment.
type GPUResult struct {
	Index int      `json:"gpu"`
	Jobs  []string `json:"jobs"`
	// Counted is what the policy counted; Reach what its processes can
	// hold (the limits under curve, the reserved peaks otherwise);
	// Allocated the sum of allocated peaks.
	Counted   units.Bytes `json:"counted_bytes"`
	Reach     units.Bytes `json:"reach_bytes"`
	Allocated units.Bytes `json:"allocated_peak_bytes"`
	// Margin is capacity − Reach: the risk margin (negative: over).
	Margin units.Bytes `json:"margin_bytes"`
	Status Status      `json:"status"`
	// Combined is the sum of the processes' curves over the longest
	// period on the GPU (reserved curves; under curve, the curves under
	// their limits), every period starting at 0; CombinedAllocated the
	// same of the allocated curves.
	Combined          []Sample `json:"combined_curve"`
	CombinedAllocated []Sample `json:"combined_allocated_curve"`
}

// PolicyResult is one policy's assignment.
type PolicyResult struct {
	Policy Policy `json:"policy"`
	// GPUsNeeded is how many GPUs the policy uses for every job it can
	// place (it may exceed the pool; the assignment lists only the pool's).
	GPUsNeeded int `json:"gpus_needed"`
	// Unplaced are jobs left out: larger than a GPU as the policy counts,
	// or beyond the pool.
	Unplaced []string `json:"unplaced,omitempty"`
	// TooLarge are those of Unplaced that no pool of this GPU holds as the
	// policy counts (a process larger than a GPU less the margin, a
	// same-node gang of more ranks than a node has): GPUsNeeded does not
	// count them, where it does count those placed past the pool's end.
	TooLarge []string    `json:"too_large,omitempty"`
	OOMGPUs  int         `json:"oom_gpus"`
	AtRisk   int         `json:"at_risk_gpus"`
	GPUs     []GPUResult `json:"assignment"`
}

// Result compares the policies on one pool.
type Result struct {
	Schema    string         `json:"schema"`
	GPU       string         `json:"gpu"`
	GPUs      int            `json:"gpus"`
	NodeGPUs  int            `json:"node_gpus"` // Pool.Node: what packing used
	Capacity  units.Bytes    `json:"capacity_bytes"`
	Margin    units.Bytes    `json:"margin_bytes"`
	Envelopes []*Envelope    `json:"envelopes"`
	Policies  []PolicyResult `json:"policies"`
	// Saved is, for each other policy, its GPUs needed minus curve's,
	// present when curve was compared and the two count the same
	// processes (their TooLarge agree): GPUs needed for different jobs do
	// not measure a saving. NotCompared says, for each other policy, why
	// it is not in Saved.
	Saved       map[string]int    `json:"gpus_saved_by_curve,omitempty"`
	NotCompared map[string]string `json:"gpus_saved_not_compared,omitempty"`
}

// Envelopes computes the envelopes of every job on the pool's GPU: procs
// with one per process (NAME#k for replica k when a job has several;
// NAME/r for rank r of a job of several GPUs), and byJob the job by its
// name (rank 0's envelope, its Members the ranks).
func Envelopes(jobs []Job, pool Pool) (procs []*Envelope, byJob map[string]*Envelope, err error) {
	return EnvelopesContext(context.Background(), jobs, pool)
}

// EnvelopesContext is Envelopes stopped by ctx: each job's plans and
// allocator replays look at it (engine.Options.Context), and once it is
// done its cause is returned.
func EnvelopesContext(ctx context.Context, jobs []Job, pool Pool) (procs []*Envelope, byJob map[string]*Envelope, err error) {
	if ctx == nil {
		ctx = context.Background()
	}
	if pool.GPU == nil {
		return nil, nil, fmt.Errorf("no GPU")
	}
	ranks := make([][]*Envelope, len(jobs))
	errs := make([]error, len(jobs))
	var wg sync.WaitGroup
	sem := make(chan struct{}, runtime.GOMAXPROCS(0))
	for i := range jobs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if workOf(&jobs[i]) > engine.HeavyWork { // one at a time, in the process
				done, err := engine.HeavyTurn(ctx)
				if err != nil {
					errs[i] = err
					return
				}
				defer done()
			}
			sem <- struct{}{}
			defer func() { <-sem }()
			ranks[i], errs[i] = envelopesOf(ctx, &jobs[i], pool.GPU)
		}()
	}
	wg.Wait()
	if err := context.Cause(ctx); err != nil {
		return nil, nil, err // not a job's error: the jobs were stopped
	}
	for _, e := range errs {
		if e != nil {
			return nil, nil, e // the first job's, as a sequential loop would
		}
	}
	byJob = map[string]*Envelope{}
	for i := range jobs {
		byJob[jobs[i].Name] = leader(ranks[i], jobs[i].Name)
		n := jobs[i].replicas()
		for k := range n {
			gang := jobs[i].Name
			if n > 1 {
				gang = fmt.Sprintf("%s#%d", gang, k+1)
			}
			procs = append(procs, named(ranks[i], gang)...)
		}
	}
	return procs, byJob, nil
}

// leader is rank 0 of ranks with the ranks as its Members (a copy; the
// ranks named NAME/r).
func leader(ranks []*Envelope, job string) *Envelope {
	if len(ranks) == 1 {
		c := *ranks[0]
		return &c
	}
	ms := named(ranks, job)
	c := *ms[0]
	c.Members = ms
	return &c
}

// named copies ranks as the processes of gang: the gang's name alone for
// one process, GANG/r for rank r of several.
func named(ranks []*Envelope, gang string) []*Envelope {
	out := make([]*Envelope, len(ranks))
	for r, e := range ranks {
		c := *e
		c.Job = gang
		if len(ranks) > 1 {
			c.Gang, c.Job = gang, fmt.Sprintf("%s/%d", gang, r)
		}
		out[r] = &c
	}
	return out
}

// Pack places jobs on pool under every policy of opt.
func Pack(jobs []Job, pool Pool, opt Options) (*Result, error) {
	envs, _, err := Envelopes(jobs, pool)
	if err != nil {
		return nil, err
	}
	return PackEnvelopes(envs, pool, opt)
}

// PackEnvelopes places processes whose envelopes are known: first fit,
// largest need first (ties in the given order), on GPUs in index order.
func PackEnvelopes(envs []*Envelope, pool Pool, opt Options) (*Result, error) {
	return PackEnvelopesContext(context.Background(), envs, pool, opt)
}

// PackEnvelopesContext is PackEnvelopes stopped by ctx (serve's --timeout:
// 1,024 processes take seconds): each policy looks at it before each gang
// it places and each GPU it sums, and once it is done its cause is
// returned.
func PackEnvelopesContext(ctx context.Context, envs []*Envelope, pool Pool, opt Options) (*Result, error) {
	if ctx == nil {
		ctx = context.Background()
	}
	if err := checkPool(pool, opt); err != nil {
		return nil, err
	}
	if err := checkEnvelopes(envs); err != nil {
		return nil, err
	}
	res := &Result{Schema: Schema, GPU: pool.GPU.Name, GPUs: pool.Count, NodeGPUs: pool.Node(), Capacity: pool.Capacity(), Margin: opt.Margin, Envelopes: envs}
	for _, p := range opt.policies() {
		r, err := packPolicy(ctx, envs, pool, opt.Margin, p)
		if err != nil {
			return nil, err
		}
		res.Policies = append(res.Policies, r)
	}
	res.compareSavings()
	return res, nil
}

// compareSavings fills Saved and NotCompared when curve was compared.
func (res *Result) compareSavings() {
	i := slices.IndexFunc(res.Policies, func(r PolicyResult) bool { return r.Policy == Curve })
	if i < 0 {
		return
	}
	c := res.Policies[i]
	res.Saved = map[string]int{}
	for _, r := range res.Policies {
		if r.Policy == Curve {
			continue
		}
		if why := whyNotCompared(c, r); why != "" {
			if res.NotCompared == nil {
				res.NotCompared = map[string]string{}
			}
			res.NotCompared[r.Policy.String()] = why
			continue
		}
		res.Saved[r.Policy.String()] = r.GPUsNeeded - c.GPUsNeeded
	}
}

// whyNotCompared names the processes one of a and b leaves out as too
// large and the other counts ("" when they leave out the same ones).
func whyNotCompared(a, b PolicyResult) string {
	var why []string
	for _, x := range [][2]PolicyResult{{a, b}, {b, a}} {
		if only := without(x[0].TooLarge, x[1].TooLarge); len(only) > 0 {
			why = append(why, fmt.Sprintf("%s leaves out %s (larger than a GPU or a node holds as it counts), which %s counts",
				x[0].Policy, someNames(only), x[1].Policy))
		}
	}
	return strings.Join(why, "; ")
}

// without is the names of a not in b.
func without(a, b []string) []string {
	var out []string
	for _, s := range a {
		if !slices.Contains(b, s) {
			out = append(out, s)
		}
	}
	return out
}

// someNames lists up to three names and how many more.
func someNames(ns []string) string {
	const shown = 3
	if len(ns) <= shown {
		return strings.Join(ns, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(ns[:shown], ", "), len(ns)-shown)
}

func checkPool(pool Pool, opt Options) error {
	switch {
	case pool.GPU == nil || pool.Count < 1 || pool.Count > maxPool:
		return fmt.Errorf("a pool is 1 to %d GPUs of a known kind", maxPool)
	case opt.Margin < 0 || opt.Margin >= pool.Capacity():
		return fmt.Errorf("margin %s must be between 0 and the GPU's %s", opt.Margin, pool.Capacity())
	case pool.NodeGPUs < 0 || pool.NodeGPUs > maxPool:
		return fmt.Errorf("GPUs per node must be between 1 and %d, got %d", maxPool, pool.NodeGPUs)
	}
	for i, p := range opt.Policies {
		if p >= numPolicies {
			return fmt.Errorf("unknown policy %d", p)
		}
		if slices.Contains(opt.Policies[:i], p) {
			return fmt.Errorf("policy %s named twice", p)
		}
	}
	return nil
}

// checkEnvelopes holds the order every envelope keeps: context ≤
// allocated ≤ cap ≤ peak, a positive period.
func checkEnvelopes(envs []*Envelope) error {
	if len(envs) == 0 {
		return fmt.Errorf("no jobs")
	}
	for _, e := range envs {
		if e == nil || e.Context < 0 || e.Allocated < e.Context || e.Cap < e.Allocated || e.Peak < e.Cap || e.Period <= 0 || e.Request < 0 || e.ModelSize < 0 {
			return fmt.Errorf("job %v: inconsistent memory envelope", name(e))
		}
	}
	return nil
}

func name(e *Envelope) string {
	if e == nil {
		return "(none)"
	}
	return strconv.Quote(e.Job)
}

// packPolicy is first-fit decreasing of gangs under policy p: gangs by
// their largest process, each gang whole on distinct GPUs (gang.go). A
// gang that is larger than a GPU, or that would reach past the pool, is
// left out whole. Under curve, peaks' assignment is valid too (every
// limit is at most its peak): curve starts from it, places what peaks
// left out by the limits, and keeps whichever of that and its own
// first-fit needs fewer GPUs, so it never needs more than peaks for the
// same jobs (first-fit decreasing alone can: smaller items do not always
// pack into fewer bins).
func packPolicy(ctx context.Context, envs []*Envelope, pool Pool, margin units.Bytes, p Policy) (PolicyResult, error) {
	room := pool.Capacity() - margin
	k, left, err := firstFit(ctx, envs, room, pool.Node(), p)
	if err != nil {
		return PolicyResult{}, err
	}
	out := PolicyResult{Policy: p, GPUsNeeded: k.needed()}
	excluded := map[string]bool{} // gangs left out: too large, or straddling the pool's end
	for _, g := range left {
		for _, i := range g.procs {
			out.Unplaced = append(out.Unplaced, envs[i].Job)
			out.TooLarge = append(out.TooLarge, envs[i].Job)
			excluded[envs[i].GangName()] = true
		}
	}
	// A gang reaching past the pool is left out whole, and the room its
	// ranks took on the pool's GPUs is given back: the rest are packed
	// again without it, until no gang straddles the pool's end. Taken, it
	// had left a one-GPU job unplaced beside an empty GPU (service sweep,
	// round 24).
	idx := make([]int, len(envs)) // the envelope of each one packed
	for i := range idx {
		idx[i] = i
	}
	for {
		cut := straddling(k.bins, pool.Count, envs, idx)
		if len(cut) == 0 {
			break
		}
		var sub []*Envelope
		idx = idx[:0]
		for i, e := range envs {
			if cut[e.GangName()] {
				excluded[e.GangName()] = true
				out.Unplaced = append(out.Unplaced, e.Job)
			}
			if !excluded[e.GangName()] {
				sub, idx = append(sub, e), append(idx, i)
			}
		}
		if k, _, err = firstFit(ctx, sub, room, pool.Node(), p); err != nil {
			return PolicyResult{}, err
		}
	}
	for b, set := range k.bins {
		kept := make([]int, 0, len(set))
		for _, j := range set {
			if b >= pool.Count {
				out.Unplaced = append(out.Unplaced, envs[idx[j]].Job)
				continue
			}
			kept = append(kept, idx[j])
		}
		if len(kept) == 0 {
			continue
		}
		if err := context.Cause(ctx); err != nil {
			return PolicyResult{}, err
		}
		out.add(gpuResult(envs, kept, pool.Capacity(), p), b)
	}
	return out, nil
}

// straddling are the gangs with ranks both on the pool's GPUs (bins below
// count) and past them, by name (idx maps a bin's entries to envs).
func straddling(bins [][]int, count int, envs []*Envelope, idx []int) map[string]bool {
	in, past := map[string]bool{}, map[string]bool{}
	for b, set := range bins {
		for _, j := range set {
			if name := envs[idx[j]].GangName(); b < count {
				in[name] = true
			} else {
				past[name] = true
			}
		}
	}
	cut := map[string]bool{}
	for name := range past {
		if in[name] {
			cut[name] = true
		}
	}
	return cut
}

// add appends GPU b's result.
func (out *PolicyResult) add(g GPUResult, b int) {
	g.Index = b
	switch g.Status {
	case OOM:
		out.OOMGPUs++
	case AtRisk:
		out.AtRisk++
	}
	out.GPUs = append(out.GPUs, g)
}

func cmpBytes(a, b units.Bytes) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Held is e's device memory at time t as policy p runs it: its reserved
// curve, or under curve its curve under its limit (its peak without a
// curve); t repeats every period.
func (e *Envelope) Held(p Policy, t float64) units.Bytes {
	c := e.Reserved
	if p == Curve {
		c = e.Capped
	}
	if len(c) == 0 {
		return e.Need(p)
	}
	return at(c, e.Period, t)
}

// Live is e's allocated curve (context included) at time t.
func (e *Envelope) Live(t float64) units.Bytes {
	if len(e.Curve) == 0 {
		return e.Allocated
	}
	return at(e.Curve, e.Period, t)
}

// liveCurve is e's allocated curve, flat at its allocated peak when it has
// none.
func (e *Envelope) liveCurve() []Sample {
	if len(e.Curve) == 0 {
		return []Sample{{e.Period, e.Allocated}}
	}
	return e.Curve
}

// gpuResult judges the processes set on one GPU of capacity c as policy p
// runs them.
func gpuResult(envs []*Envelope, set []int, c units.Bytes, p Policy) GPUResult {
	g := GPUResult{}
	for _, i := range set {
		g.Counted += envs[i].Need(p)
	}
	var curves, allocated [][]Sample
	var periods []float64
	for _, i := range set {
		e := envs[i]
		g.Jobs = append(g.Jobs, e.Job)
		g.Allocated += e.Allocated
		reach, curve := e.Peak, e.Reserved
		if p == Curve {
			reach, curve = e.Cap, e.Capped
		}
		live := e.liveCurve()
		if len(curve) == 0 {
			curve = []Sample{{e.Period, reach}}
		}
		g.Reach += reach
		curves, allocated, periods = append(curves, curve), append(allocated, live), append(periods, e.Period)
	}
	g.Margin = c - g.Reach
	switch {
	case g.Allocated > c:
		g.Status = OOM
	case g.Reach > c:
		g.Status = AtRisk
	default:
		g.Status = OK
	}
	g.Combined, g.CombinedAllocated = combine(curves, periods), combine(allocated, periods)
	return g
}

// combine sums periodic curves over the longest period, each starting at
// 0 and repeating, at 4·maxSamples evenly spaced times and at every
// sample's own time (so no curve's peak is missed).
func combine(curves [][]Sample, periods []float64) []Sample {
	window := 0.0
	for _, p := range periods {
		window = max(window, p)
	}
	if window <= 0 || len(curves) == 0 {
		return nil
	}
	const grid = 4 * maxSamples
	var ts []float64
	for k := 0; k <= grid; k++ {
		ts = append(ts, window*float64(k)/grid)
	}
	out := make([]Sample, len(ts))
	for i, t := range ts {
		out[i].T = t
		for j, c := range curves {
			out[i].Bytes += at(c, periods[j], t)
		}
	}
	// The peak of the sum is at least the sum at every curve's own peak
	// time; add those points so a narrow spike is not stepped over: at
	// each repetition of a curve in the window, at most capReps of them,
	// evenly spread (a 1 ns period beside a step of seconds repeated a
	// billion times, and took 11 GB before it was cut): 4·grid (the
	// documented mixes repeat a vLLM step up to 2,656 times over a
	// training step) but no more than maxExtra in all, each summing every
	// curve.
	const maxExtra = 1 << 16
	capReps := float64(min(4*grid, max(1, maxExtra/len(curves))))
	for j, c := range curves {
		pk := 0
		for k := range c {
			if c[k].Bytes > c[pk].Bytes {
				pk = k
			}
		}
		reps := math.Ceil(window / periods[j])
		stride := max(1, math.Ceil(reps/capReps))
		for rep := 0.0; rep*periods[j] < window; rep += stride {
			t := c[pk].T + rep*periods[j]
			if t > window {
				break
			}
			s := Sample{T: t}
			for jj, cc := range curves {
				s.Bytes += at(cc, periods[jj], t)
			}
			out = append(out, s)
		}
	}
	slices.SortStableFunc(out, func(a, b Sample) int {
		switch {
		case a.T < b.T:
			return -1
		case a.T > b.T:
			return 1
		}
		return 0
	})
	return out
}

// at is curve c (period p) at time t: the value of the first sample at or
// after t mod p (a sample holds from the previous one's time up to its
// own), the last past the end.
func at(c []Sample, p, t float64) units.Bytes {
	if len(c) == 0 {
		return 0
	}
	if p > 0 && t > p {
		t -= float64(int(t/p)) * p
	}
	i, _ := slices.BinarySearchFunc(c, t, func(s Sample, t float64) int {
		switch {
		case s.T < t:
			return -1
		case s.T > t:
			return 1
		}
		return 0
	})
	if i >= len(c) {
		i = len(c) - 1
	}
	return c[i].Bytes
}
