package cli

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// TestPlanServe: plan --mode serve prints what vLLM logs at start-up, exits
// 0 when a request of --max-model-len fits the KV cache and 3 when it does
// not, and its JSON carries the same numbers.
func TestPlanServe(t *testing.T) {
	code, out, errs := run("plan", "--mode", "serve", "--model", "llama-3.1-8b", "--gpu", "rtx-3090", "--max-model-len", "20000", "--total-memory", "25318910689")
	if code != ExitOK || errs != "" {
		t.Fatalf("exit %d, stderr %q", code, errs)
	}
	for _, want := range []string{"# GPU blocks: 1946", "Maximum concurrency for 20000 tokens per request: 1.56x", "weights                14.99 GiB", "time to first token"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	code, out, _ = run("plan", "--mode", "serve", "--model", "llama-3-70b", "--gpu", "h100", "--json")
	if code != ExitDoesNotFit {
		t.Fatalf("70B bf16 on one H100: exit %d", code)
	}
	var j struct {
		Schema string `json:"schema"`
		Blocks int64  `json:"gpu_blocks"`
		Fits   bool   `json:"fits"`
	}
	if err := json.Unmarshal([]byte(out), &j); err != nil || j.Schema != "memplan.serve/v1" || j.Blocks != 0 || j.Fits {
		t.Errorf("JSON %+v (%v)", j, err)
	}
	code, out, _ = run("plan", "--mode", "serve", "--model", "llama-3-70b", "--gpu", "h100", "--tp", "4", "--quantization", "fp8", "--kv-cache-dtype", "fp8", "--max-model-len", "8192", "--json")
	if code != ExitOK || !strings.Contains(out, `"quantization": "fp8"`) || !strings.Contains(out, `"kv_cache_dtype": "float8_e4m3fn"`) {
		t.Errorf("fp8 70B on 4 H100s: exit %d\n%s", code, out)
	}
}

// TestPlanServeBadInput: one line naming the flag, exit 1, nothing on
// stdout.
func TestPlanServeBadInput(t *testing.T) {
	base := []string{"plan", "--mode", "serve", "--model", "llama-3-8b", "--gpu", "h100"}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--tp", "3"}, "--tp 3 must divide"},
		{[]string{"--micro-batch", "4"}, "--micro-batch does not apply to --mode serve"},
		{[]string{"--seq", "4096"}, "--seq does not apply"},
		{[]string{"--quantization", "marlin-3bit"}, `--quantization "marlin-3bit": want none, int8`},
		{[]string{"--dtype", "int3"}, "--dtype"},
		{[]string{"--dtype", "int8"}, "--dtype must be bfloat16"},
		{[]string{"--kv-cache-dtype", "int64"}, "--kv-cache-dtype must be"},
		{[]string{"--gpu-memory-utilization", "1.2"}, "--gpu-memory-utilization must be in (0, 1]"},
		{[]string{"--gpu-memory-utilization", "0"}, "--gpu-memory-utilization must be in (0, 1]"},
		{[]string{"--block-size", "0"}, "--block-size must be positive"},
		{[]string{"--max-model-len", "100000"}, "--max-model-len 100000 exceeds"},
		{[]string{"--max-num-batched-tokens", "1024"}, "--max-num-batched-tokens 1024 is smaller than --max-model-len"},
		{[]string{"--context", "9000"}, "--context must be in"},
		{[]string{"--prompt", "-1"}, "--prompt must be positive"},
		{[]string{"--total-memory", "lots"}, "--total-memory"},
		{[]string{"--total-memory", "0"}, "--total-memory"},
		{[]string{"--max-num-seqs", "0"}, "--max-num-seqs must be positive"},
		{[]string{"--vllm-version", "0.5"}, `--vllm-version must be 0.6 (vLLM 0.6.4's profiler) or 0.7 (vLLM 0.7's), got "0.5"`},
	} {
		code, out, errs := run(append(append([]string{}, base...), c.args...)...)
		if code != ExitBadInput || out != "" || !strings.Contains(errs, c.want) || strings.Count(strings.TrimSpace(errs), "\n") != 0 {
			t.Errorf("%v: exit %d, stdout %q, stderr %q (want %q)", c.args, code, out, errs, c.want)
		}
	}
	code, _, errs := run("plan", "--mode", "serve", "--model", "bert-base", "--gpu", "h100")
	if code != ExitBadInput || !strings.Contains(errs, "encoder") {
		t.Errorf("bert: exit %d, %q", code, errs)
	}
	code, _, errs = run("plan", "--mode", "serve", "--model", "llama-3-8b")
	if code != ExitBadInput || !strings.Contains(errs, "--gpu") {
		t.Errorf("no gpu: exit %d, %q", code, errs)
	}
}

