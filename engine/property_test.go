package engine

import (
	"testing"

	"pgregory.net/rapid"

	"github.com/memplan/memplan/ir"
	"github.com/memplan/memplan/models"
	"github.com/memplan/memplan/models/build"
	"github.com/memplan/memplan/ops"
	"github.com/memplan/memplan/plan"
	"github.com/memplan/memplan/units"
)

// genArch shrinks a random catalog family to a size that simulates fast.
func genArch(t *rapid.T) *models.Arch {
	names := []string{"gpt2", "llama-3.2-1b", "mistral-7b", "qwen3-8b", "gemma-2-9b", "phi-3-mini", "pythia-160m", "mixtral-8x7b", "bert-base", "vit-base"}
	a, err := models.Lookup(rapid.SampledFrom(names).Draw(t, "family"))
	if err != nil {
		t.Fatal(err)
	}
	a = a.Clone()
	hd := rapid.IntRange(1, 4).Draw(t, "headdim") * 8
	a.KVHeads = rapid.IntRange(1, 2).Draw(t, "kvheads")
	a.Heads = a.KVHeads * rapid.IntRange(1, 3).Draw(t, "groups")
	a.HeadDim = hd
	a.Hidden = a.Heads * hd
	if a.Family == models.FamilyGPT2 || a.Family == models.FamilyBERT || a.Family == models.FamilyViT || a.Family == models.FamilyGPTNeoX {
		a.KVHeads = a.Heads
	}
	a.Intermediate = rapid.IntRange(1, 4).Draw(t, "ffn") * 16
	a.Layers = rapid.IntRange(1, 3).Draw(t, "layers")
	if a.Vocab > 0 {
		a.Vocab = rapid.IntRange(8, 300).Draw(t, "vocab")
	}
	if a.MaxPositions > 0 && a.PosEmbedding == "learned" && a.Family != models.FamilyViT {
		a.MaxPositions = 64
	}
	if a.Family == models.FamilyViT {
		a.ImageSize, a.PatchSize = 32, 8
		a.MaxPositions = a.NumPatches() + 1
	}
	if a.NumExperts > 0 {
		a.NumExperts = 4
		a.ExpertsPerToken = 2
	}
	if err := a.Validate(); err != nil {
		t.Fatalf("generated arch invalid: %v", err)
	}
	return a
}

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
		a := genArch(t)
		k := rapid.IntRange(2, 4).Draw(t, "k")
		b := rapid.IntRange(1, 3).Draw(t, "b")
		base := Spec{Model: a, Seq: rapid.IntRange(1, 4).Draw(t, "seq8") * 8,
			Precision: ops.Precision(rapid.IntRange(0, 4).Draw(t, "precision")),
			Optimizer: plan.Optimizer(rapid.IntRange(0, 5).Draw(t, "optimizer")),
			Impl:      plan.Impl(rapid.IntRange(0, 2).Draw(t, "impl")),
			Attention: build.Attention(rapid.IntRange(0, 1).Draw(t, "attention"))}
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
