package cli

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// --nodes, --gpus-per-node and --cluster: bad input is one line, exit 1.
func TestTopologyBadInput(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		os.WriteFile(p, []byte(body), 0o644)
		return p
	}
	noLink := write("nolink.yaml", "gpus_per_node: 8\n")
	typo := write("typo.yaml", "inter_node: {gbps: 400, latency: 5}\n")
	four := write("four.yaml", "gpus_per_node: 4\ninter_node: {gbps: 400}\n")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"plan", "--gpu", "h100", "--nodes", "0"}, "--nodes must be at least 1"},
		{[]string{"plan", "--gpu", "h100", "--nodes", "-2"}, "--nodes must be at least 1"},
		{[]string{"plan", "--gpu", "h100", "--tp", "8", "--nodes", "2"}, "--nodes 2 × 8 GPUs per node = 16 GPUs, but --dp 1 × --tp 8 × --pp 1 = 8"},
		{[]string{"plan", "--gpu", "h100", "--dp", "4", "--nodes", "1", "--gpus-per-node", "2"}, "--nodes 1 × 2 GPUs per node = 2 GPUs"},
		{[]string{"compare", "--gpu", "h100", "--nodes", "3"}, "--nodes 3"},
		{[]string{"plan", "--gpu", "h100", "--cluster", filepath.Join(dir, "missing.yaml")}, "--cluster: cannot read"},
		{[]string{"plan", "--gpu", "h100", "--cluster", noLink}, "inter_node.gbps is required"},
		{[]string{"plan", "--gpu", "h100", "--cluster", typo}, "not a cluster file"},
		{[]string{"plan", "--gpu", "h100", "--cluster", four, "--gpus-per-node", "8"}, "--gpus-per-node 8 contradicts --cluster"},
		{[]string{"fit", "--model", "gpt2", "--gpu", "h100", "--nodes", "2", "--gpus", "8"}, "--gpus 8 contradicts --nodes 2"},
		{[]string{"plan", "--mode", "serve", "--model", "llama-3-8b", "--gpu", "h100", "--nodes", "2"}, "--nodes does not apply to --mode serve"},
		{[]string{"plan", "--mode", "serve", "--model", "llama-3-8b", "--gpu", "h100", "--cluster", four}, "--cluster does not apply to --mode serve"},
	} {
		code, out, errs := run(tc.args...)
		if code != 1 || out != "" || !strings.Contains(errs, tc.want) || strings.Count(strings.TrimSpace(errs), "\n") != 0 {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want exit 1 and one line with %q", tc.args, code, out, errs, tc.want)
		}
	}
}

func stepSeconds(t *testing.T, args ...string) (float64, string) {
	t.Helper()
	code, out, errs := run(append([]string{"plan", "--json", "--no-timeline"}, args...)...)
	if code != 0 && code != 3 {
		t.Fatalf("%v: exit %d: %s", args, code, errs)
	}
	var j struct {
		Time struct {
			Step float64 `json:"step_s"`
		} `json:"time"`
	}
	if err := json.Unmarshal([]byte(out), &j); err != nil {
		t.Fatal(err)
	}
	return j.Time.Step, errs
}

// A job over nodes is priced on the inter-node link: TP=16 over two H100
// nodes (each GPU's 400 Gb/s adapter, hw/gpus.yaml) is slower than the same
// TP=16 inside one 16-GPU NVLink node, and a faster cluster link brings it
// back; data parallel over 4 nodes likewise.
func TestTopologyPlanStepTime(t *testing.T) {
	dir := t.TempDir()
	fast := filepath.Join(dir, "fast.yaml")
	os.WriteFile(fast, []byte("inter_node: {gbps: 100000}\n"), 0o644)
	base := []string{"--model", "llama-2-7b", "--gpu", "h100", "--seq", "4096"}
	one, _ := stepSeconds(t, append(base, "--tp", "16", "--gpus-per-node", "16")...)
	two, _ := stepSeconds(t, append(base, "--tp", "16", "--nodes", "2")...)
	twoFast, _ := stepSeconds(t, append(base, "--tp", "16", "--nodes", "2", "--cluster", fast)...)
	if !(two > one) || twoFast != one {
		t.Errorf("tp16: one node %vs, two nodes %vs, two nodes on a fast link %vs", one, two, twoFast)
	}
	dpOne, _ := stepSeconds(t, append(base, "--tp", "8", "--dp", "4", "--gpus-per-node", "32")...)
	dpFour, _ := stepSeconds(t, append(base, "--tp", "8", "--dp", "4", "--nodes", "4")...)
	if !(dpFour > dpOne) {
		t.Errorf("dp4 over 4 nodes %vs, not slower than in one node %vs", dpFour, dpOne)
	}
	// A GPU without a catalog node spans nodes on NVLink prices, with a warning.
	_, errs := stepSeconds(t, "--model", "gpt2", "--gpu", "a100", "--dp", "16")
	if !strings.Contains(errs, "no inter-node network for the a100-80gb") || !strings.Contains(errs, "--cluster FILE") {
		t.Errorf("no warning: %q", errs)
	}
}

