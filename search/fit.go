// Package search finds the fastest training plan that fits a memory budget.
// It enumerates plans over micro-batch (at a fixed effective batch),
// checkpointing, offload, optimizer implementation, ZeRO stage and the
// tensor/pipeline/data-parallel split of the GPUs — and, only when allowed,
// options that change the training result (LoRA, QLoRA, 8-bit optimizers,
// lower precision).
//
// Every reported number comes from the engine: the simulator and the cost
// model on the full program. To stay fast the search first estimates each
// plan on copies of the model with fewer layers: the peak of a stack of
// identical layers is the maximum of functions affine in the layer count, so
// it is convex in it, and extrapolating the line through two shallow models
// gives a lower bound on the deep model's peak. Plans whose bound exceeds the
// budget are dropped safely; the survivors are ranked by estimated step time
// and the best are verified on the full model.
package search

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/memplan/memplan/engine"
	"github.com/memplan/memplan/lower"
	"github.com/memplan/memplan/models/build"
	"github.com/memplan/memplan/ops"
	"github.com/memplan/memplan/units"
)

// Options of a search. Zero values take the defaults documented per field.
type Options struct {
	// Capacity, when set, is the device memory every plan must fit,
	// whatever its layout (a budget). By default each plan fits its own
	// spec's CapacityBytes, as plan and compare decide: the GPU's memory
	// less the recipe's overhead and one NCCL communicator for each of the
	// plan's parallel groups of more than one GPU. Headroom is the fraction
	// of it kept free besides (default 0).
	Capacity units.Bytes
	Headroom float64
	// GlobalBatch is the samples per optimizer step over all replicas
	// (default: the base spec's micro-batch × accum × dp).
	GlobalBatch int
	// GPUs is how many GPUs the job may use (default: the base spec's
	// dp × tp × pp). They are split into data, tensor and pipeline parallel.
	GPUs int
	// Allow lets options that change the training result into the search.
	Allow engine.Allow
	// Progress, when set, is called as estimates complete.
	Progress func(done, total int)
	// Workers evaluating in parallel (default GOMAXPROCS).
	Workers int
	// Keep is how many plans to verify and report besides the winner
	// (default 5).
	Keep int
	// Pinned are the dimensions the search keeps at the base spec's value
	// (fit's strategy flags and --deny); the others it chooses.
	Pinned Pins
	// Context, when set, cancels the search: Fit checks it between states
	// and verification batches and returns its error (a service's request
	// deadline or a client that went away).
	Context context.Context
	// MemoryBudget bounds the heap the search holds live in plans and
	// programs (default DefaultMemoryBudget): the candidate plans take
	// their share, and the rest is split evenly between each worker's
	// program cache and the program it plans. Fit refuses, with
	// ErrMemoryBudget, a search whose candidates alone take over a quarter
	// of it, and stops at the first plan whose program alone is over a
	// worker's share.
	MemoryBudget units.Bytes
}

// Pins is a set of the dimensions fit searches.
type Pins uint16

// The dimensions fit searches; a pinned one keeps the base spec's value.
const (
	PinMicroBatch Pins = 1 << iota
	PinAccum
	PinTP
	PinSP
	PinPP
	PinDP
	PinZeRO
	PinCheckpoint
	PinOffload
	PinImpl
	numPins = iota
)

// pinNames are the dimensions' field keys, in Pins order.
var pinNames = [numPins]string{"micro-batch", "accum", "tp", "sp", "pp", "dp", "zero", "checkpoint", "offload", "optimizer-impl"}

// Names lists the dimensions in p by field key (engine.Field.Key).
func (p Pins) Names() []string {
	var out []string
	for i, n := range pinNames {
		if p&(1<<i) != 0 {
			out = append(out, n)
		}
	}
	return out
}

// AllPins is every dimension fit searches.
const AllPins Pins = 1<<numPins - 1

// Has says whether p pins d.
func (p Pins) Has(d Pins) bool { return p&d != 0 }

// Plan is one candidate.
type Plan struct {
	Spec engine.Spec
	// EstPeak is a lower bound on the peak from shallow models, EstStep an
	// estimate of the step time (zero: not estimated), EstHost a lower
	// bound on the host memory one GPU pins (engine.Result.HostPeak).
	EstPeak units.Bytes
	EstStep time.Duration
	EstHost units.Bytes
	// Result is the full-model verification (nil if not verified), planned
	// as plan plans it (engine.Result.SimAccum: fewer micro-steps
	// simulated, with the same peak); VerifiedStep is its step time. A
	// plan too shallow to estimate on shallow models has the Result of its
	// estimate until it is verified, simulated with simAccum micro-steps
	// and its step extrapolated (stepAt).
	Result       *engine.Result
	VerifiedStep time.Duration
	// Why the candidate was dropped ("" if it was not).
	Dropped string
	// Limit is the memory the plan must fit (limitOf): its own, since
	// each parallel group of more than one GPU holds a communicator.
	Limit units.Bytes

	unpriced shots // estimated peak, step not priced yet (estimator.price)
	// stopped: EstPeak is a shallow model's peak over the limit, where
	// the estimate stopped (pair), not the bound extrapolated to the
	// full depth (refineSmallest).
	stopped bool
}

// Peak is the verified peak, or the estimate.
func (p *Plan) Peak() units.Bytes {
	if p.Result != nil {
		return p.Result.PeakBytes()
	}
	return p.EstPeak
}

// HostPerNode is the host memory a node pins: the verified plan's, or the
// estimate's bound for the node's GPUs.
func (p *Plan) HostPerNode() units.Bytes {
	if p.Result != nil {
		return p.Result.HostPerNode
	}
	v, ok := units.MulBytes(p.EstHost, int64(p.Spec.GPUsOnNode()))
	if !ok {
		return units.MaxBytes
	}
	return v
}

