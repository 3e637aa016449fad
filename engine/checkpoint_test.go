package engine

import (
	"slices"
	"testing"

	"github.com/memplan/memplan/ir"
	"github.com/memplan/memplan/lower"
	"github.com/memplan/memplan/ops"
	"github.com/memplan/memplan/search/ckpt"
	"github.com/memplan/memplan/units"
	"pgregory.net/rapid"
)

func recompute(p *ir.Program) float64 {
	var f float64
	for _, op := range p.Ops {
		if op.Recompute {
			f += op.FLOPs
		}
	}
	return f
}

// --checkpoint auto fits the budget with no more recompute than checkpointing
// every block, and with less than Chen's √n placement at Chen's own peak.
func TestAutoCheckpoint(t *testing.T) {
	// Also under transformers' eager RMSNorm and repeat_kv (the hf
	// recipe), whose costs the chain DP counted short of the simulator by
	// less than a slot: tightening by the excess alone left the DP's choice
	// unchanged ten times over, and auto fell back to every block.
	for _, sem := range []Semantics{{}, {EagerRMSNorm: true, RepeatKV: true}} {
		autoCheckpointCase(t, sem)
	}
}

// autoThroughCache plans auto (auto checkpointing on a budget) through a
// cache that holds base's programs (compare's order: the baseline first), as
// the steady step and with the first step, and checks it chooses and peaks
// as without a cache: it chooses on base's cached lowering
// (autoLoweringKey).
func autoThroughCache(t *testing.T, base, auto Spec) {
	t.Helper()
	for _, first := range []bool{false, true} {
		base.FirstStep, auto.FirstStep = first, first
		want := mustPlan(t, auto)
		c := &Cache{}
		if _, err := PlanWith(base, Options{Cache: c}); err != nil {
			t.Fatal(err)
		}
		hits, _ := c.Stats()
		got, err := PlanWith(auto, Options{Cache: c})
		if err != nil {
			t.Fatal(err)
		}
		if h, _ := c.Stats(); h == hits {
			t.Errorf("first step %v: auto checkpointing did not use the cached lowering", first)
		}
		if !slices.Equal(got.AutoCheckpointed, want.AutoCheckpointed) || got.Sim.PhasePeak != want.Sim.PhasePeak ||
			len(got.Program.Ops) != len(want.Program.Ops) || (want.First != nil && got.First.PhasePeak != want.First.PhasePeak) {
			t.Errorf("first step %v: through the cache auto checkpoints %v at %s, without it %v at %s", first,
				got.AutoCheckpointed, got.PeakBytes(), want.AutoCheckpointed, want.PeakBytes())
		}
	}
}

func autoCheckpointCase(t *testing.T, sem Semantics) {
	a := lookup(t, "llama-3.2-1b")
	base := Spec{Job: Job{Model: a, MicroBatch: 2, Seq: 2048, Precision: ops.AMPBF16, Optimizer: lower.AdamW}, Sem: sem}
	full := base
	full.Checkpoint = CheckpointPolicy{Kind: CheckpointFull}
	rf := mustPlan(t, full)
	rb := mustPlan(t, base)
	for _, frac := range []float64{0.25, 0.5, 0.75} {
		budget := rf.Sim.Peak.Total + units.Bytes(frac*float64(rb.Sim.Peak.Total-rf.Sim.Peak.Total))
		s := base
		s.Checkpoint = CheckpointPolicy{Kind: CheckpointAuto}
		s.Capacity = budget
		r := mustPlan(t, s)
		if r.Sim.Peak.Total > budget {
			t.Errorf("budget %s: auto peaks at %s", budget, r.Sim.Peak.Total)
		}
		if got, all := recompute(r.Program), recompute(rf.Program); got > all {
			t.Errorf("budget %s: auto recomputes %.3g FLOPs, full %.3g", budget, got, all)
		}
		if n := len(r.AutoCheckpointed); n == 0 || n >= len(Blocks(rb.Program)) {
			t.Errorf("budget %s: auto checkpointed %d of %d blocks", budget, n, len(Blocks(rb.Program)))
		}
		autoThroughCache(t, base, s)
	}
	// Against Chen et al. 2016's √n placement, at the peak Chen reaches.
	blocks := Blocks(rb.Program)
	chen := ckpt.Chen(blockCosts(rb.Program, blocks))
	var pats []string
	for i, c := range chen {
		if c {
			pats = append(pats, blocks[i])
		}
	}
	cs := base
	cs.Checkpoint = CheckpointModulesOf(pats...)
	rc := mustPlan(t, cs)
	s := base
	s.Checkpoint = CheckpointPolicy{Kind: CheckpointAuto}
	s.Capacity = rc.Sim.Peak.Total
	ra := mustPlan(t, s)
	if recompute(ra.Program) > recompute(rc.Program) {
		t.Errorf("auto recomputes %.3g FLOPs at Chen's peak %s; Chen %.3g", recompute(ra.Program), rc.Sim.Peak.Total, recompute(rc.Program))
	}
	t.Logf("Chen √n: %d blocks, peak %s, recompute %.3g; auto: %d blocks, peak %s, recompute %.3g",
		len(pats), rc.Sim.Peak.Total, recompute(rc.Program), len(ra.AutoCheckpointed), ra.Sim.Peak.Total, recompute(ra.Program))
}

