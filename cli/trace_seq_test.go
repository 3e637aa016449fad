package cli

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
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

// A trace plan names the dtype the trace ran in, never --precision's
// default it did not use: the JSON leaves precision out (it names a
// --precision) and gives trace_dtype, and the text's header and chart say
// float32 for the float32 lm trace, with or without its workload. They
// said amp-bf16.
func TestTracePrecisionReported(t *testing.T) {
	const lm = "../testdata/torch/lm.trace.json"
	for _, extra := range [][]string{nil, {"--workload", "../testdata/torch/workloads/lm.yaml"}} {
		args := append([]string{"plan", "--graph", lm}, extra...)
		j := planJSON(t, args[1:]...)
		if p, ok := j["precision"]; ok || j["trace_dtype"] != "float32" {
			t.Errorf("%v --json: precision %v, trace_dtype %v; want no precision, trace_dtype float32", args, p, j["trace_dtype"])
		}
		code, out, errs := run(args...)
		if code != 0 {
			t.Fatalf("%v: exit %d: %s", args, code, errs)
		}
		if head := strings.SplitN(out, "\n", 2)[0]; !strings.Contains(head, " · float32 · ") || strings.Contains(out, "amp-bf16") {
			t.Errorf("%v: the text names a precision the trace did not use, or not its dtype:\n%s", args, out)
		}
	}
	code, out, errs := run("compare", "--graph", lm)
	if code != 0 || !strings.Contains(strings.SplitN(out, "\n", 2)[0], " · float32 · ") || strings.Contains(out, "amp-bf16") {
		t.Errorf("compare: exit %d, %s\n%s", code, errs, out)
	}
	code, out, errs = run("plan", "--model", "gpt2", "--json", "--no-timeline")
	if code != 0 || !strings.Contains(out, `"precision": "amp-bf16"`) || strings.Contains(out, "trace_dtype") {
		t.Errorf("gpt2: exit %d, %s\n%s", code, errs, out)
	}
}

// --seq equal to the length a trace without a sequence dimension recorded
// is its own job, planned; another length is refused naming the exporter
// that records one; a trace that records no length refuses any --seq. The
// workload path applies the same rule to seq_len where the trace records
// a length (a seq_len it cannot check is descriptive).
func TestTraceOwnSeqAccepted(t *testing.T) {
	doc, err := os.ReadFile("../testdata/torch/lm_sgd.trace.json") // exported at --seq-len 64, no --seq-dim
	if err != nil {
		t.Fatal(err)
	}
	rec := filepath.Join(t.TempDir(), "lm_sgd.trace.json")
	if err := os.WriteFile(rec, bytes.Replace(doc, []byte(`"trace_seq":null`), []byte(`"trace_seq":64`), 1), 0o644); err != nil {
		t.Fatal(err)
	}
	peak := func(args ...string) string { return planPeak(t, args...) }
	if a, b := peak("--graph", rec), peak("--graph", rec, "--seq", "64"); a != b {
		t.Errorf("--seq 64, the trace's own: peak %s, want %s", b, a)
	}
	const ckpt = "../testdata/torch/workloads/lm_sgd_ckpt_accum2.yaml" // seq_len: 64
	peak("--graph", rec, "--workload", ckpt)
	wl := filepath.Join(t.TempDir(), "w.yaml")
	w, err := os.ReadFile(ckpt)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(wl, bytes.Replace(w, []byte("seq_len: 64"), []byte("seq_len: 32"), 1), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--graph", rec, "--seq", "32"}, "--seq 32: trace lm_sgd was exported without a sequence dimension at sequence 64, so it replays only that length (re-export it with memplan_torch export --seq-len N --seq-dim D)"},
		{[]string{"--graph", "../testdata/torch/lm_sgd.trace.json", "--seq", "64"}, "--seq 64: trace lm_sgd was exported without a sequence dimension and does not record its length"},
		{[]string{"--graph", rec, "--workload", wl}, "w.yaml: seq_len 32: trace lm_sgd was exported without a sequence dimension at sequence 64"},
	} {
		code, out, errs := run(append([]string{"plan"}, c.args...)...)
		if code != 1 || out != "" || strings.Count(strings.TrimRight(errs, "\n"), "\n") != 0 || !strings.Contains(errs, c.want) {
			t.Errorf("%v: exit %d, stdout %d bytes, stderr %q; want exit 1 and one line with %q", c.args, code, len(out), errs, c.want)
		}
	}
}

