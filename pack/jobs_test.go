package pack

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/memplan/memplan/internal/msgcheck"
)

// Every way a job file can be wrong gives one line naming the problem in
// the file's terms.
func TestParseBadInput(t *testing.T) {
	for _, tc := range []struct{ name, yaml, want string }{
		{"empty", ``, "no kind"},
		{"not a mapping", `[1, 2]`, "jobs.yaml: the document: want a mapping, got a list"},
		{"bad yaml", "kind: [", "did not find expected node content"},
		{"wrong kind", "kind: memplan.plan/v1\njobs: []", `kind "memplan.plan/v1" is not memplan.jobs/v1`},
		{"no jobs", "kind: memplan.jobs/v1\njobs: []", "no jobs"},
		{"unknown top key", "kind: memplan.jobs/v1\ngpus: 8\njobs: [{name: a, train: {model: gpt2}}]", `unknown key "gpus"`},
		{"unknown job key", "kind: memplan.jobs/v1\njobs: [{name: a, train: {model: gpt2}, gpu: h100}]", `unknown key "gpu"`},
		{"unknown train key", "kind: memplan.jobs/v1\njobs: [{name: a, train: {model: gpt2, batch: 4}}]", `jobs[0].train: unknown key "batch"`},
		// Keys match as written: encoding/json alone would read these as
		// kind, jobs, model, snapshot and recipe.
		{"top key in another case", "Kind: memplan.jobs/v1\njobs: [{name: a, train: {model: gpt2}}]", `unknown key "Kind" (keys are written as documented: kind)`},
		{"list key in another case", "kind: memplan.jobs/v1\nJOBS: [{name: a, train: {model: gpt2}}]", `unknown key "JOBS"`},
		{"model in another case", "kind: memplan.jobs/v1\njobs: [{name: a, train: {Model: gpt2}}]", `jobs[0].train: unknown key "Model" (keys are written as documented: model)`},
		{"serve model in another case", "kind: memplan.jobs/v1\njobs: [{name: s, serve: {mODEL: gpt2, concurrency: 1, context: 8}}]", `jobs[0].serve: unknown key "mODEL"`},
		{"recipe in another case", "kind: memplan.jobs/v1\njobs: [{name: a, train: {model: gpt2, Recipe: r.yaml}}]", `unknown key "Recipe"`},
		{"snapshot with a long s", "kind: memplan.jobs/v1\njobs: [{name: a, ſnapshot: s.pickle}]", `jobs[0]: unknown key "ſnapshot"`},
		{"Kelvin sign", "kind: memplan.jobs/v1\njobs: [{name: a, train: {model: gpt2, \u212aernels: cpu}}]", "unknown key \"\u212aernels\""},
		{"duplicate key", "kind: memplan.jobs/v1\nkind: memplan.jobs/v1\njobs: []", `line 2: key "kind" already set in map`},
		{"no name", "kind: memplan.jobs/v1\njobs: [{train: {model: gpt2}}]", "jobs[0]: no name"},
		{"two sources", "kind: memplan.jobs/v1\njobs: [{name: a, train: {model: gpt2}, plan: p.json}]", "exactly one of train, serve, plan, snapshot or published (found 2)"},
		{"no source", "kind: memplan.jobs/v1\njobs: [{name: a}]", "(found 0)"},
		{"duplicate names", "kind: memplan.jobs/v1\njobs: [{name: a, train: {model: gpt2}}, {name: a, train: {model: gpt2}}]", `job "a": name used by jobs[0] too`},
		{"negative replicas", "kind: memplan.jobs/v1\njobs: [{name: a, replicas: -1, train: {model: gpt2}}]", "replicas must be between 1 and 1024"},
		{"too many replicas", "kind: memplan.jobs/v1\njobs: [{name: a, replicas: 5000, train: {model: gpt2}}]", "replicas must be between"},
		{"replicas a string", "kind: memplan.jobs/v1\njobs: [{name: a, replicas: two, train: {model: gpt2}}]", "jobs.yaml: jobs.replicas: want a whole number, got a string"},
		{"bad request", "kind: memplan.jobs/v1\njobs: [{name: a, request: lots, train: {model: gpt2}}]", `request "lots" is not a positive size`},
		{"device without snapshot", "kind: memplan.jobs/v1\njobs: [{name: a, device: 0, train: {model: gpt2}}]", "device and period go with snapshot"},
		{"bad period", "kind: memplan.jobs/v1\njobs: [{name: a, snapshot: s.pickle, period: soon}]", `period: "soon" is not a positive duration`},
		{"unknown model", "kind: memplan.jobs/v1\njobs: [{name: a, train: {model: gpt5}}]", `train.model: unknown model "gpt5"`},
		{"no model", "kind: memplan.jobs/v1\njobs: [{name: a, train: {seq: 128}}]", "train.model: no model"},
		{"bad micro-batch", "kind: memplan.jobs/v1\njobs: [{name: a, train: {model: gpt2, micro-batch: -2}}]", "train.micro-batch: micro-batch must be positive, got -2"},
		{"bad precision", "kind: memplan.jobs/v1\njobs: [{name: a, train: {model: gpt2, precision: fp8}}]", "train.precision"},
		{"bad optimizer", "kind: memplan.jobs/v1\njobs: [{name: a, train: {model: gpt2, optimizer: nesterov}}]", `train: optimizer: unknown optimizer "nesterov"`},
		{"bad checkpoint", "kind: memplan.jobs/v1\njobs: [{name: a, train: {model: gpt2, checkpoint: some}}]", "train.checkpoint"},
		{"bad lora", "kind: memplan.jobs/v1\njobs: [{name: a, train: {model: gpt2, lora: r=x}}]", "train.lora"},
		{"bad recipe", "kind: memplan.jobs/v1\njobs: [{name: a, train: {model: gpt2, recipe: keras}}]", "train: recipe:"},
		{"bad set", "kind: memplan.jobs/v1\njobs: [{name: a, train: {model: gpt2, set: [nope=1]}}]", "train.set"},
		{"bad kernels", "kind: memplan.jobs/v1\njobs: [{name: a, train: {model: gpt2, kernels: tpu}}]", `kernels "tpu" is not cuda or cpu`},
		{"negative tp", "kind: memplan.jobs/v1\njobs: [{name: a, train: {model: gpt2, tp: -2}}]", "train: tp must be between 1 and 4096, got -2"},
		{"pp a string", "kind: memplan.jobs/v1\njobs: [{name: a, train: {model: gpt2, pp: two}}]", "jobs.train.pp: want a whole number, got a string"},
		{"too many GPUs", "kind: memplan.jobs/v1\njobs: [{name: a, train: {model: gpt2, dp: 4096, tp: 2}}]", "train: dp × tp × pp is 8192 GPUs, more than 4096"},
		{"a step the optimizer lacks", "kind: memplan.jobs/v1\njobs: [{name: a, train: {model: gpt2, optimizer: lion, optimizer-impl: foreach}}]", "train: optimizer-impl foreach: lion has only single"},
		{"bad pp-schedule", "kind: memplan.jobs/v1\njobs: [{name: a, train: {model: gpt2, pp: 2, pp-schedule: zigzag}}]", "train: pp-schedule:"},
		{"same-node a string", "kind: memplan.jobs/v1\njobs: [{name: a, same-node: yes please, train: {model: gpt2}}]", "jobs.same-node: want true or false, got a string"},
		{"serve negative tp", "kind: memplan.jobs/v1\njobs: [{name: s, serve: {model: llama-3-8b, concurrency: 4, context: 8, tp: -1}}]", "serve: tp must be between 1 and 4096, got -1"},
		{"serve no concurrency", "kind: memplan.jobs/v1\njobs: [{name: s, serve: {model: llama-3-8b, context: 1024}}]", "serve: concurrency must be between 1 and 2^20, got 0"},
		{"serve no context", "kind: memplan.jobs/v1\njobs: [{name: s, serve: {model: llama-3-8b, concurrency: 4}}]", "serve: context must be between 1"},
		{"serve bad server", "kind: memplan.jobs/v1\njobs: [{name: s, serve: {model: llama-3-8b, concurrency: 4, context: 8, server: tgi}}]", `server "tgi" is not one of vllm, hf`},
		{"serve hf field on vllm", "kind: memplan.jobs/v1\njobs: [{name: s, serve: {model: llama-3-8b, concurrency: 4, context: 8, precision: fp32}}]", "go with server hf"},
		{"serve vllm field on hf", "kind: memplan.jobs/v1\njobs: [{name: s, serve: {model: llama-3-8b, concurrency: 4, context: 8, server: hf, max-model-len: 64}}]", "go with server vllm"},
		{"serve context past the model", "kind: memplan.jobs/v1\njobs: [{name: s, serve: {model: gpt2, concurrency: 4, context: 4096}}]", "max-model-len 4096 exceeds gpt2's 1024 positions"},
		// vLLM refuses more sequences than a step's tokens; the job has
		// neither vLLM flag, so the message names its own keys.
		{"serve concurrency past a step's tokens", "kind: memplan.jobs/v1\njobs: [{name: s, serve: {model: gpt2, concurrency: 4096, context: 512}}]",
			"serve: concurrency 4096 is more than the 2048 tokens vLLM schedules in one step at max-model-len 512 (vLLM refuses --max-num-seqs above --max-num-batched-tokens): give at most concurrency 2048"},
		{"serve encoder", "kind: memplan.jobs/v1\njobs: [{name: s, serve: {model: bert-base, concurrency: 4, context: 128}}]", "is an encoder"},
		{"published not FILE#ID", "kind: memplan.jobs/v1\njobs: [{name: p, published: rows.jsonl}]", `published "rows.jsonl" is not FILE#ID`},
		// Aliases are measured before they are written out: 300 of a
		// 64 KiB string are 19 MiB, past a file's 16 MiB.
		{"aliases past the limit", aliasBomb("jobs", 64<<10, 300), "jobs.yaml: YAML aliases expand to more than 16 MiB"},
		{"billion laughs", "kind: memplan.jobs/v1\n" + laughs(9), "jobs.yaml: YAML aliases expand to more than 16 MiB"},
		{"alias inside itself", "kind: memplan.jobs/v1\njobs: &j [{name: a, train: {model: gpt2}}, *j]", "jobs.yaml: a YAML alias names a node that holds it (line 2)"},
		// Keys that are not strings, in the file's words.
		{"null key", "?", "jobs.yaml: a mapping key must be a string (line 1)"},
		{"list key", "? [a]\n: 1\n", "jobs.yaml: a mapping key must be a string (line 1)"},
		{"mapping key in a job", "kind: memplan.jobs/v1\njobs:\n- name: a\n  train: {model: gpt2, ? {x: 1}}\n", "jobs.yaml: a mapping key must be a string (line 4)"},
		{"null key in a job", "kind: memplan.jobs/v1\njobs:\n- name: a\n  ~: 1\n", "jobs.yaml: a mapping key must be a string (line 4)"},
		{"alias to a list as a key", "kind: memplan.jobs/v1\nx: &k [1]\n*k : 2\n", "jobs.yaml: a mapping key must be a string (line 3)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.yaml), "jobs.yaml")
			checkBad(t, err, tc.want)
		})
	}
}