// dropOverHost drops p, estimated under its device limit, when its host
// memory is estimated over --host-memory: a smaller micro-batch offloads
// fewer activations, so the group's search goes on below it.
func (p *Plan) dropOverHost() {
	if lim := p.Spec.HostMemory; p.Dropped == "" && p.EstPeak <= p.Limit && lim > 0 && p.HostPerNode() > lim {
		p.Dropped = fmt.Sprintf("host memory estimated at %s per node or more, over the host limit %s", p.HostPerNode(), lim)
	}
}

// Step is the verified step time, or the estimate.
func (p *Plan) Step() time.Duration {
	if p.Result != nil && p.VerifiedStep > 0 {
		return p.VerifiedStep
	}
	return p.EstStep
}

// Describe names the plan's choices.
func (p *Plan) Describe() string {
	s := &p.Spec
	d := fmt.Sprintf("micro-batch %d × accum %d", s.MicroBatch, s.Accum)
	if s.TP > 1 {
		d += fmt.Sprintf(", tp %d", s.TP)
		if s.SP {
			d += "+sp"
		}
	}
	if s.PP > 1 {
		d += fmt.Sprintf(", pp %d", s.PP)
	}
	if s.DP > 1 {
		d += fmt.Sprintf(", dp %d", s.DP)
		if s.ZeRO > 0 {
			d += fmt.Sprintf(" ZeRO-%d", s.ZeRO)
		}
	}
	if s.EP > 1 {
		d += fmt.Sprintf(", ep %d", s.EP)
	}
	if s.Checkpoint.Kind != engine.NoCheckpoint {
		d += ", checkpoint " + s.Checkpoint.String()
	}
	if s.Offload.Any() {
		d += ", offload " + s.Offload.String()
	}
	d += ", " + s.Impl.String() + " " + s.Optimizer.String()
	if s.Precision != ops.AMPBF16 {
		d += ", " + s.Precision.String()
	}
	if s.LoRA != nil {
		if s.QLoRA {
			d += ", qlora"
		} else {
			d += ", lora"
		}
	}
	return d
}

// Result of a search.
type Result struct {
	Winner    *Plan
	RunnersUp []*Plan
	// Front is the memory/time Pareto front of the estimated plans that fit
	// (no other fitting plan is both smaller and faster), fastest first.
	Front []*Plan
	// Considered counts every enumerated plan; Estimated those estimated on
	// shallow models; Verified those simulated in full.
	Considered, Estimated, Verified int
	// Limit is the limit of a plan on one GPU (no parallel group), and
	// LimitPerGroup what each parallel group of more than one GPU takes
	// off it (NCCL's buffers; 0 under a budget, or when no candidate has a
	// group). Plan.Limit is each plan's exactly.
	Limit, LimitPerGroup units.Bytes
	// Pinned are the dimensions kept at the given value; the others were
	// searched.
	Pinned Pins
}

// ErrNothingFits is returned when no plan fits.
var ErrNothingFits = errors.New("no plan fits")

// Fit searches plans for base (a validated training spec with a model). It is a driver over a fitter's
// phases: defaults (check base and fill o), enumerate, estimate (bundles of states on shallow models, in
// parallel), verify (the best estimates in full, Workers at a time, until Keep+1 fit), and the result (the
// winner, the runners-up and the Pareto front, or why nothing fits).
func Fit(base engine.Spec, o Options) (*Result, error) {
	if err := fitDefaults(&base, &o); err != nil {
		return nil, err
	}
	f := &fitter{o: o, cands: enumerate(base, o)}
	f.res = &Result{Considered: len(f.cands), Pinned: o.Pinned}
	f.setLimits(base)
	if len(f.cands) == 0 {
		return nil, noPlans(&base, &o)
	}
	b, err := newBudget(o.MemoryBudget, o.Workers, len(f.cands))
	if err != nil {
		return nil, err
	}
	f.est = newEstimator(base.Model)
	f.est.stop, f.est.budget, f.est.ctx = true, b, o.Context
	f.est.cache.Limit = b.cacheOps() * o.Workers // verification's, shared by the workers
	f.estimate()
	if err := f.cancelled(); err != nil {
		return nil, err
	}
	f.verify()
	if err := f.cancelled(); err != nil {
		return nil, err
	}
	if len(f.verified) == 0 {
		return f.res, f.nothingFits()
	}
	sort.SliceStable(f.verified, func(i, j int) bool { return f.verified[i].Step() < f.verified[j].Step() })
	f.res.Winner, f.res.RunnersUp = f.verified[0], f.verified[1:]
	var front []*Plan
	for _, c := range f.fits {
		if c.Dropped == "" {
			front = append(front, c)
		}
	}
	f.res.Front = pareto(front)
	return f.res, nil
}

// noPlans is why enumerate found no plan for base and o.
func noPlans(base *engine.Spec, o *Options) error {
	var why string
	if base.Sem.OptimizerInBackward {
		why = "; an optimizer step inside backward cannot accumulate gradients, so a replica's batch is one micro-batch"
	}
	if o.Pinned != 0 {
		var pins []string
		for _, n := range o.Pinned.Names() {
			if n == "optimizer-impl" {
				pins = append(pins, "the optimizer implementation")
			} else {
				pins = append(pins, "{"+n+"}")
			}
		}
		return engine.FieldErrorf(engine.FieldGlobalBatch, "no plan splits %d GPUs and a {global-batch} of %d keeping %s as given (the global batch must divide among data-parallel replicas, the GPUs into tp × pp × dp, a pipeline's batch into at most %d micro-steps%s)", o.GPUs, o.GlobalBatch, strings.Join(pins, ", "), engine.MaxPipelineAccum, why)
	}
	return engine.FieldErrorf(engine.FieldGlobalBatch, "no plan splits %d GPUs and a {global-batch} of %d (the global batch must divide among data-parallel replicas, and a pipeline's into at most %d micro-steps%s)", o.GPUs, o.GlobalBatch, engine.MaxPipelineAccum, why)
}

