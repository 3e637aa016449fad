package engine

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/memplan/memplan/hw"
	"github.com/memplan/memplan/importer/torchtrace"
	"github.com/memplan/memplan/units"
)

// tinyAs is testdata/torch/three_events.trace.json with every float32
// storage and output recorded as dtype.
func tinyAs(t *testing.T, dtype string) *torchtrace.Trace {
	b, err := os.ReadFile(filepath.Join(catalogTestdata, "three_events.trace.json"))
	if err != nil {
		t.Fatal(err)
	}
	tr, err := torchtrace.Parse([]byte(strings.ReplaceAll(string(b), `"float32"`, `"`+dtype+`"`)))
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

// A trace is priced in the dtype its matmuls ran in, whatever --precision
// says; on a GPU without that 16-bit arithmetic (the T4 has no bf16 tensor
// cores, hw/gpus.yaml) at the GPU's fp32 rate, as PyTorch runs it there; a
// dtype the GPU cannot run at all (fp8 on a T4) is refused in one line.
func TestTracePricedOnAnyGPU(t *testing.T) {
	t4, err := hw.Lookup("t4")
	if err != nil {
		t.Fatal(err)
	}
	h100, err := hw.Lookup("h100")
	if err != nil {
		t.Fatal(err)
	}
	lm, err := torchtrace.Load(filepath.Join(catalogTestdata, "lm.trace.json"))
	if err != nil {
		t.Fatal(err)
	}
	if t4.PeakFLOPs(units.BF16) != 0 || t4.PeakFLOPs(units.F32) <= 0 || h100.PeakFLOPs(units.BF16) <= 0 {
		t.Fatalf("the catalog's T4 is expected without bf16 and with fp32, the H100 with bf16")
	}
	for _, c := range []struct {
		name   string
		tr     *torchtrace.Trace
		gpu    *hw.GPU
		priced units.DType
	}{
		{"fp32 lm on t4", lm, t4, units.F32},
		{"bf16 on t4", tinyAs(t, "bfloat16"), t4, units.F32},
		{"fp16 on t4", tinyAs(t, "float16"), t4, units.F16},
		{"bf16 on h100", tinyAs(t, "bfloat16"), h100, units.BF16},
	} {
		res, err := Plan(Spec{Job: Job{Trace: c.tr}, Target: Target{GPU: c.gpu}})
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if res.Timing == nil || res.Timing.DType != c.priced || res.Timing.PeakFLOPs != c.gpu.PeakFLOPs(c.priced) || res.Timing.Step <= 0 {
			t.Errorf("%s: timing %+v, want priced in %s at %g FLOP/s", c.name, res.Timing, c.priced, c.gpu.PeakFLOPs(c.priced))
		}
	}
	_, err = Plan(Spec{Job: Job{Trace: tinyAs(t, "float8_e4m3fn")}, Target: Target{GPU: t4}})
	var fe *FieldError
	if err == nil || !errors.As(err, &fe) || fe.Field != FieldGPU || !strings.Contains(err.Error(), "the t4 has no float8_e4m3fn arithmetic, which the trace's matmuls run in: plan it on a ") || strings.Contains(err.Error(), "\n") {
		t.Errorf("fp8 on t4: got %v", err)
	}
}
