package engine

import (
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/memplan/memplan/cost"
	"github.com/memplan/memplan/hw"
	"github.com/memplan/memplan/ir"
	"github.com/memplan/memplan/strategy"
)

// MaxPipelineAccum bounds the micro-steps of a pipelined plan: a pipeline
// schedule is simulated micro-step by micro-step (GPipe holds every
// micro-batch, interleaving needs all of them), about a megabyte of program
// each, so 1024 of them stay within a few seconds and under 2 GB.
const MaxPipelineAccum = 1024

// shortAccum is the number of micro-steps that show the peak of a plan of
// s.Accum micro-steps without pipelining: three show the peak of any k ≥ 3
// — the first (gradients created), one between (every gradient
// accumulating, nothing reduced yet) and the last (where ZeRO, DDP and
// offload reduce or move gradients); every micro-step between the first and
// the last holds the same memory as the one between. This is the argument
// package search simulates fit's plans with (search.simAccum,
// search.TestPropertySimAccumShowsPeak); TestShortAccumShowsPeak checks it
// for plan. It is 0 when every micro-step is simulated: under pipelining
// (the schedule holds micro-batches in flight) and for k ≤ 3. Four are
// planned with three too: priced from two and three (planShortAccum), they
// build two more micro-steps than four, but hold three at a time, not four
// (deepseek-v3 --accum 4: 2.37 GB of RSS as four).
func shortAccum(s *Spec) int {
	if s.PP > 1 || s.Accum <= 3 || s.Mode != Train {
		return 0
	}
	return 3
}

// pipelineShortAccum is the number of micro-steps that show the peak of a
// 1F1B pipeline of s.Accum micro-steps: p+1 for p stages (a priced plan
// extrapolates its step time from p+1 and p+2, planPipelineShortAccum).
// Stage i holds at most p−i
// micro-batches in flight; it reaches them at its forward of micro-step
// p−i−1 and, from the backward of micro-step 0 on, runs with every
// gradient of the stage existing, so micro-step p−i+1 ≤ p+1 repeats the
// steady state; the last micro-step (reduction, offload) and the drain look
// the same for any k ≥ p+1. 0 when every micro-step is simulated: no
// pipeline, GPipe (which holds every micro-batch), interleaving (whose
// chunks need every micro-step), inference, or k ≤ p+1.
// TestPropertyPipelineShortAccumShowsPeak checks it on every stage and the
// first step; package search estimates the first stage the same way
// (search.simAccum).
func pipelineShortAccum(s *Spec) int {
	if s.PP < 2 || max(s.PPInterleave, 1) > 1 || s.PPSchedule != strategy.OneFOneB || s.Mode != Train || s.Accum <= s.PP+1 {
		return 0
	}
	return s.PP + 1
}

// plannedAccum is the number of micro-steps PlanWith plans s with under
// o: the few that show its peak when fewer do (shortAccum; a 1F1B
// pipeline's pipelineShortAccum, when unpriced or past 2p+3 micro-steps),
// else all of them. The cache keys
// of its programs carry it, so a cache that keeps what later plans look up
// (Cache.putOnlyFor, Cache.keepFor) names their programs by it: named by
// s.Accum, compare and the next step at --accum 8 dropped the baseline's
// programs of three micro-steps after the first strategy, and each
// strategy after it lowered the model again.
func plannedAccum(s *Spec, o Options) int {
	if o.AllAccum || o.shortAccum {
		return s.Accum
	}
	if m := shortAccum(s); m > 0 {
		return m
	}
	if m := pipelineShortAccum(s); m > 0 && (o.NoTiming || s.GPU == nil || s.Accum > 2*m+1) {
		return m
	}
	return s.Accum
}

// SimulatedAccum is the micro-steps PlanWith builds s's programs with under
// o (plannedAccum): two jobs that differ in their accumulation alone and
// simulate the same number build the same programs, so their peaks are one
// (diagnose's "accumulation ×2" past three micro-steps).
func SimulatedAccum(s Spec, o Options) int {
	return plannedAccum(&s, o)
}

