package pack

import (
	"container/heap"
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/memplan/memplan/units"
)

// ArrivalsKind is the version of the arrival trace this package reads.
const ArrivalsKind = "memplan.arrivals/v1"

// maxArrivals bounds an arrival trace.
const maxArrivals = 100000

// Trace is an arrival trace: jobs of a job file arriving over time.
type Trace struct {
	Kind     string    `json:"kind"`
	Arrivals []Arrival `json:"arrivals"`
}

// Arrival is one job arriving At (a duration from the start of the trace,
// "90m") and running for Duration once placed.
type Arrival struct {
	At       string `json:"at"`
	Duration string `json:"duration"`
	Job      string `json:"job"`

	at, dur float64
}

// ParseArrivals reads an arrival trace (YAML or JSON) strictly; every
// arrival names a job of jobs. name is the file's name in messages.
func ParseArrivals(data []byte, name string, jobs []Job) (*Trace, error) {
	if len(data) > MaxFileBytes {
		return nil, bad(name, "larger than %s", units.Bytes(MaxFileBytes))
	}
	var t Trace
	if err := strictYAML(data, &t); err != nil {
		return nil, bad(name, "%v", err)
	}
	if t.Kind != ArrivalsKind {
		if t.Kind == "" {
			return nil, bad(name, "no kind (want kind: %s)", ArrivalsKind)
		}
		return nil, bad(name, "kind %q is not %s", cut(t.Kind), ArrivalsKind)
	}
	if len(t.Arrivals) == 0 {
		return nil, bad(name, "no arrivals")
	}
	if len(t.Arrivals) > maxArrivals {
		return nil, bad(name, "%d arrivals, more than %d", len(t.Arrivals), maxArrivals)
	}
	known := map[string]bool{}
	for _, j := range jobs {
		known[j.Name] = true
	}
	for i := range t.Arrivals {
		a := &t.Arrivals[i]
		at := fmt.Sprintf("%s: arrivals[%d]", name, i)
		if !known[a.Job] {
			if a.Job == "" {
				return nil, bad(at, "no job")
			}
			return nil, bad(at, "job %q is not in the job file", cut(a.Job))
		}
		var err error
		if a.at, err = parseTime(a.At, true); err != nil {
			return nil, bad(at, "at: %v", err)
		}
		if a.dur, err = parseTime(a.Duration, false); err != nil {
			return nil, bad(at, "duration: %v", err)
		}
	}
	return &t, nil
}

// parseTime reads a duration such as "90m" or "1h30m" (zero allowed for an
// arrival time, not for a duration).
func parseTime(s string, zero bool) (float64, error) {
	d, err := time.ParseDuration(strings.TrimSpace(s))
	if err != nil || d < 0 || d == 0 && !zero {
		return 0, fmt.Errorf("%q is not a positive duration such as 90m", cut(s))
	}
	return d.Seconds(), nil
}

// GenerateArrivals makes a deterministic trace of n arrivals of the
// jobs (by name), seeded: exponential gaps of mean gap and exponential
// durations of mean dur (a Poisson stream, as cluster traces are usually
// modelled), each arrival a job drawn uniformly.
func GenerateArrivals(seed uint64, n int, names []string, gap, dur time.Duration) *Trace {
	r := rand.New(rand.NewPCG(seed, 0x6d656d706c616e))
	t := &Trace{Kind: ArrivalsKind}
	now := time.Duration(0)
	for range n {
		d := time.Duration(r.ExpFloat64()*float64(dur)).Round(time.Minute) + time.Minute
		a := Arrival{At: now.String(), Duration: d.String(), Job: names[r.IntN(len(names))]}
		a.at, a.dur = now.Seconds(), d.Seconds()
		t.Arrivals = append(t.Arrivals, a)
		now += time.Duration(r.ExpFloat64() * float64(gap)).Round(time.Minute)
	}
	return t
}

