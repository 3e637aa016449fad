package cli

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

// Every exit status, from every command that gives it: 0 fits (or nothing
// to fit), 3 does not fit, 4 nothing fits, 1 bad input.
func TestExitStatuses(t *testing.T) {
	for _, c := range []struct {
		args []string
		code int
		want string // in stdout (stderr for status 1 and fit's 4)
	}{
		{[]string{"plan", "--model", "gpt2", "--gpu", "h100", "--no-chart"}, ExitOK, "Fits on h100"},
		{[]string{"plan", "--model", "gpt2", "--no-chart"}, ExitOK, "Peak"},
		{[]string{"plan", "--model", "gpt2", "--budget", "1GiB", "--no-chart"}, ExitDoesNotFit, "Next step: "},
		{[]string{"plan", "--model", "gpt2", "--budget", "1GiB", "--json", "--no-timeline"}, ExitDoesNotFit, `"next_step"`},
		{[]string{"plan", "--model", "gpt2", "--gpu", "h100", "--offload", "optimizer", "--host-memory", "1GiB", "--no-chart"}, ExitDoesNotFit, "DOES NOT FIT in host memory"},
		// --host-memory is a limit of its own: over it, no GPU given, or
		// the fit decided on the reserved peak, the job does not fit.
		{[]string{"plan", "--model", "gpt2", "--offload", "optimizer", "--host-memory", "1KiB", "--no-chart"}, ExitDoesNotFit, "DOES NOT FIT in host memory"},
		{[]string{"plan", "--model", "gpt2", "--offload", "optimizer", "--host-memory", "64GiB", "--no-chart"}, ExitOK, "Host memory peak"},
		{[]string{"plan", "--model", "gpt2", "--gpu", "h100", "--offload", "optimizer", "--host-memory", "1KiB", "--fit-on", "reserved", "--json", "--no-timeline"}, ExitDoesNotFit, `"fits": false`},
		// ... and the device's shortfall stays the device's (not the
		// negative "reserved peak less capacity" of a device that fits).
		{[]string{"plan", "--model", "gpt2", "--gpu", "h100", "--offload", "optimizer", "--host-memory", "1KiB", "--fit-on", "reserved", "--json", "--no-timeline"}, ExitDoesNotFit, `"shortfall_bytes": 0,`},
		{[]string{"compare", "--model", "gpt2", "--gpu", "h100", "--offload", "optimizer", "--host-memory", "1GiB"}, ExitNothingFits, "host/node"},
		{[]string{"compare", "--model", "gpt2", "--gpu", "h100"}, ExitOK, "baseline"},
		{[]string{"compare", "--model", "gpt2", "--budget", "3GiB", "--micro-batch", "2"}, ExitDoesNotFit, "checkpoint every block"},
		{[]string{"compare", "--model", "gpt2", "--budget", "100MiB"}, ExitNothingFits, "baseline"},
		{[]string{"diagnose", "--model", "gpt2", "--gpu", "h100"}, ExitOK, "micro-batch ×2"},
		{[]string{"diagnose", "--model", "gpt2", "--budget", "1GiB"}, ExitDoesNotFit, "micro-batch ×2"},
		// Over --host-memory is not fitting, to diagnose as to plan.
		{[]string{"diagnose", "--model", "gpt2", "--gpu", "h100", "--offload", "optimizer", "--host-memory", "1GiB"}, ExitDoesNotFit, "micro-batch ×2"},
		{[]string{"diagnose", "--model", "llama-3.2-1b", "--gpu", "rtx-4090", "--seq", "1024", "--offload", "activations", "--host-memory", "1GiB"}, ExitDoesNotFit, "next step: "},
		{[]string{"diagnose", "--model", "gpt2", "--gpu", "h100", "--offload", "optimizer", "--host-memory", "64GiB"}, ExitOK, "micro-batch ×2"},
		// --checkpoint auto that no choice of blocks fits plans every block
		// and reports a job that does not fit, not bad input.
		{[]string{"plan", "--model", "gpt2", "--gpu", "l4", "--seq", "1024", "--micro-batch", "64", "--checkpoint", "auto", "--no-chart"}, ExitDoesNotFit, "checkpoint auto (none fits: all 12 blocks)"},
		{[]string{"plan", "--model", "gpt2", "--gpu", "l4", "--seq", "1024", "--micro-batch", "64", "--checkpoint", "auto", "--json", "--no-timeline"}, ExitDoesNotFit, `"checkpoint_auto_none_fits": true`},
		{[]string{"compare", "--model", "gpt2", "--gpu", "l4", "--seq", "1024", "--micro-batch", "64", "--checkpoint", "auto"}, ExitDoesNotFit, "accumulate ×2"},
		// max under auto: the peak can fall as the micro-batch grows (auto
		// picks other blocks); its closing line says what does hold.
		{[]string{"max", "--model", "gpt2", "--gpu", "l4", "--seq", "1024", "--micro-batch", "?", "--checkpoint", "auto"}, ExitOK, "--checkpoint auto picks other blocks as the micro-batch grows, but the blocks that fit a value fit every smaller one"},
		{[]string{"compare", "--model", "gpt2", "--gpu", "l4", "--seq", "1024", "--micro-batch", "64"}, ExitDoesNotFit, "none fits: every block checkpointed"},
		{[]string{"diagnose", "--model", "gpt2", "--gpu", "l4", "--seq", "1024", "--micro-batch", "64", "--checkpoint", "auto"}, ExitDoesNotFit, "no checkpointing"},
		// diagnose SNAPSHOT: out of memory on the device given is 3, as
		// plan's; fitting it is 0 (they were the other way round).
		{[]string{"diagnose", "../testdata/snapshots/MAGMA27__assignment2-systems__15883f2b__memory_snapshot.pickle", "--capacity", "1GiB"}, ExitDoesNotFit, "runs out of memory"},
		{[]string{"diagnose", "../testdata/snapshots/MAGMA27__assignment2-systems__15883f2b__memory_snapshot.pickle", "--gpu", "h100"}, ExitOK, "fits in"},
		{[]string{"max", "--model", "gpt2", "--gpu", "rtx-4090", "--micro-batch", "?"}, ExitOK, "Largest micro-batch that fits: "},
		{[]string{"max", "--model", "gpt2", "--budget", "100MiB", "--micro-batch", "?"}, ExitNothingFits, "Nothing fits: even micro-batch 1"},
		{[]string{"fit", "--model", "gpt2", "--gpu", "h100", "--global-batch", "4"}, ExitOK, "Fastest plan that fits"},
		{[]string{"fit", "--model", "gpt2", "--gpu", "h100", "--budget", "100MiB", "--global-batch", "1"}, ExitNothingFits, "no plan fits"},
		{[]string{"fit", "--model", "gpt2", "--gpu", "h100", "--global-batch", "4", "--gen-tokens", "3"}, ExitOK, "Fastest plan that fits"},
		{[]string{"plan", "--model", "lama-2-7b"}, ExitBadInput, "not a catalog model"},
		{[]string{"max", "--model", "lama-2-7b", "--micro-batch", "?"}, ExitBadInput, "not a catalog model"},
		{[]string{"fit", "--model", "gpt2", "--gpu", "h100", "--allow", "magic"}, ExitBadInput, "--allow"},
		{[]string{"--version"}, ExitOK, "memplan "},
	} {
		code, out, errs := run(c.args...)
		if code != c.code {
			t.Errorf("%v: exit %d, want %d; stderr %q", c.args, code, c.code, errs)
			continue
		}
		where := out
		if code == ExitBadInput || c.args[0] == "fit" && code == ExitNothingFits {
			where = errs
			var lines []string
			for _, l := range strings.SplitAfter(errs, "\n") {
				if l != "" && !strings.HasPrefix(l, "memplan: warning: ") {
					lines = append(lines, l)
				}
			}
			if out != "" || len(lines) != 1 {
				t.Errorf("%v: stdout %q, stderr %q: want one line on stderr only", c.args, out, errs)
			}
		}
		if !strings.Contains(where, c.want) {
			t.Errorf("%v: output lacks %q:\n%s", c.args, c.want, where)
		}
	}
}

