package search

import (
	"context"
	"math"
	"sync"
	"time"

	"github.com/memplan/memplan/engine"
	"github.com/memplan/memplan/hw"
	"github.com/memplan/memplan/ir"
	"github.com/memplan/memplan/models"
	"github.com/memplan/memplan/strategy"
	"github.com/memplan/memplan/units"
)

// estimator evaluates plans on shallow copies of the model. Plans share
// one engine.Cache, so those that differ only in sharding or offload build,
// lower and schedule each shallow program once; the copies of each depth
// are made once, as the cache keys on the model.
type estimator struct {
	model *models.Arch
	cache *engine.Cache
	// stop, when set, lets an estimate stop once its bound exceeds the
	// plan's limit (Plan.Limit; 0: none).
	stop bool
	// depths are the model's shallow copies, shared by every estimator
	// derived from this one (withCache), so their cache keys agree.
	depths *depths
	// overPart remembers, per state, which part (pipeline end) of the last
	// estimate over the limit went over: the state's next estimate tries
	// that part first, as its plans tend to fail at the same end
	// (BenchmarkFitLlama3_70B: 5,608 -> 5,246 shallow plans). Only
	// withCache's estimators (one goroutine each) have one.
	overPart map[engine.Spec]int
	// budget, when set, bounds each program planned (Options.MemoryBudget).
	budget *budget
	// ctx, when set, stops each plan (engine.Options.Context): the search
	// looks at it between states, a plan between its phases.
	ctx context.Context
}

type depths struct {
	mu     sync.Mutex
	copies map[int]*models.Arch
}

func newEstimator(a *models.Arch) *estimator {
	return &estimator{model: a, cache: &engine.Cache{}, depths: &depths{copies: map[int]*models.Arch{}}}
}

// withCache is e planning through c. A search gives each bundle of states
// its own cache, as no two bundles share a program: what a bundle cached
// is garbage once it is searched, not live heap the collector rescans.
func (e *estimator) withCache(c *engine.Cache) *estimator {
	f := *e
	f.cache = c
	f.overPart = map[engine.Spec]int{}
	return &f
}

// depth is the model cut to layers (0: the model).
func (e *estimator) depth(layers int) *models.Arch {
	if layers <= 0 || layers == e.model.Layers {
		return e.model
	}
	d := e.depths
	d.mu.Lock()
	defer d.mu.Unlock()
	a := d.copies[layers]
	if a == nil {
		a = e.model.Clone()
		a.Layers = layers
		d.copies[layers] = a
	}
	return a
}

// unit is the smallest layer count that keeps the plan's structure: every
// pipeline stage (and virtual stage) gets the same whole number of periods
// of the checkpoint pattern (every k-th block).
func unit(s *engine.Spec) int {
	u := max(s.PP, 1) * max(s.PPInterleave, 1)
	if s.Checkpoint.Kind == engine.CheckpointEvery {
		u *= s.Checkpoint.Every
	}
	return u
}

// simAccum is the number of micro-steps to simulate for a plan of accum
// micro-steps: the same peak with fewer ops. Without pipelining three show
// the peak of any k ≥ 3: the first (gradients created), one between (every
// gradient accumulating, nothing reduced yet) and the last (where ZeRO,
// DDP and offload reduce or move gradients); the micro-steps between hold
// the same memory. The first stage of a 1F1B pipeline holds p micro-batches
// in flight, and from micro-step p+1 on it runs a backward with p in flight
// and every gradient existing, so p+1 show the peak of any k ≥ p+1. GPipe
// holds every micro-batch and interleaving needs multiples of p: those
// simulate all. TestPropertySimAccumShowsPeak checks the claim.
func simAccum(s *engine.Spec) int {
	if s.PP > 1 {
		if max(s.PPInterleave, 1) > 1 || s.PPSchedule != strategy.OneFOneB {
			return s.Accum
		}
		return min(s.Accum, s.PP+1)
	}
	return min(s.Accum, 3)
}

// stepAt extrapolates a step time simulated with sim micro-steps to accum
// micro-steps: the optimizer step runs once, forward and backward once per
// micro-step, and a pipeline rank idles (p−1)/v micro-steps' worth in the
// bubble (Narayanan et al., SC'21).
func stepAt(r *engine.Result, sim, accum int) time.Duration {
	t := r.Timing
	if t == nil {
		return 0
	}
	s := &r.Spec
	micro := float64(t.Phases[ir.Forward].Wall+t.Phases[ir.Backward].Wall) / float64(sim)
	bubble := 0.0
	if s.PP > 1 {
		bubble = micro * float64(s.PP-1) / float64(max(s.PPInterleave, 1))
	}
	return saturate(float64(t.Phases[ir.Optimizer].Wall) + micro*float64(accum) + bubble)
}

