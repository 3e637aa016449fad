package workload

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

const suiteDir = "../testdata/torch/workloads"

func TestParseGood(t *testing.T) {
	w, err := Parse("w.yaml", []byte("model: m:f\nbatch: 16\nseq_len: 64\nstrategy: {accumulation: 4, checkpoint: blocks}\nforeach: false\n"))
	if err != nil {
		t.Fatal(err)
	}
	if w.Name != "f" || w.MicroBatch() != 4 || !w.Checkpointed() || *w.SeqLen != 64 || w.Iters != 3 || w.DType != "float32" || *w.Foreach {
		t.Errorf("unexpected %+v", w)
	}
	// JSON is YAML.
	if _, err := Parse("w.json", []byte(`{"model": "m:f", "batch": 2}`)); err != nil {
		t.Fatal(err)
	}
}

func TestParseBad(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"model: m:f\nbacth: 16\n", "w.yaml: unknown field 'bacth' (known fields: batch, batch_dim, device"},
		{"model: m:f\nbatch: '16'\n", `w.yaml: field 'batch' must be a integer, got "16"`},
		{"model: m:f\nbatch: 16.5\n", "field 'batch' must be a integer, got 16.5"},
		{"model: m:f\nbatch: true\n", "field 'batch' must be a integer, got true"},
		{"model: m:f\n", "w.yaml: missing required field 'batch'"},
		{"batch: 2\n", "missing required field 'model'"},
		{"model: m:f\nbatch: 2\nstrategy: {checkpointing: blocks}\n", "w.yaml: strategy: unknown field 'checkpointing' (known fields: accumulation, checkpoint, checkpoint_blocks, offload)"},
		{"model: m:f\nbatch: 2\nstrategy: [1]\n", "field 'strategy' must be a mapping, got a list"},
		{"model: m:f\nbatch: 6\nstrategy: {accumulation: 4}\n", "field 'batch' (6) must be divisible by 'strategy.accumulation' (4)"},
		{"model: m:f\nbatch: 2\nstrategy: {accumulation: 0}\n", "field 'strategy.accumulation' must be >= 1, got 0"},
		{"model: m:f\nbatch: 2\nstrategy: {checkpoint: all}\n", "field 'strategy.checkpoint' must be one of none, blocks, got 'all'"},
		{"model: m:f\nbatch: 2\nstrategy: {offload: disk}\n", "field 'strategy.offload' must be one of none, activations"},
		{"model: mf\nbatch: 2\n", "field 'model' must be MODULE:FUNCTION, got 'mf'"},
		{"model: m:f\nbatch: 0\n", "field 'batch' must be >= 1, got 0"},
		{"model: m:f\nbatch: 2\nseq_len: 0\n", "field 'seq_len' must be >= 1"},
		{"model: m:f\nbatch: 2\niters: 0\n", "field 'iters' must be >= 1"},
		{"model: m:f\nbatch: 2\nwarmup: -1\n", "field 'warmup' must be >= 0"},
		{"model: m:f\nbatch: 2\ndtype: int8\n", "field 'dtype': dtype 'int8' is not a floating-point"},
		{"model: m:f\nbatch: 2\ndevice: tpu\n", "field 'device' must be one of auto, cpu, cuda, got 'tpu'"},
		{"model: m:f\nbatch: 2\nhold_outputs: always\n", "field 'hold_outputs' must be one of none, backward, next-forward, got 'always'"},
		{"model: m:f\nbatch: 2\nhold_outputs: true\n", "field 'hold_outputs' must be a string, got true"},
		{"model: m:f\nbatch: 2\noptimizer: lion\n", "field 'optimizer': unknown optimizer 'lion'"},
		{"model: m:f\nbatch: 2\nschema: memplan.workload/v2\n", "field 'schema' must be 'memplan.workload/v1'"},
		{"model: m:f\nbatch: 2\nforeach: yes please\n", "field 'foreach' must be a boolean"},
		{"- 1\n- 2\n", "w.yaml: must be a mapping, got a list"},
		{"model: [m:f\n", "w.yaml: invalid YAML"},
		{"", "must be a mapping, got null"},
	} {
		_, err := Parse("w.yaml", []byte(c.in))
		if err == nil {
			t.Errorf("%q: no error, want %q", c.in, c.want)
			continue
		}
		if !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%q:\n got %q\nwant %q", c.in, err, c.want)
		}
		if !errors.Is(err, ErrWorkload) && !strings.Contains(c.want, "YAML") {
			t.Errorf("%q: %v does not wrap ErrWorkload", c.in, err)
		}
	}
}

