package cli

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

// max in serve mode agrees with plan --mode serve: --requests '?' is the
// requests plan reports at the context; --context '?' is a context at which
// plan holds the requests, and one token more does not.
func TestMaxServeAgreesWithPlan(t *testing.T) {
	type plan struct {
		Requests int64 `json:"requests_at_context"`
		Fits     bool  `json:"fits"`
	}
	planAt := func(args ...string) plan {
		t.Helper()
		code, out, errs := run(append([]string{"plan", "--mode", "serve", "--json"}, args...)...)
		if code != ExitOK && code != ExitDoesNotFit {
			t.Fatalf("plan %v: exit %d: %s", args, code, errs)
		}
		var p plan
		if err := json.Unmarshal([]byte(out), &p); err != nil {
			t.Fatal(err)
		}
		return p
	}
	job := []string{"--model", "llama-3.1-8b", "--gpu", "rtx-4090"}
	code, out, errs := run(append([]string{"max", "--json", "--max-model-len", "16384", "--context", "8192", "--requests", "?"}, job...)...)
	if code != ExitOK {
		t.Fatalf("exit %d: %s", code, errs)
	}
	var j struct {
		Schema    string `json:"schema"`
		Dimension string `json:"dimension"`
		Value     int64  `json:"value"`
	}
	if err := json.Unmarshal([]byte(out), &j); err != nil {
		t.Fatal(err)
	}
	if j.Schema != "memplan.max/v1" || j.Dimension != "requests" || j.Value < 1 {
		t.Fatalf("%+v", j)
	}
	if p := planAt(append(job, "--max-model-len", "16384", "--context", "8192")...); p.Requests != j.Value {
		t.Errorf("max --requests: %d, plan at --context 8192: %d", j.Value, p.Requests)
	}
	for _, n := range []int{1, 4, 16} {
		code, out, errs := run(append([]string{"max", "--json", "--requests", fmt.Sprint(n), "--context", "?"}, job...)...)
		if code != ExitOK {
			t.Fatalf("exit %d: %s", code, errs)
		}
		if err := json.Unmarshal([]byte(out), &j); err != nil {
			t.Fatal(err)
		}
		c := j.Value
		if at := planAt(append(job, "--max-model-len", fmt.Sprint(c), "--context", fmt.Sprint(c))...); !at.Fits || at.Requests < int64(n) {
			t.Errorf("%d requests: context %d holds %d (fits %v)", n, c, at.Requests, at.Fits)
		}
		if b := planAt(append(job, "--max-model-len", fmt.Sprint(c+1), "--context", fmt.Sprint(c+1))...); b.Fits && b.Requests >= int64(n) {
			t.Errorf("%d requests: context %d also holds %d", n, c+1, b.Requests)
		}
	}
}

// Above vLLM's chunked-prefill switch the KV cache is larger: five
// requests on an A100-40GB hold 32,800 tokens but not 32,768. max names
// the shorter contexts that do not hold them, and plan agrees at the edges.
func TestMaxServeContextGap(t *testing.T) {
	job := []string{"--model", "llama-3.1-8b", "--gpu", "a100-40gb", "--requests", "5", "--context", "?"}
	code, out, errs := run(append([]string{"max", "--json"}, job...)...)
	if code != ExitOK {
		t.Fatalf("exit %d: %s", code, errs)
	}
	var j struct {
		Value int    `json:"value"`
		Gap   [2]int `json:"gap"`
	}
	if err := json.Unmarshal([]byte(out), &j); err != nil {
		t.Fatal(err)
	}
	if j.Gap[0] < 2 || j.Gap[1] >= j.Value {
		t.Fatalf("answer %d, gap %v: want a gap below the answer", j.Value, j.Gap)
	}
	for _, c := range []struct{ context, want int }{{j.Gap[0] - 1, 5}, {j.Gap[0], 4}, {j.Gap[1], 4}} {
		_, out, _ := run("plan", "--mode", "serve", "--json", "--model", "llama-3.1-8b", "--gpu", "a100-40gb",
			"--max-model-len", fmt.Sprint(c.context), "--context", fmt.Sprint(c.context))
		var p struct {
			Requests int `json:"requests_at_context"`
		}
		if err := json.Unmarshal([]byte(out), &p); err != nil {
			t.Fatal(err)
		}
		if (p.Requests >= 5) != (c.want >= 5) {
			t.Errorf("context %d: plan holds %d requests; the gap %v says %v", c.context, p.Requests, j.Gap, c.want >= 5)
		}
	}
	_, text, _ := run(append([]string{"max"}, job...)...)
	if want := fmt.Sprintf("contexts %d to %d do not hold them", j.Gap[0], j.Gap[1]); !strings.Contains(text, want) || strings.Contains(text, "every shorter context holds them") {
		t.Errorf("text does not name the gap %q:\n%s", want, text)
	}
}

func TestMaxServeBadInput(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"max", "--model", "llama-3-8b", "--gpu", "h100", "--mode", "train", "--requests", "?"}, "--requests applies to --mode serve, not --mode train"},
		{[]string{"max", "--model", "gpt2", "--gpu", "h100", "--requests", "4", "--micro-batch", "?"}, "--requests applies to --mode serve"},
		{[]string{"max", "--model", "llama-3-8b", "--gpu", "h100", "--requests", "?", "--context", "?"}, "both given '?'"},
		{[]string{"max", "--model", "llama-3-8b", "--gpu", "h100", "--context", "?"}, "--context '?' needs --requests N"},
		{[]string{"max", "--model", "llama-3-8b", "--gpu", "h100", "--mode", "serve"}, "solves for --requests or --context"},
		{[]string{"max", "--model", "llama-3-8b", "--gpu", "h100", "--requests", "?", "--micro-batch", "4"}, "--micro-batch does not apply to --mode serve"},
		{[]string{"max", "--model", "llama-3-8b", "--gpu", "h100", "--requests", "?", "--context", "-3"}, "--context must be positive"},
		{[]string{"max", "--model", "llama-3-8b", "--gpu", "h100", "--requests", "x", "--context", "?"}, `--requests "x": want a whole number or '?'`},
		{[]string{"max", "--model", "bert-base", "--gpu", "h100", "--requests", "?"}, "encoder"},
		{[]string{"max", "--model", "llama-3-8b", "--requests", "?"}, "--gpu"},
	} {
		code, _, errs := run(c.args...)
		if code != ExitBadInput || !strings.Contains(errs, c.want) || strings.Count(strings.TrimSpace(errs), "\n") > 0 {
			t.Errorf("%v: exit %d, stderr %q, want one line with %q", c.args, code, errs, c.want)
		}
	}
	// Nothing fits: exit 4.
	if code, out, _ := run("max", "--model", "llama-3.1-8b", "--gpu", "rtx-4090", "--max-model-len", "8192", "--requests", "100000", "--context", "?"); code != ExitNothingFits || !strings.Contains(out, "Nothing fits") {
		t.Errorf("100000 requests: exit %d: %s", code, out)
	}
}