// SimPolicy is what one policy does with the arrivals.
type SimPolicy struct {
	Policy Policy `json:"policy"`
	// Started jobs were placed; OOM of them ran out of memory when they
	// started (OOMJobs names them, "JOB@at"), Completed ran to the end;
	// Queued were never placed (larger than a GPU as the policy counts).
	Started   int      `json:"started"`
	Completed int      `json:"completed"`
	OOM       int      `json:"oom"`
	OOMJobs   []string `json:"oom_jobs,omitempty"`
	AtRisk    int      `json:"at_risk_starts"`
	Queued    int      `json:"never_placed"`
	// Waits of the started jobs, seconds: mean, 95th percentile, maximum.
	MeanWait float64 `json:"mean_wait_s"`
	P95Wait  float64 `json:"p95_wait_s"`
	MaxWait  float64 `json:"max_wait_s"`
	// Makespan is when the last job ended, seconds.
	Makespan float64 `json:"makespan_s"`
	// Utilisation is the memory the running jobs use on average over their
	// period (their allocated curves' means, contexts included) over the
	// pool's capacity, averaged over the makespan; Busy the mean number of
	// GPUs running at least one job.
	Utilisation float64 `json:"memory_utilisation"`
	Busy        float64 `json:"busy_gpus"`
}

// SimResult compares the policies on one arrival trace.
type SimResult struct {
	Schema   string      `json:"schema"`
	GPU      string      `json:"gpu"`
	GPUs     int         `json:"gpus"`
	Arrivals int         `json:"arrivals"`
	Policies []SimPolicy `json:"policies"`
}

// SimSchema names the JSON layout of a SimResult.
const SimSchema = "memplan.packsim/v1"

// Simulate runs the arrivals of t on pool under every policy of opt. envs
// are the jobs' envelopes by job name (Envelopes of the job file, replicas
// aside).
func Simulate(envs map[string]*Envelope, t *Trace, pool Pool, opt Options) (*SimResult, error) {
	return SimulateContext(context.Background(), envs, t, pool, opt)
}

// SimulateContext is Simulate stopped by ctx: each policy's event loop
// looks at it every lookEvery events and placement tries, and once it is
// done its cause is returned.
func SimulateContext(ctx context.Context, envs map[string]*Envelope, t *Trace, pool Pool, opt Options) (*SimResult, error) {
	if ctx == nil {
		ctx = context.Background()
	}
	if err := checkPool(pool, opt); err != nil {
		return nil, err
	}
	list := make([]*Envelope, 0, len(envs))
	for _, e := range envs {
		if e == nil {
			list = append(list, e)
			continue
		}
		list = append(list, e.members()...)
	}
	if err := checkEnvelopes(list); err != nil {
		return nil, err
	}
	if t == nil || len(t.Arrivals) == 0 || len(t.Arrivals) > maxArrivals {
		return nil, fmt.Errorf("an arrival trace has 1 to %d arrivals", maxArrivals)
	}
	arr := slices.Clone(t.Arrivals)
	for i := range arr {
		a := &arr[i]
		if envs[a.Job] == nil {
			return nil, fmt.Errorf("arrivals[%d]: no envelope for job %q", i, cut(a.Job))
		}
		var err error
		if a.at, err = parseTime(a.At, true); err != nil {
			return nil, fmt.Errorf("arrivals[%d]: at: %v", i, err)
		}
		if a.dur, err = parseTime(a.Duration, false); err != nil {
			return nil, fmt.Errorf("arrivals[%d]: duration: %v", i, err)
		}
	}
	out := &SimResult{Schema: SimSchema, GPU: pool.GPU.Name, GPUs: pool.Count, Arrivals: len(arr)}
	for _, p := range opt.policies() {
		r, err := simulate(ctx, envs, arr, pool, opt.Margin, p)
		if err != nil {
			return nil, err
		}
		out.Policies = append(out.Policies, r)
	}
	return out, nil
}

// sortedGang is a job's processes, largest need first, and their needs.
type sortedGang struct {
	ms    []*Envelope
	needs []units.Bytes
}

// running is a process of a job on a GPU; lead marks the job's first
// (one per job, which counts its completion).
type running struct {
	arrival int
	end     float64
	env     *Envelope
	mean    units.Bytes // the mean of its allocated curve
	need    units.Bytes // what the policy counts for it
	lead    bool
}

