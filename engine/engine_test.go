package engine

import (
	"errors"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/memplan/memplan/ir"
	"github.com/memplan/memplan/lower"
	"github.com/memplan/memplan/models"
	"github.com/memplan/memplan/models/build"
	"github.com/memplan/memplan/ops"
	"github.com/memplan/memplan/sim"
	"github.com/memplan/memplan/units"
)

func lookup(t testing.TB, name string) *models.Arch {
	t.Helper()
	a, err := models.Lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func mustPlan(t testing.TB, s Spec) *Result {
	t.Helper()
	r, err := Plan(s)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Program.Verify(); err != nil {
		t.Fatal(err)
	}
	return r
}

// Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion
// Parameter Models", SC'20, §3.1: mixed-precision Adam keeps 2 + 2 + 12 = 16
// bytes per parameter (fp16 parameters and gradients, fp32 master weights,
// momentum and variance). fp32 Adam is 4 + 4 + 8 = 16; fp32 SGD is 4 + 4.
func TestModelStatesBytesPerParam(t *testing.T) {
	a := lookup(t, "gpt2")
	for _, tc := range []struct {
		prec ops.Precision
		opt  lower.Optimizer
		want float64
	}{
		{ops.BF16, lower.AdamW, 16},
		{ops.FP16, lower.Adam, 16},
		{ops.FP32, lower.AdamW, 16},
		{ops.AMPBF16, lower.AdamW, 16},
		{ops.FP32, lower.SGD, 8},
		{ops.FP32, lower.SGDMomentum, 12},
		{ops.BF16, lower.SGD, 8}, // 2 + 2 + 4 (master)
	} {
		for _, impl := range []lower.Impl{lower.Foreach, lower.Single, lower.Fused} {
			r := mustPlan(t, Spec{Job: Job{Model: a, MicroBatch: 1, Seq: 64, Precision: tc.prec, Optimizer: tc.opt, Impl: impl}})
			ms := r.Sim.ModelStates
			got := float64(ms.Parameters+ms.Gradients+ms.OptimizerState) / float64(r.Sim.Params)
			if got != tc.want {
				t.Errorf("%s %s %s: %.4f bytes/param, want %v", tc.prec, tc.opt, impl, got, tc.want)
			}
		}
	}
}

// 8-bit Adam keeps two uint8 states plus one float32 absmax per 2048-value
// block (Dettmers et al., ICLR 2022); small tensors keep 32-bit state.
func TestAdam8bitState(t *testing.T) {
	a := lookup(t, "llama-3.2-1b")
	r := mustPlan(t, Spec{Job: Job{Model: a, MicroBatch: 1, Seq: 64, Precision: ops.BF16, Optimizer: lower.Adam8bit}})
	perParam := float64(r.Sim.ModelStates.OptimizerState) / float64(r.Sim.Params)
	// master weights 4 + states 2 + absmax 8/2048, plus fp32 state for the
	// small norm weights.
	if perParam < 6 || perParam > 6.01 {
		t.Errorf("8-bit AdamW with master weights: %.5f optimizer bytes/param, want about 6.004", perParam)
	}
}

// gpt2Style is a GPT-2 configuration with the given size and dropout on,
// as Korthikanti et al. assume.
func gpt2Style(t testing.TB, s, h, a int) *models.Arch {
	arch := lookup(t, "gpt2").Clone()
	arch.Hidden, arch.Heads, arch.KVHeads, arch.HeadDim, arch.Intermediate = h, a, a, h/a, 4*h
	arch.MaxPositions = s
	arch.Layers = 3
	arch.AttnDropout, arch.HiddenDropout, arch.EmbdDropout = 0.1, 0.1, 0.1
	return arch
}

// Korthikanti et al., "Reducing Activation Recomputation in Large Transformer
// Models", MLSys 2023, Table 2 (no parallelism): a transformer layer with
// 16-bit activations and 1-byte dropout masks saves sbh(34 + 5as/h) bytes.
func TestKorthikantiTable2PerLayer(t *testing.T) {
	for _, tc := range []struct{ s, h, a, b int }{
		{512, 768, 12, 2},
		{1024, 1024, 16, 1},
		{2048, 1600, 25, 1},
		{4096, 2048, 16, 1},
	} {
		arch := gpt2Style(t, tc.s, tc.h, tc.a)
		r := mustPlan(t, Spec{Job: Job{Model: arch, MicroBatch: tc.b, Seq: tc.s, Precision: ops.FP16, Attention: build.Eager, Optimizer: lower.AdamW}})
		s, b, h, a := float64(tc.s), float64(tc.b), float64(tc.h), float64(tc.a)
		want := s * b * h * (34 + 5*a*s/h)
		// A middle block: each block's saved input is produced by the block
		// before it, so the middle one holds exactly one layer's worth.
		got := float64(r.Sim.SavedByModule["transformer.h.1"])
		if rel := math.Abs(got-want) / want; rel > 0.02 {
			t.Errorf("s=%d h=%d a=%d: saved %.0f bytes per layer, Table 2 gives %.0f (%.2f%% off)", tc.s, tc.h, tc.a, got, want, 100*rel)
		}
	}
}

// The seeds' timeline (../shared/seeds/001): with large activations the peak
// sits in backward near the forward/backward boundary; with small activations
// a foreach AdamW step, whose _foreach_sqrt list is as large as the second
// moment, moves the peak into the optimizer step.
func TestPeakPhaseMoves(t *testing.T) {
	big := mustPlan(t, Spec{Job: Job{Model: lookup(t, "gpt2"), MicroBatch: 8, Seq: 1024, Precision: ops.AMPBF16, Optimizer: lower.AdamW}})
	if big.Sim.Peak.Phase != ir.Backward {
		t.Fatalf("large activations: peak in %s, want backward", big.Sim.Peak.Phase)
	}
	// Near the boundary: within the first tenth of the backward ops.
	firstBwd, nBwd := -1, 0
	for i, op := range big.Program.Ops {
		if op.Phase == ir.Backward {
			if firstBwd < 0 {
				firstBwd = i
			}
			nBwd++
		}
	}
	if pos := big.Sim.Peak.Op - firstBwd; pos > nBwd/10 {
		t.Errorf("peak is %d ops into a backward of %d; want it near the boundary", pos, nBwd)
	}
	small := mustPlan(t, Spec{Job: Job{Model: lookup(t, "llama-3.2-1b"), MicroBatch: 1, Seq: 128, Precision: ops.AMPBF16, Optimizer: lower.AdamW, Impl: lower.Foreach}})
	if small.Sim.Peak.Phase != ir.Optimizer {
		t.Fatalf("small activations, foreach AdamW: peak in %s, want optimizer", small.Sim.Peak.Phase)
	}
	fused := mustPlan(t, Spec{Job: Job{Model: lookup(t, "llama-3.2-1b"), MicroBatch: 1, Seq: 128, Precision: ops.AMPBF16, Optimizer: lower.AdamW, Impl: lower.Fused}})
	if fused.Sim.Peak.Total >= small.Sim.Peak.Total {
		t.Errorf("fused AdamW peak %s is not below foreach %s", fused.Sim.Peak.Total, small.Sim.Peak.Total)
	}
}

// The first step creates Adam's state lazily inside the step; in steady state
// it is resident before the forward starts.
func TestFirstStepCreatesState(t *testing.T) {
	r := mustPlan(t, Spec{Job: Job{Model: lookup(t, "gpt2"), MicroBatch: 1, Seq: 128, Optimizer: lower.AdamW}, Target: Target{FirstStep: true}})
	if r.First == nil {
		t.Fatal("no first-step result")
	}
	if len(r.First.Timeline) != 0 {
		t.Errorf("the first step kept a timeline of %d points; nothing reads it", len(r.First.Timeline))
	}
	first, err := sim.RunWith(r.FirstProgram, sim.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if got := first.Timeline[0].Cat[ir.OptimizerState]; got != 0 {
		t.Errorf("first step starts with %s of optimizer state, want 0", got)
	}
	if got := r.Sim.Timeline[0].Cat[ir.OptimizerState]; got != r.Sim.ModelStates.OptimizerState {
		t.Errorf("steady state starts with %s of optimizer state, want %s", got, r.Sim.ModelStates.OptimizerState)
	}
	if r.First.ModelStates.OptimizerState != r.Sim.ModelStates.OptimizerState {
		t.Errorf("first step ends with %s of state, steady %s", r.First.ModelStates.OptimizerState, r.Sim.ModelStates.OptimizerState)
	}
}

// Inference: weights + KV cache of 2·L·KV·D·ctx·B elements + working set.
func TestInferenceKVCache(t *testing.T) {
	a := lookup(t, "llama-2-7b")
	r := mustPlan(t, Spec{Job: Job{Model: a, Mode: Infer, MicroBatch: 4, Seq: 1024, GenTokens: 1024, Precision: ops.BF16}})
	wantKV := units.BF16.Size(int64(2 * a.Layers * a.KVHeads * a.HeadDim * 2048 * 4))
	if got := r.Sim.Peak.Cat[ir.KVCache]; got != wantKV {
		t.Errorf("KV cache %d bytes, want %d", got, wantKV)
	}
	if got, want := r.Sim.ModelStates.Parameters, units.BF16.Size(a.ParamCount()); got != want {
		t.Errorf("weights %d, want %d", got, want)
	}
	if r.Sim.ModelStates.Gradients != 0 || r.Sim.ModelStates.OptimizerState != 0 || r.Sim.SavedTotal != 0 {
		t.Errorf("inference has gradients, optimizer state or saved activations: %+v", r.Sim.ModelStates)
	}
}

func TestSpecErrors(t *testing.T) {
	a := lookup(t, "gpt2")
	for _, tc := range []struct {
		name string
		s    Spec
	}{
		{"negative batch", Spec{Job: Job{Model: a, MicroBatch: -1}}},
		{"negative seq", Spec{Job: Job{Model: a, Seq: -5}}},
		{"seq beyond learned positions", Spec{Job: Job{Model: a, Seq: 4096}}},
		{"negative accum", Spec{Job: Job{Model: a, Accum: -2}}},
		{"infer with accum", Spec{Job: Job{Model: a, Mode: Infer, Accum: 2}}},
		{"no model", Spec{}},
	} {
		if _, err := Plan(tc.s); err == nil {
			t.Errorf("%s: no error", tc.name)
		}
	}
}

// TestPreQuantizedConfigRefused: a config.json with a quantization_config
// is refused for training, naming the method, never planned as if its
// weights were in the training dtype.
func TestPreQuantizedConfigRefused(t *testing.T) {
	m, err := models.Lookup("llama-3-8b")
	if err != nil {
		t.Fatal(err)
	}
	q := *m
	q.Quant = &models.Quantization{Method: "awq", Bits: 4, GroupSize: 128}
	_, err = Plan(Spec{Job: Job{Model: &q}})
	var fe *FieldError
	if !errors.As(err, &fe) || fe.Field != FieldModel || !strings.Contains(err.Error(), "quantization_config (awq 4-bit, group 128)") {
		t.Errorf("got %v", err)
	}
}

// A plan reports the optimizer step it planned, not the one asked for: an
// optimizer with one step runs it whatever was asked (lion and Adafactor
// loop over parameters, bitsandbytes runs its kernel), and one without a
// fused step (torch.optim.RMSprop takes no fused=True) runs PyTorch's
// default, foreach. compare offers a fused step only to an optimizer that
// has one.
func TestSpecReportsPlannedImpl(t *testing.T) {
	a := lookup(t, "gpt2")
	for _, tc := range []struct {
		opt        lower.Optimizer
		asked, got lower.Impl
	}{
		{lower.Lion, lower.Foreach, lower.Single},
		{lower.Adafactor, lower.Fused, lower.Single},
		{lower.Adam8bit, lower.Single, lower.Fused},
		{lower.AdamW4bitAO, lower.Foreach, lower.Fused},
		{lower.RMSprop, lower.Fused, lower.Foreach},
		{lower.AdamW, lower.Single, lower.Single},
	} {
		s := Spec{Job: Job{Model: a, MicroBatch: 1, Seq: 64, Optimizer: tc.opt, Impl: tc.asked}}
		r := mustPlan(t, s)
		if r.Spec.Impl != tc.got {
			t.Errorf("%s asked %s: the plan reports %s, want %s", tc.opt, tc.asked, r.Spec.Impl, tc.got)
		}
		s.Impl = tc.got
		if want := mustPlan(t, s); r.Sim.Peak.Total != want.Sim.Peak.Total {
			t.Errorf("%s asked %s: peak %s, the %s step's is %s", tc.opt, tc.asked, r.Sim.Peak.Total, tc.got, want.Sim.Peak.Total)
		}
		if err := s.Validate(); err != nil {
			t.Fatal(err)
		}
		fusedRow := slices.ContainsFunc(Variants(s, Allow{}), func(v Variant) bool { return v.Name == "fused optimizer step" })
		if want := tc.got != lower.Fused && tc.opt.Has(lower.Fused); fusedRow != want {
			t.Errorf("%s %s: compare's fused optimizer step offered %v, want %v", tc.opt, tc.got, fusedRow, want)
		}
	}
}
