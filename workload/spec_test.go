package workload

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/memplan/memplan/engine"
	"github.com/memplan/memplan/importer/torchtrace"
	"github.com/memplan/memplan/lower"
)

// lm is a workload of lmTrace's model, batch and sequence.
const lm = "model: memplan_torch.models:transformer_lm\nbatch: 16\nseq_len: 64\n"

// lmTrace is testdata's trace of memplan_torch's transformer_lm.
func lmTrace(t *testing.T) *torchtrace.Trace {
	t.Helper()
	tr, err := torchtrace.Load(filepath.Join("..", "testdata", "torch", "lm.trace.json"))
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

// A workload that contradicts what its trace recorded (the builder, the
// dtype the model was cast to, the batch dimension, a held output the
// trace cannot hold) is refused naming the field: Spec used to plan the
// trace as recorded, so dtype: bfloat16 on a float32 trace gave the
// float32 peak without a word. Fields the trace does not record
// (model_args, name, warmup, iters, seed) are descriptive.
func TestSpecRefusesWhatTheTraceContradicts(t *testing.T) {
	tr := lmTrace(t)
	for _, c := range []struct {
		doc  string
		want string // "": planned
	}{
		{lm, ""},
		{lm + "dtype: fp32\n", ""},
		{lm + "dtype: float\n", ""},
		{lm + "model_args: {layers: 8}\nname: other\nseed: 3\niters: 9\n", ""},
		{lm + "batch_dim: 0\n", ""},
		{lm + "dtype: bfloat16\n", "dtype bfloat16 contradicts the trace's float32 parameters"},
		{lm + "dtype: half\n", "dtype half contradicts the trace's float32 parameters"},
		{lm + "dtype: float64\n", "dtype float64 contradicts"},
		{strings.Replace(lm, "transformer_lm", "resnet18", 1), "model memplan_torch.models:resnet18 contradicts the trace's builder memplan_torch.models:transformer_lm"},
		{lm + "batch_dim: 1\n", "batch_dim 1 contradicts the trace's batch dimension 0"},
		{lm + "hold_outputs: backward\n", "hold_outputs backward needs the model's output"},
	} {
		w, err := Parse("w.yaml", []byte(c.doc))
		if err != nil {
			t.Fatal(err)
		}
		_, err = w.Spec(tr, engine.Spec{})
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%q: %v", c.doc, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n")):
			t.Errorf("%q: error %v, want one line with %q", c.doc, err, c.want)
		}
	}
	// A trace exported from a model object or by export-hf names no
	// builder, and one without batch_dim records none: nothing to check.
	other := *tr
	other.Source, other.BatchDim = "memplan_torch.export", nil
	w, err := Parse("w.yaml", []byte("model: a:b\nbatch: 16\nseq_len: 64\nbatch_dim: 2\n"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Spec(&other, engine.Spec{}); err != nil {
		t.Errorf("unchecked fields: %v", err)
	}
}

// foreach left null is torch's default on the workload's device: the
// foreach step on CUDA (and auto, which memplan plans as CUDA), the
// per-tensor loop on a CPU; given, it is what it says. Null had planned
// the loop on CUDA (trace sweep, round 24).
func TestSpecForeachFollowsTheDevice(t *testing.T) {
	tr := lmTrace(t)
	for _, c := range []struct {
		doc  string
		want lower.Impl
	}{
		{lm + "device: cuda\n", lower.Foreach},
		{lm + "device: auto\n", lower.Foreach},
		{lm, lower.Foreach},
		{lm + "device: cpu\n", lower.Single},
		{lm + "device: cuda\nforeach: false\n", lower.Single},
		{lm + "device: cpu\nforeach: true\n", lower.Foreach},
	} {
		w, err := Parse("w.yaml", []byte(c.doc))
		if err != nil {
			t.Fatal(err)
		}
		s, err := w.Spec(tr, engine.Spec{})
		if err != nil {
			t.Fatal(err)
		}
		if s.Impl != c.want {
			t.Errorf("%q: %s step, want %s", c.doc, s.Impl, c.want)
		}
	}
}