// planPipelineShortAccum plans s (validated: a 1F1B pipeline of k =
// s.Accum micro-steps, k > m) with the m = p+1 that show every stage's peak
// (pipelineShortAccum) and, when priced, times each stage's k micro-steps
// from its programs of m and m+1 — priced only past k = 2m+1, where those
// two are fewer micro-steps to build than k (deepseek-v3 --pp 4 --accum 8
// was no faster and held 0.3 GB more for the next step). Past its warm-up
// a rank runs the same forward and backward ops on the same streams for every
// micro-step (1F1B's steady state), and its reduction, offload and
// optimizer step once, so its time before the bubble is affine in the
// micro-steps from m on. The bubble, (p−1)/(v·k) of the forward and
// backward (addBubble), is added to the extrapolated time, and the step
// takes as long as the slowest stage; the per-op times kept are the m
// micro-steps' (as planShortAccum's). The stages' programs of m+1 are built
// and priced first, each garbage before the next (priceStages).
// TestPipelineShortAccumTiming checks every stage against all k micro-steps
// priced. Priced in full, deepseek-v3 --pp 4 --accum 32 built, scheduled
// and simulated 128 stage micro-steps (34-36 s, 5.8-6.1 GB; 12.9 s and
// 2.5 GB with p+1 and p+2).
func planPipelineShortAccum(s Spec, o Options, m int) (*Result, error) {
	if o.NoTiming || s.GPU == nil {
		// Unpriced: no step to extrapolate. A caller of numbers alone
		// (the lever) gets each stage planned with its own few
		// (stageAccum).
		o.stageShort = o.forNumbers() && s.Checkpoint.Kind != CheckpointAuto
		return planFewer(s, o, m)
	}
	next, like, graphs, errNext := priceStages(s, o, func(int) int { return m + 1 })
	o.graphs = graphs
	var now []*cost.Timing
	o.rankTimes = &now
	r, err := planFewer(s, o, m)
	if err != nil {
		return nil, err // the plan's error first, as when it was planned first
	}
	if errNext != nil {
		return nil, errNext
	}
	if len(now) != len(next) {
		return nil, fmt.Errorf("pipeline timing: %d stages priced with %d micro-steps, %d with %d", len(now), m, len(next), m+1)
	}
	return r, stageTimings(r, now, next, like, func(int) int { return m })
}

// stageTimings sets r's step, step FLOPs and utilization from each planned
// stage's timing before the bubble: now[i], of fewer(i) micro-steps, is
// extrapolated to r's from next[i], of one more (none when nil: now[i] is
// of all of them), or by the slope of stage like[i] (≥ 0: now[like[i]] to
// next[like[i]]), the bubble added for r's micro-steps; the step is the
// slowest stage's.
func stageTimings(r *Result, now, next []*cost.Timing, like []int, fewer func(i int) int) error {
	r.Timing, r.StepFLOPs = nil, 0
	var modelFLOPs float64
	for i, t := range now {
		lo, hi := t, next[i]
		if j := like[i]; j >= 0 {
			lo, hi = now[j], next[j] // its slope is stage j's (priceStages)
		}
		if hi != nil {
			var err error
			if t, err = extrapolate(&r.Spec, t, lo, hi, r.Spec.Accum-fewer(i)); err != nil {
				return err
			}
		}
		addBubble(&r.Spec, t)
		r.StepFLOPs += t.FLOPs
		modelFLOPs += t.ModelFLOPs
		if r.Timing == nil || t.Step > r.Timing.Step {
			r.Timing = t
		}
	}
	return pipelineUtilization(r, modelFLOPs)
}

// priceStages times each pipeline stage of s (those o.Stages names, when
// set) with n(stage) micro-steps, before the bubble (priceRank), and
// returns the forward graphs it built; a stage n gives 0 is not priced
// (nil), nor one whose step grows per micro-step as an earlier stage's
// (slopeLike): like[i] is that one's index (−1: none). Totals only: the
// per-op times of programs the plan does not keep would stay live.
func priceStages(s Spec, o Options, n func(stage int) int) ([]*cost.Timing, []int, map[int]*ir.Graph, error) {
	pl := &planner{s: &s, o: Options{Context: o.Context}, graphs: o.graphs}
	var ts []*cost.Timing
	var like []int
	priced := map[int]int{} // middle stage → its timing's index in ts
	for stage := 0; stage < s.PP; stage++ {
		if o.Stages != nil && !slices.Contains(o.Stages, stage) {
			continue
		}
		like = append(like, -1)
		if s.Accum = n(stage); s.Accum == 0 {
			ts = append(ts, nil)
			continue
		}
		if err := s.Validate(); err != nil {
			return nil, nil, pl.graphs, err
		}
		if o.Stages == nil {
			j, err := pl.slopeLike(stage, priced)
			if err != nil {
				return nil, nil, pl.graphs, err
			}
			if j >= 0 {
				ts, like[len(like)-1] = append(ts, nil), j
				continue
			}
			priced[stage] = len(ts)
		}
		p, _, err := pl.stageProgram(false, stage)
		if err != nil {
			return nil, nil, pl.graphs, err
		}
		t, err := priceRank(&s, p, false)
		if err != nil {
			return nil, nil, pl.graphs, err
		}
		ts = append(ts, t)
	}
	return ts, like, pl.graphs, nil
}

