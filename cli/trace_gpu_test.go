package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// plan --graph prices a trace on any GPU: fp32 lm on a T4 (which has no bf16)
// without a word; a bf16 trace on a T4 at its fp32 rate, with one warning
// line; on an H100 in bf16 without one.
func TestTracePricedOnT4(t *testing.T) {
	fixture, err := os.ReadFile("../testdata/torch/three_events.trace.json")
	if err != nil {
		t.Fatal(err)
	}
	bf16 := filepath.Join(t.TempDir(), "bf16.trace.json")
	if err := os.WriteFile(bf16, []byte(strings.ReplaceAll(string(fixture), `"float32"`, `"bfloat16"`)), 0o644); err != nil {
		t.Fatal(err)
	}
	const warn = "the t4 has no bfloat16 tensor cores: the trace's bfloat16 matmuls are priced at its float32 rate"
	for _, c := range []struct {
		graph, gpu string
		warns      bool
	}{{"../testdata/torch/lm.trace.json", "t4", false}, {bf16, "t4", true}, {bf16, "h100", false}} {
		code, out, errs := run("plan", "--graph", c.graph, "--gpu", c.gpu)
		if code != 0 || !strings.Contains(out, "Fits on "+c.gpu) {
			t.Errorf("%s on %s: exit %d, stderr %q", c.graph, c.gpu, code, errs)
		}
		if got := strings.Contains(errs, warn); got != c.warns || strings.Count(errs, "\n") > 1 {
			t.Errorf("%s on %s: stderr %q (want the warning: %v)", c.graph, c.gpu, errs, c.warns)
		}
	}
}
