package emit

import (
	"errors"
	"testing"

	"github.com/memplan/memplan/engine"
	"github.com/memplan/memplan/hw"
	"github.com/memplan/memplan/lower"
	"github.com/memplan/memplan/models"
	"github.com/memplan/memplan/ops"
	"github.com/memplan/memplan/recipe"
	"github.com/memplan/memplan/search"
)

// job is gpt2 at micro-batch mb × seq 256 on A100s, as recipe rec runs it,
// with set choosing the plan's dimensions.
func job(t *testing.T, rec string, set func(*engine.Spec)) engine.Spec {
	t.Helper()
	a, err := models.Lookup("gpt2")
	if err != nil {
		t.Fatal(err)
	}
	g, err := hw.Lookup("a100")
	if err != nil {
		t.Fatal(err)
	}
	s := engine.Spec{Job: engine.Job{Model: a, MicroBatch: 2, Seq: 256}, Target: engine.Target{GPU: g}}
	r, err := recipe.Load(rec)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Apply(&s, func(string) bool { return false }); err != nil {
		t.Fatal(err)
	}
	if set != nil {
		set(&s)
	}
	if err := s.Validate(); err != nil {
		t.Fatal(err)
	}
	return s
}

// apply sets the dimensions p states on s.
func apply(s *engine.Spec, p Plan) {
	k := p.Known
	if k["micro-batch"] {
		s.MicroBatch = p.MicroBatch
	}
	if k["accum"] {
		s.Accum = p.Accum
	}
	if k["dp"] {
		s.DP = p.DP
	}
	if k["zero"] {
		s.ZeRO = p.ZeRO
	}
	if k["checkpoint"] {
		s.Checkpoint = p.Checkpoint
	}
	if k["offload"] {
		s.Offload = p.Offload
	}
	if k["precision"] {
		s.Precision = p.Precision
	}
	if k["optimizer"] {
		s.Optimizer = p.Optimizer
	}
	if k["impl"] {
		s.Impl = p.Impl
	}
	if k["in-backward"] {
		s.Sem.OptimizerInBackward = p.InBackward
	}
	if max(s.TP, 1) != p.TP {
		s.TP = p.TP
	}
	if max(s.PP, 1) != p.PP {
		s.PP = p.PP
	}
}

// roundTrip emits s for framework, parses the config back as the
// framework reads it, and checks that the plan it describes is s: every
// dimension the config states equals s's, and the job with those
// dimensions (planned with the framework's recipe) is s itself, so its
// peak is s's.
func roundTrip(t *testing.T, framework string, s engine.Spec) string {
	t.Helper()
	text, err := Config(framework, &s)
	if err != nil {
		t.Fatalf("%s: %v", framework, err)
	}
	p, err := parse(framework, text)
	if err != nil {
		t.Fatalf("%s: %v\n%s", framework, err, text)
	}
	want := PlanOf(&s)
	want.Known = p.Known
	back := job(t, s.Sem.Recipe, func(b *engine.Spec) {
		b.MicroBatch, b.Accum, b.Precision, b.Optimizer, b.Impl, b.Sem.OptimizerInBackward = s.MicroBatch, s.Accum, s.Precision, s.Optimizer, s.Impl, s.Sem.OptimizerInBackward
		b.DP, b.ZeRO = s.DP, s.ZeRO                                                       // what the config does not state stays the plan's
		b.Capacity, b.FirstStep, b.GPU, b.Model = s.Capacity, s.FirstStep, s.GPU, s.Model // the same job, by identity
		apply(b, p)
	})
	for _, f := range []struct {
		name      string
		got, want any
	}{{"micro-batch", p.MicroBatch, want.MicroBatch}, {"accum", p.Accum, want.Accum}, {"dp", p.DP, want.DP}, {"zero", p.ZeRO, want.ZeRO},
		{"checkpoint", p.Checkpoint, want.Checkpoint}, {"offload", p.Offload, want.Offload}, {"precision", p.Precision, want.Precision},
		{"optimizer", p.Optimizer, want.Optimizer}, {"impl", p.Impl, want.Impl}, {"in-backward", p.InBackward, want.InBackward}} {
		if p.Known[f.name] && f.got != f.want {
			t.Errorf("%s: %s reads back as %v, the plan's is %v\n%s", framework, f.name, f.got, f.want, text)
		}
	}
	// A degree of 0 is 1 (none).
	norm := func(x engine.Spec) engine.Spec {
		x.TP, x.PP, x.DP = max(x.TP, 1), max(x.PP, 1), max(x.DP, 1)
		return x
	}
	if norm(back) != norm(s) {
		t.Errorf("%s: the config's job differs from the plan\n%s\nconfig: %+v\nplan:   %+v", framework, text,
			norm(back).Job, norm(s).Job)
	}
	return text
}