// run plans s with its model cut to layers (0: full depth) and its
// micro-steps cut to simAccum; it returns the result and the step time
// extrapolated to s's micro-steps.
func (e *estimator) run(s engine.Spec, layers int) (*engine.Result, time.Duration, error) {
	return e.runWith(s, engine.Options{}, layers, simAccum(&s))
}

// verify plans s in full as plan plans it: its step time is the engine's
// own for every micro-step (engine.Result.SimAccum: three simulated, the
// step priced from two and three), where stepAt, from three alone, spreads
// the first micro-step's cost over the others and misses what a middle one
// does that the first does not: llama-3.2-1b's tied embedding accumulates
// its gradient there, and fit said 3.663 s for a step of 64 micro-steps on
// an A100 that plan said takes 3.690 s (cross-command sweep, round 24).
func (e *estimator) verify(s engine.Spec) (*engine.Result, time.Duration, error) {
	r, _, err := e.runWith(s, engine.Options{}, 0, s.Accum)
	if err != nil {
		return nil, 0, err
	}
	var step time.Duration
	if r.Timing != nil {
		step = r.Timing.Step
	}
	return r, step, nil
}

// runWith is run simulating sim micro-steps, planned as o says (through
// e's cache).
func (e *estimator) runWith(s engine.Spec, o engine.Options, layers, sim int) (*engine.Result, time.Duration, error) {
	s.Model, o.Cache, o.Context = e.depth(layers), e.cache, e.ctx
	accum := s.Accum
	s.Accum = sim
	r, err := engine.PlanWith(s, o)
	if err != nil {
		return nil, 0, err
	}
	if e.budget != nil && !e.budget.check(&s, r) {
		r.Release()
		return nil, 0, e.budget.failed()
	}
	return r, stepAt(r, s.Accum, accum), nil
}

// part is what a plan's estimate is made of: its peak and (priced on
// demand) step time on a model of the given depth. Without pipelining there
// is one part, the whole program; under a 1F1B pipeline two, the first and
// the last stage, which bound the others (engine.Options.Stages): the first
// holds the most micro-batches in flight (firstStage), the last one, so
// three micro-steps show its peak (as without pipelining).
type part func(s engine.Spec, layers int) (units.Bytes, *shot, error)

// shot is an unpriced shallow plan: pricing waits until the plan's peak is
// known to fit (most estimates do not).
type shot struct {
	r          *engine.Result
	gpu        *hw.GPU
	sim, accum int
	pp         int // the real schedule's stages (the bubble)
	layers     int // the shallow model's depth
}

// step prices the shot and extrapolates it to the real micro-steps.
func (sh *shot) step() (time.Duration, error) {
	if sh.gpu == nil {
		return 0, nil
	}
	s := sh.r.Spec
	s.GPU = sh.gpu
	t, err := engine.Price(&s, sh.r.Program)
	if err != nil {
		return 0, err
	}
	r := *sh.r
	r.Spec, r.Timing = s, t
	r.Spec.PP = sh.pp
	return stepAt(&r, sh.sim, sh.accum), nil
}

// shoot plans the pipeline stages of s (nil: all; its GPU left out, so
// unpriced, and without a timeline; with each op's device total when
// totals asks, inFlight's) at depth layers with sim micro-steps.
func (e *estimator) shoot(s engine.Spec, stages []int, layers, sim int, totals bool) (*shot, error) {
	sh := &shot{gpu: s.GPU, sim: sim, accum: s.Accum, pp: s.PP}
	s.GPU = nil
	r, _, err := e.runWith(s, engine.Options{Stages: stages, NoTimeline: true, Totals: totals}, layers, sim)
	if err != nil {
		return nil, err
	}
	sh.r = r
	return sh, nil
}

func (e *estimator) parts(s *engine.Spec) []part {
	if s.PP < 2 || max(s.PPInterleave, 1) > 1 || s.PPSchedule != strategy.OneFOneB {
		return []part{func(s engine.Spec, layers int) (units.Bytes, *shot, error) {
			sh, err := e.shoot(s, nil, layers, simAccum(&s), false)
			if err != nil {
				return 0, nil, err
			}
			return sh.r.PeakBytes(), sh, nil
		}}
	}
	last := func(s engine.Spec, layers int) (units.Bytes, *shot, error) {
		sh, err := e.shoot(s, []int{s.PP - 1}, layers, min(s.Accum, 3), false)
		if err != nil {
			return 0, nil, err
		}
		return sh.r.PeakBytes(), sh, nil
	}
	return []part{e.firstStage, last}
}