// simulator is one policy's run over the arrivals: an event loop over
// arrival and end times; at each time it ends jobs, queues arrivals, then
// places every queued job (in arrival order) that the policy admits on the
// first GPU that admits it; a job of several GPUs (a gang) starts when
// every one of its processes has a GPU of its own that admits it (within
// one node when it says so), and waits whole until then; a placed job one
// of whose GPUs' allocated peaks then exceed the capacity runs out of
// memory and leaves at once, every process of it.
//
// Nothing is rescanned per event: the queue is one FIFO per job (kind),
// the kinds in a heap by their first arrival's place in the queue; the
// running processes' ends are a heap; the integrals' rates are kept as
// processes start and end. A job that does not fit at an event stops its
// kind for the rest of that event: starts only take room, and a gang fits
// the GPUs that admit it exactly when first-fit of its needs, largest
// first, places it (the GPUs that admit a need admit every smaller one),
// so no later arrival of the same job fits either. The result is the
// queue scanned in arrival order at every event, in time linear in the
// events.
type simulator struct {
	ctx    context.Context
	looks  int
	envs   map[string]*Envelope
	arr    []Arrival
	pool   Pool
	room   units.Bytes
	policy Policy
	gpus   [][]running
	used   []units.Bytes // what the policy counts on each GPU
	env    []*Envelope   // of each arrival (a gang's leader)
	// kind is each arrival's job, pos its place in arrival order; waiting
	// is each kind's queued arrivals, first queued first; ready the kinds
	// with queued arrivals by their first one's pos.
	kind    []int
	pos     []int
	waiting [][]int
	ready   posHeap
	// ends are the running processes' end times and GPUs.
	ends endHeap
	nrun int
	// sorted is each job's processes largest need first, and the needs.
	sorted map[*Envelope]sortedGang
	// minNeed is the smallest of the arrivals' largest process needs: with
	// less room everywhere, nothing queued can start.
	minNeed units.Bytes
	waits   []float64
	res     SimPolicy
	// integrals for utilisation: ∫ memory dt and ∫ busy GPUs dt, and
	// their rates now: the running processes' means, the busy GPUs.
	mem, busy, last float64
	memRate         units.Bytes
	busyGPUs        int
	// tree is each GPU's room for the policy (roomOf), kept as GPUs
	// change: the most room and the first GPU with room in O(log n).
	tree *roomTree
}

// lookEvery is how many events and placement tries a simulation runs
// between looks at its context.
const lookEvery = 1024

// stopped looks at the context every lookEvery units of work: an event or
// a placement try of one process (a gang's try is its processes').
func (s *simulator) stopped(work int) error {
	if s.looks += work; s.looks < lookEvery {
		return nil
	}
	s.looks = 0
	return context.Cause(s.ctx)
}

func simulate(ctx context.Context, envs map[string]*Envelope, arr []Arrival, pool Pool, margin units.Bytes, p Policy) (SimPolicy, error) {
	s := newSimulator(ctx, envs, arr, pool, margin, p)
	order := make([]int, len(arr))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmpFloat(arr[a].at, arr[b].at) })
	for i, ai := range order {
		s.pos[ai] = i
	}
	next := 0
	for next < len(order) || s.nrun > 0 {
		if err := s.stopped(1); err != nil {
			return SimPolicy{}, err
		}
		t := math.Inf(1)
		if next < len(order) {
			t = arr[order[next]].at
		}
		t = min(t, s.nextEnd())
		s.advance(t)
		s.endJobs(t)
		for next < len(order) && arr[order[next]].at <= t {
			s.enqueue(order[next])
			next++
		}
		if err := s.place(t); err != nil {
			return SimPolicy{}, err
		}
		if next == len(order) && s.nrun == 0 {
			break
		}
	}
	for _, w := range s.waiting {
		s.res.Queued += len(w)
	}
	s.finish()
	return s.res, nil
}

