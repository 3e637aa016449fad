package cli

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/memplan/memplan/hw"
	"github.com/memplan/memplan/recipe"
	"github.com/memplan/memplan/units"
)

// plan, compare and fit decide "fits" against the same usable memory: the
// GPU's total less the recipe's cuda.overhead.
func TestSameUsableMemory(t *testing.T) {
	g, err := hw.Lookup("rtx-4090")
	if err != nil {
		t.Fatal(err)
	}
	for _, recipe := range []string{"hf", "litgpt"} {
		var p struct {
			Capacity units.Bytes `json:"capacity_bytes"`
		}
		var c struct {
			Capacity units.Bytes `json:"capacity_bytes"`
		}
		var f struct {
			Limit units.Bytes `json:"limit_bytes"`
		}
		args := []string{"--model", "llama-3.2-1b", "--gpu", "rtx-4090", "--seq", "512", "--recipe", recipe, "--json"}
		for _, x := range []struct {
			cmd string
			v   any
		}{{"plan", &p}, {"compare", &c}, {"fit", &f}} {
			a := append([]string{x.cmd}, args...)
			if x.cmd == "fit" {
				a = append(a, "--global-batch", "4")
			}
			code, out, errs := run(a...)
			if code != 0 {
				t.Fatalf("%v: exit %d: %s", a, code, errs)
			}
			if err := json.Unmarshal([]byte(out), x.v); err != nil {
				t.Fatalf("%v: %v", a, err)
			}
		}
		want := g.Capacity() - 400_000_000 // every recipe's cuda.overhead
		if p.Capacity != want || c.Capacity != want || f.Limit != want {
			t.Errorf("%s: plan %d, compare %d, fit %d bytes usable; want %d", recipe, p.Capacity, c.Capacity, f.Limit, want)
		}
	}
}

func TestRecipeFlags(t *testing.T) {
	code, out, errs := run("recipes")
	if code != 0 || !strings.Contains(out, "litgpt") || !strings.Contains(out, "lora.dropout") ||
		!strings.Contains(out, "pure-bf16") || !strings.Contains(out, "adamw4bit-torchao") || !strings.Contains(out, "low_bit_optim") {
		t.Errorf("recipes: exit %d %s %s", code, out, errs)
	}
	code, out, _ = run("recipes", "torchtune")
	if code != 0 || !strings.Contains(out, "chunked:chunks=8,fp32") || !strings.Contains(out, "ce_chunked_output_loss.py") {
		t.Errorf("recipes torchtune: %s", out)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"plan", "--recipe", "nemo"}, `--recipe "nemo": want one of deepspeed, hf, hf5, litgpt, megatron, pytorch, torchtitan, torchtune, a recipe file's path`},
		{[]string{"plan", "--set", "loss=chunky"}, `unknown loss "chunky"`},
		{[]string{"plan", "--set", "lora.dropout=both"}, "lora.dropout=\"both\": want per-target or shared"},
		{[]string{"plan", "--set", "colour=blue"}, `unknown switch "colour" (switches: precision`},
		{[]string{"plan", "--recipe", "/nonexistent/r.yaml"}, "no such file"},
		{[]string{"recipes", "nothing"}, `unknown recipe "nothing"`},
		{[]string{"plan", "--recipe", "torchtune", "--set", "optimizer.in-backward=true", "--accum", "2"}, "cannot accumulate"},
		{[]string{"plan", "--model", "llama-2-7b", "--recipe", "hf5"}, "llama-2-7b's checkpoint is float16 and loads so"},
	} {
		code, out, errs := run(c.args...)
		if code == 0 || out != "" || !strings.Contains(errs, c.want) || strings.Count(errs, "\n") != 1 {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want one line containing %q", c.args, code, out, errs, c.want)
		}
	}
	// A flag the user gives wins over the recipe's value.
	code, out, errs = run("plan", "--model", "gpt2", "--seq", "128", "--recipe", "litgpt", "--precision", "fp32", "--json", "--no-timeline")
	if code != 0 || !strings.Contains(out, `"precision": "fp32"`) {
		t.Errorf("explicit --precision under --recipe litgpt: exit %d %s %.300s", code, errs, out)
	}
}