// firstStage is the peak and step time of the first stage of s's 1F1B
// pipeline over layers (stage 0 holds ⌊layers/p⌋ of them; the smaller
// schedule below gives its own first stage as many), holding m = min(accum, p+1)
// micro-batches' worth of schedule (simAccum). With p ≤ 3 or m ≤ 3 it
// simulates them; otherwise it simulates a smaller schedule of the same
// shape and adds the micro-batches the real one holds besides (inFlight):
//
//   - m ≤ p: the stage runs m forwards, then m backwards. Three micro-steps
//     (F0 F1 F2 B0 B1 B2) match it from F2 (real F(m−1)) to the end of B1
//     with m−3 micro-batches fewer in flight; before, they run the same
//     first forwards (later ones hold less than F(m−1)), and B2 plays the
//     last backward, holding one micro-batch.
//   - m = p+1: p−1 warm-up forwards, then F(p−1) B0 F(p) B1 with p in
//     flight (B1 and F(p) with every gradient), then the rest backward.
//     A 3-stage pipeline over four micro-steps (F0 F1 F2 B0 F3 B1 B2 B3)
//     has that shape with p−3 micro-batches fewer in flight from F2 to the
//     end of B2.
//
// TestPropertyInFlightIsExact checks the result equals the simulation of
// all m micro-steps on p stages.
func (e *estimator) firstStage(s engine.Spec, layers int) (units.Bytes, *shot, error) {
	p := s.PP
	m := min(s.Accum, p+1)
	first := []int{0}
	direct := func() (units.Bytes, *shot, error) {
		sh, err := e.shoot(s, first, layers, m, false)
		if err != nil {
			return 0, nil, err
		}
		return sh.r.PeakBytes(), sh, nil
	}
	if p <= 3 || m <= 3 {
		return direct()
	}
	k, extra, depth, endMicro := 3, m-3, layers, 2
	q := s
	if m == p+1 {
		q.PP = 3
		k, extra, depth, endMicro = 4, p-3, 3*(layers/p), 3
	}
	sh, err := e.shoot(q, first, depth, k, true)
	if err != nil {
		return 0, nil, err
	}
	peak, ok := inFlight(sh.r, extra, endMicro)
	if !ok {
		sh.release()
		return direct()
	}
	// The step time is the real schedule's: per micro-step from the small
	// program, the bubble from the real stage count.
	sh.accum, sh.pp = s.Accum, p
	return peak, sh, nil
}

// inFlight is the peak of a first pipeline stage's program r with extra
// more micro-batches in flight from the first op of micro-step 2's forward
// up to the first op of micro-step endMicro's backward. What one
// micro-batch keeps in flight is the rise between the first ops of the
// forwards of micro-steps 1 and 2. ok is false when the program does not
// have that shape.
func inFlight(r *engine.Result, extra, endMicro int) (units.Bytes, bool) {
	p, tot := r.Program, r.Sim.Totals
	if len(tot) != len(p.Ops) {
		return 0, false
	}
	first := func(ph ir.Phase, micro int) int {
		for i := range p.Ops {
			if p.Ops[i].Phase == ph && p.Ops[i].Micro == micro {
				return i
			}
		}
		return -1
	}
	f1, f2, end := first(ir.Forward, 1), first(ir.Forward, 2), first(ir.Backward, endMicro)
	if f1 < 0 || f2 <= f1 || end <= f2 || p.Ops[f1].Name != p.Ops[f2].Name {
		return 0, false
	}
	per := tot[f2] - tot[f1]
	if per < 0 {
		return 0, false
	}
	var peak units.Bytes
	for i := range tot {
		v := tot[i]
		if i >= f2 && i < end {
			more, ok := units.MulBytes(per, int64(extra))
			if !ok {
				more = units.MaxBytes // over any budget; v + 2^62 stays inside int64
			}
			v += more
		}
		peak = max(peak, v)
	}
	return peak, true
}

// estimate sets c.EstPeak to a lower bound on the full model's peak and
// c.EstStep to an estimate of its step time (peak, then price).
func (e *estimator) estimate(c *Plan) {
	e.peak(c)
	e.price(c)
}

// shots are the shallow plans a plan's step time is extrapolated from.
type shots []struct{ lo, hi *shot }

// release recycles the shots' programs (each is planned for its shot
// alone); their numbers stay.
func (s shots) release() {
	for _, p := range s {
		p.lo.release()
		p.hi.release()
	}
}

func (sh *shot) release() {
	if sh != nil && sh.r != nil {
		sh.r.Release()
	}
}