// fitDefaults checks base and fills o's defaults from it.
func fitDefaults(base *engine.Spec, o *Options) error {
	if base.Model == nil {
		return engine.FieldErrorf(engine.FieldTrace, "fit needs a {model} (catalog name or config.json), not a {graph}")
	}
	if base.Mode != engine.Train {
		return engine.FieldErrorf(engine.FieldMode, "fit plans training; plan inference with {mode} infer")
	}
	if o.GPUs == 0 {
		o.GPUs = max(base.DP, 1) * max(base.TP, 1) * max(base.PP, 1)
	}
	if o.GlobalBatch == 0 {
		g, ok := units.MulChecked(int64(base.MicroBatch), int64(max(base.Accum, 1)), MaxGlobalBatch)
		if ok {
			g, ok = units.MulChecked(g, int64(max(base.DP, 1)), MaxGlobalBatch)
		}
		if !ok || base.MicroBatch < 0 {
			return engine.FieldErrorf(engine.FieldGlobalBatch, "{micro-batch} × {accum} × {dp} is over the limit of %d samples per optimizer step", MaxGlobalBatch)
		}
		o.GlobalBatch = int(g)
	}
	if o.GlobalBatch > MaxGlobalBatch {
		return engine.FieldErrorf(engine.FieldGlobalBatch, "{global-batch} %d is over the limit of %d samples per optimizer step", o.GlobalBatch, MaxGlobalBatch)
	}
	if o.GPUs > engine.MaxGPUs {
		return engine.FieldErrorf(engine.FieldGPUs, "{gpus} %d is over the limit of %d GPUs", o.GPUs, engine.MaxGPUs)
	}
	// A pinned ZeRO stage (or sequence parallelism) with the data (tensor)
	// parallel degree left to the search is checked at the smallest degree
	// it needs; the search sets the degree.
	if o.Pinned.Has(PinZeRO) && !o.Pinned.Has(PinDP) && base.ZeRO > 0 && base.DP <= 1 {
		base.DP = 2
	}
	if o.Pinned.Has(PinSP) && !o.Pinned.Has(PinTP) && base.SP && base.TP <= 1 {
		base.TP = 2
	}
	// So is --ep, which needs data-parallel ranks a multiple of it: the
	// search keeps the layouts that have them (sweep E, round 25: fit
	// --gpus 16 --ep 8 was refused at the base's dp of 1).
	if base.EP > 1 && !o.Pinned.Has(PinDP) && max(base.DP, 1)%base.EP != 0 {
		base.DP = base.EP
	}
	if err := base.Validate(); err != nil {
		return err
	}
	if o.Capacity <= 0 && base.CapacityBytes() <= 0 || base.GPU == nil {
		return engine.FieldErrorf(engine.FieldGPU, "fit needs a {gpu} (its speed ranks the plans; a {budget} may lower its memory)")
	}
	if !(o.Headroom >= 0 && o.Headroom < 1) { // NaN too
		return engine.FieldErrorf(engine.FieldHeadroom, "{headroom} %.2f must be in [0, 1)", o.Headroom)
	}
	if o.GPUs < 1 || o.GlobalBatch < 1 {
		return engine.FieldErrorf(engine.FieldGPUs, "{gpus} and {global-batch} must be positive")
	}
	if o.Workers == 0 {
		o.Workers = runtime.GOMAXPROCS(0)
	}
	if o.Keep == 0 {
		o.Keep = 5
	}
	if o.MemoryBudget == 0 {
		o.MemoryBudget = DefaultMemoryBudget
	}
	if o.MemoryBudget < 0 {
		return fmt.Errorf("%w: the budget %d B is negative", ErrMemoryBudget, int64(o.MemoryBudget))
	}
	return nil
}

// MaxGlobalBatch bounds fit's samples per optimizer step: 2^24 (16.7M
// sequences; the largest published runs step on a few thousand), so that a
// step extrapolated to its micro-steps stays inside time.Duration.
const MaxGlobalBatch = 1 << 24

// fitter is one Fit.
type fitter struct {
	o        Options
	cands    []*Plan
	res      *Result
	est      *estimator
	groupOf  map[*Plan][]*Plan // the plans that differ from each only in micro-batch
	fits     []*Plan           // plans estimated to fit, by estimate (fallbacks appended)
	verified []*Plan

	// capacity is a plan's usable memory on one GPU, less perGroup for
	// each of its parallel groups (before the headroom; setLimits), for
	// the report of a search where nothing fits.
	capacity, perGroup units.Bytes
}

// cancelled is the error of o.Context once it is done (nil without one),
// or the search's memory budget's once a plan went over it.
func (f *fitter) cancelled() error {
	if f.est != nil && f.est.budget != nil {
		if err := f.est.budget.failed(); err != nil {
			return err
		}
	}
	if f.o.Context == nil {
		return nil
	}
	return context.Cause(f.o.Context)
}

// estimate bounds every candidate on shallow models: bundles of states, one worker each.
func (f *fitter) estimate() {
	groups := groupByAllButBatch(f.cands)
	f.groupOf = make(map[*Plan][]*Plan, len(f.cands))
	for _, g := range groups {
		for _, c := range g {
			f.groupOf[c] = g
		}
	}
	bundles := bundleStates(groupByState(groups))
	var mu sync.Mutex
	done := 0
	work := make(chan [][][]*Plan)
	var wg sync.WaitGroup
	for w := 0; w < f.o.Workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for b := range work {
				f.searchBundle(b, func(n, size int) {
					mu.Lock()
					f.res.Estimated += n
					done += size
					if f.o.Progress != nil {
						f.o.Progress(done, len(f.cands))
					}
					mu.Unlock()
				})
			}
		}()
	}
	for _, b := range bundles {
		work <- b
	}
	close(work)
	wg.Wait()
	for _, c := range f.cands {
		if c.Dropped == "" {
			f.fits = append(f.fits, c)
		}
	}
	slices.SortStableFunc(f.fits, byEstimate)
}

