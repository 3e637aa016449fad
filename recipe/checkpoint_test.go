package recipe

import (
	"strings"
	"testing"

	"github.com/memplan/memplan/engine"
	"github.com/memplan/memplan/importer/torchtrace"
	"github.com/memplan/memplan/models"
	"github.com/memplan/memplan/ops"
)

// TestPrecisionCheckpoint: precision=checkpoint resolves config.json's
// dtype under the Trainer's bf16=True (the flag's amp-bf16 before it).
func TestPrecisionCheckpoint(t *testing.T) {
	model := func(dtype string) *models.Arch { return &models.Arch{Name: "m", TorchDType: dtype} }
	for _, c := range []struct {
		name    string
		s       engine.Spec
		want    ops.Precision
		wantErr string
	}{
		{"bfloat16", engine.Spec{Job: engine.Job{Model: model("bfloat16")}}, ops.AutocastBF16, ""},
		{"torch. prefix", engine.Spec{Job: engine.Job{Model: model("torch.bfloat16")}}, ops.AutocastBF16, ""},
		{"upper case", engine.Spec{Job: engine.Job{Model: model("BFloat16")}}, ops.AutocastBF16, ""},
		{"float32 keeps the flag", engine.Spec{Job: engine.Job{Model: model("float32")}}, ops.AMPBF16, ""},
		{"unnamed keeps the flag", engine.Spec{Job: engine.Job{Model: model("")}}, ops.AMPBF16, ""},
		{"no model keeps the flag", engine.Spec{}, ops.AMPBF16, ""},
		{"QLoRA keeps the flag", engine.Spec{Job: engine.Job{Model: model("bfloat16"), QLoRA: true}}, ops.AMPBF16, ""},
		{"a trace keeps the flag", engine.Spec{Job: engine.Job{Model: model("bfloat16"), Trace: &torchtrace.Trace{}}}, ops.AMPBF16, ""},
		{"float16 is refused", engine.Spec{Job: engine.Job{Model: model("float16")}}, 0, "m's checkpoint is float16"},
	} {
		s := c.s
		s.Precision = ops.AMPBF16
		err := lookupApply(t, &s, "precision", "checkpoint")
		switch {
		case c.wantErr != "" && (err == nil || !strings.Contains(err.Error(), c.wantErr) || !strings.Contains(err.Error(), "--precision pure-fp16")):
			t.Errorf("%s: error %v, want one naming %q and the flag", c.name, err, c.wantErr)
		case c.wantErr == "" && err != nil:
			t.Errorf("%s: %v", c.name, err)
		case c.wantErr == "" && s.Precision != c.want:
			t.Errorf("%s: %v, want %v", c.name, s.Precision, c.want)
		}
	}
}

func lookupApply(t *testing.T, s *engine.Spec, key, value string) error {
	t.Helper()
	sw, err := lookup(key)
	if err != nil {
		t.Fatal(err)
	}
	return sw.apply(s, value)
}