// TestServeRefusesWhatItDoesNotRead: in --mode serve, every flag of plan
// and max that serve mode does not read is refused by name, so that a
// training or plot flag (--recipe, --set, --attention, --png, --fit-on, ...)
// is never accepted and ignored, a flag added to plan later included. Each
// is given its own default, which it must refuse all the same: given is
// not used.
func TestServeRefusesWhatItDoesNotRead(t *testing.T) {
	bases := map[string][]string{
		"plan": {"plan", "--mode", "serve", "--model", "llama-3.1-8b", "--gpu", "h100"},
		"max":  {"max", "--mode", "serve", "--model", "llama-3.1-8b", "--gpu", "h100", "--context", "4096", "--requests", "?"},
	}
	for name, c := range map[string]*cobra.Command{"plan": newPlanCmd(nil), "max": newMaxCmd(nil)} {
		c.Flags().VisitAll(func(f *pflag.Flag) {
			if serveReadsFlag(f.Name) {
				return
			}
			v := f.DefValue
			if _, ok := f.Value.(pflag.SliceValue); ok {
				v = "k=v"
			}
			args := append(append([]string{}, bases[name]...), "--"+f.Name+"="+v)
			code, out, errs := run(args...)
			want := "memplan: --" + f.Name + " does not apply to --mode serve\n"
			if code != ExitBadInput || out != "" || errs != want {
				t.Errorf("%s: exit %d, stdout %d bytes, stderr %q; want %q", strings.Join(args, " "), code, len(out), errs, want)
			}
		})
	}
	for _, r := range serveReads {
		if newPlanCmd(nil).Flags().Lookup(r) == nil && newMaxCmd(nil).Flags().Lookup(r) == nil {
			t.Errorf("serveReads names --%s, which neither plan nor max has", r)
		}
	}
	// The reproductions: flags of other modes with values no mode takes,
	// and a plot serve mode does not draw (and would not have written).
	png := filepath.Join(t.TempDir(), "s.png")
	for _, c := range []struct {
		args []string
		want string
	}{
		{append(bases["max"][1:], "--recipe", "/nonexistent", "--set", "nonsense=1", "--attention", "bogus"), "--attention does not apply"},
		{[]string{"--context", "4096", "--png", png, "--fit-on", "bogus", "--alloc-conf", "garbage", "--kernels", "cpu"}, "--alloc-conf does not apply"},
		{[]string{"--first-step=false"}, "--first-step does not apply"},
		{[]string{"--no-reserved"}, "--no-reserved does not apply"},
		{[]string{"--svg", "s.svg"}, "--svg does not apply"},
	} {
		args := append(append([]string{}, bases["plan"]...), c.args...)
		if c.args[0] == "--mode" {
			args = append([]string{"max"}, c.args...)
		}
		code, out, errs := run(args...)
		if code != ExitBadInput || out != "" || !strings.Contains(errs, c.want) || strings.Count(errs, "\n") != 1 {
			t.Errorf("%v: exit %d, stdout %d bytes, stderr %q; want one line with %q", args, code, len(out), errs, c.want)
		}
	}
	if _, err := os.Stat(png); err == nil {
		t.Errorf("a refused serve plan wrote %s", png)
	}
	// What serve mode reads is still taken.
	if code, _, errs := run("plan", "--mode", "serve", "--model", "llama-3.1-8b", "--gpu", "h100", "--tp", "2", "--json", "--no-timeline", "--no-chart"); code != ExitOK {
		t.Errorf("serve plan with --tp, --json, --no-timeline, --no-chart: exit %d, %q", code, errs)
	}
}

// TestOtherModesRefuseServeFlags is the converse: training and inference
// read none of serve mode's own flags, so each is refused by name, with its
// own default as the value (`plan --quantization zzz --block-size -1` was
// answered as if neither were given).
func TestOtherModesRefuseServeFlags(t *testing.T) {
	bases := map[string][]string{
		"plan": {"plan", "--model", "gpt2", "--seq", "128", "--no-timeline"},
		"max":  {"max", "--model", "gpt2", "--seq", "128", "--gpu", "h100", "--micro-batch", "?"},
	}
	fl := pflag.NewFlagSet("serve", pflag.ContinueOnError)
	(&serveFlags{}).register(fl)
	for _, mode := range []string{"train", "infer"} {
		for _, base := range bases {
			fl.VisitAll(func(f *pflag.Flag) {
				args := append(append([]string{}, base...), "--mode", mode, "--"+f.Name+"="+f.DefValue)
				code, out, errs := run(args...)
				want := "memplan: --" + f.Name + " applies to --mode serve, not --mode " + mode + "\n"
				if code != ExitBadInput || out != "" || errs != want {
					t.Errorf("%s: exit %d, stdout %d bytes, stderr %q; want %q", strings.Join(args, " "), code, len(out), errs, want)
				}
			})
		}
	}
}