// searchBundle searches the states of one bundle. They differ only in sharding and offload: each starts its
// variants' searches where the previous state's ended (hints), and their shallow programs before sharding come
// from the cache. report gets the plans estimated and searched after each state.
func (f *fitter) searchBundle(b [][][]*Plan, report func(n, size int)) {
	m := newMemo()
	be := f.est.withCache(&engine.Cache{Limit: f.est.budget.cacheOps()})
	for i, k := range b {
		if f.cancelled() != nil {
			return
		}
		if i > 0 && k[0][0].Spec.ZeRO != b[i-1][0][0].Spec.ZeRO {
			// Sharded programs of the last stage are done
			// with (states come by ZeRO stage).
			be.cache.DropSharded()
		}
		n, size := searchState(be, k, m)
		report(n, size)
	}
}

// verify simulates the best estimates in full, in order of estimated speed, until Keep+1 plans fit for real,
// Workers at a time (the same plans as one at a time, in order).
func (f *fitter) verify() {
	queue := append([]*Plan(nil), f.fits...)
	for len(queue) > 0 && len(f.verified) <= f.o.Keep && f.cancelled() == nil {
		batch := queue[:min(f.o.Workers, len(queue))]
		queue = queue[len(batch):]
		errs := make([]error, len(batch))
		var vg sync.WaitGroup
		for i, c := range batch {
			vg.Add(1)
			go func() {
				defer vg.Done()
				c.Result, c.VerifiedStep, errs[i] = f.est.verify(c.Spec)
			}()
		}
		vg.Wait()
		for i, c := range batch {
			queue = f.judge(c, errs[i], queue)
		}
	}
}

// judge records the verification of c (err: it did not plan) and returns the queue, with the same plan at a
// smaller micro-batch inserted when c is over the limit: the estimate is a lower bound, not the peak, and that
// plan, dropped for c, may fit.
func (f *fitter) judge(c *Plan, err error, queue []*Plan) []*Plan {
	if len(f.verified) > f.o.Keep {
		c.Result, c.VerifiedStep = nil, 0 // verified past the need
		return queue
	}
	f.res.Verified++
	switch {
	case err != nil:
		c.Dropped = err.Error()
	case c.Result.PeakBytes() > c.Limit || c.Result.HostShortfall > 0:
		c.Result.Compact() // its peak is reported, its program not
		c.Dropped = fmt.Sprintf("peak %s over the limit %s", c.Result.PeakBytes(), c.Limit)
		if c.Result.HostShortfall > 0 {
			// The estimate's host memory is a lower bound (Plan.EstHost);
			// a smaller micro-batch offloads fewer activations.
			c.Dropped = fmt.Sprintf("host memory %s per node over the host limit %s", c.Result.HostPerNode, c.Spec.HostMemory)
		}
		if d := smallerFallback(f.est, f.groupOf[c], c); d != nil {
			f.fits = append(f.fits, d)
			at, _ := slices.BinarySearchFunc(queue, d, byEstimate)
			queue = slices.Insert(queue, at, d)
		}
	default:
		f.verified = append(f.verified, c)
	}
	return queue
}

// nothingFits says why no plan fits: the smallest estimated peak is over its plan's limit, plans estimated under
// theirs were dropped for another reason (one that did not plan, or did not fit in full), or none was estimated
// (every plan refused: the first refusal, not a smallest peak of 0 B).
func (f *fitter) nothingFits() error {
	o, cands := f.o, f.cands
	in := fmt.Sprintf("in %s (%s with %.0f%% headroom)", f.capacity, f.res.Limit, 100*o.Headroom)
	if f.perGroup > 0 {
		in += fmt.Sprintf(" on one GPU, less %s for each parallel group of more than one GPU,", f.perGroup)
	}
	f.refineSmallest()
	under := func(c *Plan) bool { return c.EstPeak > 0 && c.EstPeak <= c.Limit }
	if m := smallest(cands); m == 0 {
		for _, c := range cands {
			if c.Dropped != "" {
				return fmt.Errorf("%w %s among %d plans; none was estimated: %s was dropped: %s", ErrNothingFits, in, len(cands), c.Describe(), c.Dropped)
			}
		}
	} else if !slices.ContainsFunc(cands, under) {
		return fmt.Errorf("%w %s among %d plans; the smallest estimated peak is %s", ErrNothingFits, in, len(cands), m)
	}
	for _, c := range cands {
		if under(c) && c.Dropped != "" {
			return fmt.Errorf("%w %s among %d plans; %s, estimated at %s, was dropped: %s", ErrNothingFits, in, len(cands), c.Describe(), c.EstPeak, c.Dropped)
		}
	}
	return fmt.Errorf("%w %s among %d plans", ErrNothingFits, in, len(cands))
}

// byEstimate orders plans by estimated step time, then estimated peak.
func byEstimate(a, b *Plan) int {
	if a.EstStep != b.EstStep {
		return cmp.Compare(a.EstStep, b.EstStep)
	}
	return cmp.Compare(a.EstPeak, b.EstPeak)
}

// droppedForLarger is why a plan is dropped when the same plan with a
// larger micro-batch fits.
const droppedForLarger = "same plan with a larger micro-batch fits and runs fewer micro-steps"

// smallerFallback is the plan to try when c, estimated to fit, does not:
// the next smaller micro-batch of its group that was dropped for c (or for
// one of the micro-batches between) and whose estimate fits; nil when
// there is none.
func smallerFallback(est *estimator, g []*Plan, c *Plan) *Plan {
	for j := slices.Index(g, c) - 1; j >= 0; j-- {
		d := g[j]
		if d.Dropped != droppedForLarger {
			return nil
		}
		d.Dropped = ""
		if d.EstPeak == 0 || d.EstStep == 0 {
			d.EstPeak, d.EstStep, d.EstHost = 0, 0, 0
			est.estimate(d)
		}
		d.dropOverHost()
		if d.Dropped == "" && d.EstPeak <= d.Limit {
			return d
		}
		if d.Dropped == "" {
			d.Dropped = fmt.Sprintf("estimated peak %s over the limit", d.EstPeak)
		}
	}
	return nil
}

