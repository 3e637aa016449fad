package engine

import (
	"reflect"
	"slices"
	"testing"

	"pgregory.net/rapid"

	"github.com/memplan/memplan/hw"
	"github.com/memplan/memplan/ir"
	"github.com/memplan/memplan/lower"
	"github.com/memplan/memplan/ops"
	"github.com/memplan/memplan/sim"
	"github.com/memplan/memplan/strategy"
	"github.com/memplan/memplan/units"
)

// leverSpec draws a small training job on a GPU it may not fit: its peak
// falls in forward, backward or the optimizer step by the draw (a foreach
// AdamW step on a short sequence peaks in the step).
func leverSpec(t *testing.T, rt *rapid.T) Spec {
	g, err := hw.Lookup(rapid.SampledFrom([]string{"t4", "h100"}).Draw(rt, "gpu"))
	if err != nil {
		t.Fatal(err)
	}
	a := lookup(t, rapid.SampledFrom([]string{"gpt2", "llama-3.2-1b", "mixtral-8x7b"}).Draw(rt, "model")).Clone()
	a.Layers = rapid.IntRange(2, 4).Draw(rt, "layers")
	s := Spec{Job: Job{Model: a, MicroBatch: 1 << rapid.IntRange(0, 3).Draw(rt, "log2 micro-batch"),
		Seq: 1 << rapid.IntRange(5, 11).Draw(rt, "log2 seq"), Precision: rapid.SampledFrom([]ops.Precision{ops.AMPBF16, ops.BF16, ops.FP32}).Draw(rt, "precision"),
		Optimizer: lower.AdamW, Impl: rapid.SampledFrom([]lower.Impl{lower.Foreach, lower.Fused}).Draw(rt, "impl")}, Target: Target{GPU: g}}
	s.FirstStep = rapid.Bool().Draw(rt, "first step")
	if rapid.Bool().Draw(rt, "dp") {
		s.DP = 4
	}
	return s
}

// leverPipelineSpec is a leverSpec under a pipeline of one to three
// stages, one or two layers each, over 1 to p+3 micro-steps.
func leverPipelineSpec(t *testing.T, rt *rapid.T) Spec {
	s := leverSpec(t, rt)
	if pp := rapid.IntRange(1, 3).Draw(rt, "pp"); pp > 1 {
		s.PP, s.Model.Layers = pp, pp*rapid.IntRange(1, 2).Draw(rt, "layers per stage")
		s.Accum = rapid.IntRange(1, pp+3).Draw(rt, "accum")
	}
	return s
}

// keepsPhases plans base's strategies that marked selects and checks each
// keeps base's peaks of phases (steady and first step) and is never under
// its floor; it returns how many it planned. A strategy that does not plan
// (auto checkpointing that cannot fit) is left out.
func keepsPhases(t *testing.T, base *Result, marked func(Variant) bool, phases ...ir.Phase) int {
	n := 0
	for _, v := range Variants(base.Spec, Allow{}) {
		vs := base.Spec
		if !marked(v) || v.apply(&vs) != nil {
			continue
		}
		r, err := Plan(vs)
		if err != nil {
			continue
		}
		n++
		for _, ph := range phases {
			for st := range base.StagePhasePeaks {
				if got, want := r.StagePhasePeaks[st][ph], base.StagePhasePeaks[st][ph]; got != want {
					t.Fatalf("%s: stage %d's %s peak %d, baseline %d", v.Name, st, ph, got, want)
				}
			}
			if got, want := r.Sim.PhasePeak[ph].Total, base.Sim.PhasePeak[ph].Total; got != want && r.Stage == base.Stage {
				t.Fatalf("%s: %s peak %d, baseline %d", v.Name, ph, got, want)
			}
			if base.First != nil && r.Stage == base.Stage && r.First.PhasePeak[ph].Total != base.First.PhasePeak[ph].Total {
				t.Fatalf("%s: first step's %s peak %d, baseline %d", v.Name, ph, r.First.PhasePeak[ph].Total, base.First.PhasePeak[ph].Total)
			}
		}
		if r.PeakBytes() < v.floor(base) {
			t.Fatalf("%s: peak %d under its floor %d", v.Name, r.PeakBytes(), v.floor(base))
		}
	}
	return n
}

