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

	"github.com/memplan/memplan/engine"
	"github.com/memplan/memplan/internal/boundedio"
	"github.com/memplan/memplan/search"
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
		{"model: m:f\nbatch: '16'\n", `w.yaml: field 'batch' must be an integer, got a string`},
		{"model: m:f\nbatch: 16.5\n", "field 'batch' must be an integer, got a float"},
		{"model: m:f\nbatch: true\n", "field 'batch' must be an integer, got a boolean"},
		{"model: m:f\n", "w.yaml: missing required field 'batch'"},
		{"batch: 2\n", "missing required field 'model'"},
		{"model: m:f\nbatch: 2\nstrategy: {checkpointing: blocks}\n", "w.yaml: strategy: unknown field 'checkpointing' (known fields: accumulation, checkpoint, checkpoint_blocks, offload)"},
		{"model: m:f\nbatch: 2\nstrategy: [1]\n", "field 'strategy' must be a mapping, got a list"},
		{"model: m:f\nbatch: 2\nstrategy: {accumulation: x}\n", "w.yaml: field 'strategy.accumulation' must be an integer, got a string"},
		{"model: \"m:f\\nx\"\nbatch: 2\ndevice: \"a\\nb\"\n", `field 'device' must be one of auto, cpu, cuda, got "a\nb"`},
		{"model: m:f\nbatch: 6\nstrategy: {accumulation: 4}\n", "field 'batch' (6) must be divisible by 'strategy.accumulation' (4)"},
		{"model: m:f\nbatch: 2\nstrategy: {accumulation: 0}\n", "field 'strategy.accumulation' must be >= 1, got 0"},
		{"model: m:f\nbatch: 2\nstrategy: {checkpoint: all}\n", "field 'strategy.checkpoint' must be one of none, blocks, got \"all\""},
		{"model: m:f\nbatch: 2\nstrategy: {offload: disk}\n", "field 'strategy.offload' must be one of none, activations"},
		{"model: mf\nbatch: 2\n", "field 'model' must be MODULE:FUNCTION, got \"mf\""},
		{"model: m:f\nbatch: 0\n", "field 'batch' must be >= 1, got 0"},
		{"model: m:f\nbatch: 2\nseq_len: 0\n", "field 'seq_len' must be >= 1"},
		{"model: m:f\nbatch: 2\niters: 0\n", "field 'iters' must be >= 1"},
		{"model: m:f\nbatch: 2\nwarmup: -1\n", "field 'warmup' must be >= 0"},
		{"model: m:f\nbatch: 2\ndtype: int8\n", `field 'dtype' must be one of float32, float16, bfloat16, float64 (or bf16, double, float, fp16, fp32, fp64, half), got "int8"`},
		{"model: m:f\nbatch: 2\ndevice: tpu\n", "field 'device' must be one of auto, cpu, cuda, got \"tpu\""},
		{"model: m:f\nbatch: 2\nhold_outputs: always\n", "field 'hold_outputs' must be one of none, backward, next-forward, got \"always\""},
		{"model: m:f\nbatch: 2\nhold_outputs: true\n", "field 'hold_outputs' must be a string, got a boolean"},
		{"model: m:f\nbatch: 2\noptimizer: lion\n", "field 'optimizer' must be one of adamw, sgd, sgd-momentum, got \"lion\""},
		{"model: m:f\nbatch: 2\nschema: memplan.workload/v2\n", "field 'schema' must be \"memplan.workload/v1\""},
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

// TestTableLimits: the field table's bounds are engine's and search's
// limits where one applies (a workload plans as an engine.Spec, and fit
// searches at most search.MaxGlobalBatch samples per step).
func TestTableLimits(t *testing.T) {
	want := map[string]int64{"batch": search.MaxGlobalBatch, "seq_len": engine.MaxTokens, "strategy.accumulation": engine.MaxAccum}
	for _, c := range []struct {
		prefix string
		fs     []fieldSpec
	}{{"", table.Top}, {"strategy.", table.Strategy}} {
		for _, f := range c.fs {
			if w, ok := want[c.prefix+f.Name]; ok && (f.Max == nil || *f.Max != w) {
				t.Errorf("%s%s: table max %v, want %d", c.prefix, f.Name, f.Max, w)
			}
			if f.Type == "integer" && (f.Min == nil || f.Max == nil) {
				t.Errorf("%s%s: an integer field without min and max", c.prefix, f.Name)
			}
		}
	}
	if table.Limits.Bytes != boundedio.SmallFile {
		t.Errorf("table limits.bytes %d, the Go reader reads up to %d", table.Limits.Bytes, boundedio.SmallFile)
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
