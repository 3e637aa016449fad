package cli

import (
	"encoding/json"
	"strings"
	"testing"
)

// plan --graph --seq N plans sequence N and says so in the header and the
// JSON report (the header used to print max(N, the trace's sequence)); without
// --seq the trace's own sequence is reported; a trace without a sequence
// dimension refuses --seq with one line.
func TestTraceSeqReported(t *testing.T) {
	const lm = "../testdata/torch/lm.trace.json" // traced at sequence 64
	for _, c := range []struct {
		args []string
		seq  int
	}{{[]string{"--seq", "16"}, 16}, {[]string{"--seq", "96"}, 96}, {nil, 64}} {
		args := append([]string{"plan", "--graph", lm, "--micro-batch", "4"}, c.args...)
		code, out, errs := run(args...)
		if code != 0 {
			t.Fatalf("%v: exit %d: %s", args, code, errs)
		}
		head := strings.SplitN(out, "\n", 2)[0]
		if want := " × seq " + itoa(c.seq) + " "; !strings.Contains(head, want) {
			t.Errorf("%v: header %q lacks %q", args, head, want)
		}
		code, out, errs = run(append(args, "--json")...)
		if code != 0 {
			t.Fatalf("%v --json: exit %d: %s", args, code, errs)
		}
		var doc struct {
			Seq int `json:"seq"`
		}
		if err := json.Unmarshal([]byte(out), &doc); err != nil {
			t.Fatal(err)
		}
		if doc.Seq != c.seq {
			t.Errorf("%v --json: seq %d, want %d", args, doc.Seq, c.seq)
		}
	}
	code, out, errs := run("plan", "--graph", "../testdata/torch/resnet18.trace.json", "--seq", "16")
	if code == 0 || out != "" || strings.Count(strings.TrimSpace(errs), "\n") != 0 || !strings.Contains(errs, "--seq 16") || !strings.Contains(errs, "sequence dimension") {
		t.Errorf("resnet18 --seq 16: exit %d, stdout %q, stderr %q", code, out, errs)
	}
}

func itoa(n int) string {
	b, _ := json.Marshal(n)
	return string(b)
}