// The lever skips checkpointing and activation offload when the peak is in
// the optimizer step: they change no op of the step, so its peak stays.
// Checked on every variant marked fwdBwd: its optimizer-step peaks (steady
// and first step) equal the baseline's, so its peak is never below a
// baseline peak that lies in the step.
func TestPropertyFwdBwdVariantsKeepOptimizerPeak(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		s := leverPipelineSpec(t, rt)
		base, err := Plan(s)
		if err != nil {
			rt.Skip(err)
		}
		keepsPhases(t, base, func(v Variant) bool { return v.fwdBwd }, ir.Optimizer)
	})
}

// LargestLever picks what Compare's rows pick: the strategy with the
// lowest peak below the baseline's (the first of equal ones), with the
// same peak and verdict, although it plans through a cache, without
// timelines, and skips the strategies that cannot lower a peak in the
// optimizer step.
func TestLargestLeverMatchesCompare(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		// Under a pipeline the lever simulates p+1 micro-steps of each
		// strategy (pipelineShortAccum), Compare all of them.
		s := leverPipelineSpec(t, rt)
		rows, err := Compare(s, Allow{})
		if err != nil {
			rt.Skip(err)
		}
		var want *Row
		for i := 1; i < len(rows); i++ {
			r := &rows[i]
			if r.Err != nil || r.Result.PeakBytes() >= rows[0].Result.PeakBytes() {
				continue
			}
			if want == nil || r.Result.PeakBytes() < want.Result.PeakBytes() {
				want = r
			}
		}
		got := LargestLever(rows[0].Result, nil)
		switch {
		case want == nil && got == nil:
		case want == nil || got == nil:
			t.Fatalf("lever %v, Compare's rows pick %v", got, want)
		case got.Name != want.Name || got.Result.PeakBytes() != want.Result.PeakBytes() || got.Result.Fits != want.Result.Fits ||
			got.Result.Shortfall != want.Result.Shortfall || got.Result.HostShortfall != want.Result.HostShortfall:
			t.Fatalf("lever %s at %d (fits %v, short %d), Compare's rows pick %s at %d (fits %v, short %d)", got.Name, got.Result.PeakBytes(),
				got.Result.Fits, got.Result.Shortfall, want.Name, want.Result.PeakBytes(), want.Result.Fits, want.Result.Shortfall)
		}
	})
}