// refineSmallest extrapolates to the full depth the estimates that stopped
// at a shallow model over the limit (Plan.stopped) and could be the
// smallest, in increasing order, so that the smallest estimated peak a
// search where nothing fits reports is a bound on the full model, not the
// shallow model's peak that was enough to drop the plan: once the next
// stopped peak is at least the smallest bound, no bound past it (each at
// least its own stopped peak) is smaller.
func (f *fitter) refineSmallest() {
	var stopped, rest []*Plan
	for _, c := range f.cands {
		if c.stopped {
			stopped = append(stopped, c)
		} else {
			rest = append(rest, c)
		}
	}
	slices.SortStableFunc(stopped, func(a, b *Plan) int { return cmp.Compare(a.EstPeak, b.EstPeak) })
	best := smallest(rest)
	e := *f.est
	e.stop, e.overPart = false, nil
	for _, c := range stopped {
		if best > 0 && c.EstPeak >= best {
			return
		}
		shallow, why := c.EstPeak, c.Dropped
		e.peak(c)
		c.unpriced.release()
		c.unpriced, c.stopped = nil, false
		if c.Dropped != why {
			// A deeper shallow model did not plan (the memory
			// budget): the stopped peak is still a bound.
			c.EstPeak = shallow
		}
		c.Dropped = why
		if best == 0 || c.EstPeak < best {
			best = c.EstPeak
		}
	}
}

func smallest(cs []*Plan) units.Bytes {
	m := units.Bytes(math.MaxInt64)
	for _, c := range cs {
		if c.EstPeak > 0 && c.EstPeak < m {
			m = c.EstPeak
		}
	}
	if m == math.MaxInt64 {
		return 0
	}
	return m
}

// pareto returns the plans no other plan beats on both peak and step time,
// fastest first: a verified plan's exact ones, the others' estimates (Peak,
// Step). On the estimates alone a verified plan stayed beside one that its
// verification showed smaller and faster, with a step the runners-up gave
// otherwise (cross-command sweep, round 24).
func pareto(ps []*Plan) []*Plan {
	s := append([]*Plan(nil), ps...)
	sort.SliceStable(s, func(i, j int) bool {
		if s[i].Step() != s[j].Step() {
			return s[i].Step() < s[j].Step()
		}
		return s[i].Peak() < s[j].Peak()
	})
	var front []*Plan
	best := units.Bytes(math.MaxInt64)
	for _, p := range s {
		if p.Peak() < best {
			front = append(front, p)
			best = p.Peak()
		}
	}
	return front
}

// enumerate lists the candidate plans: every parallel layout the GPUs and
// the model allow (layouts), crossed with the other axes (axesOf: offload,
// checkpointing, optimizer implementation, precision, optimizer, adapters)
// and the micro-batches that split a replica's batch.
func enumerate(base engine.Spec, o Options) []*Plan {
	ax := axesOf(base, o)
	var out []*Plan
	for _, l := range layouts(base, o) {
		out = ax.cross(out, base, o, l)
	}
	return out
}

// adapter is a choice of adapters: LoRA, with QLoRA's 4-bit base weights or not.
type adapter struct {
	lora  *build.LoRA
	qlora bool
}

// axes are the choices enumerate crosses with every layout (offload aside,
// which depends on the ZeRO stage).
type axes struct {
	precisions []ops.Precision
	optimizers []lower.Optimizer
	adapters   []adapter
	impls      []lower.Impl
	ckpts      []engine.CheckpointPolicy
}

// axesOf is the spec's own choice on each axis, then what Options.Allow
// adds, unless the dimension is pinned.
func axesOf(base engine.Spec, o Options) axes {
	pin := o.Pinned
	ax := axes{
		precisions: []ops.Precision{base.Precision},
		optimizers: []lower.Optimizer{base.Optimizer},
		adapters:   []adapter{{base.LoRA, base.QLoRA}},
		impls:      []lower.Impl{base.Impl},
		ckpts:      []engine.CheckpointPolicy{{}, {Kind: engine.CheckpointEvery, Every: 2}, {Kind: engine.CheckpointFull}},
	}
	if to, ok := engine.LoweredPrecision(base.Precision); o.Allow.LowerPrecision && ok {
		ax.precisions = append(ax.precisions, to)
	}
	if o.Allow.EightBit && (base.Optimizer == lower.Adam || base.Optimizer == lower.AdamW) {
		ax.optimizers = append(ax.optimizers, lower.Adam8bit)
	}
	if base.LoRA == nil && o.Allow.LoRA {
		ax.adapters = append(ax.adapters, adapter{&build.LoRA{Rank: 16, Alpha: 32, Targets: []string{"all-linear"}}, false})
	}
	if !base.QLoRA && o.Allow.QLoRA {
		ax.adapters = append(ax.adapters, adapter{&build.LoRA{Rank: 16, Alpha: 32, Targets: []string{"all-linear"}}, true})
	}
	// The fused step where an optimizer of the search has one (--allow
	// 8bit's bitsandbytes has nothing else).
	if base.Impl != lower.Fused && !pin.Has(PinImpl) && slices.ContainsFunc(ax.optimizers, func(o lower.Optimizer) bool { return o.Has(lower.Fused) }) {
		ax.impls = append(ax.impls, lower.Fused)
	}
	if base.Attention == build.Eager {
		ax.ckpts = append(ax.ckpts, engine.CheckpointPolicy{Kind: engine.CheckpointSelective})
	}
	if pin.Has(PinCheckpoint) {
		ax.ckpts = []engine.CheckpointPolicy{base.Checkpoint}
	}
	return ax
}

// layout is one parallel layout: tensor, pipeline and data parallel degrees
// (replica: the global batch's share of one data-parallel rank), sequence
// parallelism and the ZeRO stage.
type layout struct {
	tp, pp, dp, replica, zero int
	sp                        bool
}

