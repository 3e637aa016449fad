package torchtrace

import (
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// tiny is testdata/torch/three_events.trace.json: three events (forward,
// backward, optimizer), small enough to edit by string replacement.
var tiny = readFixture("../../testdata/torch/three_events.trace.json")

func readFixture(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		panic(err)
	}
	return string(b)
}

func TestParseTiny(t *testing.T) {
	tr, err := Parse([]byte(tiny))
	if err != nil {
		t.Fatal(err)
	}
	if len(tr.Events) != 3 || tr.TraceBatch != 2 || tr.HasSeq() {
		t.Fatalf("unexpected %+v", tr)
	}
	// Accumulation: the second micro-step's gradient is a temporary, freed at once.
	p, err := tr.Program(Options{Batch: 8, Accum: 2})
	if err != nil {
		t.Fatal(err)
	}
	got := phasePeaks(t, p)
	// params 64 + input 128 + activation 128 = 320 in forward; backward adds
	// the gradient (64) while the activation is still live.
	if got["forward"] != 64+128+128+64 || got["backward"] != 64+128+128+64+64 || got["optimizer"] != 64+128+64 {
		t.Errorf("peaks %v", got)
	}
}

func TestParseErrors(t *testing.T) {
	edit := func(old, new string) string {
		if !strings.Contains(tiny, old) {
			t.Fatalf("fixture lacks %q", old)
		}
		return strings.Replace(tiny, old, new, 1)
	}
	for _, c := range []struct{ in, want string }{
		{"", "trace: empty document"},
		{tiny[:200], "trace: truncated JSON"},
		{"{\"schema\": ", "trace: truncated JSON"},
		{"[1, 2]", "trace: not a JSON object"},
		{"{} {}", "extra data after the document"},
		{"{\"a\": 1,}", "trace: invalid JSON at line 1"},
		{"{}", `trace: missing "schema": not a memplan trace`},
		{`{"schema": 2}`, `field "schema" must be a string`},
		{edit("memplan.trace/v1", "memplan.trace/v3"), "trace is schema memplan.trace/v3; this memplan reads v1 and v2 — upgrade memplan"},
		{edit("memplan.trace/v1", "memplan.plan/v1"), `schema "memplan.plan/v1" is not a memplan trace`},
		{edit(`"trace_batch": 2`, `"trace_batch": "2"`), "trace: trace_batch: must be an integer, got a string"},
		{edit(`"bytes_per_batch": 16, "dtype": "float32", "shape": [2, 4], "category": "activation"`, `"dtype": "float32", "shape": [2, 4], "category": "activation"`),
			`trace: events[0].alloc[0]: missing "bytes_per_batch"`},
		{edit(`"category": "gradient"`, `"category": "grad"`), `events[1].alloc[0].category: unknown category "grad"`},
		{edit(`"phase": "backward"`, `"phase": "bwd"`), `events[1].phase: unknown phase "bwd"`},
		{edit(`"free": [2]`, `"free": [7]`), "events[1].free[0] (aten.mm.default): frees storage 7, which is never allocated"},
		{edit(`"free": [2]`, `"free": [2.5]`), "events[1].free[0]: must be an integer, got 2.5"},
		{edit(`"index": 1,`, `"index": 5,`), "events[1].index: is 5, want 1"},
		{edit(`"bytes": 32, "bytes_const": 0`, `"bytes": 33, "bytes_const": 0`), "initial_storages[1]: the size model gives 32 bytes at the trace batch, but \"bytes\" is 33"},
		{edit(`"end_live": [0, 1]`, `"end_live": [0, 9]`), "end_live[1]: storage 9 is not live after the last event"},
		// Round 23's sweep: a storage shrinking with the batch (max said
		// nothing fits where plan at a larger batch fitted), and traces of
		// no forward (the plan of no op panicked).
		{edit(`"bytes": 32, "bytes_const": 0, "bytes_per_batch": 16`, `"bytes": 32, "bytes_const": 64, "bytes_per_batch": -16`), "bytes_per_batch: -16: a storage cannot shrink as the batch grows"},
		{edit(`"phase": "forward"`, `"phase": "backward"`), "events: no forward event among its"},
		{edit(`"shape": [4, 4], "category": "parameter"`, `"shape": [4, -4], "category": "parameter"`), "initial_storages[0].shape[1]: negative dimension"},
		{edit(`"optimizer_events": []`, `"optimizer_events": {}`), "first_step.optimizer_events: must be a list, got an object"},
		{edit(`"outputs": [{"storage": 2,`, `"outputs": [{"storage": 9,`), "events[0].outputs[0] (aten.mm.default).storage: outputs storage 9, which is never allocated"},
		{edit(`"outputs": [{"storage": 2,`, `"outputs": [{"storage": -2,`), "events[0].outputs[0].storage: storage id -2 out of range"},
		{edit(`"free": [2]`, `"free": [4294967296]`), "events[1].free[0]: storage id 4294967296 out of range"},
		{strings.Replace(tiny, `"id": 1`, `"id": -1`, 1), "initial_storages[1].id: storage id -1 out of range"},
	} {
		_, err := Parse([]byte(c.in))
		if err == nil {
			t.Errorf("no error for %.60q, want %q", c.in, c.want)
			continue
		}
		if !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("got  %q\nwant %q", err, c.want)
		}
	}
}