func TestAutoCheckpointErrors(t *testing.T) {
	a := lookup(t, "llama-3.2-1b")
	if _, err := Plan(Spec{Job: Job{Model: a, Seq: 256}, Savings: Savings{Checkpoint: CheckpointPolicy{Kind: CheckpointAuto}}}); err != ErrNoCapacity {
		t.Errorf("auto without capacity: %v", err)
	}
	// A GPU too small for the model states is no error: TestAutoCheckpointNoneFits.
}

// When no choice of blocks fits, auto checkpointing plans every block
// checkpointed, the lowest peak it can reach, as an ordinary plan that does
// not fit and says so (Result.AutoNoneFits), whether the optimizer step
// alone is over the capacity (checkpointing changes no op of the step, so
// auto knows without planning every block first), the step fits but every
// block does not, or every block is just over; at every block's peak it fits.
// A job too big for the GPU is an answer (plan exits 3, max bisects over it),
// not bad input.
func TestAutoCheckpointNoneFits(t *testing.T) {
	a := lookup(t, "llama-3.2-1b").Clone()
	a.Layers = 4
	base := Spec{Job: Job{Model: a, MicroBatch: 8, Seq: 2048, Precision: ops.AMPBF16, Optimizer: lower.AdamW, Impl: lower.Foreach}}
	full := base
	full.Checkpoint = CheckpointPolicy{Kind: CheckpointFull}
	step := mustPlan(t, base).Sim.PhasePeak[ir.Optimizer].Total
	rf := mustPlan(t, full)
	all, blocks := rf.Sim.Peak.Total, Blocks(mustPlan(t, base).Program)
	if all <= step {
		t.Fatalf("every block checkpointed peaks at %s, not above the step's %s: no room to tell the cases apart", all, step)
	}
	for _, tc := range []struct {
		name     string
		capacity units.Bytes
		noneFits bool
	}{
		{"the optimizer step alone over", step - 1, true},
		{"at the step's peak, every block over", step, true},
		{"every block just over", all - 1, true},
		{"at every block's peak", all, false},
	} {
		s := base
		s.Checkpoint = CheckpointPolicy{Kind: CheckpointAuto}
		s.Capacity = tc.capacity
		r, err := Plan(s)
		if err != nil {
			t.Errorf("%s (capacity %s): %v", tc.name, tc.capacity, err)
			continue
		}
		if r.AutoNoneFits != tc.noneFits || r.Fits == tc.noneFits {
			t.Errorf("%s (capacity %s): none fits %v, fits %v; want none fits %v", tc.name, tc.capacity, r.AutoNoneFits, r.Fits, tc.noneFits)
		}
		if !tc.noneFits {
			continue
		}
		if r.Sim.Peak.Total != all || r.Shortfall != all-tc.capacity {
			t.Errorf("%s (capacity %s): peak %s, %s short; every block peaks at %s", tc.name, tc.capacity, r.Sim.Peak.Total, r.Shortfall, all)
		}
		if got := slices.Sorted(slices.Values(r.AutoCheckpointed)); !slices.Equal(got, slices.Sorted(slices.Values(blocks))) {
			t.Errorf("%s (capacity %s): checkpointed %v, want every block %v", tc.name, tc.capacity, r.AutoCheckpointed, blocks)
		}
	}
}