// TestRecipeHF5 checks what transformers 5.x changes, through the CLI: the
// checkpoint's dtype (config.json torch_dtype) decides the precision unless
// --precision is given, the Trainer's default AdamW is fused, a mixture of
// experts runs grouped matmuls, and grouped heads are not copied.
func TestRecipeHF5(t *testing.T) {
	type plan struct {
		Precision string `json:"precision"`
		Impl      string `json:"optimizer_impl"`
		Ops       int    `json:"ops"`
		Saved     struct {
			Bytes int64 `json:"total_bytes"`
		} `json:"saved_activations"`
	}
	get := func(args ...string) plan {
		t.Helper()
		code, out, errs := run(append([]string{"plan", "--json", "--no-timeline", "--seq", "256"}, args...)...)
		var p plan
		if code != 0 && code != 3 {
			t.Fatalf("%v: exit %d: %s", args, code, errs)
		}
		if err := json.Unmarshal([]byte(out), &p); err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		return p
	}
	for _, c := range []struct {
		args           []string
		precision, opt string
	}{
		{[]string{"--model", "llama-3-8b", "--recipe", "hf5"}, "autocast-bf16", "fused"}, // bfloat16 checkpoint under bf16=True
		{[]string{"--model", "gpt2", "--recipe", "hf5"}, "amp-bf16", "fused"},            // no torch_dtype: float32 weights
		{[]string{"--model", "gemma-2-9b", "--recipe", "hf5"}, "amp-bf16", "fused"},      // torch_dtype float32
		{[]string{"--model", "llama-2-7b", "--recipe", "hf5", "--precision", "pure-fp16"}, "pure-fp16", "fused"},
		{[]string{"--model", "llama-3-8b", "--recipe", "hf5", "--precision", "amp-bf16"}, "amp-bf16", "fused"},
		{[]string{"--model", "llama-3-8b", "--recipe", "hf5", "--lora", "r=8", "--qlora"}, "amp-bf16", "fused"},
		{[]string{"--model", "llama-3-8b", "--recipe", "hf"}, "amp-bf16", "foreach"},
	} {
		if p := get(c.args...); p.Precision != c.precision || p.Impl != c.opt {
			t.Errorf("%v: precision %s, optimizer %s; want %s, %s", c.args, p.Precision, p.Impl, c.precision, c.opt)
		}
	}
	// Same precision and optimizer, so what is left is the attention's
	// copies of the grouped heads (8 query heads per key/value head) and
	// the experts: fewer bytes, and far fewer ops for the experts.
	same := []string{"--precision", "pure-bf16", "--optimizer-impl", "fused"}
	dense4, dense5 := get(append([]string{"--model", "llama-3-8b", "--recipe", "hf"}, same...)...), get(append([]string{"--model", "llama-3-8b", "--recipe", "hf5"}, same...)...)
	// SDPA saves repeat_kv's 4,096-wide copies of k and v under hf and the
	// 1,024-wide grouped heads under hf5: 32 layers × 2 × 256 tokens ×
	// 3,072 more bf16 values.
	if d := dense4.Saved.Bytes - dense5.Saved.Bytes; d != 32*2*256*3072*2 {
		t.Errorf("llama-3-8b: hf saves %d bytes more than hf5, want repeat_kv's copies, %d", d, 32*2*256*3072*2)
	}
	moe4, moe5 := get(append([]string{"--model", "mixtral-8x7b", "--recipe", "hf"}, same...)...), get(append([]string{"--model", "mixtral-8x7b", "--recipe", "hf5"}, same...)...)
	if moe5.Ops*2 > moe4.Ops {
		t.Errorf("mixtral-8x7b: hf5 %d ops, hf %d: the experts' loop should be one grouped matmul a projection", moe5.Ops, moe4.Ops)
	}
}