// plan --help says a trace's micro-batch and sequence are its own unless
// given: it said "default 1" alone, while --graph plans the trace's batch.
func TestPlanHelpTraceDefaults(t *testing.T) {
	code, out, _ := run("plan", "--help")
	for _, want := range []string{"with --graph, the batch the trace was exported at unless given", "with --graph, the trace's own)"} {
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("plan --help lacks %q:\n%s", want, out)
		}
	}
}

// A trace plan names the optimizer step it planned, never the flags'
// defaults it did not run: the lm_sgd trace's recorded single-tensor SGD
// (JSON optimizer sgd, optimizer_impl single, optimizer_recorded; the
// text's header, chart and compare's header "sgd (single) as recorded"),
// and no attention (it ran the one it recorded). It said adamw, foreach
// and sdpa. A replaced step (--optimizer, or a workload's optimizer that
// differs from the trace's) is named as the replacement; --attention on a
// trace is refused in one line.
func TestTraceOptimizerReported(t *testing.T) {
	const sgd = "../testdata/torch/lm_sgd.trace.json"
	dir := t.TempDir()
	w, err := os.ReadFile("../testdata/torch/workloads/lm_sgd_ckpt_accum2.yaml")
	if err != nil {
		t.Fatal(err)
	}
	adamw := filepath.Join(dir, "adamw.yaml")
	if err := os.WriteFile(adamw, []byte(strings.Replace(string(w), "optimizer: sgd", "optimizer: adamw", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		extra          []string
		opt, impl, txt string
		recorded       bool
	}{
		{nil, "sgd", "single", " · sgd (single) as recorded", true},
		{[]string{"--workload", "../testdata/torch/workloads/lm_sgd_ckpt_accum2.yaml"}, "sgd", "single", " · sgd (single) as recorded", true},
		{[]string{"--optimizer", "adamw"}, "adamw", "foreach", " · adamw (foreach)", false},
		{[]string{"--workload", adamw}, "adamw", "single", " · adamw (single)", false},
	} {
		args := append([]string{"plan", "--graph", sgd}, c.extra...)
		j := planJSON(t, args[1:]...)
		rec, _ := j["optimizer_recorded"].(bool)
		if a, ok := j["attention"]; ok || j["optimizer"] != c.opt || j["optimizer_impl"] != c.impl || rec != c.recorded {
			t.Errorf("%v --json: attention %v, optimizer %v (%v), recorded %v; want no attention, %s (%s), %v",
				args, a, j["optimizer"], j["optimizer_impl"], rec, c.opt, c.impl, c.recorded)
		}
		code, out, errs := run(args...)
		if code != 0 {
			t.Fatalf("%v: exit %d: %s", args, code, errs)
		}
		head := strings.SplitN(out, "\n", 2)[0]
		if !strings.Contains(head, c.txt) || strings.Count(out, c.txt) < 2 || strings.Contains(out, "sdpa") || c.recorded && strings.Contains(out, "adamw") {
			t.Errorf("%v: the header and chart title do not name %q, or name what the trace did not run:\n%s", args, c.txt, out)
		}
	}
	code, out, errs := run("compare", "--graph", sgd)
	if code != 0 || !strings.Contains(strings.SplitN(out, "\n", 2)[0], " · sgd (single) as recorded") || strings.Contains(out, "adamw") {
		t.Errorf("compare: exit %d, %s\n%s", code, errs, out)
	}
	for _, cmd := range []string{"plan", "compare"} {
		code, out, errs = run(cmd, "--graph", sgd, "--attention", "eager")
		if code != 1 || out != "" || strings.TrimSpace(errs) != "memplan: --attention: a trace ran the attention it recorded" {
			t.Errorf("%s --attention eager on a trace: exit %d, stdout %q, stderr %q; want one line refusing it", cmd, code, out, errs)
		}
	}
	code, out, errs = run("plan", "--model", "gpt2", "--json", "--no-timeline")
	if code != 0 || !strings.Contains(out, `"attention": "sdpa"`) || !strings.Contains(out, `"optimizer_impl": "foreach"`) || strings.Contains(out, "optimizer_recorded") {
		t.Errorf("gpt2: exit %d, %s\n%s", code, errs, out)
	}
}