// compare and fit price their plans over the same nodes: GPT-2 on 16 H100s
// is slower over two 8-GPU nodes than inside one 16-GPU node.
func TestTopologyCompareAndFit(t *testing.T) {
	var steps [2][]float64
	for i, where := range [][]string{{"--gpus-per-node", "16"}, {"--nodes", "2"}} {
		code, out, errs := run(append([]string{"compare", "--json", "--model", "gpt2", "--gpu", "h100", "--dp", "16"}, where...)...)
		if code != 0 && code != 3 {
			t.Fatalf("compare %v: exit %d: %s", where, code, errs)
		}
		var c struct {
			Strategies []struct {
				Step float64 `json:"step_s"`
			} `json:"strategies"`
		}
		if err := json.Unmarshal([]byte(out), &c); err != nil || len(c.Strategies) == 0 {
			t.Fatalf("compare %v: %v", where, err)
		}
		for _, s := range c.Strategies {
			steps[i] = append(steps[i], s.Step)
		}
	}
	slower := 0
	for i := range steps[0] {
		if steps[1][i] < steps[0][i] {
			t.Errorf("compare strategy %d: %vs over two nodes, %vs in one", i, steps[1][i], steps[0][i])
		}
		if steps[1][i] > steps[0][i] {
			slower++
		}
	}
	if slower == 0 {
		t.Error("compare: no strategy is slower over two nodes")
	}
	var fits [2]float64
	for i, where := range [][]string{{"--gpus", "16", "--gpus-per-node", "16"}, {"--nodes", "2"}} {
		code, out, errs := run(append([]string{"fit", "--json", "--model", "gpt2", "--gpu", "h100", "--global-batch", "64"}, where...)...)
		if code != 0 {
			t.Fatalf("fit %v: exit %d: %s", where, code, errs)
		}
		var f struct {
			Winner struct {
				DP   int     `json:"dp"`
				Step float64 `json:"step_s"`
			} `json:"winner"`
		}
		if err := json.Unmarshal([]byte(out), &f); err != nil {
			t.Fatal(err)
		}
		fits[i] = f.Winner.Step
	}
	if !(fits[1] > fits[0]) {
		t.Errorf("fit winner: %vs over two nodes, %vs in one", fits[1], fits[0])
	}
}

// memplan gpus -o json names each catalog GPU's node (GPUs, network per GPU
// in Gb/s, source) where the catalog has one.
func TestGPUsJSONNode(t *testing.T) {
	code, out, errs := run("gpus", "-o", "json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	var d struct {
		GPUs []struct {
			Name string `json:"name"`
			Node *struct {
				GPUs        int     `json:"gpus"`
				NetworkGbps float64 `json:"network_gbps"`
				Source      string  `json:"source"`
			} `json:"node"`
		} `json:"gpus"`
	}
	if err := json.Unmarshal([]byte(out), &d); err != nil {
		t.Fatal(err)
	}
	nodes := map[string]bool{}
	for _, g := range d.GPUs {
		if g.Node != nil {
			nodes[g.Name] = true
			if g.Node.GPUs != 8 || g.Node.NetworkGbps != 400 || g.Node.Source == "" {
				t.Errorf("%s: node %+v", g.Name, *g.Node)
			}
		}
	}
	if !nodes["h100-sxm"] || !nodes["h200"] || !nodes["b200"] || nodes["rtx-4090"] {
		t.Errorf("GPUs with a node: %v", nodes)
	}
}