// stageAccum is the micro-steps that show the peak of stage stage of a
// 1F1B pipeline planned with m = p+1 (pipelineShortAccum): the stage holds
// p−i micro-batches in flight from the forward of micro-step p−i−1 on, and
// with every gradient of the stage from micro-step p−i on, so p−i+1
// micro-steps show its steady state, and at least three its first, its
// accumulating and its last backward (shortAccum's argument): stage 0's
// p+1, 3 from stage p−2 on. deepseek-v3 --pp 4's lever planned 20 stage
// micro-steps and the first step's 5, where 15 and 4 show every peak.
// A stage whose program of m is cached (a baseline planned through the
// same cache) keeps m: the cached program costs less than a shorter one
// built. TestPropertyStageAccumShowsPeak checks it.
func (pl *planner) stageAccum(m, stage int) int {
	n := min(m, max(3, pl.s.PP-stage+1))
	if n == m || pl.o.Cache == nil {
		return n
	}
	s := *pl.s
	s.Accum = m
	k, ok := (&planner{s: &s, o: pl.o}).cacheKey(false, stage)
	if ok && (pl.o.Cache.has(k) || pl.o.Cache.has(k.lowering())) {
		return m
	}
	return n
}

// planFewer plans s (validated) with m of its micro-steps, which show its
// peak (shortAccum, pipelineShortAccum), and reports it as s.Accum's with
// SimAccum m; the step time, when priced, is the m micro-steps'.
func planFewer(s Spec, o Options, m int) (*Result, error) {
	k := s.Accum
	s.Accum = m
	o.shortAccum = true
	r, err := PlanWith(s, o)
	if err != nil {
		return nil, err
	}
	r.Spec.Accum, r.SimAccum = k, m
	return r, nil
}

// planShortAccum plans s (validated, s.Accum > 3, no pipeline) with three
// micro-steps, which peak as s.Accum do, and prices the step of s.Accum
// micro-steps from the steps of two and three: every micro-step between the
// first and the last is the same ops on the same streams, so each time and
// FLOP total is affine in the micro-steps from the second on (the program
// of two is the first and the last; three add one between, as every
// further one does). TestShortAccumTiming checks the extrapolation against
// a full plan, and TestShortAccumIncrement that two, three and four
// micro-steps step by the same time. The two micro-steps are built and
// priced first, and only their price kept: the plan of three is then
// lowered from the same forward graph (the graph does not depend on the
// micro-steps), and the program of two is garbage before it. Priced from
// three and four, deepseek-v3 --accum 8 built 3.3 million ops to plan
// with 1.4 million; two build 0.9 million where four built 1.9.
func planShortAccum(s Spec, o Options) (*Result, error) {
	// A job whose ops all run on the compute stream (no parallel group,
	// nothing offloaded) is charged each op's own roofline, whatever runs
	// before it: its step is the sum of its ops' times, and what a
	// micro-step between the first and the last adds is what the ops of
	// the three's second take where they run (middleStep), without
	// building and pricing the program of two (deepseek-v3 --accum 4
	// --checkpoint auto: 0.9 million ops, 1.8 s of CPU).
	// TestMiddleStepIsTwoToThree checks it against the two and three
	// priced.
	middle := s.GPU != nil && !o.NoTiming && !o.NumbersOnly && s.computeStreamOnly()
	var t2 *cost.Timing
	var err2 error
	if !middle {
		t2, o.graphs, err2 = priceTwo(s, o)
	}
	r, err := planFewer(s, o, 3)
	if err != nil {
		return nil, err // the plan's error first, as when it was planned first
	}
	if err2 != nil {
		return nil, err2
	}
	if r.Timing == nil {
		return r, nil
	}
	lo, hi := t2, r.Timing // two and three micro-steps
	if middle {
		if hi, err = middleStep(&s, r.Program); err != nil {
			return nil, err
		}
		lo = &cost.Timing{}
		if hi == nil {
			// It communicates or copies after all: priced with two,
			// after the plan.
			if lo, _, err = priceTwo(s, o); err != nil {
				return nil, err
			}
			hi = r.Timing
		}
	}
	if lo == nil {
		return r, nil
	}
	if r.Timing, err = extrapolate(&r.Spec, r.Timing, lo, hi, s.Accum-3); err != nil {
		return nil, err
	}
	r.StepFLOPs = r.Timing.FLOPs // one stage
	return r, nil
}

