package torchtrace

import (
	"strings"
	"testing"

	"github.com/memplan/memplan/cost"
	"github.com/memplan/memplan/hw"
	"github.com/memplan/memplan/ir"
)

// withFLOPs is the tiny fixture with PyTorch's count on its two mm events:
// x[b,4] @ W[4,4] forward and xᵀ @ dy backward, 2·b·4·4 FLOPs each.
func withFLOPs(t *testing.T) string {
	t.Helper()
	s := flopsFixture()
	if strings.Count(s, `"flops": 64`) != 2 {
		t.Fatal("the tiny fixture's mm events moved")
	}
	return s
}

func flopsFixture() string {
	s := tiny
	for _, ph := range []string{"forward", "backward"} {
		old := `"op": "aten.mm.default", "phase": "` + ph + `", "module": "fc",`
		s = strings.Replace(s, old, old+` "flops": 64, "flops_const": 0, "flops_per_batch": 32,`, 1)
	}
	return strings.Replace(s, `"optimizer": "sgd",`, `"optimizer": "sgd", "flops": "torch.utils.flop_counter",`, 1)
}

// A trace's FLOPs are read with their model, scaled to the batch planned,
// and priced: the step is no faster than its FLOPs at the GPU's peak
// (sweep C, round 24: a trace without FLOPs priced a step faster than that).
func TestTraceFLOPsScaleAndPrice(t *testing.T) {
	tr, err := Parse([]byte(withFLOPs(t)))
	if err != nil {
		t.Fatal(err)
	}
	if tr.FLOPsSource != "torch.utils.flop_counter" || tr.Events[0].FLOPsAt != 64 || tr.Events[2].FLOPs != nil {
		t.Fatalf("source %q, event 0 %d FLOPs, event 2 %+v", tr.FLOPsSource, tr.Events[0].FLOPsAt, tr.Events[2].FLOPs)
	}
	p, err := tr.Program(Options{Batch: 1 << 20, Accum: 2})
	if err != nil {
		t.Fatal(err)
	}
	var total float64
	for _, op := range p.Ops {
		if op.Name == "aten.mm.default" && op.FLOPs != 32<<20 {
			t.Errorf("op %s (%v, micro %d): %v FLOPs, want %d", op.Name, op.Phase, op.Micro, op.FLOPs, 32<<20)
		}
		total += op.FLOPs
	}
	if total != 4*(32<<20) { // two mm a micro-step, two micro-steps
		t.Errorf("total %v FLOPs, want %d", total, 4*(32<<20))
	}
	g, _ := hw.Lookup("h100")
	tm, err := cost.Price(p, g, cost.PriceOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if tm.FLOPs != total || tm.HFU <= 0 || tm.HFU > 1 {
		t.Errorf("priced %v FLOPs, HFU %v", tm.FLOPs, tm.HFU)
	}
}

// gpt2_tiny_flops.trace.json is memplan_torch.models:gpt2_tiny exported on
// PyTorch 2.14.1 (CPU, float32, batch 2, sequence 64 fitted over 48/32):
// its matrix products are the linear layers' 2·N·T and eager attention's
// 2 × 2·b·s²·d per layer in forward, twice that in backward (every input
// needs its gradient: the first layer's feeds the embeddings).
func TestGPT2TinyTraceFLOPs(t *testing.T) {
	tr, err := Load("../../testdata/torch/gpt2_tiny_flops.trace.json")
	if err != nil {
		t.Fatal(err)
	}
	const b, s, d, layers, vocab = 64, 128, 64, 2, 1000
	linear := int64(layers*(d*3*d+d*d+d*4*d+4*d*d) + d*vocab) // c_attn, attn c_proj, c_fc, mlp c_proj; tied lm_head
	forward := 2*linear*b*s + layers*2*2*b*s*s*d
	p, err := tr.Program(Options{Batch: b, Seq: s})
	if err != nil {
		t.Fatal(err)
	}
	by := map[ir.Phase]float64{}
	for _, op := range p.Ops {
		by[op.Phase] += op.FLOPs
	}
	if by[ir.Forward] != float64(forward) || by[ir.Backward] != float64(2*forward) || by[ir.Optimizer] != 0 {
		t.Errorf("FLOPs by phase %v, want forward %d, backward %d", by, forward, 2*forward)
	}
}

func TestTraceFLOPsErrors(t *testing.T) {
	good := withFLOPs(t)
	for _, c := range []struct{ old, new, want string }{
		{`"flops": 64, "flops_const": 0, "flops_per_batch": 32,`, `"flops": -64, "flops_const": 0, "flops_per_batch": -32,`, "events[0].flops: negative FLOPs -64"},
		{`"flops": 64, "flops_const": 0, "flops_per_batch": 32,`, `"flops": 64, "flops_const": 0, "flops_per_batch": 16,`, `events[0]: the FLOPs model gives 32 at the trace batch, but "flops" is 64`},
		{`"flops": 64, "flops_const": 0, "flops_per_batch": 32,`, `"flops": 64, "flops_const": 64,`, `events[0]: missing "flops_per_batch"`},
		{`"flops": 64, "flops_const": 0, "flops_per_batch": 32,`, `"flops": "64", "flops_const": 0, "flops_per_batch": 32,`, "events[0].flops: must be an integer, got a string"},
		{`"flops": 64, "flops_const": 0, "flops_per_batch": 32,`, `"flops": 64, "flops_const": 0, "flops_per_batch": 1e300,`, "events[0].flops_per_batch: must be an integer"},
	} {
		if !strings.Contains(good, c.old) {
			t.Fatalf("fixture lacks %q", c.old)
		}
		_, err := Parse([]byte(strings.Replace(good, c.old, c.new, 1)))
		if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("got %v, want %q", err, c.want)
		}
	}
	// A model that is right at the trace batch but negative below it is
	// refused where the plan asks for that batch, naming the event.
	tr, err := Parse([]byte(strings.Replace(good, `"flops": 64, "flops_const": 0, "flops_per_batch": 32,`, `"flops": 64, "flops_const": 128, "flops_per_batch": -32,`, 1)))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tr.Program(Options{Batch: 8}); err == nil || !strings.Contains(err.Error(), "events[0] (aten.mm.default) has -128 FLOPs at batch 8") {
		t.Errorf("got %v", err)
	}
}
