package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"
)

// probes are issue 15's adversarial inputs (commands and the outcome each
// must have): every one ends with its exit status and, when refused, one
// line saying why, within probeTime and probeRSS. Each ran out of memory,
// hung, panicked or answered wrongly before the limits, the bounded readers
// and the short accumulation. {dir} is a temporary directory holding the
// files setupProbes writes; {fifo} a named pipe in it.
var probes = []struct {
	args []string
	code int
	// want is a substring of stdout+stderr; a refusal (code 1) must be a
	// single line.
	want string
}{
	// --accum: every micro-step was built (131 s and 12.6 GB at 10,000).
	{[]string{"plan", "--model", "llama-3.2-1b", "--seq", "512", "--accum", "10000"}, 0, "accum 10000 (3 simulated"},
	{[]string{"plan", "--model", "llama-3.2-1b", "--seq", "512", "--accum", "1000000", "--json"}, 0, `"simulated_accum": 3`},
	{[]string{"plan", "--model", "llama-3.2-1b", "--seq", "512", "--accum", "10000000"}, 0, "accum 10000000 (3 simulated"},
	{[]string{"plan", "--model", "llama-3.2-1b", "--seq", "512", "--accum", "2147483647"}, 1, "--accum 2147483647 is over the limit of 1073741824"},
	{[]string{"plan", "--model", "gpt2", "--seq", "128", "--accum", "100000", "--pp", "2"}, 1, "over the limit of 1024 micro-steps for a pipeline"},
	// Byte arithmetic wrapped silently.
	{[]string{"plan", "--model", "llama-3-70b", "--attention", "eager", "--seq", "33554432", "--json"}, 1, "allocates more than 4 EiB"},
	{[]string{"plan", "--model", "llama-3-70b", "--attention", "eager", "--seq", "1073741824"}, 1, "2^58 elements"},
	{[]string{"plan", "--graph", "{testdata}/torch/lm.trace.json", "--micro-batch", "4611686018427387904", "--budget", "1GiB"}, 1, "--micro-batch 4611686018427387904 × --seq 64 is over the limit of 2^34 tokens"},
	{[]string{"plan", "--model", "gpt2", "--micro-batch", "9223372036854775807"}, 1, "2^34 tokens"},
	{[]string{"plan", "--model", "gpt2", "--tp", "4096", "--pp", "4096", "--dp", "4"}, 1, "over the limit of 16777216 GPUs"},
	{[]string{"fit", "--model", "gpt2", "--gpu", "h100", "--global-batch", "1099511627776"}, 1, "--global-batch 1099511627776 is over the limit of 16777216"},
	{[]string{"fit", "--model", "gpt2", "--gpu", "h100", "--headroom", "NaN"}, 1, "--headroom NaN must be in [0, 1)"},
	{[]string{"fit", "--model", "gpt2", "--gpu", "h100", "--gpus", "1000000000", "--global-batch", "1000000000"}, 1, "over the limit of 16777216"},
	// A 253-byte config.json of 4096 layers × 4096 experts ran out of memory.
	{[]string{"plan", "--model", "{dir}/moe.json", "--seq", "128"}, 1, "4096 layers × 4096 experts: over the limit"},
	// Readers: /dev/zero read until memory ran out; a named pipe hung.
	{[]string{"plan", "--model", "/dev/zero"}, 1, "/dev/zero: not a regular file (a device)"},
	{[]string{"plan", "--graph", "/dev/zero"}, 1, "not a regular file (a device)"},
	{[]string{"plan", "--model", "{fifo}"}, 1, "not a regular file (a named pipe)"},
	{[]string{"plan", "--graph", "{fifo}"}, 1, "not a regular file (a named pipe)"},
	{[]string{"plan", "--graph", "{testdata}/torch/lm.trace.json", "--workload", "{fifo}"}, 1, "not a regular file (a named pipe)"},
	{[]string{"plan", "--model", "gpt2", "--recipe", "{fifo}"}, 1, "not a regular file (a named pipe)"},
	{[]string{"plan", "--model", "gpt2", "--cluster", "/dev/zero"}, 1, "--cluster: cannot read /dev/zero: not a regular file"},
	{[]string{"plan", "--model", "{dir}"}, 1, "no config.json in this directory"},
	{[]string{"plan", "--model", "{dir}/big/config.json"}, 1, "file too large"},
	{[]string{"diagnose", "/dev/zero"}, 1, "not a regular file (a device)"},
	{[]string{"explain", "{fifo}"}, 1, "not a regular file (a named pipe)"},
	// Writers: a pipe given as --svg is refused, not replaced or blocked on.
	{[]string{"plan", "--model", "gpt2", "--seq", "128", "--svg", "{dir}/pipe.svg"}, 1, "not a regular file (a named pipe)"},
}