func TestLoadNamesFile(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "trace.json")
	if err := os.WriteFile(p, []byte(strings.Replace(tiny, `"bytes_per_batch": 16, "dtype": "float32", "shape": [2, 4], "category": "activation"`, `"dtype": "float32", "shape": [2, 4], "category": "activation"`, 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := Load(p)
	if err == nil || err.Error() != `trace.json: events[0].alloc[0]: missing "bytes_per_batch"` {
		t.Fatalf("got %v", err)
	}
	if _, err := Load(filepath.Join(dir, "none.json")); err == nil || !strings.HasPrefix(err.Error(), "") {
		t.Fatalf("got %v", err)
	}
}

func TestProgramOptionErrors(t *testing.T) {
	tr, err := Parse([]byte(tiny))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tr.Program(Options{Seq: 128}); err == nil || !strings.Contains(err.Error(), "without a sequence dimension") {
		t.Errorf("got %v", err)
	}
	if _, err := tr.Program(Options{Batch: -1}); err == nil {
		t.Error("negative batch accepted")
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte(tiny))
	// small seeds near the replay checks: v2's param_grads, inputs read,
	// a size model that overflows at large batches
	v2 := strings.Replace(strings.Replace(tiny, "memplan.trace/v1", "memplan.trace/v2", 1), `"end_live"`, `"param_grads": [{"param": 0, "grad": 3}], "end_live"`, 1)
	f.Add([]byte(v2))
	f.Add([]byte(strings.Replace(v2, `"free": [3], "saved": []`, `"free": [3], "saved": [], "inputs": [0, 3]`, 1)))
	f.Add([]byte(strings.Replace(tiny, `"bytes": 32, "bytes_const": 0, "bytes_per_batch": 16, "dtype": "float32", "shape": [2, 4], "category": "activation"`,
		`"bytes": 2199023255552, "bytes_const": 0, "bytes_per_batch": 1099511627776, "dtype": "float32", "shape": [2, 4], "category": "activation"`, 1)))
	// FLOPs per event (round 25), and a model that goes negative below the
	// trace batch
	fl := flopsFixture()
	f.Add([]byte(fl))
	f.Add([]byte(strings.Replace(fl, `"flops_const": 0, "flops_per_batch": 32`, `"flops_const": 128, "flops_per_batch": -32`, 1)))
	for _, name := range []string{"lm_sgd.trace.json", "resnet18.trace.json"} {
		if data, err := os.ReadFile(filepath.Join(testdata, name)); err == nil {
			f.Add(data)
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		tr, err := Parse(data)
		if err != nil {
			if strings.Contains(err.Error(), "\n") || !strings.HasPrefix(err.Error(), "") {
				t.Fatalf("bad error %q", err)
			}
			return
		}
		for _, o := range []Options{{}, {Batch: 3, Accum: 2}, {FirstStep: true, MinBytes: 1024}, {Batch: 1 << 40, Accum: 3, FullBatchInputs: true}} {
			p, err := tr.Program(o)
			if err != nil {
				continue
			}
			if err := p.Verify(); err != nil {
				t.Fatalf("program of a parsed trace fails Verify: %v", err)
			}
			for i := range p.Ops {
				if f := p.Ops[i].FLOPs; !(f >= 0) || math.IsInf(f, 0) {
					t.Fatalf("op %d (%s) of a parsed trace has %v FLOPs", i, p.Ops[i].Name, f)
				}
			}
		}
	})
}

// A trace without a sequence dimension replays at the length it recorded
// (trace_seq, which memplan_torch export writes whenever the builder took a
// seq_len) and at no other; one that records none replays at none given.
// Each refusal names the exporter that makes a trace with the dimension.
func TestSeqLessTraceReplaysItsOwnLength(t *testing.T) {
	own, err := Parse([]byte(strings.Replace(tiny, `"trace_batch": 2,`, `"trace_batch": 2, "trace_seq": 64,`, 1)))
	if err != nil {
		t.Fatal(err)
	}
	if own.HasSeq() || own.TraceSeq != 64 || !own.ReplaysSeq(64) || own.ReplaysSeq(32) {
		t.Fatalf("trace_seq 64 without seq_dim: HasSeq %t, TraceSeq %d", own.HasSeq(), own.TraceSeq)
	}
	if _, err := own.Program(Options{Seq: 64}); err != nil {
		t.Errorf("its own length: %v", err)
	}
	if _, err := own.Program(Options{Seq: 32}); err == nil || !strings.Contains(err.Error(), "at sequence 64") || !strings.Contains(err.Error(), "memplan_torch export --seq-len N --seq-dim D") {
		t.Errorf("another length: %v", err)
	}
	hf := *own
	hf.Source = "transformers 5.24.0 AutoModelForCausalLM.from_config(llama.json)"
	if msg := hf.FixedSeq(); !strings.Contains(msg, "memplan_torch export-hf") || strings.Contains(msg, "--seq-dim") {
		t.Errorf("export-hf trace: %s", msg)
	}
	none, err := Parse([]byte(tiny))
	if err != nil {
		t.Fatal(err)
	}
	if none.ReplaysSeq(64) || !strings.Contains(none.FixedSeq(), "does not record its length") {
		t.Errorf("no trace_seq: replays 64 %t, %s", none.ReplaysSeq(64), none.FixedSeq())
	}
	if _, err := Parse([]byte(strings.Replace(tiny, `"trace_batch": 2,`, `"trace_batch": 2, "trace_seq": 0,`, 1))); err == nil || !strings.Contains(err.Error(), "trace_seq") {
		t.Errorf("trace_seq 0: %v", err)
	}
}