// layouts are the layouts the GPUs and the model allow: TP dividing the
// heads, KV heads and intermediate size; TP × PP dividing the GPUs; DP
// dividing the global batch and a multiple of the spec's EP; SP only under
// TP on a sequence it divides and without experts; ZeRO only with DP.
// Pinned dimensions keep the spec's.
func layouts(base engine.Spec, o Options) []layout {
	a, pin := base.Model, o.Pinned
	var ls []layout
	// A spec's degree of 0 is 1 (none).
	tps, pps, sps := pinned(pin.Has(PinTP), []int{1, 2, 4, 8}, max(base.TP, 1)), pinned(pin.Has(PinPP), []int{1, 2, 4, 8}, max(base.PP, 1)), pinned(pin.Has(PinSP), []bool{false, true}, base.SP)
	for _, tp := range tps {
		if tp > o.GPUs || a.Heads%tp != 0 || a.KVHeads%tp != 0 || a.Intermediate%tp != 0 || (tp > 1 && a.Encoder) {
			continue
		}
		for _, pp := range pps {
			if tp*pp > o.GPUs || o.GPUs%(tp*pp) != 0 || pp > a.Layers {
				continue
			}
			dp := o.GPUs / (tp * pp)
			if o.GlobalBatch%dp != 0 || pin.Has(PinDP) && dp != max(base.DP, 1) || base.EP > 1 && dp%base.EP != 0 {
				continue
			}
			for _, sp := range sps {
				if sp && (tp == 1 || base.Seq%tp != 0 || a.NumExperts > 0) {
					continue
				}
				zeros := []int{0}
				if dp > 1 {
					zeros = []int{0, 1, 2, 3}
				}
				if zeros = pinned(pin.Has(PinZeRO), zeros, base.ZeRO); dp == 1 && zeros[0] > 0 {
					continue
				}
				for _, zero := range zeros {
					ls = append(ls, layout{tp: tp, pp: pp, dp: dp, replica: o.GlobalBatch / dp, zero: zero, sp: sp})
				}
			}
		}
	}
	return ls
}

// cross appends to out the plans of layout l: each offload the ZeRO stage
// allows (parameter offload only under ZeRO-3) crossed with every axis and
// micro-batch.
func (ax axes) cross(out []*Plan, base engine.Spec, o Options, l layout) []*Plan {
	offloads := []engine.Offload{{}, {Activations: true}, {Optimizer: true}, {Activations: true, Optimizer: true}}
	if l.zero == 3 {
		offloads = append(offloads, engine.Offload{Params: true}, engine.Offload{Params: true, Activations: true})
	}
	if offloads = pinned(o.Pinned.Has(PinOffload), offloads, base.Offload); offloads[0].Params && l.zero != 3 {
		return out
	}
	for _, off := range offloads {
		for _, ck := range ax.ckpts {
			for _, impl := range ax.impls {
				for _, prec := range ax.precisions {
					for _, opt := range ax.optimizers {
						if !opt.Has(impl) {
							continue // a step it lacks: the plan of its own step is another impl's
						}
						for _, ad := range ax.adapters {
							for _, b := range batches(l.replica, o.Pinned, &base) {
								if l.pp > 1 && l.replica/b > engine.MaxPipelineAccum {
									continue // plan refuses it: a pipeline simulates every micro-step
								}
								s := base
								s.MicroBatch, s.Accum = b, l.replica/b
								s.TP, s.SP, s.PP, s.DP, s.ZeRO = l.tp, l.sp, l.pp, l.dp, l.zero
								s.Offload, s.Checkpoint, s.Impl = off, ck, impl
								s.Precision, s.Optimizer, s.LoRA, s.QLoRA = prec, opt, ad.lora, ad.qlora
								if o.Capacity > 0 {
									s.Capacity = o.Capacity
								}
								s.FirstStep = false
								out = append(out, &Plan{Spec: s, Limit: limitOf(&s, o.Headroom)})
							}
						}
					}
				}
			}
		}
	}
	return out
}

// limitOf is the memory a plan of spec s must fit: its usable memory as
// plan decides (engine.Spec.CapacityBytes: the budget, else the GPU's
// memory less the CUDA context and one NCCL communicator for each parallel
// group of more than one GPU) less the headroom.
func limitOf(s *engine.Spec, headroom float64) units.Bytes {
	return units.Bytes(float64(s.CapacityBytes()) * (1 - headroom))
}

// setLimits sets the limits the reports name (Result.Limit and
// LimitPerGroup, and before the headroom f.capacity and f.perGroup): a
// plan's of base's job on one GPU, and what a parallel group takes off it
// (0 under a budget, or when no candidate has a group). Each plan is
// judged against its own (Plan.Limit).
func (f *fitter) setLimits(base engine.Spec) {
	if f.o.Capacity > 0 {
		base.Capacity = f.o.Capacity
	}
	base.TP, base.PP, base.DP, base.EP = 1, 1, 1, 1
	group := base
	group.DP = 2
	f.capacity, f.res.Limit = limitOf(&base, 0), limitOf(&base, f.o.Headroom)
	if slices.ContainsFunc(f.cands, func(c *Plan) bool { return c.Limit != f.res.Limit }) {
		f.perGroup, f.res.LimitPerGroup = f.capacity-limitOf(&group, 0), f.res.Limit-limitOf(&group, f.o.Headroom)
	}
}

// pinned is []T{given} when the dimension is pinned, else all.
func pinned[T any](pin bool, all []T, given T) []T {
	if pin {
		return []T{given}
	}
	return all
}

// batches are the micro-batches that split a replica's batch, keeping a
// pinned micro-batch or accumulation. An optimizer step inside backward
// cannot accumulate gradients (lower.ErrInBackwardAccum): its only
// micro-batch is the replica's batch, as any other would be refused.
func batches(replica int, pin Pins, base *engine.Spec) []int {
	var out []int
	inBackward := base.Sem.OptimizerInBackward
	switch {
	case pin.Has(PinMicroBatch):
		out = []int{base.MicroBatch}
	case pin.Has(PinAccum):
		out = []int{replica / max(base.Accum, 1)}
	case inBackward:
		out = []int{replica}
	default:
		return divisors(replica)
	}
	b := out[0]
	if b < 1 || replica%b != 0 || pin.Has(PinAccum) && replica/b != base.Accum || inBackward && b != replica {
		return nil
	}
	return out
}

func divisors(n int) []int {
	var d []int
	for i := 1; i <= n && len(d) < 16; i++ {
		if n%i == 0 {
			d = append(d, i)
		}
	}
	return d
}