func checkBad(t *testing.T, err error, want string) {
	t.Helper()
	if err == nil {
		t.Fatalf("no error, want one containing %q", want)
	}
	msg := err.Error()
	if !strings.Contains(msg, want) {
		t.Fatalf("error %q does not contain %q", msg, want)
	}
	if strings.Contains(msg, "\n") {
		t.Errorf("error is not one line: %q", msg)
	}
	if !strings.HasPrefix(msg, "jobs.yaml") && !strings.HasPrefix(msg, "trace.yaml") && !strings.Contains(msg, "/") {
		t.Errorf("error %q does not name the file", msg)
	}
	for _, p := range msgcheck.Problems(msg) {
		t.Errorf("error %q: %s", msg, p)
	}
}

// The files a job names are read relative to the job file, and what is
// wrong with them is said naming the job.
func TestReadFileBadReferences(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	write("notplan.json", `{"schema": "memplan.compare/v1"}`)
	write("notime.json", `{"schema": "memplan.plan/v1", "params": 10, "peak": {"bytes": 100}, "timeline": [{"phase": "forward", "total": 5}]}`)
	write("garbage.pickle", "not a pickle")
	write("rows.jsonl", `{"schema": "memplan.published/v1"}`)
	abs, err := filepath.Abs("../testdata/published/published.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	pub := relTo(t, dir, abs)
	for _, tc := range []struct{ name, job, want string }{
		{"missing plan", `{name: a, plan: nothere.json}`, `job "a": cannot read`},
		{"wrong schema", `{name: a, plan: notplan.json}`, `schema "memplan.compare/v1" is not memplan.plan/v1`},
		{"plan without a time", `{name: a, plan: notime.json}`, "no step time: plan it with --gpu"},
		{"bad snapshot", `{name: a, snapshot: garbage.pickle, request: 1GiB}`, `job "a": snapshot garbage.pickle:`},
		{"missing published", `{name: a, published: none.jsonl#x}`, `job "a": cannot read`},
		{"bad published row", `{name: a, published: rows.jsonl#x}`, `job "a": rows.jsonl:1: field id: empty`},
		{"row not there", `{name: a, published: PUB#Z-none}`, `has no row "Z-none"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := strings.ReplaceAll("kind: memplan.jobs/v1\njobs: ["+tc.job+"]", "PUB", pub)
			_, err := ReadFile(write("jobs.yaml", body))
			checkBad(t, err, tc.want)
		})
	}
}

func relTo(t *testing.T, from, to string) string {
	r, err := filepath.Rel(from, to)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestParseArrivalsBadInput(t *testing.T) {
	jobs := []Job{{Name: "a"}}
	for _, tc := range []struct{ name, yaml, want string }{
		{"empty", ``, "no kind"},
		{"wrong kind", "kind: memplan.jobs/v1\narrivals: []", "is not memplan.arrivals/v1"},
		{"no arrivals", "kind: memplan.arrivals/v1\narrivals: []", "no arrivals"},
		{"unknown key", "kind: memplan.arrivals/v1\narrivals: [{at: 0s, duration: 1h, job: a, gpu: 1}]", `unknown key "gpu"`},
		{"key in another case", "kind: memplan.arrivals/v1\narrivals: [{at: 0s, duration: 1h, Job: a}]", `arrivals[0]: unknown key "Job" (keys are written as documented: job)`},
		{"unknown job", "kind: memplan.arrivals/v1\narrivals: [{at: 0s, duration: 1h, job: b}]", `arrivals[0]: job "b" is not in the job file`},
		{"no job", "kind: memplan.arrivals/v1\narrivals: [{at: 0s, duration: 1h}]", "arrivals[0]: no job"},
		{"bad at", "kind: memplan.arrivals/v1\narrivals: [{at: noon, duration: 1h, job: a}]", `at: "noon" is not a positive duration`},
		{"negative at", "kind: memplan.arrivals/v1\narrivals: [{at: -1h, duration: 1h, job: a}]", "at:"},
		{"zero duration", "kind: memplan.arrivals/v1\narrivals: [{at: 0s, duration: 0s, job: a}]", "duration:"},
		{"duration a number", "kind: memplan.arrivals/v1\narrivals: [{at: 0s, duration: 5, job: a}]", "trace.yaml: arrivals.duration: want a string, got a number"},
		{"aliases past the limit", aliasBomb("arrivals", 64<<10, 300), "trace.yaml: YAML aliases expand to more than 16 MiB"},
		{"list key", "kind: memplan.arrivals/v1\narrivals:\n- {at: 0s, [d]: 1h, job: a}\n", "trace.yaml: a mapping key must be a string (line 3)"},
		{"null key", "?\n", "trace.yaml: a mapping key must be a string (line 1)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseArrivals([]byte(tc.yaml), "trace.yaml", jobs)
			checkBad(t, err, tc.want)
		})
	}
}

// aliasBomb is a file of kind's with n aliases of an anchored string of
// size bytes (the probe's bomb2.yaml was 500 of 1 MiB).
func aliasBomb(kind string, size, n int) string {
	k := map[string]string{"jobs": Kind, "arrivals": ArrivalsKind}[kind]
	return "kind: " + k + "\nbig: &a \"" + strings.Repeat("x", size) + "\"\n" + kind + ": [" + strings.TrimSuffix(strings.Repeat("*a,", n), ",") + "]\n"
}

// laughs is the billion laughs: levels of lists of nine aliases of the
// level below, 9^levels strings once written out.
func laughs(levels int) string {
	var b strings.Builder
	b.WriteString("l0: &l0 [lol]\n")
	for i := 1; i <= levels; i++ {
		fmt.Fprintf(&b, "l%d: &l%d [%s]\n", i, i, strings.TrimSuffix(strings.Repeat(fmt.Sprintf("*l%d,", i-1), 9), ","))
	}
	return b.String()
}

// Errors wrap ErrInput so a caller (the CLI, a service) can tell bad input
// from a failure.
func TestErrorsWrapErrInput(t *testing.T) {
	_, err := Parse([]byte("kind: x"), "jobs.yaml")
	if !errors.Is(err, ErrInput) {
		t.Fatalf("%v does not wrap ErrInput", err)
	}
}

// A job file that parses survives a JSON round trip unchanged: the reader
// keeps everything it accepted.
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		"kind: memplan.jobs/v1\njobs: [{name: a, train: {model: gpt2, micro-batch: 2, seq: 128}}]",
		"kind: memplan.jobs/v1\njobs: [{name: s, serve: {model: llama-3-8b, concurrency: 8, context: 1024}, replicas: 2}]",
		"kind: memplan.jobs/v1\njobs: [{name: p, plan: p.json, request: 20GiB}]",
		"kind: memplan.jobs/v1\njobs: [{name: q, snapshot: s.pickle, device: 0, period: 1s}]",
		"kind: memplan.jobs/v1\njobs: [{name: r, published: rows.jsonl#A-1}]",
		"{\"kind\": \"memplan.jobs/v1\", \"jobs\": [{\"name\": \"a\", \"train\": {\"model\": \"gpt2\", \"lora\": \"r=8\"}}]}",
		"kind: memplan.jobs/v1\njobs: [{name: a, train: {Model: gpt2, MICRO-BATCH: 2}}]",
		"kind: memplan.jobs/v1\njobs: [{name: a, ſnapshot: s.pickle}]",
		// Aliases and keys that are not strings (yamlerr.ToJSON).
		"kind: memplan.jobs/v1\ntrain: &t {model: gpt2, seq: 128}\njobs: [{name: a, train: *t}, {name: b, train: *t}]",
		aliasBomb("jobs", 1024, 64), "kind: memplan.jobs/v1\n" + laughs(4),
		"kind: memplan.jobs/v1\njobs: &j [{name: a, train: {model: gpt2}}, *j]",
		"?", "? [a]\n: 1\n", "kind: memplan.jobs/v1\njobs: [{name: a, train: {model: gpt2, ? [x]}}]",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		file, err := Parse(data, "jobs.yaml")
		if err != nil {
			if strings.Contains(err.Error(), "\n") {
				t.Fatalf("multi-line error %q", err)
			}
			return
		}
		js, err := json.Marshal(file)
		if err != nil {
			t.Fatal(err)
		}
		again, err := Parse(js, "jobs.json")
		if err != nil {
			t.Fatalf("re-reading %s: %v", js, err)
		}
		js2, _ := json.Marshal(again)
		if string(js) != string(js2) {
			t.Fatalf("round trip changed the file:\n%s\n%s", js, js2)
		}
	})
}

func FuzzParseArrivals(f *testing.F) {
	f.Add([]byte("kind: memplan.arrivals/v1\narrivals: [{at: 0s, duration: 1h, job: a}, {at: 90m, duration: 30m, job: a}]"))
	f.Add([]byte("{\"kind\": \"memplan.arrivals/v1\", \"arrivals\": [{\"at\": \"1h\", \"duration\": \"2h\", \"job\": \"a\"}]}"))
	f.Add([]byte("kind: memplan.arrivals/v1\narrivals: [&a {at: 0s, duration: 1h, job: a}, *a, *a]"))
	f.Add([]byte(aliasBomb("arrivals", 1024, 64)))
	f.Add([]byte("kind: memplan.arrivals/v1\narrivals: [{at: 0s, ? [d]: 1h, job: a}]"))
	jobs := []Job{{Name: "a"}}
	f.Fuzz(func(t *testing.T, data []byte) {
		tr, err := ParseArrivals(data, "trace.yaml", jobs)
		if err != nil {
			if strings.Contains(err.Error(), "\n") {
				t.Fatalf("multi-line error %q", err)
			}
			return
		}
		for _, a := range tr.Arrivals {
			if a.dur <= 0 || a.at < 0 {
				t.Fatalf("accepted %+v", a)
			}
		}
	})
}

// A model given as a config.json path is read relative to the job file.
func TestModelPathRelativeToJobFile(t *testing.T) {
	dir := t.TempDir()
	sub := filepath.Join(dir, "jobs")
	if err := os.MkdirAll(filepath.Join(sub, "models"), 0o755); err != nil {
		t.Fatal(err)
	}
	cfg := `{"model_type": "gpt2", "n_embd": 256, "n_layer": 2, "n_head": 4, "vocab_size": 1000, "n_positions": 512}`
	if err := os.WriteFile(filepath.Join(sub, "models", "tiny.json"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(sub, "jobs.yaml")
	if err := os.WriteFile(p, []byte("kind: memplan.jobs/v1\njobs: [{name: tiny, train: {model: models/tiny.json, seq: 128}}]"), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if got := f.Jobs[0].Train.Model; got != filepath.Join(sub, "models", "tiny.json") {
		t.Errorf("model %q", got)
	}
}
