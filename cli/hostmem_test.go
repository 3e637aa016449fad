package cli

import (
	"encoding/json"
	"fmt"
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
