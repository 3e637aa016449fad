package cli

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/memplan/memplan/importer/torchtrace"
	"github.com/memplan/memplan/validate"
	"github.com/memplan/memplan/workload"
)

// plan --graph --workload and validate plan one spec (workload.Spec): on
// every case of the validation suite they give the same phase peaks of the
// steady and the first step, so the accuracy validate reports is that of
// the command users run.
func TestPlanWorkloadIsValidatesPrediction(t *testing.T) {
	dir := filepath.Join("..", "testdata", "torch")
	m, err := validate.LoadMeasured(filepath.Join(dir, "measured.json"))
	if err != nil {
		t.Fatal(err)
	}
	compared := 0
	for _, c := range m.Cases {
		t.Run(c.Name, func(t *testing.T) {
			path := filepath.Join(dir, "workloads", c.Name+".yaml")
			w, err := workload.Load(path)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(w, c.Workload) {
				t.Fatalf("%s is not the workload measured.json ran:\n%+v\n%+v", path, w, c.Workload)
			}
			tr, err := torchtrace.Load(filepath.Join(dir, c.Trace))
			if err != nil {
				t.Fatal(err)
			}
			want, err := validate.PredictWith(c.Workload, tr, validate.CounterFor(c.Memory, tr))
			if err != nil {
				t.Fatal(err)
			}
			if want.Pending != "" {
				t.Skipf("validate does not compare it: %s", want.Pending)
			}
			var out, errb bytes.Buffer
			if code := Main([]string{"plan", "--graph", filepath.Join(dir, c.Trace), "--workload", path, "--json", "--no-timeline"}, &out, &errb); code != 0 {
				t.Fatalf("exit %d: %s", code, errb.String())
			}
			var got struct {
				Phases map[string]struct {
					PeakBytes int64 `json:"peak_bytes"`
				} `json:"phases"`
				FirstStep struct {
					Phases map[string]struct {
						PeakBytes int64 `json:"peak_bytes"`
					} `json:"phases"`
				} `json:"first_step"`
			}
			if err := json.Unmarshal(out.Bytes(), &got); err != nil {
				t.Fatal(err)
			}
			for _, ph := range validate.PhaseNames {
				if g, w := got.Phases[ph].PeakBytes, want.Steady.Get(ph); g != w {
					t.Errorf("steady %s: plan %d, validate %d", ph, g, w)
				}
				if g, w := got.FirstStep.Phases[ph].PeakBytes, want.First.Get(ph); g != w {
					t.Errorf("first step %s: plan %d, validate %d", ph, g, w)
				}
			}
			compared++
		})
	}
	if compared < 6 {
		t.Errorf("only %d suite cases compared", compared)
	}
}

