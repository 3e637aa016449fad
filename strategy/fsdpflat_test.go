package strategy_test

import (
	"strings"
	"testing"

	"github.com/memplan/memplan/models/modeltest"

	"github.com/memplan/memplan/ir"
	"github.com/memplan/memplan/lower"
	"github.com/memplan/memplan/models"
	"github.com/memplan/memplan/models/build"
	"github.com/memplan/memplan/ops"
	"github.com/memplan/memplan/strategy"
	"github.com/memplan/memplan/units"
)

// fTrain lowers a LoRA job on a (q_proj and v_proj adapted in every layer,
// bf16 adapters as litgpt keeps them) with AdamW over accum micro-steps;
// flat builds the graph FSDP1 runs with FlatParameters.
func fTrain(t testing.TB, a *models.Arch, accum int, flat bool) *ir.Program {
	t.Helper()
	g, err := build.Graph(a, build.Options{MicroBatch: 2, Seq: 64, Precision: ops.PureBF16, Training: true, FSDPFlat: flat,
		LoRA: &build.LoRA{Rank: 8, Alpha: 16, Targets: []string{"q_proj", "v_proj"}, ModelDType: true}})
	if err != nil {
		t.Fatal(err)
	}
	p, err := lower.Train(g, lower.TrainConfig{Optimizer: lower.AdamW, Impl: lower.Foreach, Precision: ops.PureBF16, Accum: accum, WeightDecay: -1})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func fTensor(p *ir.Program, name string) (ir.TensorID, bool) {
	for i := range p.Tensors {
		if p.Tensors[i].Name == name {
			return ir.TensorID(i), true
		}
	}
	return ir.NoTensor, false
}

// readers lists the ops that read or write t (or a view of it).
func fUses(p *ir.Program, t ir.TensorID) []int {
	var uses []int
	for oi := range p.Ops {
		for _, ts := range [2][]ir.TensorID{p.Ops[oi].In, p.Ops[oi].Out} {
			for _, x := range ts {
				if ir.Storage(p.Tensors, x) == t {
					uses = append(uses, oi)
				}
			}
		}
	}
	return uses
}

func fStates(p *ir.Program) units.Bytes {
	var b units.Bytes
	for _, t := range p.Tensors {
		if t.Cat == ir.OptimizerState && t.Base == ir.NoTensor {
			b += t.Bytes
		}
	}
	return b
}

// FSDP1 with use_orig_params=True puts a layer's frozen base weights and its
// LoRA adapters in one FlatParameter, which requires grad because one of
// them does (torch 2.1 distributed/fsdp/flat_param.py L740-741); the
// original parameters are views of it (L1729-1835), so backward computes a
// gradient for every weight of the layer, and the views' gradients make one
// unsharded flat gradient of the unit's full size. Under no_sync it is kept
// across micro-steps (_runtime_utils.py L721-790: _post_backward_hook
// returns before reducing when not state._sync_gradients) and reduced on the
// last one; the root unit (embedding, final norm, head: all frozen) has none
// and is gathered once per micro-step, its forward gather serving its
// backward (L522-536: the root is not resharded after forward).
func TestFSDPFlatUnitHoldsFlatGradient(t *testing.T) {
	a := modeltest.SmallLlama(t)
	const accum, dp = 3, 2
	p := fTrain(t, a, accum, true)
	q := zApply(t, p, &strategy.ZeRO{Stage: 3, DP: dp, Flat: true})

	var allUnits units.Bytes
	for i := 0; i < a.Layers; i++ {
		layer := "model.layers." + string(rune('0'+i))
		var full, lora units.Bytes
		for _, id := range p.Params {
			pt := &p.Tensors[id]
			if strings.HasPrefix(pt.Name, layer+".") {
				full += pt.Bytes
				if pt.RequiresGrad {
					lora += pt.Bytes
				}
			}
		}
		allUnits += full
		g, ok := fTensor(q, layer+".flat_param.grad")
		if !ok {
			t.Fatalf("%s: no unsharded flat gradient", layer)
		}
		if gt := q.Tensors[g]; gt.Bytes != full || gt.Cat != ir.Gradient {
			t.Errorf("%s: flat gradient of %d bytes (%v), want the unit's %d parameter bytes (frozen ones included; the adapters are %d)", layer, gt.Bytes, gt.Cat, full, lora)
		}
		uses := fUses(q, g)
		first, last := &q.Ops[uses[0]], &q.Ops[uses[len(uses)-1]]
		if first.Name != "fsdp.flat_grad("+layer+")" || first.Micro != 0 {
			t.Errorf("%s: flat gradient first written by %s in micro-step %d", layer, first.Name, first.Micro)
		}
		if last.Name != "fsdp.reduce_scatter("+layer+")" || last.Micro != accum-1 {
			t.Errorf("%s: flat gradient last used by %s in micro-step %d, want the last micro-step's reduce-scatter", layer, last.Name, last.Micro)
		}
		if s, ok := fTensor(q, layer+".flat_param.grad.shard"); !ok || q.Tensors[s].Bytes != (full+dp-1)/dp {
			t.Errorf("%s: sharded flat gradient missing or not 1/%d of the unit", layer, dp)
		}
	}
	// A frozen weight's gradient exists only under Flat.
	w := "model.layers.0.mlp.down_proj.weight"
	wid, _ := fTensor(p, w)
	if g, ok := fTensor(q, w+".grad@1"); !ok || q.Tensors[g].Bytes != p.Tensors[wid].Bytes {
		t.Errorf("frozen %s has no full-size gradient in micro-step 1", w)
	}
	if _, ok := fTensor(q, "root.flat_param.grad"); ok {
		t.Error("the frozen root unit has a flat gradient")
	}
	gathers := 0
	for _, op := range q.Ops {
		if op.Name == "zero3.all_gather(root)" {
			gathers++
			if op.Phase != ir.Forward {
				t.Errorf("root gathered again in %v", op.Phase)
			}
		}
	}
	if gathers != accum {
		t.Errorf("root gathered %d times in %d micro-steps", gathers, accum)
	}
	// The optimizer sees the adapters only: the frozen weights' gradients
	// get no state.
	q0 := zApply(t, fTrain(t, a, accum, false), &strategy.ZeRO{Stage: 3, DP: dp})
	if fStates(q) != fStates(q0) {
		t.Errorf("optimizer state %d bytes under Flat, %d without", fStates(q), fStates(q0))
	}
	// In the middle micro-step every unit's unsharded gradient is alive at
	// once, on top of the parameter shards.
	r, r0 := zSim(t, q), zSim(t, q0)
	if r.Peak.Micro != 1 || r.Peak.Cat[ir.Gradient] < allUnits {
		t.Errorf("peak in micro-step %d with %d gradient bytes, want micro-step 1 and at least the layers' %d", r.Peak.Micro, r.Peak.Cat[ir.Gradient], allUnits)
	}
	if r.Peak.Total <= r0.Peak.Total {
		t.Errorf("FlatParameters peak at %d, per-parameter ZeRO-3 at %d", r.Peak.Total, r0.Peak.Total)
	}
}
