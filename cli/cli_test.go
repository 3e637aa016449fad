package cli

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

func run(args ...string) (int, string, string) {
	var out, errb bytes.Buffer
	code := Main(args, &out, &errb)
	if code != 0 {
		record(errb.String())
	}
	return code, out.String(), errb.String()
}

// Bad input gets one line naming the problem, a non-zero exit, no output on
// stdout and never a panic.
func TestBadInput(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "config.json")
	os.WriteFile(bad, []byte(`{"model_type": "llama", "hidden_size": 4096}`), 0o644)
	trunc := filepath.Join(dir, "trunc.json")
	os.WriteFile(trunc, []byte(`{"model_type": "gpt2", "n_embd": 7`), 0o644)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"plan", "--model", "lama-2-7b"}, "did you mean llama-2-7b"},
		{[]string{"plan", "--model", bad}, "num_hidden_layers"},
		{[]string{"plan", "--model", trunc}, "invalid JSON"},
		{[]string{"plan", "--micro-batch", "0"}, "--micro-batch"},
		{[]string{"plan", "--micro-batch", "-3"}, "--micro-batch"},
		{[]string{"plan", "--seq", "-1"}, "--seq"},
		{[]string{"plan", "--accum", "0"}, "--accum"},
		{[]string{"plan", "--precision", "fp8"}, "--precision \"fp8\": want one of"},
		{[]string{"plan", "--optimizer", "lamb"}, "--optimizer \"lamb\": want one of"},
		{[]string{"plan", "--optimizer-impl", "turbo"}, "--optimizer-impl \"turbo\": want one of foreach"},
		{[]string{"plan", "--attention", "linear"}, "--attention \"linear\": want eager or sdpa"},
		{[]string{"plan", "--gpu", "h1000"}, "--gpu \"h1000\": not a GPU of the catalog"},
		{[]string{"plan", "--mode", "serving"}, "--mode \"serving\": want train or infer"},
		{[]string{"plan", "--budget", "lots"}, "--budget"},
		{[]string{"plan", "--budget", "-4GiB"}, "--budget"},
		{[]string{"plan", "--host-memory", "lots"}, "--host-memory"},
		{[]string{"plan", "--host-memory", "0"}, "--host-memory: bad size"},
		{[]string{"fit", "--gpu", "h100", "--host-memory", "-1GiB"}, "--host-memory"},
		{[]string{"compare", "--gpus-per-node", "0"}, "--gpus-per-node must be at least 1"},
		{[]string{"plan", "--mode", "serve", "--gpu", "h100", "--model", "llama-3-8b", "--host-memory", "1TiB"}, "--host-memory does not apply to --mode serve"},
		{[]string{"plan", "--seq", "4096"}, "exceeds gpt2's 1024 learned positions"},
		{[]string{"plan", "--micro-batch", "banana"}, `--micro-batch "banana": want a whole number`},
		{[]string{"plan", "--no-such-flag"}, "unknown flag"},
		{[]string{"plan", "extra"}, "unknown command"},
		{[]string{"plan", "--kernels", "tpu"}, "--kernels"},
		{[]string{"plan", "--svg", filepath.Join(dir, "missing", "x.svg")}, "cannot write"},
		{[]string{"plan", "--mode", "infer", "--accum", "2"}, "--accum applies to training only"},
		{[]string{"frobnicate"}, "unknown command"},
		// Arguments cobra ignored or worded without the command (exit 0, or
		// "accepts at most 1 arg(s), received 2").
		{[]string{"completion", "nope"}, `unknown command "nope" for "memplan completion": want one of bash, fish, powershell, zsh`},
		{[]string{"help", "nope"}, `help: no command "nope" (memplan help lists them)`},
		{[]string{"help", "plan", "extra"}, `help: no command "plan extra"`},
		{[]string{"-v", "plan"}, `--version prints memplan's version and takes nothing else: got "-v", "plan"`},
		{[]string{"--version", "extra"}, `--version prints memplan's version and takes nothing else`},
		{[]string{"plan", "--model", "gpt2", "--version"}, `--version prints memplan's version and takes nothing else`},
		{[]string{"recipes", "hf", "extra"}, `recipes takes [NAME|FILE]: got 2 arguments ("hf", "extra")`},
		{[]string{"validate", "a", "b"}, `validate takes MEASURED.json: got 2 arguments ("a", "b")`},
		// A switch or an offload given twice: the last silently won.
		{[]string{"plan", "--set", "precision=fp32", "--set", "precision=bf16"}, "--set precision given twice (precision=fp32, then precision=bf16): give it once"},
		{[]string{"plan", "--offload", "params,params"}, `--offload "params,params": params given twice`},
		{[]string{"plan", "--offload", "params,parameters"}, `--offload "params,parameters": params given twice`},
		{[]string{"plan", "--offload", "none,activations"}, `--offload "none,activations": none offloads nothing and stands alone`},
		{[]string{"plan", "--offload", "activations,"}, `--offload "activations,": an empty item`},
		{[]string{"plan", "--checkpoint", "every=0"}, "positive integer"},
		{[]string{"plan", "--zero", "3"}, "needs --dp of at least 2"},
		{[]string{"plan", "--graph", filepath.Join(dir, "none.json")}, "none.json"},
		{[]string{"plan", "--graph", trunc}, "trunc.json"},
		{[]string{"plan", "--workload", "../testdata/torch/workloads/lm.yaml"}, "--workload needs --graph"},
		{[]string{"plan", "--graph", "../testdata/torch/lm.trace.json", "--model", "gpt2"}, "not both"},
		{[]string{"plan", "--graph", "../testdata/torch/lm.trace.json", "--tp", "2"}, "rebuild the model's graph"},
		{[]string{"plan", "--graph", "../testdata/torch/lm.trace.json", "--precision", "bf16"}, "--precision does not apply"},
		{[]string{"plan", "--graph", "../testdata/torch/lm.trace.json", "--workload", "../testdata/torch/workloads/lm.yaml", "--accum", "3"}, "--accum disagrees"},
		{[]string{"plan", "--graph", "../testdata/torch/resnet18.trace.json", "--seq", "99"}, "sequence dimension"},
		{[]string{"plan", "--zero", "5", "--dp", "4"}, "--zero 5: want 0, 1, 2 or 3"},
		{[]string{"plan", "--dp", "0"}, "--dp"},
		{[]string{"plan", "--offload", "disk"}, `--offload "disk": want activations, optimizer or params`},
		{[]string{"plan", "--offload", "params", "--dp", "4"}, "--zero 3"},
		{[]string{"plan", "--fsdp", "--zero", "2", "--dp", "4"}, "--fsdp is ZeRO-3"},
		{[]string{"plan", "--pp", "64", "--accum", "64"}, "stages"},
		{[]string{"plan", "--pp", "2", "--pp-schedule", "zigzag"}, "schedule"},
		{[]string{"plan", "--mode", "infer", "--dp", "2"}, "training only"},
		{[]string{"plan", "--model", "llama-3.2-1b", "--tp", "3"}, "divide"},
		{[]string{"plan", "--tp", "0"}, "--tp"},
		{[]string{"plan", "--sp"}, "--sp needs --tp above 1"},
		{[]string{"plan", "--qlora"}, "--qlora needs --lora"},
		{[]string{"plan", "--lora", "r=0"}, "--lora"},
		{[]string{"plan", "--lora", "r=8,targets=nonexistent_proj"}, "nonexistent_proj"},
		{[]string{"plan", "--model", "gpt2", "--ep", "2"}, "expert"},
		{[]string{"plan", "--checkpoint", "modules=nothing.*"}, "no module matches"},
		{[]string{"plan", "--checkpoint", "sometimes"}, `--checkpoint "sometimes": want none, full`},
		{[]string{"plan", "--mode", "infer", "--checkpoint", "full"}, "training only"},
	} {
		code, out, errs := run(tc.args...)
		if code == 0 {
			t.Errorf("%v: exit 0", tc.args)
			continue
		}
		if out != "" {
			t.Errorf("%v: wrote to stdout: %q", tc.args, out)
		}
		if strings.Count(strings.TrimRight(errs, "\n"), "\n") != 0 {
			t.Errorf("%v: error is not one line: %q", tc.args, errs)
		}
		if !strings.HasPrefix(errs, "memplan: ") || !strings.Contains(errs, tc.want) {
			t.Errorf("%v: error %q does not contain %q", tc.args, errs, tc.want)
		}
	}
}