func TestValidatePublished(t *testing.T) {
	code, out, errs := run("validate", "--published", "../testdata/published/published.jsonl", "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	var j struct {
		Rows []struct {
			ID        string   `json:"id"`
			Measured  float64  `json:"measured_bytes"`
			Predicted float64  `json:"predicted_bytes"`
			RelError  *float64 `json:"rel_error"`
			Fits      *bool    `json:"fits"`
		} `json:"rows"`
	}
	if err := json.Unmarshal([]byte(out), &j); err != nil {
		t.Fatal(err)
	}
	if len(j.Rows) != 43 || j.Rows[0].ID == "" {
		t.Fatalf("%d rows", len(j.Rows))
	}
	// A tight tolerance fails with a non-zero exit, after printing.
	code, out, errs = run("validate", "--published", "../testdata/published/published.jsonl", "--tolerance", "0.01%")
	if code == 0 || !strings.Contains(out, "median |error|") || !strings.Contains(errs, "rows beyond 0.01%") {
		t.Errorf("tolerance 0.01%%: exit %d, stderr %q", code, errs)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"validate", "--published", "/nonexistent.jsonl"}, "no such file"},
		{[]string{"validate", "--published", "../testdata/published/FORMAT.md"}, "FORMAT.md:1: not a JSON object"},
		{[]string{"validate", "--published", "../testdata/published"}, "not a regular file"},
		{[]string{"validate", "--published", "../testdata/published/published.jsonl", "x.json"}, "not both"},
		{[]string{"validate"}, "give a measured file"},
	} {
		code, out, errs := run(c.args...)
		if code == 0 || out != "" || !strings.Contains(errs, c.want) || strings.Count(errs, "\n") != 1 {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want one line containing %q", c.args, code, out, errs, c.want)
		}
	}
}

// TestSetDisagreesWithFlag: a --set of a switch whose flag was also given
// (recipe.Switch.Flag) must say the same thing; --set silently won (plan
// --precision fp32 --set precision=pure-bf16 planned pure-bf16). When they
// disagree both are named in one line; when they agree, in any spelling,
// the plan is the flag's.
func TestSetDisagreesWithFlag(t *testing.T) {
	base := []string{"plan", "--model", "gpt2", "--seq", "512", "--json", "--no-timeline"}
	for _, sw := range recipe.Switches() {
		if sw.Flag != "" && newPlanCmd(nil).Flags().Lookup(sw.Flag) == nil {
			t.Errorf("switch %s names --%s, which plan does not take", sw.Key, sw.Flag)
		}
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--precision", "fp32", "--set", "precision=pure-bf16"}, "--precision fp32 and --set precision=pure-bf16 disagree"},
		{[]string{"--optimizer", "sgd", "--set", "optimizer=adamw"}, "--optimizer sgd and --set optimizer=adamw disagree"},
		{[]string{"--checkpoint", "full", "--set", "checkpoint=none"}, "--checkpoint full and --set checkpoint=none disagree"},
		{[]string{"--attention", "eager", "--set", "attention=sdpa"}, "--attention eager and --set attention=sdpa disagree"},
		{[]string{"--optimizer-impl", "fused", "--set", "optimizer.impl=foreach"}, "--optimizer-impl fused and --set optimizer.impl=foreach disagree"},
		// A recipe's own value still yields to the flag; the --set does not.
		{[]string{"--recipe", "litgpt", "--precision", "fp32", "--set", "precision=bf16-true"}, "--precision fp32 and --set precision=bf16-true disagree"},
	} {
		for _, cmd := range []string{"plan", "compare"} {
			args := append([]string{cmd, "--model", "gpt2", "--seq", "512"}, c.args...)
			code, out, errs := run(args...)
			if code != ExitBadInput || out != "" || errs != "memplan: "+c.want+"\n" {
				t.Errorf("%v: exit %d, stdout %d bytes, stderr %q; want %q", args, code, len(out), errs, c.want)
			}
		}
	}
	// --alloc-conf is plan's alone; it silently replaced the --set.
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--set", "cuda.alloc-conf=expandable_segments:True", "--alloc-conf", "max_split_size_mb:64"},
			"--alloc-conf max_split_size_mb:64 and --set cuda.alloc-conf=expandable_segments:True disagree"},
		{[]string{"--recipe", "hf", "--set", "cuda.alloc-conf=", "--alloc-conf", "expandable_segments:True"},
			`--alloc-conf expandable_segments:True and --set cuda.alloc-conf= disagree`},
		{[]string{"--alloc-conf", "bogus:1"}, "--alloc-conf: "},
	} {
		code, out, errs := run(append(append([]string{}, base...), c.args...)...)
		if code != ExitBadInput || out != "" || !strings.HasPrefix(errs, "memplan: "+c.want) || strings.Count(errs, "\n") != 1 {
			t.Errorf("%v: exit %d, stdout %d bytes, stderr %q; want %q", c.args, code, len(out), errs, c.want)
		}
	}
	code, out, errs := run(append(append([]string{}, base...), "--gpu", "h100", "--alloc-conf", "expandable_segments:True", "--set", "cuda.alloc-conf=expandable_segments:True")...)
	if code != 0 || !strings.Contains(out, `"expandable_segments": true`) {
		t.Errorf("--alloc-conf and --set agreeing: exit %d, stderr %q", code, errs)
	}
	for _, c := range []struct {
		args      []string
		precision string
	}{
		{[]string{"--precision", "fp32", "--set", "precision=fp32"}, "fp32"},
		{[]string{"--precision", "amp-bf16", "--set", "precision=bf16-mixed"}, "amp-bf16"},
		{[]string{"--optimizer", "sgd", "--set", "optimizer=sgd", "--checkpoint", "full", "--set", "checkpoint=full"}, "amp-bf16"},
		{[]string{"--set", "precision=pure-bf16"}, "pure-bf16"},
	} {
		code, out, errs := run(append(append([]string{}, base...), c.args...)...)
		var j struct {
			Precision string `json:"precision"`
		}
		if code != 0 || json.Unmarshal([]byte(out), &j) != nil || j.Precision != c.precision {
			t.Errorf("%v: exit %d, precision %q (want %s), stderr %q", c.args, code, j.Precision, c.precision, errs)
		}
	}
}

