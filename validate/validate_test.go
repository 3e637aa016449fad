package validate

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/memplan/memplan/importer/torchtrace"
	"github.com/memplan/memplan/workload"
)

const testdata = "../testdata/torch"

// The suite's published accuracy: every compared phase peak within 3%
// (issue 4), the peak phase right; checkpointed cases pending until
// strategy.Checkpoint is wired.
func TestSuiteWithinTolerance(t *testing.T) {
	m, err := LoadMeasured(filepath.Join(testdata, "measured.json"))
	if err != nil {
		t.Fatal(err)
	}
	var preds []Prediction
	for _, c := range m.Cases {
		tr, err := torchtrace.Load(filepath.Join(testdata, c.Trace))
		if err != nil {
			t.Fatal(err)
		}
		p, err := PredictWith(c.Workload, tr, CounterFor(c.Memory, tr))
		if err != nil {
			t.Fatal(err)
		}
		preds = append(preds, p)
	}
	rep := Compare(m, preds, 0.03)
	t.Log(rep.Summary())
	if !rep.Pass {
		for _, r := range rep.Rows {
			t.Logf("%-20s %-6s %-9s %+.2f%% %s", r.Case, r.Step, r.Phase, 100*r.Error, r.Pending)
		}
		t.Fatal("beyond tolerance")
	}
	if rep.Compared < 6 {
		t.Errorf("only %d cases compared", rep.Compared)
	}
}

func TestPredictUsesWorkloadDevice(t *testing.T) {
	tr, err := torchtrace.Load(filepath.Join(testdata, "lm.trace.json"))
	if err != nil {
		t.Fatal(err)
	}
	w, err := workload.Load(filepath.Join(testdata, "workloads", "lm.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	cpu, err := Predict(w, tr)
	if err != nil {
		t.Fatal(err)
	}
	w.Device = "cuda"
	gpu, err := Predict(w, tr)
	if err != nil {
		t.Fatal(err)
	}
	// 512-byte blocks and no threshold: never below the thresholded count.
	if gpu.Steady.Forward < cpu.Steady.Forward {
		t.Errorf("cuda %d < cpu %d", gpu.Steady.Forward, cpu.Steady.Forward)
	}
	// A different optimizer replaces the recorded one.
	w.Optimizer = "sgd"
	sgd, err := Predict(w, tr)
	if err != nil {
		t.Fatal(err)
	}
	if sgd.Steady.Optimizer >= gpu.Steady.Optimizer {
		t.Errorf("sgd optimizer peak %d not below adamw %d", sgd.Steady.Optimizer, gpu.Steady.Optimizer)
	}
}

func TestCompare(t *testing.T) {
	m := &Measured{Cases: []Case{
		{Name: "a", Phases: Phases{100, 200, 50}, First: Phases{90, 190, 50}},
		{Name: "b", Phases: Phases{100, 200, 50}, First: Phases{90, 190, 50}},
		{Name: "c", Phases: Phases{100, 200, 50}, First: Phases{90, 190, 50}},
	}}
	preds := []Prediction{
		{Case: "a", Steady: Phases{101, 202, 50}, First: Phases{90, 190, 50}},
		{Case: "b", Steady: Phases{300, 200, 50}, First: Phases{90, 190, 50}}, // wrong peak phase, 200% off
		{Case: "c", Pending: "checkpointing"},
	}
	rep := Compare(m, preds, 0.03)
	if rep.Pass || rep.Compared != 2 || rep.Pending != 1 || rep.PeakRight != 1 || rep.Peaks != 12 {
		t.Errorf("%+v", rep)
	}
	if rep.Worst != 2 || rep.WorstAt != "b steady forward" {
		t.Errorf("worst %v at %q", rep.Worst, rep.WorstAt)
	}
	if !strings.Contains(rep.Summary(), "2 cases, 12 phase peaks: median 0.00%, worst 200.0% (b steady forward), peak phase right in 1/2; 1 pending; FAIL") {
		t.Errorf("summary %q", rep.Summary())
	}
	ok := Compare(m, preds[:1], 0.03)
	if ok.Pass {
		t.Error("cases without prediction must not pass silently")
	}
	m.Cases = m.Cases[:1]
	if ok = Compare(m, preds[:1], 0.03); !ok.Pass || ok.Worst != 0.01 {
		t.Errorf("%+v", ok)
	}
}

func TestParseMeasuredErrors(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{`{"cases": []}`, `m.json: missing "schema"`},
		{`{"schema": "memplan.measured/v2", "cases": []}`, `schema "memplan.measured/v2"`},
		{`{"schema": "memplan.measured/v1", "cases": []}`, "no cases"},
		{`{"schema": "memplan.measured/v1", "cases": [{"name": "x"}]}`, `cases[0]: missing "workload"`},
		{`{"schema": "memplan.measured/v1", "cases": [{"name": "x", "workload": {"model": "m:f", "batch": 2, "bacth": 1}, "micro_batch": 2, "phases": {}, "first_step": {"phases": {}}}]}`,
			"m.json: cases[0].workload: unknown field 'bacth'"},
		{`{"schema": "memplan.measured/v1", "cases": [{"name": "x", "micro_batch": "2"}]}`, `m.json: cases[0]: micro_batch: want a whole number, got a string`},
		{`{"schema": "memplan.measured/v1", "cases": [`, "truncated JSON"},
	} {
		_, err := ParseMeasured("m.json", []byte(c.in))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%.50q: got %v, want %q", c.in, err, c.want)
		}
	}
}