func TestLoadMissing(t *testing.T) {
	_, err := Load(filepath.Join(t.TempDir(), "nope.yaml"))
	if err == nil || !strings.HasPrefix(err.Error(), "") {
		t.Fatalf("got %v", err)
	}
}

func pythonWithTorch(t *testing.T) string {
	t.Helper()
	py := "/usr/bin/python3"
	if _, err := os.Stat(py); err != nil {
		t.Skip("no /usr/bin/python3")
	}
	if err := exec.Command(py, "-c", "import torch, yaml").Run(); err != nil {
		t.Skip("Debian's torch/yaml not importable by /usr/bin/python3")
	}
	return py
}

// TestFieldsMatchPython: the Go and Python readers have the same fields with
// the same defaults.
func TestFieldsMatchPython(t *testing.T) {
	python := pythonWithTorch(t)
	out, err := exec.Command(python, "-c", `
import json, sys
sys.path.insert(0, "../python")
from memplan_torch import workload as w
print(json.dumps({"top": [[k, v[1]] for k, v in w._TOP.items()], "strategy": [[k, v[1]] for k, v in w._STRATEGY.items()],
                  "devices": list(w.DEVICES), "checkpoints": list(w.CHECKPOINTS), "offloads": list(w.OFFLOADS),
                  "optimizers": list(w.harness.OPTIMIZERS), "holds": list(w.HOLDS)}))
`).CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	var py struct {
		Top, Strategy                              [][2]any
		Devices, Checkpoints, Offloads, Optimizers []string
		Holds                                      []string
	}
	if err := json.Unmarshal(out, &py); err != nil {
		t.Fatal(err)
	}
	cmp := func(what string, spec []field, pyf [][2]any) {
		if len(spec) != len(pyf) {
			t.Errorf("%s: Go has %d fields, Python %d", what, len(spec), len(pyf))
		}
		for i := range min(len(spec), len(pyf)) {
			def := spec[i].def
			if n, ok := def.(int64); ok {
				def = float64(n)
			}
			if spec[i].name != pyf[i][0] || !reflect.DeepEqual(def, pyf[i][1]) {
				t.Errorf("%s field %d: Go %s=%v, Python %v=%v", what, i, spec[i].name, spec[i].def, pyf[i][0], pyf[i][1])
			}
		}
	}
	cmp("top", topFields, py.Top)
	cmp("strategy", strategyFields, py.Strategy)
	for _, c := range []struct {
		what   string
		go_, p []string
	}{{"devices", Devices, py.Devices}, {"checkpoints", Checkpoints, py.Checkpoints}, {"offloads", Offloads, py.Offloads}, {"optimizers", Optimizers, py.Optimizers}, {"holds", Holds, py.Holds}} {
		if !reflect.DeepEqual(c.go_, c.p) {
			t.Errorf("%s: Go %v, Python %v", c.what, c.go_, c.p)
		}
	}
}

// TestSuiteWorkloadsMatchPython parses every workload of the suite with both
// readers and requires the same normalised workload.
func TestSuiteWorkloadsMatchPython(t *testing.T) {
	files, _ := filepath.Glob(filepath.Join(suiteDir, "*.yaml"))
	if len(files) == 0 {
		t.Fatal("no suite workloads")
	}
	for _, f := range files {
		if _, err := Load(f); err != nil {
			t.Errorf("%s: %v", f, err)
		}
	}
	py := pythonWithTorch(t)
	out, err := exec.Command(py, append([]string{"-c", `
import json, sys
sys.path.insert(0, "../python")
from memplan_torch.workload import load
print(json.dumps([load(f) for f in sys.argv[1:]]))
`}, files...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	var want []map[string]any
	if err := json.Unmarshal(out, &want); err != nil {
		t.Fatal(err)
	}
	for i, f := range files {
		w, err := Load(f)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := json.Marshal(w)
		var got map[string]any
		_ = json.Unmarshal(b, &got)
		if !reflect.DeepEqual(got, want[i]) {
			t.Errorf("%s:\n Go     %v\n Python %v", filepath.Base(f), got, want[i])
		}
	}
}