// computeStreamOnly says whether every op of s's program runs on the
// compute stream: no tensor, expert, pipeline or data parallel group to
// communicate over, nothing offloaded to copy, and a model's program (a
// trace replays what it recorded).
func (s *Spec) computeStreamOnly() bool {
	return s.Model != nil && s.Trace == nil && max(s.TP, 1) == 1 && max(s.EP, 1) == 1 && max(s.PP, 1) == 1 && max(s.DP, 1) == 1 &&
		s.Offload == (Offload{})
}

// middleStep is the timing of micro-step 1 of p, a program of three or more
// micro-steps of s, priced as it runs in p (cost.PriceOptions.Micro): what a
// micro-step between the first and the last adds to a step whose ops all
// run on the compute stream. nil when an op of p communicates or copies, or
// the result keeps no program to price.
func middleStep(s *Spec, p *ir.Program) (*cost.Timing, error) {
	if p == nil {
		return nil, nil
	}
	for i := range p.Ops {
		if p.Ops[i].Comm != nil || p.Ops[i].Transfer != nil {
			return nil, nil
		}
	}
	return cost.Price(p, s.GPU, cost.PriceOptions{DType: s.priceDType(), Topology: s.Topology(), NoOps: true, Micro: 1})
}

// priceTwo prices s with two micro-steps (nil when the plan is not
// priced) and returns the forward graphs it built.
func priceTwo(s Spec, o Options) (*cost.Timing, map[int]*ir.Graph, error) {
	if s.GPU == nil || o.NoTiming {
		return nil, nil, nil
	}
	s.Accum = 2
	if err := s.Validate(); err != nil {
		return nil, nil, err
	}
	pl := &planner{s: &s, o: Options{Context: o.Context}}
	p2, _, err := pl.stageProgram(false, 0)
	if err == nil {
		err = o.stopped()
	}
	if err != nil {
		return nil, pl.graphs, err
	}
	t2, err := Price(&s, p2) // totals alone: only they are extrapolated
	return t2, pl.graphs, err
}

// extrapolate is the timing of n micro-steps more than t's: t plus n times
// hi − lo, the timings of one micro-step apart (t's per-op times stay:
// they are aligned with the program the result keeps). The step of s's
// micro-steps is what its throughput and utilization are of.
func extrapolate(s *Spec, t0, lo, hi *cost.Timing, n int) (*cost.Timing, error) {
	var overflow bool
	dur := func(a, l, h time.Duration) time.Duration {
		v := float64(a) + float64(n)*float64(h-l)
		if v >= math.MaxInt64 || v < 0 {
			overflow = true
			return 0
		}
		return time.Duration(math.Round(v))
	}
	fl := func(a, l, h float64) float64 { return a + float64(n)*(h-l) }
	t := *t0
	for i := range t.Phases {
		p, l, h := &t.Phases[i], &lo.Phases[i], &hi.Phases[i]
		p.Compute, p.Comm, p.Transfer, p.Wall = dur(p.Compute, l.Compute, h.Compute), dur(p.Comm, l.Comm, h.Comm), dur(p.Transfer, l.Transfer, h.Transfer), dur(p.Wall, l.Wall, h.Wall)
		p.FLOPs = fl(p.FLOPs, l.FLOPs, h.FLOPs)
	}
	t.Idle = dur(t0.Idle, lo.Idle, hi.Idle)
	t.Step = dur(t0.Step, lo.Step, hi.Step)
	t.Compute = dur(t0.Compute, lo.Compute, hi.Compute)
	t.Comm, t.Transfer = dur(t0.Comm, lo.Comm, hi.Comm), dur(t0.Transfer, lo.Transfer, hi.Transfer)
	t.ExposedComm, t.ExposedTransfer = dur(t0.ExposedComm, lo.ExposedComm, hi.ExposedComm), dur(t0.ExposedTransfer, lo.ExposedTransfer, hi.ExposedTransfer)
	t.Recompute = dur(t0.Recompute, lo.Recompute, hi.Recompute)
	t.RecomputeFLOPs = fl(t0.RecomputeFLOPs, lo.RecomputeFLOPs, hi.RecomputeFLOPs)
	t.FLOPs, t.ModelFLOPs = fl(t0.FLOPs, lo.FLOPs, hi.FLOPs), fl(t0.ModelFLOPs, lo.ModelFLOPs, hi.ModelFLOPs)
	k := s.Accum
	if overflow {
		return nil, invalid(FieldAccum, "a step of {accum} %d micro-steps would take more than %s", k, time.Duration(math.MaxInt64).Round(time.Hour))
	}
	t.TokensPerSec, t.SamplesPerSec, t.MFU, t.HFU = 0, 0, 0, 0
	if t.Step <= 0 {
		return &t, nil
	}
	dp := float64(max(s.DP, 1))
	var err error
	if t.TokensPerSec, err = cost.TokensPerSecond(s.TokensPerStep()*dp, t.Step); err != nil {
		return nil, err
	}
	if t.SamplesPerSec, err = cost.SamplesPerSecond(float64(s.MicroBatch)*float64(s.Accum)*dp, t.Step); err != nil {
		return nil, err
	}
	if t.PeakFLOPs > 0 {
		if t.MFU, err = cost.MFU(t.ModelFLOPs, t.Step, t.PeakFLOPs); err != nil {
			return nil, err
		}
		if t.HFU, err = cost.MFU(t.FLOPs, t.Step, t.PeakFLOPs); err != nil {
			return nil, err
		}
	}
	return &t, nil
}