// measuredWith is testdata's measured file cut to its first case, with
// edit applied to that case's decoded JSON.
func measuredWith(t testing.TB, edit func(c map[string]any)) []byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(testdata, "measured.json"))
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	c := doc["cases"].([]any)[0].(map[string]any)
	edit(c)
	doc["cases"] = []any{c}
	out, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// A measured phase peak divides every error: a 0 made them +Inf (which
// --json cannot encode), a negative one made them nonsense ("worst
// 3193010180.0%"). Each is refused in one line naming the case and field.
func TestParseMeasuredPhasePeaks(t *testing.T) {
	setPhase := func(step, ph string, v any) func(map[string]any) {
		return func(c map[string]any) {
			phases := c["phases"].(map[string]any)
			if step == "first_step" {
				phases = c["first_step"].(map[string]any)["phases"].(map[string]any)
			}
			if v == nil {
				delete(phases, ph)
			} else {
				phases[ph] = v
			}
		}
	}
	for _, c := range []struct {
		name string
		edit func(map[string]any)
		want string
	}{
		{"zero", setPhase("phases", "forward", 0), `cases[0] "resnet18": phases.forward is 0 bytes: a measured peak must be positive`},
		{"negative", setPhase("phases", "backward", -5), `cases[0] "resnet18": phases.backward is -5 bytes: a measured peak must be positive`},
		{"missing", setPhase("phases", "optimizer", nil), `cases[0] "resnet18": missing "phases.optimizer" (a measured peak must be positive)`},
		{"null", setPhase("phases", "forward", json.RawMessage("null")), `missing "phases.forward"`},
		{"empty phases", func(c map[string]any) { c["phases"] = map[string]any{} }, `missing "phases.forward"`},
		{"first step zero", setPhase("first_step", "optimizer", 0), `first_step.phases.optimizer is 0 bytes: a measured peak must be positive`},
		{"first step negative", setPhase("first_step", "forward", -1), `first_step.phases.forward is -1 bytes`},
		{"first step missing", setPhase("first_step", "backward", nil), `missing "first_step.phases.backward"`},
		{"past 4 EiB", setPhase("phases", "forward", int64(1)<<62+1), `phases.forward is 4611686018427387905 bytes: over 4 EiB (2^62 bytes)`},
		{"micro-batch 0", func(c map[string]any) { c["micro_batch"] = 0 }, `cases[0] "resnet18": micro_batch is 0: want at least 1`},
		{"negative seq", func(c map[string]any) { c["seq_len"] = -1 }, `seq_len is -1: want at least 0`},
		{"negative trace batch", func(c map[string]any) { c["trace_batch"] = -2 }, `trace_batch is -2: want at least 0`},
		{"negative threshold", func(c map[string]any) { c["memory"] = map[string]any{"kind": "memtrack", "threshold_bytes": -1} }, `memory.threshold_bytes is -1: want at least 0`},
		// The run's peak and accumulation passed whatever they were.
		{"peak -1", func(c map[string]any) { c["peak_bytes"] = -1 }, `cases[0] "resnet18": peak_bytes is -1: want a whole number from 1 to 2^62`},
		{"peak 0", func(c map[string]any) { c["peak_bytes"] = 0 }, `peak_bytes is 0: want a whole number from 1 to 2^62`},
		{"peak 1e300", func(c map[string]any) { c["peak_bytes"] = 1e300 }, `peak_bytes is 1e+300: want a whole number from 1 to 2^62`},
		{"first step peak string", func(c map[string]any) { c["first_step"].(map[string]any)["peak_bytes"] = "x" }, `first_step.peak_bytes is "x": want a whole number`},
		{"micro-batch 1e12", func(c map[string]any) { c["micro_batch"] = 1_000_000_000_000 }, `micro_batch is 1000000000000: want at most 16777216`},
		{"seq past 2^34", func(c map[string]any) { c["seq_len"] = int64(1) << 35 }, `seq_len is 34359738368: want at most 17179869184`},
		{"accumulation 1e9", func(c map[string]any) { c["strategy"] = map[string]any{"accumulation": 1_000_000_000} }, `strategy.accumulation is 1000000000, its workload's strategy.accumulation 1`},
		{"accumulation past 2^30", func(c map[string]any) { c["strategy"] = map[string]any{"accumulation": int64(1) << 31} }, `strategy.accumulation is 2147483648: want a whole number from 1 to 2^30`},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := ParseMeasured("m.json", measuredWith(t, c.edit))
			if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") {
				t.Errorf("got %v, want one line containing %q", err, c.want)
			}
		})
	}
	if _, err := ParseMeasured("m.json", measuredWith(t, func(map[string]any) {})); err != nil {
		t.Errorf("the unedited case: %v", err)
	}
	// Saved with a UTF-8 byte order mark: "invalid character 'ï'".
	if _, err := ParseMeasured("m.json", append([]byte("\xef\xbb\xbf"), measuredWith(t, func(map[string]any) {})...)); err != nil {
		t.Errorf("with a BOM: %v", err)
	}
}

