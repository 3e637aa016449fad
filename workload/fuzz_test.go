package workload

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// FuzzParse reads workload files (YAML or JSON, docs/measure-format.md): any
// input is refused in one line naming the file, or yields a workload whose
// sizes hold what Validate promises (batch >= 1 and a multiple of the
// accumulation, seq_len >= 1, iters >= 1). Seeds: the validation suite's
// workloads and the extreme integers (2^63-1, 2^63, -2^63, 1e309), floats
// for ints, several documents and anchors.
func FuzzParse(f *testing.F) {
	paths, _ := filepath.Glob(filepath.Join(suiteDir, "*.yaml"))
	for _, p := range paths {
		if b, err := os.ReadFile(p); err == nil {
			f.Add(b)
		}
	}
	for _, s := range []string{
		"model: m:f\nbatch: 9223372036854775807\n",
		"model: m:f\nbatch: 9223372036854775808\nstrategy: {accumulation: 9223372036854775807}\n",
		"model: m:f\nbatch: -9223372036854775808\n",
		"model: m:f\nbatch: 1e309\nseq_len: 1e309\n",
		"model: m:f\nbatch: 16.0\nseq_len: 2147483647\niters: 2147483648\n",
		"model: m:f\nbatch: 4\n---\nmodel: n:g\nbatch: 8\n",
		"a: &x {accumulation: 2}\nmodel: m:f\nbatch: 4\nstrategy: *x\n",
		"model: m:f\nbatch: .nan\n", "model: m:f\nbatch: .inf\n", "model: m:f\nbatch: 0x10\n",
		`{"model": "m:f", "batch": 2, "model_args": {"n": 1e400}}`,
		"\xff\xfe\x00", "",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		w, err := Parse("w.yaml", data)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "w.yaml") || strings.Contains(err.Error(), "\n") {
				t.Fatalf("error not one line naming the file: %q", err)
			}
			return
		}
		if w.Batch < 1 || w.Strategy.Accumulation < 1 || w.Batch%w.Strategy.Accumulation != 0 || w.MicroBatch() < 1 ||
			w.SeqLen != nil && *w.SeqLen < 1 || w.Iters < 1 || w.Warmup < 0 {
			t.Fatalf("%q: accepted %+v", data, w)
		}
	})
}
