package cli

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

// fit --host-memory keeps every verified plan's host memory per node under
// the limit; without it the same search's winner offloads more than that.
func TestFitRespectsHostMemory(t *testing.T) {
	args := []string{"fit", "--model", "llama-3.2-1b", "--gpu", "rtx-4090", "--gpus", "8", "--global-batch", "32", "--seq", "2048", "--json"}
	type plan struct {
		Plan        string `json:"plan"`
		HostPerNode int64  `json:"host_per_node_bytes"`
		Command     string `json:"command"`
	}
	var free struct {
		Winner    plan   `json:"winner"`
		RunnersUp []plan `json:"runners_up"`
	}
	code, out, errs := run(args...)
	if code != ExitOK {
		t.Fatalf("exit %d: %s", code, errs)
	}
	if err := json.Unmarshal([]byte(out), &free); err != nil {
		t.Fatal(err)
	}
	var most int64
	for _, p := range append(free.RunnersUp, free.Winner) {
		most = max(most, p.HostPerNode)
	}
	if most == 0 {
		t.Fatalf("no plan of the unlimited search offloads; the test needs one that does")
	}
	limit := most - 1
	var held struct {
		Winner    plan   `json:"winner"`
		RunnersUp []plan `json:"runners_up"`
	}
	code, out, errs = run(append(args, "--host-memory", jsonBytes(limit))...)
	if code != ExitOK {
		t.Fatalf("--host-memory %d: exit %d: %s", limit, code, errs)
	}
	if err := json.Unmarshal([]byte(out), &held); err != nil {
		t.Fatal(err)
	}
	for _, p := range append(held.RunnersUp, held.Winner) {
		if p.HostPerNode > limit {
			t.Errorf("%s: host memory per node %d over --host-memory %d", p.Plan, p.HostPerNode, limit)
		}
	}
	// Each plan's command reproduces its verdict: plan exits 0.
	if c, _, e := run(append(shellSplit(t, held.Winner.Command)[1:], "--no-chart")...); c != ExitOK {
		t.Errorf("%s: exit %d: %s", held.Winner.Command, c, e)
	}
}

// jsonBytes is n bytes as --host-memory reads it.
func jsonBytes(n int64) string { return fmt.Sprintf("%dB", n) }

// max names --host-memory when host memory is what a job runs out of: how
// far over it the value beyond the answer (or micro-batch 1) is, never "0 B
// over" the GPU, and no next step, as plan gives none: compare's strategies
// lower the device peak, and those that lower it most add host memory.
func TestMaxHostMemory(t *testing.T) {
	for _, c := range []struct {
		name        string
		args        []string
		code        int
		want, lacks []string
	}{
		{"micro-batch 1 over", []string{"--model", "llama-3.2-1b", "--gpu", "rtx-4090", "--seq", "1024", "--offload", "activations", "--host-memory", "1GiB"}, ExitNothingFits,
			[]string{"Nothing fits: even micro-batch 1 needs ", " more host memory per node than --host-memory 1.00 GiB", "DOES NOT FIT: ", " over --host-memory 1.00 GiB"},
			[]string{"0 B", "Next step"}},
		{"the value beyond over", []string{"--model", "gpt2", "--gpu", "h100", "--seq", "1024", "--offload", "activations", "--host-memory", "8GiB"}, ExitOK,
			[]string{"Largest micro-batch that fits: 8 on h100-sxm (78.82 GiB usable) and --host-memory 8.00 GiB", " over --host-memory 8.00 GiB"},
			[]string{"0 B"}},
	} {
		code, out, errs := run(append([]string{"max", "--micro-batch", "?"}, c.args...)...)
		if code != c.code {
			t.Errorf("%s: exit %d, want %d: %s", c.name, code, c.code, errs)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(out, w) {
				t.Errorf("%s: output lacks %q:\n%s", c.name, w, out)
			}
		}
		for _, w := range c.lacks {
			if strings.Contains(out, w) {
				t.Errorf("%s: output says %q:\n%s", c.name, w, out)
			}
		}
	}
}