// price sets c.EstStep from the shallow plans peak kept (pricing waits
// until a plan is known to be worth it: most that fit are dropped for a
// larger micro-batch that fits too).
func (e *estimator) price(c *Plan) {
	sh := c.unpriced
	c.unpriced = nil
	defer sh.release()
	L := e.model.Layers
	for _, pr := range sh {
		u := pr.hi.layers - pr.lo.layers
		if u == 0 { // planned at full depth (pair)
			t, err := pr.hi.step()
			if err != nil {
				c.Dropped = err.Error()
				return
			}
			c.EstStep = max(c.EstStep, t)
			continue
		}
		t1, err := pr.lo.step()
		if err != nil {
			c.Dropped = err.Error()
			return
		}
		t2, err := pr.hi.step()
		if err != nil {
			c.Dropped = err.Error()
			return
		}
		c.EstStep = max(c.EstStep, saturate(float64(t2)+float64(L-pr.hi.layers)/float64(u)*float64(t2-t1)))
	}
}

// pair plans part pt of sh at depths lo and lo+u and extrapolates their
// peaks to the model's L layers; with u = 0 (lo = L) it plans the one depth
// and both shots are that plan. When the peak at lo is already over limit
// (0: none) it stops there and returns that peak with both shots the one
// plan: a deeper model peaks at least as high (the extrapolation assumes
// it too, keeping the second peak when the line falls), so the full model
// is over the limit as well, and the deeper plan — the larger of the two —
// would only confirm it. A quarter of the estimates over the limit in
// BenchmarkFitMixtralAllow stop there (805 of 3,394; with shallow's
// per-part depths its search took 12-17% less time); TestPropertyDeeperPeaksHigher checks the shallow peaks against
// the deeper and the full model's, TestPropertyEstimateIsLowerBound the
// estimate so stopped.
func pair(pt part, sh engine.Spec, lo, u, L int, limit units.Bytes) (units.Bytes, *shot, *shot, error) {
	p1, s1, err := pt(sh, lo)
	if err != nil {
		return 0, nil, nil, err
	}
	s1.layers = lo
	if u == 0 || limit > 0 && p1 > limit {
		return p1, s1, s1, nil
	}
	p2, s2, err := pt(sh, lo+u)
	if err != nil {
		s1.release()
		return 0, nil, nil, err
	}
	s2.layers = lo + u
	// Integer arithmetic rounds the extrapolation down, keeping it a
	// bound.
	return extrapolate(p1, p2, L-lo-u, u), s1, s2, nil
}

// hostBound is a lower bound on the host memory one GPU of the full model
// pins, from the part's shallow plans s1 and s2 (the same plan when pair
// planned one depth): the host holds offloaded model state, affine in the
// depth, and the activations offloaded so far, so its peak is a maximum of
// functions affine in the depth, as the device's is, and extrapolates the
// same way (TestPropertyEstimateIsLowerBound checks it). k is the layers
// past s2's depth, u the unit between the two. Not under ZeRO-2 (peak
// leaves EstHost 0 there): its shallow plans reduce gradients in
// one-element buckets, which moves what reaches the host too, and the
// property test found the line 0.1 % over the full plan (mixtral-8x7b,
// dp 8, activations and optimizer offloaded).
func hostBound(s1, s2 *shot, k, u int) units.Bytes {
	if s1 == s2 || u == 0 {
		return s1.r.HostPeak
	}
	return extrapolate(s1.r.HostPeak, s2.r.HostPeak, k, u)
}

// extrapolate is p2 + (p2 − p1)·k/u (at least p2), rounded down, and
// saturated at units.MaxBytes rather than wrapped: a model of thousands of
// layers with petabytes per layer is over every budget, not negative.
func extrapolate(p1, p2 units.Bytes, k, u int) units.Bytes {
	if p2 <= p1 || k <= 0 {
		return p2
	}
	v, ok := units.MulBytes(p2-p1, int64(k))
	if !ok || v/units.Bytes(u) > units.MaxBytes-p2 {
		return units.MaxBytes
	}
	return p2 + v/units.Bytes(u)
}

// saturate is d nanoseconds as a Duration, saturated rather than wrapped
// past 292 years (a float's conversion out of int64's range is undefined).
func saturate(d float64) time.Duration {
	if d >= math.MaxInt64 {
		return time.Duration(math.MaxInt64)
	}
	if d <= 0 {
		return 0
	}
	return time.Duration(d)
}