// newSimulator sorts each job's processes and numbers the jobs (kinds).
func newSimulator(ctx context.Context, envs map[string]*Envelope, arr []Arrival, pool Pool, margin units.Bytes, p Policy) *simulator {
	s := &simulator{ctx: ctx, envs: envs, arr: arr, pool: pool, room: pool.Capacity() - margin, policy: p, sorted: map[*Envelope]sortedGang{},
		gpus: make([][]running, pool.Count), used: make([]units.Bytes, pool.Count), res: SimPolicy{Policy: p}, minNeed: math.MaxInt64,
		kind: make([]int, len(arr)), pos: make([]int, len(arr))}
	kinds := map[*Envelope]int{}
	for i, a := range arr {
		e := envs[a.Job]
		s.env = append(s.env, e)
		k, ok := kinds[e]
		if !ok {
			k = len(kinds)
			kinds[e] = k
			ms := slices.Clone(e.members())
			s.sorted[e] = sortedGang{ms, byNeed(ms, nil, p)}
		}
		s.kind[i] = k
		var top units.Bytes
		for _, m := range e.members() {
			top = max(top, m.Need(p))
		}
		s.minNeed = min(s.minNeed, top)
	}
	s.waiting = make([][]int, len(kinds))
	if p == WholeGPU {
		s.minNeed = 0
	}
	s.tree = newRoomTree(pool.Count, s.roomOf)
	return s
}