func TestPlanJSONFields(t *testing.T) {
	code, out, errs := run("plan", "--model", "gpt2", "--gpu", "rtx-4090", "--micro-batch", "4", "--seq", "512", "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	var j map[string]any
	if err := json.Unmarshal([]byte(out), &j); err != nil {
		t.Fatal(err)
	}
	get := func(path string) any {
		var v any = j
		for _, k := range strings.Split(path, ".") {
			m, ok := v.(map[string]any)
			if !ok {
				return nil
			}
			v = m[k]
		}
		return v
	}
	for _, f := range []string{"peak.bytes", "peak.phase", "peak.op", "phases.forward.peak_bytes", "phases.backward.peak_bytes",
		"phases.optimizer.peak_bytes", "ledger.parameters", "ledger.gradients", "ledger.optimizer_state", "ledger.activations",
		"ledger.temporaries", "ledger.other", "model_states.parameters", "model_states.gradients", "model_states.optimizer_state",
		"saved_activations.total_bytes", "saved_activations.by_module", "params", "fits", "capacity_bytes", "timeline"} {
		if get(f) == nil {
			t.Errorf("JSON has no %s", f)
		}
	}
	if get("params").(float64) != 124439808 {
		t.Errorf("params = %v", get("params"))
	}
	if _, ok := get("saved_activations.by_module").(map[string]any)["transformer.h.0"]; !ok {
		t.Error("by_module has no transformer.h.0")
	}
	if tl := get("timeline").([]any); len(tl) != int(get("ops").(float64)) {
		t.Errorf("timeline has %d events for %v ops", len(tl), get("ops"))
	}
}

func TestPlanTextAndLists(t *testing.T) {
	code, out, errs := run("plan", "--model", "llama-3-8b", "--gpu", "h100", "--seq", "4096", "--precision", "bf16")
	if code != ExitDoesNotFit {
		t.Fatalf("exit %d, want %d (does not fit): %s", code, ExitDoesNotFit, errs)
	}
	for _, want := range []string{"Peak", "DOES NOT FIT", "Next step: ", "Ledger at the peak", "Peak of each phase", "Model states", "h100-sxm"} {
		if !strings.Contains(out, want) {
			t.Errorf("text report lacks %q:\n%s", want, out)
		}
	}
	if code, out, _ := run("models"); code != 0 || !strings.Contains(out, "llama-3-70b") || !strings.Contains(out, "70,553,706,496") {
		t.Errorf("models: exit %d\n%s", code, out)
	}
	if code, out, _ := run("gpus"); code != 0 || !strings.Contains(out, "h200") {
		t.Errorf("gpus: exit %d\n%s", code, out)
	}
}

// FuzzPlanFlags drives `memplan plan` with arbitrary sizes and names: it must
// exit 0 with output, or 1 with one line on stderr (after any warnings), and
// never panic.
func FuzzPlanFlags(f *testing.F) {
	f.Add("gpt2", "64", "1", "1", "amp-bf16", "adamw", "sdpa", "train", "0", "", false, false)
	f.Add("llama-3.2-1b", "2147483647", "2147483647", "3", "bf16", "sgd", "eager", "infer", "9", "rtx-4090", true, true)
	f.Add("bert-base", "-1", "0", "x", "fp32", "adafactor", "eager", "train", "-2", "t4", true, false)
	f.Add("vit-base", "1", "99999999", "1", "amp-fp16", "adamw8bit", "sdpa", "infer", "0", "h100", false, true)
	// The limits' edges (issue 15): a million micro-steps (three simulated),
	// accum past 2^30, tokens past 2^34, eager scores of 2^25 tokens, a
	// micro-batch that wraps int64 when multiplied, generated tokens past
	// the token limit.
	f.Add("llama-3.2-1b", "512", "1", "1000000", "amp-bf16", "adamw", "sdpa", "train", "0", "", false, false)
	f.Add("gpt2", "128", "1", "1073741825", "amp-bf16", "adamw", "sdpa", "train", "0", "rtx-4090", true, true)
	f.Add("llama-3.2-1b", "131072", "131072", "1", "bf16", "adamw", "sdpa", "train", "0", "t4", true, false)
	f.Add("llama-3-70b", "33554432", "1", "1", "bf16", "adamw", "eager", "train", "0", "h100", false, true)
	f.Add("gpt2", "1024", "4611686018427387904", "4", "fp32", "sgd", "sdpa", "train", "0", "", false, false)
	// The text report with a GPU and the first step: the reserved line once
	// panicked when the first step's capped replay ran out of memory.
	f.Add("llama-3.2-1b", "1024", "1", "1", "amp-bf16", "adamw", "sdpa", "train", "0", "rtx-4090", true, true)
	f.Add("llama-3.2-1b", "1", "1", "1", "bf16", "adamw", "sdpa", "infer", "17179869184", "rtx-4090", true, true)
	f.Fuzz(func(t *testing.T, model, seq, mb, accum, prec, opt, att, mode, gen, gpu string, text, first bool) {
		args := []string{"plan", "--model", model, "--seq", seq, "--micro-batch", mb, "--accum", accum,
			"--precision", prec, "--optimizer", opt, "--attention", att, "--mode", mode, "--gen-tokens", gen,
			"--first-step=" + strconv.FormatBool(first)}
		if gpu != "" {
			args = append(args, "--gpu", gpu)
		}
		if !text {
			args = append(args, "--json", "--no-timeline")
		}
		code, out, errs := run(args...)
		// Warnings come first, one line each; an error is the last line.
		lines := strings.Split(strings.TrimRight(errs, "\n"), "\n")
		if errs == "" {
			lines = nil
		}
		for _, l := range lines[:max(len(lines)-1, 0)] {
			if !strings.HasPrefix(l, "memplan: warning: ") {
				t.Fatalf("%v: stderr line %q is neither a warning nor the last", args, l)
			}
		}
		switch code {
		case 0, ExitDoesNotFit: // the report is printed either way
			if out == "" || len(lines) > 0 && !strings.HasPrefix(lines[len(lines)-1], "memplan: warning: ") {
				t.Fatalf("%v: exit 0 with stdout %d bytes, stderr %q", args, len(out), errs)
			}
		case 1:
			if out != "" || len(lines) == 0 || !strings.HasPrefix(lines[len(lines)-1], "memplan: ") || strings.HasPrefix(lines[len(lines)-1], "memplan: warning: ") {
				t.Fatalf("%v: bad failure output: stdout %q stderr %q", args, out, errs)
			}
		default:
			t.Fatalf("%v: exit %d", args, code)
		}
	})
}

func TestCompare(t *testing.T) {
	code, out, errs := run("compare", "--model", "llama-3.2-1b", "--gpu", "rtx-4090", "--micro-batch", "4", "--seq", "1024", "--allow", "8bit", "--json")
	if code != ExitDoesNotFit { // the baseline does not fit; strategies do
		t.Fatalf("exit %d: %s", code, errs)
	}
	var j struct {
		Rows []struct {
			Strategy  string  `json:"strategy"`
			Applies   bool    `json:"applies"`
			PeakBytes float64 `json:"peak_bytes"`
			Extra     float64 `json:"extra_flops"`
			StepS     float64 `json:"step_s"`
		} `json:"strategies"`
	}
	if err := json.Unmarshal([]byte(out), &j); err != nil {
		t.Fatal(err)
	}
	if len(j.Rows) < 6 || j.Rows[0].Strategy != "baseline" {
		t.Fatalf("rows: %+v", j.Rows)
	}
	base := j.Rows[0]
	for _, r := range j.Rows[1:] {
		if !r.Applies {
			continue
		}
		switch {
		case strings.HasPrefix(r.Strategy, "checkpoint every block"):
			if r.PeakBytes >= base.PeakBytes || r.Extra <= 0 || r.StepS <= base.StepS {
				t.Errorf("full checkpoint: %+v vs baseline %+v", r, base)
			}
		case strings.HasPrefix(r.Strategy, "accumulate"):
			if r.PeakBytes >= base.PeakBytes || r.Extra != 0 {
				t.Errorf("accumulation: %+v vs baseline %+v", r, base)
			}
		}
	}
	if code, _, errs := run("compare", "--allow", "everything"); code == 0 || !strings.Contains(errs, `--allow "everything": want lora`) {
		t.Errorf("bad --allow: exit %d, %q", code, errs)
	}
}

// The trace path: replaying the committed lm trace with the workload the
// suite measured gives the measured per-phase peaks (testdata/torch).
func TestPlanGraphWorkload(t *testing.T) {
	code, out, errs := run("plan", "--graph", "../testdata/torch/lm.trace.json", "--workload", "../testdata/torch/workloads/lm_ckpt.yaml", "--json", "--no-timeline")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	var j struct {
		Checkpoint string `json:"checkpoint"`
		Peak       struct {
			Bytes float64 `json:"bytes"`
			Phase string  `json:"phase"`
		} `json:"peak"`
	}
	if err := json.Unmarshal([]byte(out), &j); err != nil {
		t.Fatal(err)
	}
	if j.Checkpoint != "modules=layers.*" || j.Peak.Phase != "backward" || j.Peak.Bytes <= 0 {
		t.Errorf("unexpected plan: %+v", j)
	}
}

func TestFit(t *testing.T) {
	code, out, errs := run("fit", "--model", "llama-3.2-1b", "--gpu", "rtx-4090", "--global-batch", "16", "--seq", "1024", "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	var j struct {
		Considered int `json:"considered"`
		Winner     struct {
			Plan      string  `json:"plan"`
			PeakBytes float64 `json:"peak_bytes"`
			Verified  bool    `json:"verified"`
		} `json:"winner"`
		Limit float64 `json:"limit_bytes"`
	}
	if err := json.Unmarshal([]byte(out), &j); err != nil {
		t.Fatal(err)
	}
	if !j.Winner.Verified || j.Winner.PeakBytes > j.Limit || j.Considered == 0 {
		t.Errorf("fit: %+v", j)
	}
	for _, bad := range [][]string{
		{"fit", "--model", "gpt2"},
		{"fit", "--model", "gpt2", "--gpu", "t4", "--headroom", "2"},
		{"fit", "--model", "gpt2", "--gpu", "t4", "--allow", "everything"},
		{"fit", "--graph", "../testdata/torch/lm.trace.json", "--gpu", "t4"},
		{"fit", "--model", "gpt2", "--gpu", "t4", "--search-memory", "1KiB"},
		{"fit", "--model", "gpt2", "--gpu", "t4", "--search-memory", "lots"},
		{"fit", "--model", "gpt2", "--gpu", "t4", "--search-memory", "9999999TiB"},
	} {
		if code, out, errs := run(bad...); code == 0 || out != "" || !strings.HasPrefix(errs, "memplan: ") || strings.Count(errs, "\n") != 1 {
			t.Errorf("%v: exit %d, stdout %q, stderr %q", bad, code, out, errs)
		} else if bad[len(bad)-2] == "--search-memory" && !strings.Contains(errs, "--search-memory") {
			t.Errorf("%v: %q does not name the flag", bad, errs)
		} else if v := bad[len(bad)-1]; v == "9999999TiB" && !strings.Contains(errs, "over the limit") {
			t.Errorf("%v: %q says not what is wrong (too large, not too small)", bad, errs)
		}
	}
}

// A GPU without the precision's arithmetic (the T4 predates bfloat16) is
// refused up front, naming the precisions it runs.
func TestPrecisionTheGPULacks(t *testing.T) {
	for _, cmd := range [][]string{
		{"plan", "--model", "gpt2", "--gpu", "t4", "--seq", "256"},
		{"fit", "--model", "gpt2", "--gpu", "t4", "--gpus", "2", "--global-batch", "8", "--seq", "256"},
		{"compare", "--model", "gpt2", "--gpu", "t4", "--seq", "256"},
	} {
		code, out, errs := run(cmd...)
		want := "memplan: the t4 has no bfloat16 arithmetic (--precision amp-bf16); it runs --precision fp32, amp-fp16, fp16, pure-fp16\n"
		if code == 0 || out != "" || errs != want {
			t.Errorf("%v: exit %d, stdout %q, stderr %q, want %q", cmd, code, out, errs, want)
		}
	}
	if code, _, errs := run("plan", "--model", "gpt2", "--gpu", "t4", "--seq", "256", "--precision", "amp-fp16"); code != 0 {
		t.Errorf("amp-fp16 on a t4: exit %d: %s", code, errs)
	}
}