func TestRoundTrip(t *testing.T) {
	ckpt := func(k engine.CheckpointKind, every int) engine.CheckpointPolicy {
		return engine.CheckpointPolicy{Kind: k, Every: every}
	}
	for _, c := range []struct {
		framework, recipe string
		set               func(*engine.Spec)
	}{
		{"deepspeed", "deepspeed", nil},
		{"deepspeed", "deepspeed", func(s *engine.Spec) { s.DP, s.ZeRO, s.Accum = 8, 2, 4 }},
		{"deepspeed", "deepspeed", func(s *engine.Spec) {
			s.DP, s.ZeRO, s.Offload, s.Checkpoint = 4, 3, engine.Offload{Params: true}, ckpt(engine.CheckpointFull, 0)
		}},
		{"deepspeed", "deepspeed", func(s *engine.Spec) {
			s.DP, s.ZeRO, s.Offload, s.Precision = 2, 1, engine.Offload{Optimizer: true}, ops.FP16
		}},
		{"deepspeed", "deepspeed", func(s *engine.Spec) { s.Precision, s.Optimizer = ops.FP32, lower.Adam }},
		{"accelerate", "hf", nil},
		{"accelerate", "hf", func(s *engine.Spec) { s.DP, s.Accum = 4, 2 }},
		{"accelerate", "hf", func(s *engine.Spec) { s.DP, s.ZeRO, s.Checkpoint = 8, 3, ckpt(engine.CheckpointFull, 0) }},
		{"accelerate", "hf", func(s *engine.Spec) {
			s.DP, s.ZeRO, s.Offload, s.Precision = 2, 3, engine.Offload{Params: true}, ops.AMPFP16
		}},
		{"accelerate", "hf", func(s *engine.Spec) { s.DP, s.ZeRO, s.Precision = 2, 2, ops.FP32 }},
		{"accelerate", "deepspeed", func(s *engine.Spec) { s.DP, s.ZeRO, s.Accum, s.Offload = 8, 2, 4, engine.Offload{Optimizer: true} }},
		{"accelerate", "deepspeed", func(s *engine.Spec) { s.DP, s.ZeRO, s.Offload = 16, 3, engine.Offload{Params: true} }},
		{"torchtune", "torchtune", nil},
		{"torchtune", "torchtune", func(s *engine.Spec) { s.Sem.OptimizerInBackward, s.Checkpoint = true, ckpt(engine.CheckpointFull, 0) }},
		{"torchtune", "torchtune", func(s *engine.Spec) {
			s.Checkpoint, s.Offload, s.Impl, s.Accum = ckpt(engine.CheckpointFull, 0), engine.Offload{Activations: true}, lower.Single, 4
		}},
		{"torchtune", "torchtune", func(s *engine.Spec) { s.DP, s.ZeRO, s.Checkpoint = 8, 3, ckpt(engine.CheckpointEvery, 2) }},
		{"torchtune", "torchtune", func(s *engine.Spec) {
			s.DP, s.ZeRO, s.Offload, s.Precision, s.Impl = 4, 3, engine.Offload{Params: true}, ops.FP32, lower.Foreach
		}},
		{"torchtune", "torchtune", func(s *engine.Spec) { s.DP, s.ZeRO, s.Accum = 2, 2, 8 }},
		{"litgpt", "litgpt", nil},
		{"litgpt", "litgpt", func(s *engine.Spec) { s.Precision, s.Impl, s.Accum = ops.AMPBF16, lower.Fused, 3 }},
		{"litgpt", "litgpt", func(s *engine.Spec) { s.DP, s.ZeRO, s.Checkpoint, s.Accum = 4, 3, ckpt(engine.CheckpointFull, 0), 2 }},
		{"litgpt", "litgpt", func(s *engine.Spec) {
			s.DP, s.ZeRO, s.Checkpoint, s.Precision, s.Impl = 16, 3, ckpt(engine.CheckpointFull, 0), ops.FP32, lower.Single
		}},
	} {
		s := job(t, c.recipe, c.set)
		roundTrip(t, c.framework, s)
	}
}

// A fit winner, searched with the framework's recipe (and the pins that
// keep it to what the framework runs), emits a config whose job is the
// winner: planned in full it has the winner's verified peak.
func TestFitWinnerEmits(t *testing.T) {
	for _, c := range []struct {
		framework, recipe string
		set               func(*engine.Spec)
		pins              search.Pins
	}{
		{"deepspeed", "deepspeed", nil, search.PinTP | search.PinSP | search.PinPP},
		{"accelerate", "hf", func(s *engine.Spec) { s.ZeRO, s.DP = 3, 2 }, search.PinTP | search.PinSP | search.PinPP | search.PinZeRO | search.PinOffload},
		{"torchtune", "torchtune", func(s *engine.Spec) { s.ZeRO, s.DP = 3, 2 }, search.PinTP | search.PinSP | search.PinPP | search.PinZeRO | search.PinOffload},
		{"litgpt", "litgpt", func(s *engine.Spec) {
			s.ZeRO, s.DP, s.Checkpoint = 3, 2, engine.CheckpointPolicy{Kind: engine.CheckpointFull}
		},
			search.PinTP | search.PinSP | search.PinPP | search.PinZeRO | search.PinOffload | search.PinCheckpoint},
	} {
		base := job(t, c.recipe, c.set)
		r, err := search.Fit(base, search.Options{GPUs: 4, GlobalBatch: 16, Pinned: c.pins, Keep: 1})
		if err != nil {
			t.Fatalf("%s: %v", c.framework, err)
		}
		w := r.Winner.Spec
		roundTrip(t, c.framework, w)
		full := w
		full.FirstStep = false
		res, err := engine.Plan(full)
		if err != nil {
			t.Fatal(err)
		}
		if res.PeakBytes() != r.Winner.Result.PeakBytes() {
			t.Errorf("%s: the emitted job peaks at %s, the winner at %s", c.framework, res.PeakBytes(), r.Winner.Result.PeakBytes())
		}
	}
}