// The statuses are documented where a user looks: memplan --help and the
// help of each command that gives them.
func TestExitStatusesDocumented(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {"plan", "--help"}, {"max", "--help"}, {"compare", "--help"}} {
		code, out, _ := run(args...)
		if code != 0 || !strings.Contains(out, "Exit status: 0 the job fits") || !strings.Contains(out, "3 it does not fit") ||
			!strings.Contains(out, "4 nothing fits") || !strings.Contains(out, "1 bad input") {
			t.Errorf("%v: exit %d, help does not document the exit statuses:\n%s", args, code, out)
		}
	}
}

// Every warning: its line on stderr, the same sentence in the JSON's
// warnings, and the plan still made.
func TestWarnings(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--budget", "24"}, "--budget 24 has no unit: read as 24 bytes"},
		{[]string{"--gpu", "h100", "--budget", "24GiB"}, "--budget 24.00 GiB replaces the h100-sxm's usable memory"},
		{[]string{"--gpu", "h100", "--budget", "200GiB"}, "--budget 200.00 GiB is more than the h100-sxm's 79.19 GiB of memory"},
		// Within the 79.19 GiB plan reports usable, not the datasheet's 74.51.
		{[]string{"--gpu", "h100", "--budget", "76GiB"}, "--budget 76.00 GiB replaces the h100-sxm's usable memory"},
		{[]string{"--mode", "infer", "--optimizer", "sgd"}, "--optimizer applies to training; ignored with --mode infer"},
		{[]string{"--mode", "infer", "--optimizer-impl", "fused"}, "--optimizer-impl applies to training"},
		{[]string{"--mode", "infer", "--first-step=false"}, "--first-step applies to training"},
		{[]string{"--mode", "infer", "--set", "optimizer=sgd"}, "--set optimizer applies to training; ignored with --mode infer"},
		{[]string{"--mode", "infer", "--set", "optimizer.impl=fused"}, "--set optimizer.impl applies to training"},
		{[]string{"--mode", "infer", "--set", "optimizer.in-backward=true"}, "--set optimizer.in-backward applies to training"},
		{[]string{"--mode", "infer", "--set", "optimizer.paged=true"}, "--set optimizer.paged applies to training"},
		{[]string{"--mode", "infer", "--set", "loss=chunked:chunks=4"}, "--set loss applies to training"},
		{[]string{"--mode", "infer", "--set", "loop.hold-outputs=true"}, "--set loop.hold-outputs applies to training"},
		{[]string{"--mode", "infer", "--set", "loop.zero-grad=in-place"}, "--set loop.zero-grad applies to training"},
		{[]string{"--mode", "infer", "--set", "checkpoint=full"}, "--set checkpoint applies to training"},
		{[]string{"--pp-schedule", "gpipe"}, "--pp-schedule applies to pipeline parallelism"},
		{[]string{"--pp-interleave", "2"}, "--pp-interleave applies to pipeline parallelism"},
		{[]string{"--gpu", "h100", "--kernels", "cpu"}, "--kernels cpu plans CPU kernels' memory"},
		{[]string{"--gen-tokens", "5"}, "--gen-tokens applies to inference (--mode infer); ignored in training"},
		{[]string{"--model", "vit-base", "--seq", "77"}, "--seq is ignored: vit-base takes 224×224 images, 197 tokens"},
		{[]string{"--model", "tinyllama-1.1b", "--seq", "4096"}, "--seq 4096 is beyond tinyllama-1.1b's 2048 positions"},
		{[]string{"--model", "tinyllama-1.1b", "--mode", "infer", "--seq", "2000", "--gen-tokens", "100"}, "--seq 2000 + --gen-tokens 100 is beyond tinyllama-1.1b's 2048 positions"},
	} {
		args := append([]string{"plan", "--no-chart"}, c.args...)
		code, _, errs := run(args...)
		if code == ExitBadInput {
			t.Errorf("%v: exit 1: %s", args, errs)
			continue
		}
		if !strings.Contains(errs, "memplan: warning: "+c.want) {
			t.Errorf("%v: stderr %q lacks the warning %q", args, errs, c.want)
		}
		code, out, _ := run(append(args, "--json", "--no-timeline")...)
		var j struct {
			Warnings []string `json:"warnings"`
		}
		if err := json.Unmarshal([]byte(out), &j); err != nil {
			t.Errorf("%v --json: exit %d: %v", args, code, err)
			continue
		}
		if !strings.Contains(strings.Join(j.Warnings, "\n"), c.want) {
			t.Errorf("%v --json: warnings %q lack %q", args, j.Warnings, c.want)
		}
	}
	// An ignored input is dropped: vit plans its own tokens, not 77.
	_, out, _ := run("plan", "--model", "vit-base", "--seq", "77", "--json", "--no-timeline")
	if !strings.Contains(out, `"seq": 197`) {
		t.Errorf("vit with --seq 77 did not plan 197 tokens:\n%.400s", out)
	}
	// A recipe's training-only switches do not apply to inference, nor are
	// they the user's to be warned about: torchtitan's selective-op
	// checkpointing was refused as "--checkpoint applies to training only".
	// A --set of a switch inference uses is no warning.
	for _, args := range [][]string{{"--recipe", "torchtitan"}, {"--recipe", "torchtune"}, {"--set", "attention=eager"}, {"--set", "cuda.overhead=0"}} {
		if code, _, errs := run(append([]string{"plan", "--model", "gpt2", "--mode", "infer", "--no-chart"}, args...)...); code != 0 || errs != "" {
			t.Errorf("infer %v: exit %d, stderr %q", args, code, errs)
		}
	}
	// No warning without a reason.
	if _, _, errs := run("plan", "--model", "gpt2", "--gpu", "h100", "--no-chart"); errs != "" {
		t.Errorf("a plain plan warns: %q", errs)
	}
}