// A baseline planned through LeverCache leaves in it only the programs the
// lever's strategies plan from, and the lever through it picks what it
// picks through a cache that keeps everything: a priced 1F1B pipeline of
// p+2 to 2p+3 micro-steps (priced in full) leaves nothing (the lever plans
// p+1); one of more, planned with p+1 (planPipelineShortAccum), and a job
// without a pipeline leave the baseline's programs, which the lever plans
// from. The
// filter ends with the lever.
func TestLeverCacheKeepsWhatTheLeverPlansFrom(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		s := leverSpec(t, rt)
		pp := rapid.IntRange(1, 3).Draw(rt, "pp")
		if pp > 1 {
			s.PP, s.Model.Layers = pp, pp*rapid.IntRange(1, 2).Draw(rt, "layers per stage")
		}
		s.Accum = rapid.IntRange(1, 8).Draw(rt, "accum")
		// Sharded and offloaded baselines too: the programs LeverCache
		// refuses are rewritten in place by the transforms after them
		// (Cache.transform), which must make what a copy would.
		if s.DP > 1 {
			s.ZeRO = rapid.IntRange(0, 3).Draw(rt, "zero")
		}
		s.Offload.Activations = rapid.Bool().Draw(rt, "offload activations")
		kept, all := LeverCache(s), &Cache{Limit: 1 << 40}
		base, err := PlanWith(s, Options{Cache: kept})
		if err != nil {
			rt.Skip(err)
		}
		switch {
		case pp > 1 && s.Accum > pp+1 && s.Accum <= 2*pp+3 && len(kept.m) > 0:
			t.Fatalf("a pipeline of %d micro-steps left %d programs the lever (%d micro-steps) never plans from", s.Accum, len(kept.m), pp+1)
		case (pp > 1 && s.Accum > 2*pp+3 || pp == 1 && s.Accum > 1) && len(kept.m) == 0:
			t.Fatalf("the baseline of %d micro-steps (pp %d) left none of its programs for the lever", s.Accum, pp)
		}
		ref, err := PlanWith(s, Options{Cache: all})
		if err != nil {
			t.Fatal(err)
		}
		// LeverCache holds the plan's own program where autocast's cache
		// alone made it, and makes the one it was made from again.
		if !reflect.DeepEqual(base.Program.Ops, ref.Program.Ops) {
			t.Fatal("the plan through LeverCache differs from the plan through a plain cache")
		}
		derived := 0
		for k, e := range kept.m {
			if !e.exits {
				continue
			}
			derived++
			if !kept.holds(base.Program) && !kept.holds(base.FirstProgram) {
				t.Fatal("LeverCache holds a program the plan made, but not the plan's")
			}
			if p, _ := kept.program(e, false); all.m[k] != nil && !reflect.DeepEqual(p.Ops, all.m[k].prog.Ops) {
				t.Fatalf("LeverCache's program (first step %v, lowered %v) made again differs from the one it was made from", k.first, k.lowered)
			}
		}
		if derived == 0 && pp == 1 && s.Accum > 1 && s.Precision == ops.AMPBF16 && !s.Offload.Any() {
			t.Fatal("LeverCache holds the program autocast's cache was applied to beside the plan's")
		}
		got, want := LargestLever(base, kept), LargestLever(ref, all)
		switch {
		case got == nil && want == nil:
		case got == nil || want == nil || got.Name != want.Name || got.Result.PeakBytes() != want.Result.PeakBytes():
			t.Fatalf("lever through LeverCache %v, through a cache that keeps everything %v", got, want)
		}
		if kept.filter {
			t.Fatal("the lever left LeverCache's filter on")
		}
	})
}

// The lever's branch and bound picks what planning every strategy picks —
// the lowest peak under the baseline's, the first in Compare's order of
// equal ones — while it plans them by increasing floor and skips those whose
// floor bounds them out. Floors and peaks are drawn small so that ties are
// common; a strategy that does not plan is never offered.
func TestPropertyLeverBoundPicksTheLowest(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		n := rapid.IntRange(0, 8).Draw(rt, "strategies")
		basePeak := units.Bytes(rapid.IntRange(1, 6).Draw(rt, "baseline peak"))
		floors, peaks := make([]units.Bytes, n), make([]units.Bytes, n)
		plans := make([]bool, n)
		for i := range n {
			floors[i] = units.Bytes(rapid.IntRange(0, 6).Draw(rt, "floor"))
			peaks[i] = floors[i] + units.Bytes(rapid.IntRange(0, 3).Draw(rt, "above floor"))
			plans[i] = rapid.IntRange(0, 4).Draw(rt, "plans") > 0
		}
		want := -1
		for i := range n {
			if plans[i] && peaks[i] < basePeak && (want < 0 || peaks[i] < peaks[want]) {
				want = i
			}
		}
		b, got := newBound(basePeak, floors), -1
		order := bestFirst(floors)
		for k, i := range order {
			if k > 0 && floors[order[k-1]] > floors[i] {
				t.Fatalf("order %v: floors %v not increasing", order, floors)
			}
			if b.skip(i) || !plans[i] {
				continue
			}
			if b.offer(i, peaks[i]) {
				got = i
			}
		}
		if got != want {
			t.Fatalf("floors %v, peaks %v, plans %v under %d: the bound picks %d, planning all picks %d", floors, peaks, plans, basePeak, got, want)
		}
	})
}