// plan --graph --workload refuses what plan --graph refuses, in the same
// words, and a flag or switch the workload file also sets is refused when
// it disagrees with the file. The workload path used to set the mode and
// the loop's hold of the model's output itself: --mode infer and --set
// loop.hold-outputs planned the workload's training step, exit 0.
func TestPlanWorkloadRefusesWhatItWouldIgnore(t *testing.T) {
	const lm, w = "../testdata/torch/lm.trace.json", "../testdata/torch/workloads/lm.yaml"
	const setHold = "--set loop.hold-outputs="
	for _, c := range []struct {
		args []string
		want string // in the refusal; "": the refusal without --workload, word for word
	}{
		{[]string{"--mode", "infer"}, ""},
		{[]string{"--mode", "infer", "--gen-tokens", "8"}, ""},
		{[]string{"--precision", "fp32"}, ""},
		{[]string{"--tp", "2"}, ""},
		{[]string{"--set", "loop.hold-outputs=true"}, setHold + "true disagrees with " + w + " (hold_outputs: none)"},
		{[]string{"--set", "loop.hold-outputs=backward"}, setHold + "backward disagrees with " + w + " (hold_outputs: none)"},
		{[]string{"--micro-batch", "4"}, "--micro-batch disagrees with " + w + " (batch: 16, strategy.accumulation: 1)"},
		{[]string{"--accum", "2"}, "--accum disagrees with " + w + " (strategy.accumulation: 1)"},
		{[]string{"--seq", "32"}, "--seq disagrees with " + w + " (seq_len: 64)"},
		{[]string{"--optimizer", "sgd"}, "--optimizer disagrees with " + w + " (optimizer: adamw)"},
		{[]string{"--optimizer-impl", "fused"}, "--optimizer-impl disagrees with " + w + " (foreach: false)"},
		{[]string{"--checkpoint", "full"}, "--checkpoint disagrees with " + w + " (strategy.checkpoint: none)"},
		{[]string{"--offload", "activations"}, "--offload disagrees with " + w + " (strategy.offload: none)"},
		{[]string{"--kernels", "cuda"}, "--kernels disagrees with " + w + " (device: cpu)"},
	} {
		want := c.want
		if want == "" {
			code, _, errs := run(append([]string{"plan", "--graph", lm}, c.args...)...)
			if code != 1 {
				t.Fatalf("%v without --workload: exit %d, want 1: %s", c.args, code, errs)
			}
			want = errs
		}
		code, out, errs := run(append([]string{"plan", "--graph", lm, "--workload", w}, c.args...)...)
		if code != 1 || out != "" || strings.Count(strings.TrimRight(errs, "\n"), "\n") != 0 || !strings.Contains(errs, want) {
			t.Errorf("%v: exit %d, stdout %d bytes, stderr %q; want exit 1 and one line with %q", c.args, code, len(out), errs, want)
		}
	}
	// What agrees with the file plans the file's job.
	peak := func(args ...string) string {
		return planPeak(t, append([]string{"--graph", lm, "--workload", w}, args...)...)
	}
	if a, b := peak(), peak("--mode", "train", "--set", "loop.hold-outputs=false", "--micro-batch", "16", "--accum", "1", "--seq", "64",
		"--optimizer", "adamw", "--optimizer-impl", "single", "--kernels", "cpu", "--checkpoint", "none", "--offload", "none"); a != b {
		t.Errorf("flags that agree with the file: peak %s, want %s", b, a)
	}
}

// A workload file that contradicts its trace is refused in one line naming
// the file and the field; it used to plan the trace as recorded, exit 0.
func TestPlanWorkloadRefusesWhatTheTraceContradicts(t *testing.T) {
	const lm = "../testdata/torch/lm.trace.json"
	doc, err := os.ReadFile("../testdata/torch/workloads/lm.yaml")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for _, c := range []struct{ from, to, want string }{
		{"dtype: float32", "dtype: bfloat16", "w.yaml: dtype bfloat16 contradicts the trace's float32 parameters"},
		{"models:transformer_lm", "models:resnet18", "w.yaml: model memplan_torch.models:resnet18 contradicts the trace's builder memplan_torch.models:transformer_lm"},
		{"batch_dim: 0", "batch_dim: 1", "w.yaml: batch_dim 1 contradicts the trace's batch dimension 0"},
	} {
		path := filepath.Join(dir, "w.yaml")
		if err := os.WriteFile(path, []byte(strings.Replace(string(doc), c.from, c.to, 1)), 0o644); err != nil {
			t.Fatal(err)
		}
		code, out, errs := run("plan", "--graph", lm, "--workload", path)
		if code != 1 || out != "" || strings.Count(strings.TrimRight(errs, "\n"), "\n") != 0 || !strings.Contains(errs, c.want) {
			t.Errorf("%s: exit %d, stdout %d bytes, stderr %q; want exit 1 and one line with %q", c.to, code, len(out), errs, c.want)
		}
	}
}

// planPeak is plan's JSON peak (bytes, as printed) for args, which must be
// answered with exit 0.
func planPeak(t *testing.T, args ...string) string {
	t.Helper()
	peak, _ := planJSON(t, args...)["peak"].(map[string]any)
	b, ok := peak["bytes"].(json.Number)
	if !ok {
		t.Fatalf("%v: no peak.bytes in plan's JSON", args)
	}
	return b.String()
}

// planJSON is plan's JSON for args (numbers as printed), which must be
// answered with exit 0.
func planJSON(t *testing.T, args ...string) map[string]any {
	t.Helper()
	code, out, errs := run(append([]string{"plan", "--json", "--no-timeline"}, args...)...)
	if code != 0 {
		t.Fatalf("%v: exit %d: %s", args, code, errs)
	}
	dec := json.NewDecoder(strings.NewReader(out))
	dec.UseNumber()
	var j map[string]any
	if err := dec.Decode(&j); err != nil {
		t.Fatal(err)
	}
	return j
}
