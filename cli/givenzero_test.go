package cli

import (
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// An integer flag given 0 (or less) where it takes at least 1 is refused in
// one line naming it, never run as the unset default the 0 also stands for
// (issue 15: plan --seq 0 planned the model's length, fit --gpus 0 and
// --global-batch 0 the plan's own).
func TestGivenBelowRefused(t *testing.T) {
	const snap = "../testdata/snapshots/MAGMA27__assignment2-systems__15883f2b__memory_snapshot.pickle"
	job := []string{"--model", "gpt2", "--gpu", "h100"}
	serving := []string{"--mode", "serve", "--model", "llama-3-8b", "--gpu", "h100"}
	type row struct {
		cmd   []string // the command and what it needs beside the flag
		flag  string
		least int
	}
	var rows []row
	for _, cmd := range []string{"plan", "compare", "fit"} {
		for _, fl := range []string{"seq", "micro-batch", "accum", "tp", "ep", "dp", "pp", "pp-interleave", "nodes", "gpus-per-node"} {
			rows = append(rows, row{append([]string{cmd}, job...), fl, 1})
		}
		rows = append(rows, row{append([]string{cmd}, job...), "gen-tokens", 0})
	}
	rows = append(rows,
		row{append([]string{"fit"}, job...), "gpus", 1},
		row{append([]string{"fit"}, job...), "global-batch", 1},
		row{append([]string{"max", "--micro-batch", "?"}, job...), "seq", 1},
		row{append([]string{"max", "--seq", "?"}, job...), "micro-batch", 1},
		row{append([]string{"max", "--context", "?"}, serving...), "requests", 1},
		row{[]string{"explain", snap, "--against", "flags", "--model", "gpt2"}, "seq", 1},
		row{[]string{"serve"}, "max-in-flight", 1},
		row{[]string{"serve"}, "max-queue", 1},
		row{[]string{"serve"}, "max-body", 1},
		row{[]string{"serve"}, "max-file-body", 1},
		row{[]string{"serve"}, "cache-bytes", 1},
	)
	for _, r := range rows {
		for v := r.least - 1; v >= r.least-2; v-- {
			args := append(append([]string{}, r.cmd...), "--"+r.flag, fmt.Sprint(v))
			code, out, errs := run(args...)
			want := fmt.Sprintf("memplan: --%s must be at least %d, got %d\n", r.flag, r.least, v)
			if code != 1 || out != "" || errs != want {
				t.Errorf("%q: exit %d, stdout %d bytes, stderr %q; want exit 1 and %q", args, code, len(out), errs, want)
			}
		}
	}
}

// zeroMeans are the integer flags whose 0 (or -1) given is a value of its
// own, not the unset default: each says what it means in its help.
var zeroMeans = map[string]string{
	"gen-tokens":    "generating no tokens",
	"zero":          "ZeRO stage 0",
	"device":        "-1: the device with the largest peak, as the help says",
	"cache-entries": "-1: no cache",
}

// Every integer flag of every command whose default is 0 or -1 (an unset
// value the command fills in) is checked by TestGivenBelowRefused or
// elsewhere when given, or named in zeroMeans: a new one must say which.
func TestIntFlagsWithUnsetDefaults(t *testing.T) {
	checked := map[string]bool{
		"seq": true, "nodes": true, "gpus-per-node": true, "gpus": true, "global-batch": true, "requests": true,
		"max-in-flight": true, "max-queue": true,
		// serve's vLLM flags refuse anything below 1 (serve_test.go), pack's
		// --node-gpus anything outside 1 to the pool (below).
		"max-model-len": true, "max-num-batched-tokens": true, "context": true, "prompt": true, "node-gpus": true,
	}
	root := NewRoot(io.Discard, io.Discard)
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		c.LocalFlags().VisitAll(func(f *pflag.Flag) {
			if t := f.Value.Type(); t != "int" && t != "int64" || f.DefValue != "0" && f.DefValue != "-1" {
				return
			}
			if !checked[f.Name] && zeroMeans[f.Name] == "" {
				t.Errorf("%s --%s: default %s; refuse it given below 1 (givenBelow) or say in zeroMeans what it means", c.CommandPath(), f.Name, f.DefValue)
			}
		})
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
	code, _, errs := run("pack", "../testdata/pack/mix.yaml", "--gpus", "8xh100", "--node-gpus", "0")
	if code != 1 || !strings.Contains(errs, "--node-gpus must be between 1 and the pool's 8 GPUs, got 0") {
		t.Errorf("pack --node-gpus 0: exit %d, %q", code, errs)
	}
	for _, args := range [][]string{{"serve", "--cache-entries", "0"}, {"serve", "--timeout", "0s"}, {"serve", "--queue-wait", "-1s"}} {
		code, _, errs := run(args...)
		if code != 1 || !strings.HasPrefix(errs, "memplan: "+args[1]+" must be") {
			t.Errorf("%q: exit %d, %q", args, code, errs)
		}
	}
}