// groupByAllButBatch groups plans that differ only in micro-batch (and so
// accumulation); each group is in increasing micro-batch order.
func groupByAllButBatch(cs []*Plan) [][]*Plan {
	var out [][]*Plan
	for i := 0; i < len(cs); {
		j := i + 1
		for j < len(cs) && groupKey(&cs[i].Spec) == groupKey(&cs[j].Spec) {
			j++
		}
		out = append(out, cs[i:j])
		i = j
	}
	return out
}

// groupByState collects the groups of each state key; in each, the group
// that saves the most memory (full checkpointing, activations offloaded,
// fused step) comes first.
func groupByState(groups [][]*Plan) [][][]*Plan {
	out := collect(groups, func(g []*Plan) engine.Spec { return stateKey(&g[0].Spec) })
	for _, gs := range out {
		sort.SliceStable(gs, func(i, j int) bool { return thrift(&gs[i][0].Spec) > thrift(&gs[j][0].Spec) })
	}
	return out
}

// bundleStates collects states that differ only in ZeRO stage and
// optimizer or parameter offload: by ZeRO stage, and for each the one that
// offloads the most first (its failures bound the others', see memo).
func bundleStates(states [][][]*Plan) [][][][]*Plan {
	bs := collect(states, func(st [][]*Plan) engine.Spec { return bundleKey(&st[0][0].Spec) })
	for _, b := range bs {
		slices.SortStableFunc(b, func(x, y [][]*Plan) int {
			a, c := &x[0][0].Spec, &y[0][0].Spec
			if a.ZeRO != c.ZeRO {
				return cmp.Compare(a.ZeRO, c.ZeRO)
			}
			return cmp.Compare(offloaded(c), offloaded(a))
		})
	}
	return bs
}

// offloaded ranks a state's model-state offload: parameter offload moves
// the optimizer state too, so each rank offloads what the ones below do.
func offloaded(s *engine.Spec) int {
	switch {
	case s.Offload.Params:
		return 2
	case s.Offload.Optimizer:
		return 1
	}
	return 0
}

// memo is what the search of a bundle carries from one state to the next.
type memo struct {
	// hints maps a variant to the index of the largest micro-batch that
	// fitted in the last state searched (-1: none). Hints only decide
	// where each search starts.
	hints map[engine.Spec]int
	// fitted says whether the last state searched had a plan that fits.
	fitted bool
	// over maps a ZeRO stage and variant (checkpointing, activation
	// offload, optimizer step) to the smallest micro-batch whose estimate
	// was over the limit in a state of the bundle that offloads at least as
	// much model state. Offload never raises the device peak
	// (strategy.TestPropertyOffload, engine.TestPropertyOffloadOrder), so
	// the same plan that offloads less does not fit either: its search
	// stops below that micro-batch. The plans of a key share their limit
	// (overKey keeps the layout, the GPU, the budget and the overheads
	// limitOf reads; TestMemoKeysShareLimit), so the bound is found and
	// applied under one limit.
	over map[engine.Spec]int
}

func newMemo() *memo { return &memo{hints: map[engine.Spec]int{}, over: map[engine.Spec]int{}} }

// bound is the largest index of g (in increasing micro-batch) not known
// to be over the limit.
func (m *memo) bound(g []*Plan) int {
	over, ok := m.over[overKey(&g[0].Spec)]
	if !ok {
		return len(g) - 1
	}
	i := len(g) - 1
	for i >= 0 && g[i].Spec.MicroBatch >= over {
		i--
	}
	return i
}

// record notes the smallest micro-batch of g whose estimate is over its
// limit.
func (m *memo) record(g []*Plan) {
	for _, c := range g {
		if c.EstPeak > c.Limit {
			k := overKey(&c.Spec)
			if v, ok := m.over[k]; !ok || c.Spec.MicroBatch < v {
				m.over[k] = c.Spec.MicroBatch
			}
			return
		}
	}
}

// overDrop is why a plan is dropped on memo.over.
const overDrop = "the same plan with more model state offloaded is already over the limit at this micro-batch or a smaller one"

// collect gathers items with equal keys, in order of first appearance.
func collect[T any, K comparable](items []T, key func(T) K) [][]T {
	idx := map[K]int{}
	var out [][]T
	for _, it := range items {
		k := key(it)
		i, ok := idx[k]
		if !ok {
			i = len(out)
			idx[k] = i
			out = append(out, nil)
		}
		out[i] = append(out[i], it)
	}
	return out
}

// thrift orders plans of one state by how much memory they save.
func thrift(s *engine.Spec) int {
	t := 0
	switch s.Checkpoint.Kind {
	case engine.CheckpointFull:
		t += 4
	case engine.CheckpointEvery:
		t += 2
	case engine.CheckpointSelective:
		t++
	}
	if s.Offload.Activations {
		t += 8
	}
	if s.Impl == lower.Fused {
		t++
	}
	return t
}