// The measured file is outside input: never a panic or a multi-line error,
// and a case accepted has every phase peak in (0, 2^62].
func FuzzParseMeasured(f *testing.F) {
	f.Add(measuredWith(f, func(map[string]any) {}))
	f.Add(measuredWith(f, func(c map[string]any) { c["phases"] = map[string]any{} }))
	f.Add(measuredWith(f, func(c map[string]any) {
		c["phases"] = map[string]any{"forward": 0, "backward": -5, "optimizer": int64(1) << 62}
	}))
	f.Add([]byte(`{"schema": "memplan.measured/v1", "cases": [{"name": "x", "micro_batch": "2"}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := ParseMeasured("m.json", data)
		if err != nil {
			if strings.Contains(err.Error(), "\n") {
				t.Fatalf("multi-line error %q", err)
			}
			return
		}
		for _, c := range m.Cases {
			if c.MicroBatch < 1 || c.SeqLen < 0 || c.TraceBatch < 0 || c.Memory.Threshold < 0 || c.Memory.Overflow < 0 {
				t.Fatalf("case %q: sizes %+v accepted", c.Name, c)
			}
			for _, p := range []Phases{c.Phases, c.First} {
				for _, ph := range PhaseNames {
					if v := p.Get(ph); v <= 0 || v > 1<<62 {
						t.Fatalf("case %q: %s %d bytes accepted", c.Name, ph, v)
					}
				}
			}
		}
	})
}