const (
	probeTime = 10 * time.Second
	probeRSS  = 2 << 30
)

func TestProbes(t *testing.T) {
	if testing.Short() {
		t.Skip("builds memplan and runs it per probe")
	}
	if runtime.GOOS != "linux" {
		t.Skip("measures each probe's peak RSS through Linux's rusage")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "memplan")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	files := setupProbes(t, dir)
	testdata, err := filepath.Abs("../../testdata")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range probes {
		args := make([]string, len(p.args))
		for i, a := range p.args {
			a = strings.ReplaceAll(a, "{testdata}", testdata)
			a = strings.ReplaceAll(a, "{fifo}", files.fifo)
			args[i] = strings.ReplaceAll(a, "{dir}", files.dir)
		}
		name := strings.Join(p.args, " ")
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), probeTime)
			defer cancel()
			// ulimit -v stops a probe that runs away (8 GiB of address
			// space: Go reserves more than it touches); RSS is checked below.
			cmd := exec.CommandContext(ctx, "bash", append([]string{"-c", `ulimit -v 8388608 2>/dev/null; exec "$0" "$@"`, bin}, args...)...)
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			start := time.Now()
			err := cmd.Run()
			took := time.Since(start)
			if ctx.Err() != nil {
				t.Fatalf("still running after %v (hung or too slow)", probeTime)
			}
			code := 0
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				code = ee.ExitCode()
			} else if err != nil {
				t.Fatal(err)
			}
			text := out.String()
			if code != p.code || !strings.Contains(text, p.want) {
				t.Errorf("exit %d, want %d with %q; output:\n%.2000s", code, p.code, p.want, text)
			}
			if strings.Contains(text, "panic:") || strings.Contains(text, "goroutine ") {
				t.Errorf("panicked:\n%.2000s", text)
			}
			if p.code == 1 && len(refusal(text)) != 1 {
				t.Errorf("refusal in more than one line:\n%s", text)
			}
			if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok && ru.Maxrss*1024 > probeRSS {
				t.Errorf("peak RSS %d MiB, over %d MiB", ru.Maxrss/1024, probeRSS>>20)
			}
			t.Logf("%v", took.Round(time.Millisecond))
		})
	}
	if ents, _ := os.ReadDir(files.dir); len(ents) != 4 {
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		t.Errorf("files left in the probes' directory: %v", names)
	}
}

// refusal is the output's lines but warnings.
func refusal(text string) []string {
	var out []string
	for _, l := range strings.Split(strings.TrimSpace(text), "\n") {
		if !strings.HasPrefix(l, "memplan: warning:") {
			out = append(out, l)
		}
	}
	return out
}

type probeFiles struct{ dir, fifo string }

// setupProbes writes the probes' files: moe.json (the 300-byte
// Mixtral config.json of 4096 layers × 4096 experts, hidden 64), big/
// config.json (2 MiB, over the 1 MiB cap) and two named pipes (fifo,
// pipe.svg); nothing else may be left in it after the probes.
func setupProbes(t *testing.T, root string) probeFiles {
	dir := filepath.Join(root, "probes")
	if err := os.MkdirAll(filepath.Join(dir, "big"), 0o755); err != nil {
		t.Fatal(err)
	}
	moe := `{"model_type":"mixtral","hidden_size":64,"intermediate_size":64,"num_hidden_layers":4096,"num_attention_heads":4,"num_key_value_heads":4,"vocab_size":100,"num_local_experts":4096,"num_experts_per_tok":2,"max_position_embeddings":512,"rms_norm_eps":1e-5}`
	if err := os.WriteFile(filepath.Join(dir, "moe.json"), []byte(moe), 0o644); err != nil {
		t.Fatal(err)
	}
	big := `{"model_type":"llama","pad":"` + strings.Repeat("x", 2<<20) + `"}`
	if err := os.WriteFile(filepath.Join(dir, "big", "config.json"), []byte(big), 0o644); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(dir, "fifo")
	for _, f := range []string{fifo, filepath.Join(dir, "pipe.svg")} {
		if err := syscall.Mkfifo(f, 0o644); err != nil {
			t.Skip("no named pipes:", err)
		}
	}
	return probeFiles{dir: dir, fifo: fifo}
}
