package cli

import (
	"bytes"
	"strings"
	"testing"
)

// diagnose and plan's allocator flags refuse bad input with one line and
// exit status 1, printing nothing on stdout.
func TestDiagnoseAndReservedBadInput(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"diagnose", "--model", "lama-2-7b"}, `--model "lama-2-7b": not a catalog model`},
		{[]string{"diagnose", "--micro-batch", "0"}, "--micro-batch"},
		{[]string{"diagnose", "extra"}, `reading snapshot: cannot read extra: no such file`}, // a positional argument is a snapshot file
		{[]string{"plan", "--alloc-conf", "max_split_size_mb:4"}, "--alloc-conf: max_split_size_mb:4"},
		{[]string{"plan", "--alloc-conf", "expandable_segments:maybe"}, "--alloc-conf: expandable_segments:maybe"},
		{[]string{"plan", "--alloc-conf", "backend:cudaMallocAsync"}, "only the native caching allocator"},
		{[]string{"plan", "--fit-on", "both"}, `--fit-on "both": want allocated or reserved`},
		{[]string{"plan", "--no-reserved", "--fit-on", "reserved"}, "--no-reserved"},
	} {
		var out, errb bytes.Buffer
		if rc := Main(c.args, &out, &errb); rc != 1 {
			t.Errorf("%v: exit %d, want 1", c.args, rc)
		}
		msg := errb.String()
		if !strings.Contains(msg, c.want) || strings.Count(msg, "\n") != 1 || out.Len() != 0 {
			t.Errorf("%v: stderr %q stdout %d bytes; want one line with %q", c.args, msg, out.Len(), c.want)
		}
	}
}

// plan --fit-on reserved decides fits on the caching allocator's prediction:
// llama-3.2-1b at micro-batch 1 × 1984 fits an RTX 4090 on allocated bytes
// but not once the allocator's segments are counted; with expandable
// segments it fits again. (At 2048 it no longer does since round 25's
// float32 rotary q and k under amp: the replay then runs out at the first
// step's _foreach_sqrt, 2.24 GiB of its two expandable segments cached or
// split off.)
func TestPlanFitOnReserved(t *testing.T) {
	run := func(extra ...string) string {
		var out, errb bytes.Buffer
		args := append([]string{"plan", "--model", "llama-3.2-1b", "--gpu", "rtx-4090", "--micro-batch", "1", "--seq", "1984", "--no-chart"}, extra...)
		rc := Main(args, &out, &errb)
		if fits := strings.Contains(out.String(), "Fits on"); rc != 0 && !(rc == ExitDoesNotFit && !fits) {
			t.Fatalf("%v: exit %d: %s", args, rc, errb.String())
		}
		return out.String()
	}
	if s := run(); !strings.Contains(s, "Fits on rtx-4090") || !strings.Contains(s, "Reserved ") {
		t.Errorf("allocated decides:\n%s", s)
	}
	if s := run("--fit-on", "reserved"); !strings.Contains(s, "DOES NOT FIT") || !strings.Contains(s, "fits decided on reserved") {
		t.Errorf("reserved decides:\n%s", s)
	}
	if s := run("--fit-on", "reserved", "--alloc-conf", "expandable_segments:True"); !strings.Contains(s, "Fits on rtx-4090") {
		t.Errorf("reserved with expandable segments decides:\n%s", s)
	}
}

// The capped replay runs the first step's program when that one reserves
// more, and the first step's optimizer has more ops than the steady one's:
// the OOM op must be looked up in the program that ran (seq 1024 on an
// rtx-4090 once indexed the steady program with the first one's op and
// panicked).
func TestPlanReservedOOMInFirstStep(t *testing.T) {
	var out, errb bytes.Buffer
	args := []string{"plan", "--model", "llama-3.2-1b", "--gpu", "rtx-4090", "--micro-batch", "1", "--seq", "1024", "--no-chart"}
	if rc := Main(args, &out, &errb); rc != 0 {
		t.Fatalf("exit %d: %s", rc, errb.String())
	}
	s := out.String()
	if !strings.Contains(s, "of the first step at _foreach_sqrt(exp_avg_sqs); out of memory at _foreach_sqrt(exp_avg_sqs) (optimizer)") {
		t.Errorf("the reserved line should name the first step's OOM op:\n%s", s)
	}
}

// max and fit print their warnings once the search has taken the job: a
// refusal is the one line on stderr (sweep H, round 25: a warning came
// first, then the refusal).
func TestRefusalAfterAWarningIsOneLine(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"max", "--graph", "../testdata/torch/lm.trace.json", "--gpu", "t4", "--dp", "2", "--zero", "3", "--micro-batch", "?"}, "--zero 3: trace lm is memplan.trace/v1"},
		{[]string{"max", "--model", "gpt2", "--gpu", "h100", "--budget", "76GiB", "--micro-batch", "?", "--seq", "2000"}, "--seq 2000 exceeds gpt2's 1024 learned positions"},
		{[]string{"fit", "--model", "gpt2", "--gpu", "h100", "--budget", "76", "--search-memory", "1MiB"}, `--search-memory "1MiB": want a size of at least 64MiB`},
		{[]string{"fit", "--graph", "../testdata/torch/lm.trace.json", "--gpu", "t4", "--dp", "2"}, "fit needs a --model"},
	} {
		var out, errb bytes.Buffer
		if rc := Main(c.args, &out, &errb); rc != ExitBadInput {
			t.Errorf("%v: exit %d, want 1", c.args, rc)
		}
		if msg := errb.String(); !strings.HasPrefix(msg, "memplan: ") || strings.Count(msg, "\n") != 1 || !strings.Contains(msg, c.want) || out.Len() != 0 {
			t.Errorf("%v: stderr %q, stdout %d bytes; want one line with %q", c.args, msg, out.Len(), c.want)
		}
	}
}
