package cli

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fit --emit writes the winner's framework config (to --emit-out whole, or
// after the report); a winner the framework cannot express is one line
// naming the dimension, exit 1, and no file.
func TestFitEmit(t *testing.T) {
	dir := t.TempDir()
	job := []string{"fit", "--model", "gpt2", "--gpu", "a100", "--gpus", "4", "--global-batch", "16", "--seq", "256"}
	out := filepath.Join(dir, "tt.yaml")
	code, stdout, errs := run(append(job, "--recipe", "torchtune", "--zero", "3", "--offload", "none", "--tp", "1", "--pp", "1",
		"--emit", "torchtune", "--emit-out", out, "--json")...)
	if code != ExitOK {
		t.Fatalf("exit %d: %s", code, errs)
	}
	var j struct {
		Winner struct {
			MicroBatch int `json:"micro_batch"`
			Accum      int `json:"accum"`
		} `json:"winner"`
		Emitted struct {
			Framework, File string
		} `json:"emitted"`
	}
	if err := json.Unmarshal([]byte(stdout), &j); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	cfg := string(b)
	if j.Emitted.File != out || j.Emitted.Framework != "torchtune" || !strings.Contains(cfg, "full_finetune_distributed") ||
		!strings.Contains(cfg, "fsdp_reshard_after_forward: True") || !strings.Contains(cfg, "batch_size: "+itoa(j.Winner.MicroBatch)+"\n") {
		t.Errorf("emitted %+v:\n%s", j.Emitted, cfg)
	}
	// Without --emit-out the config follows the report.
	code, stdout, errs = run(append(job, "--recipe", "deepspeed", "--tp", "1", "--pp", "1", "--sp=false", "--emit", "deepspeed")...)
	if code != ExitOK || !strings.Contains(stdout, "The winner's deepspeed config") || !strings.Contains(stdout, `"train_micro_batch_size_per_gpu"`) {
		t.Errorf("exit %d: %s %s", code, stdout, errs)
	}
	// Refused: litgpt has no tensor parallelism.
	refused := filepath.Join(dir, "lit.yaml")
	code, _, errs = run(append(job, "--recipe", "litgpt", "--tp", "2", "--emit", "litgpt", "--emit-out", refused)...)
	if code != ExitBadInput || !strings.Contains(errs, "--emit litgpt cannot express this plan's --tp") || strings.Count(strings.TrimSpace(errs), "\n") > 0 {
		t.Errorf("exit %d: %q", code, errs)
	}
	if _, err := os.Stat(refused); !os.IsNotExist(err) {
		t.Errorf("a refused config was written: %v", err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Errorf("left behind: %v", ents)
	}
}

func TestFitEmitBadInput(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--emit", "nemo"}, `--emit "nemo": want one of deepspeed, accelerate, torchtune, litgpt`},
		{[]string{"--emit-out", "x.json"}, "--emit-out needs --emit"},
		{[]string{"--emit", "torchtune"}, "--emit torchtune plans the run with --recipe torchtune, not --recipe hf"},
		{[]string{"--emit", "accelerate", "--recipe", "litgpt"}, "--recipe hf or --recipe deepspeed"},
		{[]string{"--emit", "deepspeed", "--recipe", "deepspeed", "--emit-out", "/no/such/dir/ds.json"}, "its directory does not exist"},
		// The optimizer is the job's, not a dimension fit searches: no
		// pin or --deny to suggest, and no "this plan's --emit".
		{[]string{"--emit", "deepspeed", "--recipe", "deepspeed", "--optimizer", "sgd"}, "--emit deepspeed cannot express this plan, as DeepSpeed's Adam and AdamW are its fused kernels (fused adam or adamw here, not fused sgd)\n"},
	} {
		code, _, errs := run(append([]string{"fit", "--model", "gpt2", "--gpu", "a100", "--global-batch", "4"}, c.args...)...)
		if code != ExitBadInput || !strings.Contains(errs, c.want) || strings.Contains(errs, "this plan's --emit") {
			t.Errorf("%v: exit %d, %q, want %q", c.args, code, errs, c.want)
		}
	}
}
