package strategy

import (
	"testing"

	"github.com/memplan/memplan/importer/torchtrace"
	"github.com/memplan/memplan/ir"
)

func traceProgram(t *testing.T, name string, accum int) *ir.Program {
	t.Helper()
	tr, err := torchtrace.Load("../testdata/torch/" + name + ".trace.json")
	if err != nil {
		t.Fatal(err)
	}
	p, err := tr.Program(torchtrace.Options{Accum: accum})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// UntieTraceGrads gives a tied embedding's head a gradient of its own: the
// embedding's sum no longer reads the head's contribution, which becomes a
// gradient of the same parameter (GradOf), accumulated in place from the
// second micro-step on by an accumulate_grad of the head's module; the
// embedding's own contribution is its gradient (no out-of-place sum), and
// the optimizer step reads both. An untied trace is returned as it was.
func TestUntieTraceGrads(t *testing.T) {
	p := traceProgram(t, "gpt2_2l_tied", 3)
	q, err := UntieTraceGrads(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := q.Verify(); err != nil {
		t.Fatal(err)
	}
	var grads []ir.TensorID
	for g, par := range q.GradOf {
		if par == 0 {
			grads = append(grads, g)
		}
	}
	if len(grads) != 2 {
		t.Fatalf("parameter 0 has %d gradients, want 2 (one per part)", len(grads))
	}
	acc := 0
	for i := range q.Ops {
		op := &q.Ops[i]
		if op.Name == "accumulate_grad" {
			acc++
			if op.Module != "lm_head" || op.Micro == 0 {
				t.Errorf("op %d: accumulate_grad of %q in micro-step %d, want lm_head's from micro-step 1", i, op.Module, op.Micro)
			}
		}
		if op.Module == "transformer.wte" && op.Phase == ir.Backward {
			for _, in := range op.In {
				if q.Tensors[in].Name == "mm#222" || len(q.Tensors[in].Name) > 6 && q.Tensors[in].Name[:7] == "mm#222@" {
					t.Errorf("op %d (%s) of the embedding still reads the head's contribution %s", i, op.Name, q.Tensors[in].Name)
				}
			}
		}
		if op.Phase == ir.Optimizer && len(op.In) > 28 {
			n := 0
			for _, in := range op.In {
				if q.GradOf[in] == 0 && q.Tensors[in].Cat == ir.Gradient {
					n++
				}
			}
			if n == 1 {
				t.Errorf("op %d (%s) reads one of parameter 0's two gradients", i, op.Name)
			}
		}
	}
	if acc != 2 {
		t.Errorf("%d accumulate_grad ops over three micro-steps, want 2", acc)
	}
	for _, name := range []string{"lm", "resnet18", "replace_state"} {
		p := traceProgram(t, name, 2)
		if q, err := UntieTraceGrads(p); err != nil || q != p {
			t.Errorf("%s: untied an untied trace (%v)", name, err)
		}
	}
}