// The lever's queue picks what planning every strategy in full picks, the
// lowest peak under the baseline's (the first in Compare's order of equal
// ones), whatever it puts off: strategies of a few pipeline stages each,
// every stage's peak at least its floor, some that do not plan. It puts
// off a strategy at most once, plans no stage of one its bound rules out
// when its turn comes, and plans no more stages than planning them one
// after another in the order of their floors, less one plan's stages per
// strategy it put off (each is planned again from its first stage).
func TestPropertyLeverQueuePicksTheLowest(t *testing.T) {
	putOff := 0
	rapid.Check(t, func(rt *rapid.T) {
		n := rapid.IntRange(0, 6).Draw(rt, "strategies")
		basePeak := units.Bytes(rapid.IntRange(1, 8).Draw(rt, "baseline peak"))
		floors := make([]units.Bytes, n)
		stages := make([][]units.Bytes, n)
		never, fails := make([]bool, n), make([]bool, n)
		peakOf := func(i int) units.Bytes { return slices.Max(stages[i]) }
		for i := range n {
			floors[i] = units.Bytes(rapid.IntRange(0, 6).Draw(rt, "floor"))
			stages[i] = make([]units.Bytes, rapid.IntRange(1, 4).Draw(rt, "stages"))
			for st := range stages[i] {
				stages[i][st] = floors[i] + units.Bytes(rapid.IntRange(0, 4).Draw(rt, "above floor"))
			}
			never[i] = rapid.IntRange(0, 5).Draw(rt, "applies") == 0
			fails[i] = rapid.IntRange(0, 5).Draw(rt, "plans") == 0
		}
		want := -1
		for i := range n {
			if !never[i] && !fails[i] && peakOf(i) < basePeak && (want < 0 || peakOf(i) < peakOf(want)) {
				want = i
			}
		}
		// Planning in full in the order of the floors, with the bound.
		whole := 0
		b := newBound(basePeak, slices.Clone(floors))
		for _, i := range bestFirst(floors) {
			if never[i] || b.skip(i) {
				continue
			}
			var peak units.Bytes
			for _, p := range stages[i] {
				whole++
				if peak = max(peak, p); b.beaten(i, peak) || fails[i] {
					break
				}
			}
			if !fails[i] {
				b.offer(i, peak)
			}
		}
		q := newLeverQueue(basePeak, slices.Clone(floors), slices.Clone(never), nil)
		planned, offs := 0, map[int]int{}
		got, err := q.pick(func(pending []int, skip func(int) bool, stop func(int, units.Bytes, bool) bool, seen func(int, units.Bytes, bool) bool) error {
			for k, i := range pending {
				if skip(k) {
					continue
				}
				if never[i] { // eachVariant's row of a variant that does not apply
					seen(k, 0, false)
					continue
				}
				var peak units.Bytes
				for st, p := range stages[i] {
					planned++
					peak = max(peak, p)
					if fails[i] {
						break
					}
					if stop(k, peak, st+1 < len(stages[i])) {
						break
					}
				}
				if !seen(k, peak, !fails[i]) && q.once[i] && !q.done[i] {
					offs[i]++
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Fatalf("floors %v, stages %v, never %v, fails %v under %d: the queue picks %d, planning all picks %d", floors, stages, never, fails, basePeak, got, want)
		}
		for i, k := range offs {
			if k > 1 {
				t.Fatalf("strategy %d put off %d times", i, k)
			}
		}
		extra := 0
		for i := range offs {
			extra += len(stages[i])
		}
		if planned > whole+extra {
			t.Fatalf("floors %v, stages %v, never %v, fails %v under %d: %d stages planned, %d planned in full in order (put off: %v)", floors, stages, never, fails, basePeak, planned, whole, offs)
		}
		putOff += len(offs)
	})
	if putOff == 0 {
		t.Fatal("no draw put a strategy off")
	}
}

// The lever skips the fused step when its floor, forward's and backward's
// peaks, is not below the best strategy's: the fused step changes no op of
// forward or backward. Checked on every variant marked stepOnly: its
// forward and backward peaks (steady and first step) equal the baseline's.
func TestPropertyStepOnlyVariantsKeepForwardBackward(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		s := leverSpec(t, rt)
		s.Impl = lower.Foreach
		base, err := Plan(s)
		if err != nil {
			rt.Skip(err)
		}
		if keepsPhases(t, base, func(v Variant) bool { return v.stepOnly }, ir.Forward, ir.Backward) == 0 {
			t.Fatal("no step-only strategy for a foreach step")
		}
	})
}

// Options.NoTiming, which the lever plans its strategies with, drops the
// step time and nothing else: the peaks, what fits and the host memory
// equal a priced plan's, under accumulation too (where a priced plan of
// more than three micro-steps builds two more for its step time) and under
// a pipeline (every stage priced; unpriced, p+1 micro-steps simulated,
// TestPropertyPipelineShortAccumShowsPeak).
func TestPropertyNoTimingKeepsPeaks(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		s := leverSpec(t, rt)
		s.Accum = rapid.SampledFrom([]int{1, 3, 6}).Draw(rt, "accum")
		if rapid.Bool().Draw(rt, "pp") {
			s.PP, s.Model.Layers = 2, 4
		}
		priced, err := Plan(s)
		if err != nil {
			rt.Skip(err)
		}
		bare, err := PlanWith(s, Options{NoTiming: true})
		if err != nil {
			t.Fatalf("priced plan planned, unpriced one: %v", err)
		}
		if bare.Timing != nil || bare.StepFLOPs != 0 {
			t.Fatalf("unpriced plan has a step time (%v) or FLOPs (%g)", bare.Timing, bare.StepFLOPs)
		}
		if priced.Timing == nil {
			t.Fatal("priced plan has no step time")
		}
		if bare.PeakBytes() != priced.PeakBytes() || bare.Fits != priced.Fits || bare.Shortfall != priced.Shortfall ||
			bare.HostPeak != priced.HostPeak || bare.Stage != priced.Stage || (s.PP < 2 && bare.SimAccum != priced.SimAccum) ||
			!slices.Equal(bare.StagePeaks, priced.StagePeaks) || !samePoint(bare.Sim.Peak, priced.Sim.Peak, s.PP < 2) {
			t.Fatalf("unpriced plan peaks %d (stages %v, fits %v, host %d, %d simulated), priced %d (stages %v, fits %v, host %d, %d simulated)",
				bare.PeakBytes(), bare.StagePeaks, bare.Fits, bare.HostPeak, bare.SimAccum,
				priced.PeakBytes(), priced.StagePeaks, priced.Fits, priced.HostPeak, priced.SimAccum)
		}
	})
}