// A plan a framework cannot express is refused naming the dimension.
func TestRefusals(t *testing.T) {
	for _, c := range []struct {
		framework, recipe string
		set               func(*engine.Spec)
		field             engine.Field
	}{
		{"deepspeed", "deepspeed", func(s *engine.Spec) { s.TP = 2 }, engine.FieldTP},
		{"deepspeed", "deepspeed", func(s *engine.Spec) { s.PP, s.Accum = 2, 2 }, engine.FieldPP},
		{"deepspeed", "deepspeed", func(s *engine.Spec) { s.Offload.Activations = true }, engine.FieldOffload},
		{"deepspeed", "deepspeed", func(s *engine.Spec) { s.Precision = ops.AMPBF16 }, engine.FieldPrecision},
		{"deepspeed", "deepspeed", func(s *engine.Spec) { s.Checkpoint = engine.CheckpointPolicy{Kind: engine.CheckpointEvery, Every: 2} }, engine.FieldCheckpoint},
		{"deepspeed", "deepspeed", func(s *engine.Spec) { s.Impl = lower.Foreach }, engine.FieldEmit},
		{"accelerate", "hf", func(s *engine.Spec) { s.DP, s.ZeRO = 2, 1 }, engine.FieldZeRO},
		{"accelerate", "hf", func(s *engine.Spec) { s.Checkpoint = engine.CheckpointPolicy{Kind: engine.CheckpointFull} }, engine.FieldCheckpoint},
		{"accelerate", "hf", func(s *engine.Spec) { s.DP, s.ZeRO, s.Offload = 2, 3, engine.Offload{Optimizer: true} }, engine.FieldOffload},
		{"accelerate", "hf", func(s *engine.Spec) { s.Precision = ops.BF16 }, engine.FieldPrecision},
		{"accelerate", "deepspeed", func(s *engine.Spec) {
			s.DP, s.ZeRO, s.Checkpoint = 2, 2, engine.CheckpointPolicy{Kind: engine.CheckpointFull}
		}, engine.FieldCheckpoint},
		{"torchtune", "torchtune", func(s *engine.Spec) { s.PP, s.Accum = 2, 2 }, engine.FieldPP},
		{"torchtune", "torchtune", func(s *engine.Spec) { s.TP = 2 }, engine.FieldTP},
		{"torchtune", "torchtune", func(s *engine.Spec) { s.DP = 2 }, engine.FieldZeRO},
		{"torchtune", "torchtune", func(s *engine.Spec) { s.Precision = ops.AMPBF16 }, engine.FieldPrecision},
		{"torchtune", "torchtune", func(s *engine.Spec) { s.Offload.Activations = true }, engine.FieldOffload},
		{"torchtune", "torchtune", func(s *engine.Spec) { s.DP, s.ZeRO, s.Offload = 2, 3, engine.Offload{Optimizer: true} }, engine.FieldOffload},
		{"torchtune", "torchtune", func(s *engine.Spec) { s.Sem.OptimizerInBackward, s.Accum = true, 2 }, engine.FieldAccum},
		{"litgpt", "litgpt", func(s *engine.Spec) { s.DP, s.ZeRO = 2, 2 }, engine.FieldZeRO},
		{"litgpt", "litgpt", func(s *engine.Spec) { s.DP, s.ZeRO = 2, 3 }, engine.FieldCheckpoint},
		{"litgpt", "litgpt", func(s *engine.Spec) { s.Checkpoint = engine.CheckpointPolicy{Kind: engine.CheckpointFull} }, engine.FieldCheckpoint},
		{"litgpt", "litgpt", func(s *engine.Spec) { s.PP, s.Accum = 2, 2 }, engine.FieldPP},
		{"litgpt", "litgpt", func(s *engine.Spec) { s.Offload.Activations = true }, engine.FieldOffload},
		{"litgpt", "hf", nil, engine.FieldEmit},
		{"torchtune", "litgpt", nil, engine.FieldEmit},
		{"nemo", "hf", nil, engine.FieldEmit},
	} {
		s := job(t, c.recipe, c.set)
		_, err := Config(c.framework, &s)
		var fe *engine.FieldError
		if !errors.As(err, &fe) || fe.Field != c.field {
			t.Errorf("%s (%s recipe): %v, want an error about %s", c.framework, c.recipe, err, c.field)
		}
	}
}