// --checkpoint auto chooses the same blocks whichever program it looks at
// first (autoOrder), and a plan of the program it built for its choice is
// the plan of that program built again (autoReuse). Capacities are drawn
// from under every block checkpointed to over no checkpointing, so the
// choices cover none fitting and none needed; llama-3.2-1b's budgets
// between the two (autoCheckpointCase) checkpoint some blocks.
func TestPropertyAutoCheckpointOrderAndReuse(t *testing.T) {
	kinds := map[string]int{}
	kind := func(r *Result) {
		switch {
		case r.AutoNoneFits:
			kinds["none fits"]++
		case len(r.AutoCheckpointed) == 0:
			kinds["none needed"]++
		default:
			kinds["some blocks"]++
		}
	}
	a := lookup(t, "llama-3.2-1b")
	base := Spec{Job: Job{Model: a, MicroBatch: 2, Seq: 2048, Precision: ops.AMPBF16, Optimizer: lower.AdamW}}
	full := base
	full.Checkpoint = CheckpointPolicy{Kind: CheckpointFull}
	rf, rb := mustPlan(t, full), mustPlan(t, base)
	for _, frac := range []float64{0.25, 0.75} {
		s := base
		s.Checkpoint = CheckpointPolicy{Kind: CheckpointAuto}
		s.Capacity = rf.Sim.Peak.Total + units.Bytes(frac*float64(rb.Sim.Peak.Total-rf.Sim.Peak.Total))
		kind(autoModesAgree(t, s))
	}
	rapid.Check(t, func(rt *rapid.T) {
		s, free, rf := planFreeAndFull(t, rt)
		lo, hi := int64(rf.PeakBytes())*3/4, int64(free.PeakBytes())*11/10
		s.Checkpoint = CheckpointPolicy{Kind: CheckpointAuto}
		s.Capacity = units.Bytes(rapid.Int64Range(min(lo, hi), hi).Draw(rt, "capacity"))
		kind(autoModesAgree(t, s))
	})
	for _, k := range []string{"none fits", "none needed", "some blocks"} {
		if kinds[k] == 0 {
			t.Errorf("no plan where %s (%v)", k, kinds)
		}
	}
}

// autoModesAgree plans s (--checkpoint auto) in autoCheckpoint's two
// orders, with the program it built reused and built again, checks the
// four plans agree and returns one.
func autoModesAgree(t *testing.T, s Spec) *Result {
	t.Helper()
	defer func(o func(*Spec, *ir.Program) bool, r bool) { autoOrder, autoReuse = o, r }(autoOrder, autoReuse)
	var want *Result
	for _, c := range []struct{ step, reuse bool }{{false, false}, {true, false}, {false, true}, {true, true}} {
		autoOrder = func(*Spec, *ir.Program) bool { return c.step }
		autoReuse = c.reuse
		r, err := Plan(s)
		if err != nil {
			t.Fatalf("step first %v, reuse %v: %v", c.step, c.reuse, err)
		}
		if want == nil {
			want = r
			continue
		}
		if !slices.Equal(r.AutoCheckpointed, want.AutoCheckpointed) || r.AutoNoneFits != want.AutoNoneFits ||
			r.PeakBytes() != want.PeakBytes() || r.Sim.Peak != want.Sim.Peak || len(r.Program.Ops) != len(want.Program.Ops) ||
			len(r.Program.Tensors) != len(want.Program.Tensors) || r.Sim.Params != want.Sim.Params || !sameStep(r, want) {
			t.Fatalf("step first %v, reuse %v: %d blocks (none fits %v), peak %d, %d ops; step last, built again: %d blocks (none fits %v), peak %d, %d ops",
				c.step, c.reuse, len(r.AutoCheckpointed), r.AutoNoneFits, r.PeakBytes(), len(r.Program.Ops),
				len(want.AutoCheckpointed), want.AutoNoneFits, want.PeakBytes(), len(want.Program.Ops))
		}
	}
	return want
}

// sameStep says whether a and b are priced alike (both unpriced, or the
// same step time).
func sameStep(a, b *Result) bool {
	if a.Timing == nil || b.Timing == nil {
		return a.Timing == b.Timing
	}
	return a.Timing.Step == b.Timing.Step
}