// samePoint says a and b are the same moment of a step: the same bytes by
// category, phase and micro-step, and the same op when op (a shorter
// pipeline schedule places the same op elsewhere).
func samePoint(a, b sim.Point, op bool) bool {
	if !op {
		a.Op, b.Op = 0, 0
	}
	return a == b
}

// Compare caches, and keeps between strategies, only the programs the
// strategies still to come plan from (Cache.putOnlyFor, Cache.keepFor), and
// builds nothing more for it: through a cache that keeps every program, the
// same strategies find the same programs in it and miss the same, and plan
// the same peaks; as each strategy's row is handed on the cache holds only
// what those after it plan from, and nothing once the last is planned. A job
// drawn with checkpointing, data parallelism (DDP or ZeRO) and a first
// step, on the baseline's programs of which the strategies build.
func TestPropertyCompareKeepsBaseProgramsOnly(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		s := leverSpec(t, rt)
		if rapid.Bool().Draw(rt, "checkpoint") {
			s.Checkpoint = CheckpointPolicy{Kind: CheckpointEvery, Every: 2}
		}
		if s.DP > 1 {
			s.ZeRO = rapid.IntRange(0, 3).Draw(rt, "zero")
		}
		// Past four micro-steps each strategy is planned with three
		// (plannedAccum): keyed by its own micro-steps, the baseline's
		// programs were dropped after the first strategy and built again
		// for every one after it.
		s.Accum = rapid.SampledFrom([]int{1, 3, 6}).Draw(rt, "accum")
		if err := s.Validate(); err != nil {
			rt.Skip(err)
		}
		vs := Variants(s, Allow{})
		kept := &Cache{}
		var peaks []units.Bytes
		held := map[cacheKey]bool{} // the keys held when the last row was handed on
		err := eachVariant(s, vs, Options{Cache: kept, NoTimeline: true}, nil, func(i int, r Row) error {
			if r.Err == nil {
				peaks = append(peaks, r.Result.PeakBytes())
			}
			// A program held since before this row is one this strategy
			// or one after it plans from; one put during it, one after it.
			this, later := specsOf(s, vs[i:]), specsOf(s, vs[i+1:])
			for k := range kept.m {
				o := Options{NoTimeline: true}
				ok := k.wantedBy(wants(later, o), kept.m) || held[k] && k.wantedBy(wants(this, o), kept.m)
				if !ok {
					t.Fatalf("after %s the cache holds a program no strategy after it plans from: checkpoint %+v, optimizer step %v, lowered %v",
						vs[i].Name, k.spec.Checkpoint, k.spec.Impl, k.lowered)
				}
			}
			held = map[cacheKey]bool{}
			for k := range kept.m {
				held[k] = true
			}
			return nil
		})
		if err != nil {
			rt.Skip(err)
		}
		all := &Cache{Limit: 1 << 40}
		var want []units.Bytes
		for _, v := range vs {
			vs := s
			if v.apply(&vs) != nil {
				continue
			}
			if r, err := PlanWith(vs, Options{Cache: all, NoTimeline: true}); err == nil {
				want = append(want, r.PeakBytes())
			}
		}
		if !slices.Equal(peaks, want) {
			t.Fatalf("peaks %v, through a cache that keeps everything %v", peaks, want)
		}
		h, m := kept.Stats()
		wh, wm := all.Stats()
		if h != wh || m != wm {
			t.Fatalf("%d hits and %d misses, through a cache that keeps everything %d and %d", h, m, wh, wm)
		}
		for k := range kept.m {
			t.Fatalf("a program is still held after the last strategy: checkpoint %+v, optimizer step %v, lowered %v", k.spec.Checkpoint, k.spec.Impl, k.lowered)
		}
	})
}

