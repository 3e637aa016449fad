package engine

import (
	"testing"

	"pgregory.net/rapid"

	"github.com/memplan/memplan/ir"
	"github.com/memplan/memplan/lower"
	"github.com/memplan/memplan/models/build"
	"github.com/memplan/memplan/models/modeltest"
	"github.com/memplan/memplan/ops"
	"github.com/memplan/memplan/units"
)

// nonBatchSaved is the saved-for-backward bytes of micro-step 0 that do not
// scale with the batch (autocast's weight casts).
func nonBatchSaved(p *ir.Program) units.Bytes {
	var w units.Bytes
	for _, t := range p.Tensors {
		if t.Cat == ir.Activation && t.Base == ir.NoTensor && !t.Batch && !t.Resident {
			w += t.Bytes
		}
	}
	return w / units.Bytes(p.MicroBatches)
}

// Splitting a batch into k accumulated micro-batches keeps the model states
// and the effective batch, and divides the activations saved at the
// forward/backward boundary by k, up to the terms that do not scale with
// the batch (../shared/seeds/000: accumulation changes the per-micro-step
// activation peak, not parameters, gradients or optimizer state).
func TestPropertyAccumulation(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		a := modeltest.Arch(t)
		k := rapid.IntRange(2, 4).Draw(t, "k")
		b := rapid.IntRange(1, 3).Draw(t, "b")
		base := Spec{Job: Job{Model: a, Seq: rapid.IntRange(1, 4).Draw(t, "seq8") * 8, Precision: ops.Precision(rapid.IntRange(0, 4).Draw(t, "precision")), Optimizer: lower.Optimizer(rapid.IntRange(0, 5).Draw(t, "optimizer")), Impl: lower.Impl(rapid.IntRange(0, 2).Draw(t, "impl")), Attention: build.Attention(rapid.IntRange(0, 1).Draw(t, "attention"))}}
		full, split := base, base
		full.MicroBatch, full.Accum = k*b, 1
		split.MicroBatch, split.Accum = b, k
		rf, err := Plan(full)
		if err != nil {
			t.Fatal(err)
		}
		rs, err := Plan(split)
		if err != nil {
			t.Fatal(err)
		}
		if rf.Sim.ModelStates != rs.Sim.ModelStates {
			t.Fatalf("model states changed: %+v vs %+v", rf.Sim.ModelStates, rs.Sim.ModelStates)
		}
		if rf.Spec.MicroBatch*rf.Spec.Accum != rs.Spec.MicroBatch*rs.Spec.Accum {
			t.Fatal("effective batch changed")
		}
		wf, ws := nonBatchSaved(rf.Program), nonBatchSaved(rs.Program)
		if wf != ws {
			t.Fatalf("non-batch saved bytes differ: %d vs %d", wf, ws)
		}
		if got, want := rf.Sim.SavedTotal-wf, units.Bytes(k)*(rs.Sim.SavedTotal-ws); got != want {
			t.Fatalf("batch %d saves %d batch-scaled bytes; %d × micro-batch %d saves %d", k*b, got, k, b, want)
		}
	})
}