// stagewise says whether PlanWith plans s (validated) a stage at a time
// with the micro-steps that show each stage's own peak (stagewiseSteps,
// planStagewise): a priced 1F1B pipeline of k > p+1 micro-steps whose
// stages, all planned with k, would build more than MaxSimBlocks
// block-steps in all (layers × (1 + experts) × k; a trace's events × k
// over MaxTraceEventSteps). pipelineShortAccum's p+1 on every stage is a
// bound per stage: deepseek-v3 --pp 8 --accum 16 (under 2p+3, so every
// micro-step) built and priced 128 stage micro-steps of about 65,000 ops
// each, --pp 16 --accum 32 512 of 32,000. Smaller plans keep their
// programs of p+1 or k on every stage (their reports, reserved
// predictions and goldens unchanged).
func stagewise(s *Spec, o Options) bool {
	if o.AllAccum || o.shortAccum || o.NoTiming || s.GPU == nil || pipelineShortAccum(s) == 0 || s.Checkpoint.Kind == CheckpointAuto {
		return false
	}
	k := int64(s.Accum)
	if o.stagewise {
		return true
	}
	if s.Trace != nil {
		return int64(len(s.Trace.Events))*k > MaxTraceEventSteps
	}
	blocks := int64(s.Model.Layers) * int64(1+s.Model.NumExperts) // ≤ MaxBlocks
	return blocks*k > MaxSimBlocks
}

// stagewiseSteps is the micro-steps each stage of s is planned with under
// stagewise: stage i's few, n = p−i+1, at least three (the steady state of
// its p−i micro-batches in flight with every gradient existing, and its
// first, accumulating and last backward: stageAccum's argument), priced
// with n+1 too to extrapolate its step; or all k where n and n+1 are no
// fewer to build (2n+1 ≥ k: the first stages of a plan under 2p+3) and
// the stage's k hold no more than maxStageBlocks.
func stagewiseSteps(s *Spec) []int {
	steps := make([]int, s.PP)
	for i := range steps {
		steps[i] = stagewiseStep(s, i)
	}
	return steps
}

// stagewiseStep is stagewiseSteps' of stage i.
func stagewiseStep(s *Spec, i int) int {
	k := s.Accum
	if n := min(k, max(3, s.PP-i+1)); n < k && (2*n+1 < k || stageBlocks(s, i)*int64(k) > maxStageBlocks) {
		return n
	}
	return k
}