// --checkpoint auto decides on the first stage (autoCheckpoint), so when
// that stage fits without checkpointing, auto plans the baseline (without
// checkpointing), and when it does not fit with every block checkpointed,
// auto plans "checkpoint every block": the same peaks, stage by stage, in
// the first step, under a pipeline or not. The lever settles auto so
// without planning it (autoSettled).
func TestPropertyAutoSettled(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		s, base, fr := planFreeAndFull(t, rt)
		want, capacity := base, base.StagePeaks[0]
		if rapid.Bool().Draw(rt, "every block over") {
			want, capacity = fr, fr.StagePeaks[0]-units.Bytes(rapid.IntRange(1, 1<<20).Draw(rt, "under"))
		} else {
			capacity += units.Bytes(rapid.IntRange(0, 1<<20).Draw(rt, "over"))
		}
		auto := s
		auto.Checkpoint, auto.Capacity = CheckpointPolicy{Kind: CheckpointAuto}, capacity
		ar, err := Plan(auto)
		if err != nil {
			t.Fatalf("auto at %d: %v", capacity, err)
		}
		if ar.PeakBytes() != want.PeakBytes() || !slices.Equal(ar.StagePeaks, want.StagePeaks) || ar.HostPeak != want.HostPeak {
			t.Fatalf("auto at %d peaks %d %v (host %d), settled as %d %v (host %d)", capacity, ar.PeakBytes(), ar.StagePeaks, ar.HostPeak, want.PeakBytes(), want.StagePeaks, want.HostPeak)
		}
	})
}

// planFreeAndFull draws a leverPipelineSpec and plans it without
// checkpointing and with every block checkpointed (a draw either does not
// plan is skipped).
func planFreeAndFull(t *testing.T, rt *rapid.T) (s Spec, free, full *Result) {
	s = leverPipelineSpec(t, rt)
	free, err := Plan(s)
	if err != nil {
		rt.Skip(err)
	}
	f := s
	f.Checkpoint = CheckpointPolicy{Kind: CheckpointFull}
	if full, err = Plan(f); err != nil {
		rt.Skip(err)
	}
	return s, free, full
}