func cmpFloat(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// enqueue queues arrival ai behind the queued arrivals of its job.
func (s *simulator) enqueue(ai int) {
	k := s.kind[ai]
	if len(s.waiting[k]) == 0 {
		heap.Push(&s.ready, [2]int{s.pos[ai], k})
	}
	s.waiting[k] = append(s.waiting[k], ai)
}

func (s *simulator) nextEnd() float64 {
	if len(s.ends) == 0 {
		return math.Inf(1)
	}
	return s.ends[0].end
}

// advance accumulates the utilisation integrals up to t.
func (s *simulator) advance(t float64) {
	dt := t - s.last
	if dt <= 0 || math.IsInf(t, 1) {
		return
	}
	s.busy += dt * float64(s.busyGPUs)
	s.mem += dt * float64(s.memRate)
	s.last = t
}

// mean is the time-average of e's allocated curve (context included).
func mean(e *Envelope) units.Bytes {
	if len(e.Curve) == 0 || e.Period <= 0 {
		return e.Allocated
	}
	var sum, prev float64
	for _, c := range e.Curve {
		sum += float64(c.Bytes) * (min(c.T, e.Period) - prev)
		prev = min(c.T, e.Period)
	}
	if prev <= 0 {
		return e.Allocated
	}
	return units.Bytes(sum / prev)
}

// endJobs ends the processes whose end is t or before, on the GPUs the
// end heap names.
func (s *simulator) endJobs(t float64) {
	var gs []int
	for len(s.ends) > 0 && s.ends[0].end <= t {
		gs = append(gs, heap.Pop(&s.ends).(endItem).gpu)
	}
	slices.Sort(gs)
	for _, gi := range slices.Compact(gs) {
		g := s.gpus[gi]
		kept := g[:0]
		for _, r := range g {
			if r.end <= t {
				if r.lead {
					s.res.Completed++
				}
				s.used[gi] -= r.need
				s.memRate -= r.mean
				s.nrun--
				continue
			}
			kept = append(kept, r)
		}
		s.gpus[gi] = kept
		if len(kept) == 0 && len(g) > 0 {
			s.busyGPUs--
		}
		s.tree.set(gi, s.roomOf(gi))
	}
}

// place starts every queued job the policy admits somewhere, in arrival
// order: the kind whose first queued arrival came first, until every kind
// has one that does not fit. A job whose largest process is larger than
// the most room any GPU has is passed over without trying each GPU.
func (s *simulator) place(t float64) error {
	free := s.mostRoom()
	if free < s.minNeed {
		return nil
	}
	var stuck [][2]int
	defer func() {
		for _, x := range stuck {
			heap.Push(&s.ready, x)
		}
	}()
	for len(s.ready) > 0 {
		x := heap.Pop(&s.ready).([2]int)
		ai := s.waiting[x[1]][0]
		sg := s.sorted[s.env[ai]]
		if err := s.stopped(len(sg.needs)); err != nil {
			heap.Push(&s.ready, x)
			return err
		}
		var at []int
		if sg.needs[0] <= free {
			at = s.fitGang(sg.needs, s.env[ai].SameNode)
		}
		if at == nil {
			stuck = append(stuck, x)
			continue
		}
		w := s.waiting[x[1]][1:]
		s.waiting[x[1]] = w
		if len(w) > 0 {
			heap.Push(&s.ready, [2]int{s.pos[w[0]], x[1]})
		}
		s.start(at, ai, t, sg.ms, sg.needs)
		free = s.mostRoom()
	}
	return nil
}

// mostRoom is the largest need some GPU admits now (whole-gpu: any need
// when a GPU is empty, none otherwise).
func (s *simulator) mostRoom() units.Bytes { return s.tree.most() }

// start places arrival ai's processes ms on GPUs at (one each) at t,
// judging each GPU as the policy runs its processes: the job runs out of
// memory when one of them does.
func (s *simulator) start(at []int, ai int, t float64, ms []*Envelope, needs []units.Bytes) {
	a := &s.arr[ai]
	s.res.Started++
	s.waits = append(s.waits, t-a.at)
	c, risky := s.pool.Capacity(), false
	for k, g := range at {
		allocated, reach := ms[k].Allocated, s.reach(ms[k])
		for _, r := range s.gpus[g] {
			allocated += r.env.Allocated
			reach += s.reach(r.env)
		}
		if allocated > c {
			s.res.OOM++
			s.res.OOMJobs = append(s.res.OOMJobs, fmt.Sprintf("%s@%s", a.Job, time.Duration(a.at*float64(time.Second))))
			return
		}
		risky = risky || reach > c
	}
	if risky {
		s.res.AtRisk++
	}
	for k, g := range at {
		if len(s.gpus[g]) == 0 {
			s.busyGPUs++
		}
		r := running{arrival: ai, end: t + a.dur, env: ms[k], mean: mean(ms[k]), need: needs[k], lead: k == 0}
		s.gpus[g] = append(s.gpus[g], r)
		s.used[g] += needs[k]
		s.tree.set(g, s.roomOf(g))
		s.memRate += r.mean
		s.nrun++
		heap.Push(&s.ends, endItem{r.end, g})
	}
}

// posHeap is kinds by the place of their first queued arrival: {pos, kind}.
type posHeap [][2]int

func (h posHeap) Len() int           { return len(h) }
func (h posHeap) Less(i, j int) bool { return h[i][0] < h[j][0] }
func (h posHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *posHeap) Push(x any)        { *h = append(*h, x.([2]int)) }
func (h *posHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// endItem is a running process's end time and GPU.
type endItem struct {
	end float64
	gpu int
}

// endHeap is the running processes by end time.
type endHeap []endItem

func (h endHeap) Len() int           { return len(h) }
func (h endHeap) Less(i, j int) bool { return h[i].end < h[j].end }
func (h endHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *endHeap) Push(x any)        { *h = append(*h, x.(endItem)) }
func (h *endHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

func (s *simulator) reach(e *Envelope) units.Bytes {
	if s.policy == Curve {
		return e.Cap
	}
	return e.Peak
}

func (s *simulator) finish() {
	s.res.Makespan = s.last
	if s.last > 0 {
		s.res.Utilisation = s.mem / (s.last * float64(s.pool.Count) * float64(s.pool.Capacity()))
		s.res.Busy = s.busy / s.last
	}
	if len(s.waits) == 0 {
		return
	}
	w := slices.Clone(s.waits)
	slices.Sort(w)
	var sum float64
	for _, x := range w {
		sum += x
	}
	s.res.MeanWait = sum / float64(len(w))
	s.res.MaxWait = w[len(w)-1]
	s.res.P95Wait = w[min(len(w)-1, int(math.Ceil(0.95*float64(len(w))))-1)]
}
