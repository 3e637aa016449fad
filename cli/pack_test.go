package cli

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/memplan/memplan/engine"
	"github.com/memplan/memplan/pack"
	"github.com/spf13/pflag"
)

// A small job file: two training jobs in plan's terms and a vLLM service.
const packJobs = `kind: memplan.jobs/v1
jobs:
  - name: gpt2-train
    train: {model: gpt2, micro-batch: 4, seq: 512}
    replicas: 3
  - name: pythia-lora
    train: {model: pythia-160m, micro-batch: 8, seq: 256, lora: "r=8,alpha=16", precision: bf16}
  - name: chat
    serve: {model: qwen2.5-0.5b, concurrency: 16, context: 1024, gen-tokens: 256}
`

const packArrivals = `kind: memplan.arrivals/v1
arrivals:
  - {at: 0s, duration: 2h, job: gpt2-train}
  - {at: 10m, duration: 1h, job: chat}
  - {at: 15m, duration: 30m, job: pythia-lora}
  - {at: 20m, duration: 3h, job: gpt2-train}
`

func packFiles(t *testing.T) (dir, jobs, arrivals string) {
	t.Helper()
	dir = t.TempDir()
	jobs, arrivals = filepath.Join(dir, "jobs.yaml"), filepath.Join(dir, "arrivals.yaml")
	if err := os.WriteFile(jobs, []byte(packJobs), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(arrivals, []byte(packArrivals), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir, jobs, arrivals
}

func TestPackCommand(t *testing.T) {
	dir, jobs, arrivals := packFiles(t)
	png, svg := filepath.Join(dir, "pack.png"), filepath.Join(dir, "pack.svg")
	code, out, errs := run("pack", jobs, "--gpus", "2xl4", "--arrivals", arrivals, "--png", png, "--svg", svg)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	for _, want := range []string{"2 × l4", "What each process needs", "torch.cuda.set_per_process_memory_fraction(", "vllm serve --gpu-memory-utilization",
		"Assignment: curve", "Simulation: 4 arrivals", "GPUs curve saves:"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	for _, p := range []string{png, svg} {
		if st, err := os.Stat(p); err != nil || st.Size() < 1000 {
			t.Errorf("%s: %v", p, err)
		}
	}
	if left, _ := filepath.Glob(filepath.Join(dir, ".*.tmp")); len(left) > 0 {
		t.Errorf("temporary files left: %v", left)
	}

	code, out, errs = run("pack", jobs, "--gpus", "2xl4", "--arrivals", arrivals, "--json", "--policy", "static,curve", "--margin", "1GiB")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	var got struct {
		Schema     string `json:"schema"`
		Margin     int64  `json:"margin_bytes"`
		Envelopes  []json.RawMessage
		Policies   []struct{ Policy string }
		Simulation struct {
			Schema   string
			Policies []struct {
				Policy  string
				Started int
			}
		}
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatal(err)
	}
	if got.Schema != pack.Schema || got.Simulation.Schema != pack.SimSchema || got.Margin != 1<<30 || len(got.Envelopes) != 5 ||
		len(got.Policies) != 2 || got.Policies[0].Policy != "static" || len(got.Simulation.Policies) != 2 {
		t.Errorf("JSON: %+v", got)
	}
}

// A job of several GPUs: pack prints one process per rank and places them
// whole; a same-node gang larger than --node-gpus is left out whole.
func TestPackGangCommand(t *testing.T) {
	dir := t.TempDir()
	jobs := filepath.Join(dir, "jobs.yaml")
	body := `kind: memplan.jobs/v1
jobs:
  - name: ddp
    same-node: true
    train: {model: gpt2, micro-batch: 4, seq: 512, dp: 2}
  - name: pipe
    train: {model: gpt2, micro-batch: 2, seq: 512, pp: 2, accum: 4}
`
	if err := os.WriteFile(jobs, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, errs := run("pack", jobs, "--gpus", "4xl4", "--node-gpus", "1", "--policy", "whole-gpu,curve")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	for _, want := range []string{"4 × l4 (", "1 to a node", "train, rank 1 of 2, stage 0, same node", "train, rank 1 of 2, stage 1", "unplaced under curve: ddp/0, ddp/1"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	code, out, errs = run("pack", jobs, "--gpus", "4xl4", "--node-gpus", "1", "--policy", "whole-gpu,curve", "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	var got pack.Result
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range got.Envelopes {
		names = append(names, e.Job)
	}
	if want := []string{"ddp/0", "ddp/1", "pipe/0", "pipe/1"}; !reflect.DeepEqual(names, want) || got.NodeGPUs != 1 {
		t.Fatalf("processes %v, want %v (node of %d)", names, want, got.NodeGPUs)
	}
	if got.Envelopes[2].Stage != 0 || got.Envelopes[3].Stage != 1 || got.Envelopes[2].Allocated == got.Envelopes[3].Allocated {
		t.Errorf("pipeline stages: %+v %+v", got.Envelopes[2], got.Envelopes[3])
	}
	for _, p := range got.Policies {
		if !reflect.DeepEqual(p.Unplaced, []string{"ddp/0", "ddp/1"}) || p.GPUsNeeded == 0 {
			t.Errorf("%s: unplaced %v, %d GPUs", p.Policy, p.Unplaced, p.GPUsNeeded)
		}
	}
}

// A job larger than its GPU (llama-3-8b at seq 2048 on one H100, a
// tester's file): curve places nothing, so it saves nothing against the
// policies that count the job, and the job's setting says it does not fit
// instead of giving a fraction over 1.
func TestPackJobLargerThanGPU(t *testing.T) {
	jobs := filepath.Join(t.TempDir(), "jobs.yaml")
	if err := os.WriteFile(jobs, []byte("kind: memplan.jobs/v1\njobs:\n- name: a\n  train: {model: llama-3-8b, seq: 2048}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, errs := run("pack", jobs, "--gpus", "1xh100")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	for _, want := range []string{"none: does not fit one h100-sxm", "GPUs curve saves: 0 against peaks",
		"GPUs curve saves against whole-gpu: not compared: curve leaves out a", "unplaced under curve: a"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "set_per_process_memory_fraction") || strings.Contains(out, "1 against whole-gpu") {
		t.Errorf("a fraction or a saving for a job no GPU holds:\n%s", out)
	}
	code, out, errs = run("pack", jobs, "--gpus", "1xh100", "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	var got pack.Result
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatal(err)
	}
	if _, ok := got.Saved["whole-gpu"]; ok || got.NotCompared["whole-gpu"] == "" || got.Envelopes[0].Fraction != 0 {
		t.Errorf("saved %v, not compared %v, fraction %g", got.Saved, got.NotCompared, got.Envelopes[0].Fraction)
	}
}

// tinyJobFile is a job file of one tiny GPT-2 training job (planned in
// milliseconds).
func tinyJobFile(t *testing.T) string {
	t.Helper()
	model, err := filepath.Abs("../testdata/torch/gpt2_tiny.config.json")
	if err != nil {
		t.Fatal(err)
	}
	jobs := filepath.Join(t.TempDir(), "jobs.yaml")
	if err := os.WriteFile(jobs, []byte("kind: memplan.jobs/v1\njobs:\n- name: a\n  train: {model: "+model+", seq: 64}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return jobs
}

// --margin takes zero in any spelling, as its default "0" (units.ParseBytesOrZero).
func TestPackMarginZero(t *testing.T) {
	jobs := tinyJobFile(t)
	for _, m := range []string{"0", "0GiB", "0B", "00", "0.0GiB"} {
		code, out, errs := run("pack", jobs, "--gpus", "h100", "--policy", "curve", "--json", "--margin", m)
		var got pack.Result
		if code != 0 || json.Unmarshal([]byte(out), &got) != nil || got.Margin != 0 {
			t.Errorf("--margin %s: exit %d, margin %d: %s", m, code, got.Margin, errs)
		}
	}
	code, _, errs := run("pack", jobs, "--gpus", "h100", "--margin", "-0.5GiB")
	if code != 1 || !strings.Contains(errs, "--margin") {
		t.Errorf("--margin -0.5GiB: exit %d: %s", code, errs)
	}
}

// pack reports the node it packs with: a pool of 2 H100s is one node of
// 2 (what --node-gpus 2 says; --node-gpus 8 is refused), not the catalog
// server's 8.
func TestPackNodeIsThePools(t *testing.T) {
	jobs := tinyJobFile(t)
	code, out, errs := run("pack", jobs, "--gpus", "2xh100", "--policy", "curve")
	if code != 0 || !strings.Contains(out, "2 × h100-sxm (79.19 GiB each, 2 to a node)") {
		t.Errorf("exit %d: %s%s", code, out, errs)
	}
	code, out, errs = run("pack", jobs, "--gpus", "2xh100", "--policy", "curve", "--json")
	var got pack.Result
	if code != 0 || json.Unmarshal([]byte(out), &got) != nil || got.NodeGPUs != 2 {
		t.Errorf("exit %d, node_gpus %d: %s", code, got.NodeGPUs, errs)
	}
}

// Bad flags and files: one line naming the problem, exit 1, nothing on
// stdout, no plot written.
func TestPackBadInput(t *testing.T) {
	dir, jobs, _ := packFiles(t)
	badJobs := filepath.Join(dir, "bad.yaml")
	os.WriteFile(badJobs, []byte("kind: memplan.jobs/v1\njobs: [{name: a, train: {model: gpt2, micro-batch: 0.5}}]"), 0o644)
	badArr := filepath.Join(dir, "badarr.yaml")
	os.WriteFile(badArr, []byte("kind: memplan.arrivals/v1\narrivals: [{at: 0s, duration: 1h, job: nobody}]"), 0o644)
	huge := filepath.Join(dir, "huge.yaml")
	os.WriteFile(huge, []byte("kind: memplan.jobs/v1\njobs: [{name: big, train: {model: llama-2-70b}}]"), 0o644)
	q2 := filepath.Join(dir, "q2.yaml")
	os.WriteFile(q2, []byte("? [a]\n: 1\n"), 0o644)
	bomb := filepath.Join(dir, "bomb.yaml")
	os.WriteFile(bomb, []byte("kind: memplan.jobs/v1\nbig: &a \""+strings.Repeat("x", 64<<10)+"\"\njobs: ["+strings.Repeat("*a,", 300)+"*a]\n"), 0o644)
	png := filepath.Join(dir, "out.png")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"pack"}, "pack: want one job file, got 0 arguments"},
		{[]string{"pack", jobs}, "pack needs --gpus, e.g. --gpus 8xh100"},
		{[]string{"pack", jobs, "--gpus", "8xnothing"}, "--gpus: unknown GPU"},
		{[]string{"pack", jobs, "--gpus", "0xh100"}, "--gpus: GPU count must be between 1 and 100000, got 0"},
		{[]string{"pack", jobs, "--gpus", "h100", "--policy", "greedy"}, `--policy "greedy": want one of whole-gpu, static, peaks, curve`},
		{[]string{"pack", jobs, "--gpus", "h100", "--policy", "curve, peaks,curve"}, `--policy "curve, peaks,curve": curve is named twice`},
		{[]string{"pack", jobs, "--gpus", "h100", "--margin", "lots"}, "--margin:"},
		{[]string{"pack", jobs, "--gpus", "8xh100", "--node-gpus", "-1"}, "--node-gpus must be between 1 and the pool's 8 GPUs, got -1"},
		{[]string{"pack", jobs, "--gpus", "8xh100", "--node-gpus", "9"}, "--node-gpus must be between 1 and the pool's 8 GPUs, got 9"},
		{[]string{"pack", jobs, "--gpus", "h100", "--margin", "100GiB"}, "--margin must be between 0 and the GPU's"},
		{[]string{"pack", jobs, "--gpus", "h100", "--policy", "static", "--png", png}, "--plot-policy curve is not among --policy static"},
		{[]string{"pack", jobs, "--gpus", "h100", "--png", filepath.Join(dir, "no", "x.png")}, "no such directory"},
		{[]string{"pack", jobs, "--gpus", "h100", "--png", filepath.Join(dir, "x.gif")}, `--png "` + filepath.Join(dir, "x.gif") + `": want a file name ending in .png`},
		{[]string{"pack", filepath.Join(dir, "none.yaml"), "--gpus", "h100"}, "cannot read"},
		{[]string{"pack", badJobs, "--gpus", "h100"}, "micro-batch: want a whole number, got a number (0.5)"},
		{[]string{"pack", jobs, "--gpus", "h100", "--arrivals", badArr}, `arrivals[0]: job "nobody" is not in the job file`},
		{[]string{"pack", jobs, "--gpus", "h100", "--arrivals", filepath.Join(dir, "none.yaml")}, "cannot read"},
		{[]string{"pack", q2, "--gpus", "1xh100"}, "q2.yaml: a mapping key must be a string (line 1)"},
		{[]string{"pack", jobs, "--gpus", "1xh100", "--arrivals", q2}, "q2.yaml: a mapping key must be a string (line 1)"},
		{[]string{"pack", bomb, "--gpus", "1xh100"}, "bomb.yaml: YAML aliases expand to more than 16 MiB"},
		{[]string{"pack", huge, "--gpus", "l4", "--policy", "whole-gpu", "--plot-policy", "whole-gpu", "--png", png}, ""},
	} {
		code, out, errs := run(tc.args...)
		if tc.want == "" { // a job larger than the GPU is placed alone and drawn; no error
			if code != 0 {
				t.Errorf("%v: exit %d: %s", tc.args, code, errs)
			}
			continue
		}
		if code != 1 || out != "" || !strings.Contains(errs, tc.want) || strings.Count(strings.TrimSpace(errs), "\n") > 0 {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want %q", tc.args, code, out, errs, tc.want)
		}
		if _, err := os.Stat(png); err == nil && !strings.Contains(strings.Join(tc.args, " "), huge) {
			t.Errorf("%v: wrote %s", tc.args, png)
		}
	}
}

// A training job of the job file is the job plan runs with the same flags:
// the file's keys are plan's flag names.
func TestPackTrainIsPlansJob(t *testing.T) {
	for _, tc := range []struct {
		train pack.Train
		flags []string
	}{
		{pack.Train{Model: "gpt2"}, nil},
		{pack.Train{Model: "llama-3-8b", MicroBatch: 2, Seq: 1024, Accum: 4, Precision: "bf16", Optimizer: "adamw8bit", Checkpoint: "full", LoRA: "r=16,alpha=32,targets=all-linear"},
			[]string{"--micro-batch", "2", "--seq", "1024", "--accum", "4", "--precision", "bf16", "--optimizer", "adamw8bit", "--checkpoint", "full", "--lora", "r=16,alpha=32,targets=all-linear"}},
		{pack.Train{Model: "llama-2-7b", Recipe: "litgpt", Precision: "bf16-true", QLoRA: true, LoRA: "r=8"},
			[]string{"--recipe", "litgpt", "--precision", "bf16-true", "--qlora", "--lora", "r=8"}},
		{pack.Train{Model: "qwen2.5-7b", Recipe: "torchtune", Set: []string{"loss=chunked"}, OptimizerImpl: "fused", Attention: "eager", Offload: "activations"},
			[]string{"--recipe", "torchtune", "--set", "loss=chunked", "--optimizer-impl", "fused", "--attention", "eager", "--offload", "activations"}},
		{pack.Train{Model: "mistral-7b", Kernels: "cpu", Checkpoint: "every=2"},
			[]string{"--kernels", "cpu", "--checkpoint", "every=2"}},
	} {
		got, err := tc.train.Spec()
		if err != nil {
			t.Fatalf("%+v: %v", tc.train, err)
		}
		f := &planFlags{}
		fl := pflag.NewFlagSet("plan", pflag.ContinueOnError)
		f.register(fl)
		if err := fl.Parse(append([]string{"--model", tc.train.Model}, tc.flags...)); err != nil {
			t.Fatal(err)
		}
		want, err := f.spec()
		if err != nil {
			t.Fatal(err)
		}
		if err := want.Validate(); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(specKey(got), specKey(want)) {
			t.Errorf("%+v:\n pack %+v\n plan %+v", tc.train, specKey(got), specKey(want))
		}
	}
}

// specKey is a spec with its pointers compared by value and of its target
// (which pack sets per pool) only what a job file decides.
func specKey(s engine.Spec) any {
	type key struct {
		engine.Spec
		Model     string
		LoRA      any
		FirstStep bool
	}
	k := key{Spec: s, Model: s.Model.Name, FirstStep: s.FirstStep}
	if s.LoRA != nil {
		k.LoRA = *s.LoRA
	}
	k.Spec.Model, k.Spec.LoRA, k.Spec.Target = nil, nil, engine.Target{}
	return k
}