// shallow is the depths part part of a plan (0: the whole program or a
// 1F1B pipeline's first stage, 1: its last stage, parts) is estimated
// from: lo and lo+u layers, u the plan's unit, or (L, 0) when that is not
// shallower than the model's L layers (planned at full depth). One and two
// units; two and three where one unit has no layer like the rest: under
// ZeRO-3, whose prefetch reaches the head from a single unit and breaks
// the affine pattern the extrapolation relies on (TestPropertyEstimateIsLowerBound
// finds it, on a pipeline's first stage too: mixtral-8x7b pp 2, 75.09 GiB
// estimated over a 68.80 GiB peak), and under LoRA, whose frozen
// embeddings make the first layer's backward smaller than the others' (no
// gradient for its input), for the part that holds the first layer: where
// a layer's backward sets the peak (mixtral-8x7b, full checkpointing:
// 10.23 GB at one layer, then 5.98 GB more for the second and 5.93 GB for
// each after) the line through one and two units overshoots. A pipeline's
// last stage holds no first layer: its input comes from the stage before,
// with a gradient, so under LoRA alone it keeps one and two units. Both
// keep the full model's remainder of layers past whole units (an odd
// layer count under every-other-layer checkpointing, pipeline stages of
// unequal sizes), so the full model is the shallow ones plus whole units:
// L = lo + k·u.
func shallow(s *engine.Spec, part, L int) (lo, u int) {
	u = unit(s)
	lo = u + L%u
	if s.ZeRO == 3 || s.LoRA != nil && part == 0 {
		lo += u
	}
	if lo+u >= L {
		return L, 0
	}
	return lo, u
}

// peak sets c.EstPeak to a lower bound on the full model's peak, from
// shallow models of a few units u of layers: the peak is the maximum of
// functions affine in the layer count (convex in it), so the line through
// two shallow points extended to the full depth lies below it. The step
// time is a sum over layers, affine in it: the shallow plans are kept in
// c for price. When e stops it may stop at a bound over c's limit.
func (e *estimator) peak(c *Plan) {
	L := e.model.Layers
	// Models too shallow to shrink are planned in full.
	parts := e.parts(&c.Spec)
	if lo, _ := shallow(&c.Spec, 0, L); lo == L && len(parts) < 2 {
		// Planned in full: its peak is exact, its step priced, and its
		// program and timeline are not kept (verification plans again
		// the few plans it reaches).
		r, t, err := e.runWith(c.Spec, engine.Options{NoTimeline: true}, 0, simAccum(&c.Spec))
		if err != nil {
			c.Dropped = err.Error()
			return
		}
		r.Compact()
		c.Result, c.EstPeak, c.EstStep, c.VerifiedStep, c.EstHost = r, r.PeakBytes(), t, t, r.HostPeak
		return
	}
	// ZeRO-2 reduces gradients in buckets of reduce_bucket_size elements,
	// and where their boundaries fall depends on the depth: the peak is a
	// sawtooth in it, not convex. Reducing each gradient as it is ready
	// never holds more, and is affine in depth, so shallow models with
	// one-element buckets give a lower bound.
	sh := c.Spec
	if sh.ZeRO == 2 {
		sh.ZeROBucketElems = 1
	}
	// Each part is extrapolated on its own (each is a maximum of functions
	// affine in the depth, and so is their maximum); once one part's bound
	// is over the limit the plan is dropped without the rest, and the step
	// is priced only for plans that fit.
	var kept shots
	order := make([]int, len(parts))
	for i := range order {
		order[i] = i
	}
	sk := stateKey(&c.Spec)
	var limit units.Bytes
	if e.stop {
		limit = c.Limit
	}
	if i, ok := e.overPart[sk]; ok && i < len(order) {
		order[0], order[i] = i, 0
	}
	for _, pi := range order {
		lo, u := shallow(&c.Spec, pi, L)
		bound, s1, s2, err := pair(parts[pi], sh, lo, u, L, limit)
		if err != nil {
			kept.release()
			c.Dropped = err.Error()
			return
		}
		c.EstPeak = max(c.EstPeak, bound)
		if c.Spec.ZeRO != 2 {
			c.EstHost = max(c.EstHost, hostBound(s1, s2, L-lo-u, u))
		}
		c.stopped = u > 0 && s1 == s2 // pair stopped at the shallower depth
		kept = append(kept, struct{ lo, hi *shot }{s1, s2})
		if limit > 0 && c.EstPeak > limit {
			kept.release()
			if e.overPart != nil {
				e.overPart[sk] = pi
			}
			return
		}
	}
	if c.EstPeak <= 0 {
		kept.release()
		c.Dropped = "no estimate (the shallow models hold nothing)"
		return
	}
	c.unpriced = kept
}