// maxStageBlocks bounds the block-steps (stageBlocks × micro-steps) of a
// stage stagewise plans with all its micro-steps where its few and one
// more are more to build: half of MaxSimBlocks, about 1 GB at 34-41 KB a
// block-step (validateSimulatedBlocks). Each transform copies the stage's
// program, so a larger one is live twice, over the 1.5 GiB heap the CLI
// holds, and the collector runs back to back: deepseek-v3 --pp 8
// --accum 16's stage 1, 8 layers of 257 blocks over 16 micro-steps
// (32,896), was planned in 3.1-3.7 s, and its 8 planned and 9 priced in
// 1.8 s; stage 0, three dense layers and four of experts (16,496), in
// 0.6 s against 1.0-1.2 s. A variable: TestPropertyStagewiseMatchesFull
// sets it to 0 to plan every stage with its few.
var maxStageBlocks int64 = MaxSimBlocks / 2

// stageBlocks is the blocks of stage i of s's pipeline: each layer with
// experts one per expert and one more, each other layer one
// (validateSimulatedBlocks counts every layer with experts, a bound); 0
// for a trace, bounded by its events (stagewise).
func stageBlocks(s *Spec, i int) int64 {
	if s.Model == nil {
		return 0
	}
	lo, hi := stageLayers(s, i)
	var n int64
	for l := lo; l < hi; l++ {
		n++
		if s.Model.MoELayer(l) {
			n += int64(s.Model.NumExperts)
		}
	}
	return n
}

// planStagewise plans s (validated, stagewise) a stage at a time, stage i
// with stagewiseSteps' n_i micro-steps, each stage's programs garbage
// before the next: a stage planned with fewer than k is priced with
// n_i+1 first, and its step before the bubble extrapolated from n_i and
// n_i+1 (past its warm-up a rank runs the same forward and backward ops on
// the same streams for every micro-step: planPipelineShortAccum's
// argument, from the stage's own steady state on), the bubble added for
// k. The peaks are each stage's own few's (stageAccum's argument, which
// TestPropertyStageAccumShowsPeak checks); SimAccum is the peak stage's
// micro-steps when fewer than k. TestPropertyStagewiseMatchesFull checks
// peaks and step against all k planned and priced.
func planStagewise(s Spec, o Options) (*Result, error) {
	k := s.Accum
	steps := stagewiseSteps(&s)
	next, like, graphs, errNext := priceStages(s, o, func(stage int) int {
		if steps[stage] < k {
			return steps[stage] + 1
		}
		return 0
	})
	o.graphs = graphs
	var now []*cost.Timing
	o.rankTimes, o.stageSteps, o.shortAccum = &now, steps, true
	r, err := PlanWith(s, o)
	if err != nil {
		return nil, err // the plan's error first, as when it was planned first
	}
	if errNext != nil {
		return nil, errNext
	}
	if len(now) != len(next) {
		return nil, fmt.Errorf("pipeline timing: %d stages planned, %d priced", len(now), len(next))
	}
	if n := steps[r.Stage]; n < k {
		r.SimAccum = n
	}
	return r, stageTimings(r, now, next, like, func(i int) int {
		if o.Stages != nil {
			return steps[o.Stages[i]]
		}
		return steps[i]
	})
}

// StageWork is what PlanWith builds to plan stage stage of s (validated)
// on its own (Options.Stages), priced or not as priced says (whatever
// s.GPU): the micro-steps of
// the programs it builds for it, summed (one planned with m and priced
// with m+1 is 2m+1), and the layers each holds while built (a stage of an
// interleaved pipeline, or under auto checkpointing, is built from the
// whole model and cut: stageSlice). Without a pipeline, stage 0 is the
// plan. Package pack bounds a job file's work with it.
func StageWork(s *Spec, stage int, priced bool) (microSteps, layers int) {
	q := *s
	if q.GPU = nil; priced {
		q.GPU = &hw.GPU{} // only whether there is one is read below
	}
	s = &q
	if s.Model != nil {
		layers = s.Model.Layers
	}
	if s.Mode != Train {
		return 1, layers
	}
	if s.PP > 1 && (&planner{s: s}).sliced() {
		lo, hi := stageLayers(s, stage)
		layers = hi - lo
	}
	k, o := s.Accum, Options{Stages: []int{stage}}
	if stagewise(s, o) {
		if n := stagewiseStep(s, stage); n < k {
			return 2*n + 1, layers
		}
		return k, layers
	}
	m := plannedAccum(s, o)
	switch {
	case m == k:
		return k, layers
	case s.GPU == nil:
		return m, layers
	case s.PP > 1:
		return 2*m + 1, layers // m and m+1 (planPipelineShortAccum)
	}
	return m + 2, layers // three and two (planShortAccum)
}