// The lever takes a cached program on its last use (Cache.take) and
// rewrites it in place, but never one a result still holds: the baseline's
// programs are as they were after a lever planned beside it, and the lever
// of a compacted baseline, which may take them, picks what a lever without
// a cache picks, at the same peak. Some draws must take, or the test
// checks nothing.
func TestPropertyLeverTakesNoLentProgram(t *testing.T) {
	took := 0
	rapid.Check(t, func(rt *rapid.T) {
		s := leverPipelineSpec(t, rt)
		c1 := LeverCache(s)
		b1, err := PlanWith(s, Options{Cache: c1})
		if err != nil {
			rt.Skip(err)
		}
		type copied struct {
			ops     []ir.Op
			tensors []ir.Tensor
		}
		snap := func(p *ir.Program) copied {
			if p == nil {
				return copied{}
			}
			return copied{slices.Clone(p.Ops), slices.Clone(p.Tensors)}
		}
		before := []copied{snap(b1.Program), snap(b1.FirstProgram)}
		r1 := LargestLever(b1, c1)
		if after := []copied{snap(b1.Program), snap(b1.FirstProgram)}; !reflect.DeepEqual(before, after) {
			t.Fatalf("%s: the lever rewrote a program the baseline holds", s.JobName())
		}
		c2 := LeverCache(s)
		b2, err := PlanWith(s, Options{Cache: c2})
		if err != nil {
			t.Fatal(err)
		}
		b2.Compact()
		r2 := LargestLever(b2, c2)
		took += c2.taken
		r0 := LargestLever(b2, nil)
		for _, r := range []*Row{r1, r2} {
			switch {
			case (r == nil) != (r0 == nil):
				t.Fatalf("%s: lever %v, without a cache %v", s.JobName(), r, r0)
			case r != nil && (r.Name != r0.Name || r.Result.PeakBytes() != r0.Result.PeakBytes() || r.Result.HostPeak != r0.Result.HostPeak):
				t.Fatalf("%s: lever %s at %d (host %d), without a cache %s at %d (host %d)", s.JobName(),
					r.Name, r.Result.PeakBytes(), r.Result.HostPeak, r0.Name, r0.Result.PeakBytes(), r0.Result.HostPeak)
			}
		}
	})
	if took == 0 {
		t.Error("no draw took a cached program")
	}
}

// Once the baseline's steady step peaks in its optimizer step over its
// capacity, a LeverCache drops the lowered program only the other
// checkpointings and activation offload plan from (Cache.settle), and does
// not keep the first step's, which the strategies left plan from only
// through the baseline's checkpointed program (Cache.wantsLowering: the
// plan lowers it with room and checkpoints it in place); the lever still
// picks what it picks without a cache.
func TestLeverCacheSettles(t *testing.T) {
	a := lookup(t, "gpt2").Clone()
	a.Layers = 2
	s := Spec{Job: Job{Model: a, MicroBatch: 1, Seq: 32, Precision: ops.AMPBF16, Optimizer: lower.AdamW, Impl: lower.Foreach},
		Target: Target{Capacity: 1 << 20, FirstStep: true}}
	s.Checkpoint = CheckpointPolicy{Kind: CheckpointFull}
	c := LeverCache(s)
	base, err := PlanWith(s, Options{Cache: c})
	if err != nil {
		t.Fatal(err)
	}
	if ph := base.Sim.Peak.Phase; ph != ir.Optimizer || base.Fits {
		t.Fatalf("the baseline peaks in %v (fits: %v): want the optimizer step, over its capacity", ph, base.Fits)
	}
	if c.lever != nil {
		t.Fatal("the cache did not settle")
	}
	for k := range c.m {
		if k.lowered {
			t.Errorf("the cache holds a lowered program (first step: %v) after settling", k.first)
		}
	}
	base.Compact()
	got, want := LargestLever(base, c), LargestLever(base, nil)
	if (got == nil) != (want == nil) || got != nil && (got.Name != want.Name || got.Result.PeakBytes() != want.Result.PeakBytes()) {
		t.Fatalf("lever %v, without a cache %v", got, want)
	}
}