// Overheads that leave the GPU no memory for tensors are refused: a usable
// memory clamped to 0 read as no GPU given, and plan printed no verdict
// (JSON fits false, capacity 0, exit 0). Just under the GPU's memory, the
// job is judged (it does not fit).
func TestOverheadsLeavingNoMemory(t *testing.T) {
	base := []string{"plan", "--model", "llama-3.2-1b", "--seq", "128", "--gpu", "h100", "--json", "--no-timeline"}
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--set", "cuda.overhead=100TB"}, ExitBadInput, "memplan: cuda.overhead 90.95 TiB leaves none of the h100-sxm's 79.19 GiB for tensors\n"},
		{[]string{"--dp", "2", "--set", "nccl.overhead=90GB"}, ExitBadInput, "(a communicator per parallel group) leave none of the h100-sxm's 79.19 GiB for tensors\n"},
		{[]string{"--set", "cuda.overhead=85GB"}, ExitDoesNotFit, ""},
		{[]string{"--budget", "10GiB", "--set", "cuda.overhead=100TB"}, ExitDoesNotFit, ""},
		// Overheads past any GPU are refused on their switch; their sum
		// wrapped, and plan said "Fits (4194307.08 TiB usable)".
		{[]string{"--dp", "2", "--tp", "2", "--set", "cuda.overhead=4194303TiB", "--set", "nccl.overhead=4194303TiB"}, ExitBadInput,
			"memplan: --set cuda.overhead=\"4194303TiB\": over the limit of 1024.00 TiB (no GPU holds a TiB) (allowed: bytes, e.g. 1343MiB or 0)\n"},
		{[]string{"--dp", "2", "--tp", "2", "--pp", "2", "--accum", "2", "--set", "nccl.overhead=3000000TiB"}, ExitBadInput, "over the limit of 1024.00 TiB (no GPU holds a TiB) (allowed: bytes per communicator, e.g. 544MB or 0)\n"},
		{[]string{"--dp", "2", "--tp", "2", "--set", "cuda.overhead=1TiB", "--set", "nccl.overhead=1TiB"}, ExitBadInput, "leave none of the h100-sxm's 79.19 GiB for tensors\n"},
		{[]string{"--recipe", "../testdata/adversarial/recipe_overflow.yaml"}, ExitBadInput, `cuda.overhead="4194303TiB": over the limit of 1024.00 TiB (no GPU holds a TiB) (allowed: bytes, e.g. 1343MiB or 0)` + "\n"},
		{[]string{"--set", "cuda.cublas-workspace=9223372036854775807"}, ExitBadInput, "over the limit of 1024.00 TiB (no GPU holds a TiB) (allowed: auto (32 MiB on compute capability 9.0, else 8519680), or bytes per thread, e.g. 0)\n"},
	} {
		code, out, errs := run(append(append([]string{}, base...), c.args...)...)
		if code != c.code || !strings.HasSuffix(errs, c.want) || (c.code == ExitBadInput) != (out == "") {
			t.Errorf("%v: exit %d, stderr %q, stdout %d bytes; want exit %d, stderr ending %q", c.args, code, errs, len(out), c.code, c.want)
		}
	}
}