// max answers with the value plan agrees on: plan at the answer fits (exit
// 0), plan one past it does not (exit 3).
func TestMaxAgreesWithPlan(t *testing.T) {
	for _, c := range []struct {
		dim  string
		args []string
	}{
		{"micro-batch", []string{"--model", "gpt2", "--gpu", "rtx-4090", "--seq", "512"}},
		// Beyond the answer no choice of blocks fits: auto plans every
		// block, which does not fit, and the search goes on.
		{"micro-batch", []string{"--model", "gpt2", "--gpu", "l4", "--seq", "1024", "--checkpoint", "auto"}},
		// Host memory, not the GPU, stops it.
		{"micro-batch", []string{"--model", "gpt2", "--gpu", "h100", "--seq", "1024", "--offload", "activations", "--host-memory", "8GiB"}},
		{"seq", []string{"--model", "llama-3.2-1b", "--gpu", "rtx-4090", "--checkpoint", "full", "--micro-batch", "2"}},
		{"gen-tokens", []string{"--model", "llama-3.2-1b", "--gpu", "rtx-4090", "--mode", "infer", "--micro-batch", "64", "--seq", "1024"}},
	} {
		code, out, errs := run(append([]string{"max", "--" + c.dim, "?", "--json"}, c.args...)...)
		if code != 0 {
			t.Fatalf("max --%s: exit %d: %s", c.dim, code, errs)
		}
		var j struct {
			Dimension string          `json:"dimension"`
			Value     int             `json:"value"`
			Step      int             `json:"step"`
			AtCap     bool            `json:"at_cap"`
			At        json.RawMessage `json:"at"`
			Beyond    json.RawMessage `json:"beyond"`
		}
		if err := json.Unmarshal([]byte(out), &j); err != nil {
			t.Fatal(err)
		}
		if j.Dimension != c.dim || j.Value < 1 || j.AtCap || j.At == nil || j.Beyond == nil {
			t.Fatalf("max --%s: %s", c.dim, out[:min(len(out), 400)])
		}
		for _, v := range []struct{ val, code int }{{j.Value, ExitOK}, {j.Value + j.Step, ExitDoesNotFit}} {
			args := append([]string{"plan", "--no-chart", "--no-reserved", "--" + c.dim, fmt.Sprint(v.val)}, c.args...)
			if code, _, errs := run(args...); code != v.code {
				t.Errorf("%v: exit %d, want %d (max said %d): %s", args, code, v.code, j.Value, errs)
			}
		}
	}
}

