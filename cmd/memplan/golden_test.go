package main

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/memplan/memplan/cli"
)

var update = flag.Bool("update", false, "rewrite testdata/golden/* from the current outputs")

// golden are the README's examples (plan, compare, max, fit) whose outputs are pinned byte for byte: a refactor must
// leave every one of them as it was. `go test ./cmd/memplan -run TestGolden -update` rewrites them after a change
// that is meant to move a number (say why in the commit).
var golden = []struct {
	name string
	args []string
	// code is the exit status (cli.ExitOK unless the example does not fit).
	code int
}{
	// README "The two commands": make demo.
	{"plan-demo.json", []string{"plan", "--model", "llama-3-8b", "--gpu", "h100", "--micro-batch", "1", "--seq", "4096", "--precision", "bf16", "--json"}, cli.ExitDoesNotFit},
	{"plan-demo.txt", []string{"plan", "--model", "llama-3-8b", "--gpu", "h100", "--micro-batch", "1", "--seq", "4096", "--precision", "bf16"}, cli.ExitDoesNotFit},
	// README "What it prints" (the text, the chart and the plot).
	{"plan-llama-3.2-1b.json", []string{"plan", "--model", "llama-3.2-1b", "--gpu", "rtx-4090", "--micro-batch", "4", "--seq", "2048", "--json"}, cli.ExitDoesNotFit},
	{"plan-llama-3.2-1b.txt", []string{"plan", "--model", "llama-3.2-1b", "--gpu", "rtx-4090", "--micro-batch", "4", "--seq", "2048", "--svg", "{dir}/timeline.svg"}, cli.ExitDoesNotFit},
	// README "What fits subtracts": recipes.
	{"plan-litgpt-lora.json", []string{"plan", "--model", "llama-2-7b", "--gpu", "a100-40gb", "--seq", "1304", "--recipe", "litgpt", "--lora", "r=8,alpha=16,dropout=0.05,targets=qkv_proj", "--json"}, cli.ExitOK},
	{"plan-torchtune-in-backward.json", []string{"plan", "--model", "llama-3-8b", "--gpu", "h100", "--recipe", "torchtune", "--set", "optimizer.in-backward=true", "--json"}, cli.ExitOK},
	// README "Any PyTorch model": a trace, with and without the measured workload.
	{"plan-graph.json", []string{"plan", "--graph", "../../testdata/torch/lm.trace.json", "--micro-batch", "64", "--checkpoint", "modules=layers.*", "--gpu", "a100", "--json"}, cli.ExitOK},
	{"plan-graph-workload.json", []string{"plan", "--graph", "../../testdata/torch/lm.trace.json", "--workload", "../../testdata/torch/workloads/lm.yaml", "--json"}, cli.ExitOK},
	// README "Strategies": compare on 8 H100s, fit at global batch 64.
	{"compare-llama-3-8b.json", []string{"compare", "--model", "llama-3-8b", "--gpu", "h100", "--micro-batch", "4", "--seq", "4096", "--precision", "bf16", "--dp", "8", "--json"}, cli.ExitNothingFits},
	{"compare-llama-3-8b.txt", []string{"compare", "--model", "llama-3-8b", "--gpu", "h100", "--micro-batch", "4", "--seq", "4096", "--precision", "bf16", "--dp", "8"}, cli.ExitNothingFits},
	// README "The largest that fits": max (its example had drifted from 5903 to 5570 unseen: sweep F, round 25).
	{"max-llama-3.2-1b-seq.txt", []string{"max", "--model", "llama-3.2-1b", "--gpu", "rtx-4090", "--micro-batch", "1", "--seq", "?", "--checkpoint", "full"}, cli.ExitOK},
	{"fit-llama-3-8b.json", []string{"fit", "--model", "llama-3-8b", "--gpu", "h100", "--gpus", "8", "--global-batch", "64", "--seq", "4096", "--precision", "bf16", "--json"}, cli.ExitOK},
}

// TestGolden runs the README's examples in process and compares their outputs (and the plot one of them writes)
// with testdata/golden byte for byte.
func TestGolden(t *testing.T) {
	dir := t.TempDir()
	for _, g := range golden {
		t.Run(g.name, func(t *testing.T) {
			args := make([]string, len(g.args))
			for i, a := range g.args {
				args[i] = strings.ReplaceAll(a, "{dir}", dir)
			}
			var out, errb bytes.Buffer
			if code := cli.Main(args, &out, &errb); code != g.code {
				t.Fatalf("memplan %s: exit %d, want %d: %s", strings.Join(args, " "), code, g.code, errb.String())
			}
			check(t, g.name, out.Bytes())
			for _, a := range args {
				if strings.HasPrefix(a, dir) {
					b, err := os.ReadFile(a)
					if err != nil {
						t.Fatal(err)
					}
					check(t, strings.TrimSuffix(g.name, filepath.Ext(g.name))+"."+filepath.Base(a), b)
				}
			}
		})
	}
}

func check(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("..", "..", "testdata", "golden", name)
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		gl, wl := strings.Split(string(got), "\n"), strings.Split(string(want), "\n")
		for i := 0; i < len(gl) && i < len(wl); i++ {
			if gl[i] != wl[i] {
				t.Fatalf("%s differs at line %d:\n got: %.300s\nwant: %.300s", name, i+1, gl[i], wl[i])
			}
		}
		t.Fatalf("%s differs in length: %d lines, want %d", name, len(gl), len(wl))
	}
}