// A plan through no cache lowers a checkpointed job with room for its
// recompute (lower.TrainConfig.RecomputeRoom) and checkpoints it and adds
// autocast's exits in place: no edit moves its op list (strategy.Moves;
// each moved deepseek-v3's 2.1 million ops under --checkpoint full), and
// the plan equals one through a cache.
func TestPlanAloneCheckpointsInPlace(t *testing.T) {
	for _, name := range []string{"gpt2", "llama-3.2-1b", "mixtral-8x7b"} {
		for _, ck := range []string{"none", "full", "every=2", "selective-op"} {
			a := lookup(t, name).Clone()
			a.Layers = 4
			s := Spec{Job: Job{Model: a, MicroBatch: 2, Seq: 128, Accum: 2, Precision: ops.AMPBF16, Optimizer: lower.AdamW},
				Target: Target{FirstStep: true}}
			var err error
			if s.Checkpoint, err = ParseCheckpoint(ck); err != nil {
				t.Fatal(err)
			}
			before := strategy.Moves()
			alone, err := PlanWith(s, Options{NoTimeline: true, NoTiming: true})
			if err != nil {
				t.Fatal(err)
			}
			if n := strategy.Moves() - before; n != 0 {
				t.Errorf("%s --checkpoint %s: %d op lists moved", name, ck, n)
			}
			cached, err := PlanWith(s, Options{NoTimeline: true, NoTiming: true, Cache: &Cache{}})
			if err != nil {
				t.Fatal(err)
			}
			if alone.PeakBytes() != cached.PeakBytes() || alone.First.Peak != cached.First.Peak || len(alone.Program.Ops) != len(cached.Program.Ops) {
				t.Errorf("%s --checkpoint %s: alone %d (%d ops), through a cache %d (%d ops)", name, ck,
					alone.PeakBytes(), len(alone.Program.Ops), cached.PeakBytes(), len(cached.Program.Ops))
			}
		}
	}
}

// Under --checkpoint auto the candidates are built from one lowering, each
// a copy, but the first step is built once, for the blocks chosen: in
// place, as any checkpointed plan alone (deepseek-v3 --accum 4 --checkpoint
// auto copied its 1.4 million ops).
func TestAutoCheckpointsTheFirstStepInPlace(t *testing.T) {
	a := lookup(t, "gpt2").Clone()
	a.Layers = 4
	for _, capacity := range []units.Bytes{1 << 20, 1 << 40} { // every block, then none
		s := Spec{Job: Job{Model: a, MicroBatch: 2, Seq: 128, Accum: 2, Precision: ops.AMPBF16, Optimizer: lower.AdamW},
			Target: Target{Capacity: capacity}}
		s.Checkpoint = CheckpointPolicy{Kind: CheckpointAuto}
		moved := func(first bool) int64 {
			s.FirstStep = first
			before := strategy.Moves()
			if _, err := PlanWith(s, Options{NoTimeline: true, NoTiming: true}); err != nil {
				t.Fatal(err)
			}
			return strategy.Moves() - before
		}
		if steady, both := moved(false), moved(true); both != steady {
			t.Errorf("capacity %d: %d op lists moved with the first step, %d without", capacity, both, steady)
		}
	}
}

// A strategy CannotFit rules out never fits (diagnose's next step skips
// it): planned under the same capacity, its peak is over it. Capacities
// are drawn up to the baseline's peak, so the floors cross them.
func TestPropertyCannotFitNeverFits(t *testing.T) {
	ruled := 0
	rapid.Check(t, func(rt *rapid.T) {
		s := leverPipelineSpec(t, rt)
		free, err := Plan(s)
		if err != nil {
			rt.Skip(err)
		}
		s.Capacity = units.Bytes(rapid.Int64Range(1, int64(free.PeakBytes())).Draw(rt, "capacity"))
		base, err := Plan(s)
		if err != nil {
			rt.Skip(err)
		}
		for _, v := range Variants(base.Spec, Allow{})[1:] {
			vs := base.Spec
			if !v.CannotFit(base) || v.apply(&vs) != nil {
				continue
			}
			r, err := Plan(vs)
			if err != nil {
				continue
			}
			ruled++
			if r.Fits {
				t.Fatalf("%s: ruled out by its floor %d over the capacity %d, but fits (peak %d)", v.Name, v.floor(base), base.Capacity, r.PeakBytes())
			}
		}
	})
	if ruled == 0 {
		t.Fatal("no draw had a strategy CannotFit rules out")
	}
}