// searchState estimates the groups of one state. The thriftiest group is
// tried first at its smallest micro-batch: when even that does not fit, the
// state's model states and buffers leave no room for any of its plans, and
// the rest are dropped unestimated. A foreach step is dropped when the
// fused step of the same plan was estimated: fused holds no intermediates
// and launches fewer kernels, so it is never larger or slower. It returns
// how many plans it estimated and how many the state has.
//
// m carries hints and bounds between the states of a bundle;
// searchState updates it. Each plan is judged against its own limit.
func searchState(est *estimator, groups [][]*Plan, m *memo) (int, int) {
	size := 0
	for _, g := range groups {
		size += len(g)
	}
	// Only the plans that survive the state's search are priced.
	defer func() {
		for _, g := range groups {
			for _, c := range g {
				if c.Dropped == "" {
					est.price(c)
				}
				c.unpriced.release()
				c.unpriced = nil
			}
		}
	}()
	first := groups[0][0]
	n := 0
	// The thriftiest probe prunes states that cannot fit; after a state of
	// the bundle that fitted, this one most likely fits too (it differs
	// only in sharding or offload), and the probe would be spent.
	switch {
	case m.bound(groups[0]) < 0:
		first.Dropped = overDrop
	case !m.fitted:
		est.peak(first)
		n++
		m.record(groups[0])
	}
	if first.Dropped != "" || (first.EstPeak > 0 && first.EstPeak > first.Limit) {
		why := first.Dropped
		if why == "" {
			why = fmt.Sprintf("its thriftiest variant (%s) already peaks at %s", first.Describe(), first.EstPeak)
		}
		for _, g := range groups {
			for _, c := range g {
				if c.Dropped == "" || c == first {
					c.Dropped = why
				}
			}
		}
		return n, size
	}
	// A foreach step is dropped when the fused step of the same plan is
	// searched: fused holds no intermediates and launches fewer kernels.
	fused := map[engine.Spec]bool{}
	for _, g := range groups {
		if g[0].Spec.Impl == lower.Fused {
			fused[stepKey(&g[0].Spec)] = true
		}
	}
	var live [][]*Plan
	for _, g := range groups {
		if s := &g[0].Spec; s.Impl != lower.Fused && fused[stepKey(s)] {
			for _, c := range g {
				if c != first {
					c.Dropped = "the fused optimizer step of the same plan is never larger or slower"
				}
			}
			continue
		}
		live = append(live, g)
	}
	// Speed first: the least thrifty variant runs fastest at a given
	// micro-batch (checkpointing adds recompute, offload adds copies), so a
	// thriftier variant is only worth its cost at a micro-batch larger than
	// every faster variant reached.
	sort.SliceStable(live, func(i, j int) bool { return thrift(&live[i][0].Spec) < thrift(&live[j][0].Spec) })
	best := -1
	for _, g := range live {
		v := hintKey(&g[0].Spec)
		h, ok := m.hints[v]
		if !ok {
			h = -1
		}
		top := m.bound(g)
		for _, c := range g[top+1:] {
			if c.Dropped == "" {
				c.Dropped = overDrop
			}
		}
		k, used := searchGroupAbove(est, g[:top+1], best, h)
		m.record(g)
		n += used
		best = max(best, k)
		m.hints[v] = k
	}
	m.fitted = best >= 0
	return n, size
}

// searchGroupAbove estimates a group's plans (in increasing micro-batch)
// above index above: the peak grows with the micro-batch, so it looks for
// the largest micro-batch that fits, starting at index hint (or the first
// candidate when the hint is out of range): when that fits it searches
// upward, checking the next one first; when it does not, it binary-searches
// below. Larger ones are dropped as too big, smaller ones as slower (a
// faster variant of the state, or this one with a larger micro-batch,
// already fits them). It returns the index of the largest fitting
// micro-batch (-1: none) and how many plans it estimated.
func searchGroupAbove(est *estimator, g []*Plan, above, hint int) (int, int) {
	n := 0
	probe := func(c *Plan) bool {
		if c.EstPeak == 0 && c.Dropped == "" {
			est.peak(c)
			n++
		}
		// Judged here whoever estimated it (the state's thriftiest
		// probe too, which offloads the most activations).
		c.dropOverHost()
		return c.Dropped == "" && c.EstPeak <= c.Limit
	}
	lo := above + 1
	for i := 0; i < lo && i < len(g); i++ {
		g[i].Dropped = "a faster variant of the same state fits at this micro-batch or a larger one"
	}
	if lo >= len(g) {
		return -1, n
	}
	start := lo
	if hint > lo {
		start = min(hint, len(g)-1)
	}
	fit := -1
	// between binary-searches g[l..h] for the largest fitting micro-batch.
	between := func(l, h int) {
		for l <= h {
			mid := (l + h) / 2
			if probe(g[mid]) {
				fit, l = mid, mid+1
			} else {
				h = mid - 1
			}
		}
	}
	// up finds the largest fitting micro-batch from g[from], which fits:
	// the next one first, then binary search.
	up := func(from int) {
		fit = from
		if next := from + 1; next < len(g) && probe(g[next]) {
			fit = next
			between(next+1, len(g)-1)
		}
	}
	switch {
	case start > lo && start+1 < len(g):
		// A hint: the micro-batch above it first, as the last state's
		// fit is more often exceeded than missed.
		switch {
		case probe(g[start+1]):
			up(start + 1)
		case probe(g[start]):
			fit = start
		default:
			between(lo, start-1)
		}
	case probe(g[start]):
		up(start)
	default:
		between(lo, start-1)
	}
	if fit < 0 {
		why := g[lo].Dropped
		if why == "" {
			why = fmt.Sprintf("estimated peak %s over the limit", g[lo].EstPeak)
			if g[lo].EstPeak == 0 {
				why = "a smaller micro-batch is already over the limit"
			}
			g[lo].Dropped = why
		}
		for _, c := range g[lo+1:] {
			if c.Dropped == "" {
				c.Dropped = "a smaller micro-batch is already over the limit: " + why
			}
		}
		return -1, n
	}
	for i := lo; i < len(g); i++ {
		c := g[i]
		switch {
		case i == fit:
			c.Dropped = ""
		case i > fit:
			if c.Dropped == "" {
				c.Dropped = "a larger micro-batch than the largest that fits"
			}
		default:
			c.Dropped = droppedForLarger
		}
	}
	return fit, n
}

// TokensPerSec is the job's throughput at the plan's step time.
func (p *Plan) TokensPerSec() float64 {
	st := p.Step()
	if st <= 0 {
		return 0
	}
	return p.Spec.TokensPerStep() * float64(max(p.Spec.DP, 1)) / st.Seconds()
}

// MFU is the model FLOPs utilisation at the plan's step time (the
// simulated micro-steps' model FLOPs scaled to the plan's).
func (p *Plan) MFU() float64 {
	if p.Result == nil || p.Result.Timing == nil || p.Step() <= 0 {
		return 0
	}
	t := p.Result.Timing
	sim := p.Result.Spec.Accum
	return t.MFU * float64(p.Spec.Accum) / float64(sim) * t.Step.Seconds() / p.Step().Seconds()
}
