package cli

import (
	"strings"
	"testing"
)

// --pp on a trace plans each stage, or is refused in one line naming --pp,
// the reason and what to do, exit 1; never the pipeline transform's own
// message (issue 15: "pipeline cannot place op 1 (aten.unsqueeze.default)
// on a stage" for every trace).
func TestPlanTracePipeline(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string // "" plans; else the refusal contains it
	}{
		{[]string{"--graph", "../testdata/torch/lm.trace.json", "--pp", "2", "--accum", "4"}, ""},
		{[]string{"--graph", "../testdata/torch/lm.trace.json", "--pp", "4"}, ""},
		{[]string{"--graph", "../testdata/torch/gpt2_tiny.trace.json", "--pp", "2", "--dp", "2", "--zero", "3"}, ""},
		{[]string{"--graph", "../testdata/torch/vit_tiny.trace.json", "--pp", "4", "--pp-schedule", "gpipe"}, ""},
		{[]string{"--graph", "../testdata/torch/lm.trace.json", "--pp", "8"}, "--pp 8 needs 8 blocks, but trace lm has 4 (module paths ending in a list index); use --pp 4 or less"},
		{[]string{"--graph", "../testdata/torch/gpt2_tiny.trace.json", "--pp", "4"}, "has 2 (module paths"},
		{[]string{"--graph", "../testdata/torch/lm.trace.json", "--pp", "2", "--pp-interleave", "4", "--accum", "4"}, "--pp 2 with 4 virtual stages each needs 8 blocks"},
		{[]string{"--graph", "../testdata/torch/gru.trace.json", "--pp", "2"}, "--pp 2: trace gru has no repeated block modules to cut into stages"},
		{[]string{"--graph", "../testdata/torch/three_events.trace.json", "--pp", "2"}, "plan it with --pp 1"},
	} {
		code, out, errs := run(append([]string{"plan"}, tc.args...)...)
		switch {
		case tc.want == "" && (code != 0 || !strings.Contains(out, "pipeline stage")):
			t.Errorf("%v: exit %d, %s%s", tc.args, code, errs, out)
		case tc.want != "" && (code != 1 || out != "" || strings.Count(errs, "\n") != 1 || !strings.Contains(errs, tc.want) || strings.Contains(errs, "cannot place")):
			t.Errorf("%v: exit %d, stdout %d bytes, stderr %q; want one line with %q", tc.args, code, len(out), errs, tc.want)
		}
	}
}