// max's own bad input: one line, exit 1, nothing on stdout.
func TestMaxBadInput(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"max", "--model", "gpt2", "--gpu", "h100"}, "give it the value '?'"},
		{[]string{"max", "--model", "gpt2", "--gpu", "h100", "--micro-batch", "?", "--seq", "?"}, "--micro-batch and --seq were all given '?'"},
		{[]string{"max", "--model", "vit-base", "--gpu", "h100", "--seq", "?"}, "vit-base takes images of a fixed size; it has no --seq to solve for"},
		{[]string{"max", "--model", "gpt2", "--gpu", "h100", "--gen-tokens", "?"}, "--gen-tokens applies to inference (--mode infer)"},
		{[]string{"max", "--model", "bert-base", "--gpu", "h100", "--mode", "infer", "--gen-tokens", "?"}, "bert-base is an encoder"},
		{[]string{"max", "--model", "gpt2", "--micro-batch", "?"}, "max needs a --gpu or a --budget"},
		{[]string{"max", "--model", "gpt2", "--gpu", "h100", "--micro-batch", "??"}, `--micro-batch "??": want a whole number or '?'`},
		{[]string{"max", "--model", "gpt2", "--gpu", "h100", "--seq", "?", "--mode", "infer", "--gen-tokens", "1024"}, "no --seq fits in gpt2's 1024 positions less 1024 generated tokens"},
	} {
		code, out, errs := run(c.args...)
		if code != ExitBadInput || out != "" || strings.Count(errs, "\n") != 1 || !strings.Contains(errs, c.want) {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want one line with %q", c.args, code, out, errs, c.want)
		}
	}
	// The search's bound is said as such: gpt2's 1024 positions fit an H100.
	code, out, _ := run("max", "--model", "gpt2", "--gpu", "h100", "--seq", "?")
	if code != 0 || !strings.Contains(out, "Largest seq that fits: 1024, the bound of the search (gpt2's 1024 positions)") {
		t.Errorf("exit %d:\n%s", code, out)
	}
}

// --total-memory above the GPU's warns as --budget does (it was taken
// silently: 1 TiB on an H100 held 56 requests).
func TestTotalMemoryOverGPUWarns(t *testing.T) {
	base := []string{"plan", "--mode", "serve", "--model", "llama-3.1-8b", "--gpu", "h100"}
	for _, c := range []struct{ total, want string }{
		{"1TiB", "memplan: warning: --total-memory 1.00 TiB is more than the h100-sxm's 79.19 GiB of memory\n"},
		{"79GiB", ""},
	} {
		code, _, errs := run(append(append([]string{}, base...), "--total-memory", c.total)...)
		if code == ExitBadInput || errs != c.want {
			t.Errorf("--total-memory %s: exit %d, stderr %q; want %q", c.total, code, errs, c.want)
		}
	}
}