// The plan's header and JSON name the optimizer step it planned: an
// optimizer with one step plans it whatever the default or a recipe says,
// and a step the user asks for that the optimizer lacks is refused in one
// line (torch.optim.RMSprop takes no fused=True; lion-pytorch loops over
// parameters; bitsandbytes runs its own kernel).
func TestOptimizerImplPlanned(t *testing.T) {
	job := []string{"plan", "--model", "gpt2", "--seq", "64", "--no-timeline", "--no-chart"}
	for _, c := range []struct {
		args []string
		want string // the header's optimizer, or the refusal
	}{
		{[]string{"--optimizer", "lion"}, "lion (single)"},
		{[]string{"--optimizer", "adafactor"}, "adafactor (single)"},
		{[]string{"--optimizer", "adamw8bit"}, "adamw8bit (fused)"},
		{[]string{"--optimizer", "adamw4bit-torchao"}, "adamw4bit-torchao (fused)"},
		{[]string{"--optimizer", "lion", "--recipe", "torchtune"}, "lion (single)"},        // the recipe's fused AdamW step
		{[]string{"--optimizer", "rmsprop", "--recipe", "torchtune"}, "rmsprop (foreach)"}, // ditto: PyTorch's default
		{[]string{"--optimizer", "rmsprop", "--optimizer-impl", "single"}, "rmsprop (single)"},
		{[]string{"--optimizer", "lion", "--optimizer-impl", "foreach"}, "--optimizer-impl foreach: lion has only single"},
		{[]string{"--optimizer", "adamw8bit", "--optimizer-impl", "single"}, "--optimizer-impl single: adamw8bit has only fused"},
		{[]string{"--optimizer", "rmsprop", "--optimizer-impl", "fused"}, "--optimizer-impl fused: rmsprop has only foreach and single"},
		{[]string{"--optimizer", "lion", "--set", "optimizer.impl=fused"}, "--set optimizer.impl=fused: lion has only single"},
		{[]string{"--set", "optimizer=rmsprop", "--set", "optimizer.impl=fused"}, "--set optimizer.impl=fused: rmsprop has only foreach and single"},
	} {
		code, out, errs := run(append(job, c.args...)...)
		refused := strings.HasPrefix(c.want, "--")
		switch {
		case refused && (code != 1 || strings.TrimSpace(errs) != "memplan: "+c.want || out != ""):
			t.Errorf("%v: exit %d, stderr %q; want exit 1 and %q", c.args, code, errs, c.want)
		case !refused && (code != 0 || !strings.Contains(strings.SplitN(out, "\n", 2)[0], " · "+c.want+" · ")):
			t.Errorf("%v: exit %d %s, header %q; want %q", c.args, code, errs, strings.SplitN(out, "\n", 2)[0], c.want)
		}
		if refused {
			continue
		}
		code, out, _ = run(append(append(job, c.args...), "--json")...)
		var p struct {
			Impl string `json:"optimizer_impl"`
		}
		if err := json.Unmarshal([]byte(out), &p); code != 0 || err != nil || !strings.HasSuffix(c.want, "("+p.Impl+")") {
			t.Errorf("%v --json: exit %d, optimizer_impl %q; want the one of %q", c.args, code, p.Impl, c.want)
		}
	}
	// compare offers a fused step only to an optimizer that has one.
	for opt, want := range map[string]bool{"lion": false, "rmsprop": false, "adamw": true} {
		code, out, errs := run("compare", "--model", "gpt2", "--seq", "64", "--optimizer", opt)
		if code != 0 || strings.Contains(out, "fused optimizer step") != want {
			t.Errorf("compare --optimizer %s: exit %d %s; fused optimizer step offered: %v, want %v", opt, code, errs, !want, want)
		}
	}
}
