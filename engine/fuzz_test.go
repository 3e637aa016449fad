package engine

import (
	"os"
	"strings"
	"testing"

	"github.com/memplan/memplan/importer/torchtrace"
)

// tinyTrace is testdata/torch/three_events.trace.json (importer/torchtrace's
// tiny fixture): three events, small enough that the fuzzer mutates rather
// than minimizes.
var tinyTrace = func() string {
	b, err := os.ReadFile("../testdata/torch/three_events.trace.json")
	if err != nil {
		panic(err)
	}
	return string(b)
}()

// FuzzPlanTraceSizes plans small traces at extreme micro-batches,
// accumulations and pipeline degrees: a plan is refused in one line or
// has a peak in [0, MaxBytes] (a wrapped size would be negative or past
// it). Seeds carry the extreme values of every size field.
func FuzzPlanTraceSizes(f *testing.F) {
	huge := strings.Replace(tinyTrace, `"bytes_per_batch": 16, "dtype": "float32", "shape": [2, 4], "category": "activation"`, `"bytes_per_batch": 4611686018427387904, "dtype": "float32", "shape": [2, 4], "category": "activation"`, 1)
	neg := strings.Replace(tinyTrace, `"bytes_const": 64, "bytes_per_batch": 0, "dtype": "float32", "shape": [4, 4], "category": "gradient"`, `"bytes_const": -9223372036854775808, "bytes_per_batch": 0, "dtype": "float32", "shape": [4, 4], "category": "gradient"`, 1)
	big := strings.Replace(tinyTrace, `"trace_batch": 2`, `"trace_batch": 9223372036854775807`, 1)
	for _, tr := range []string{tinyTrace, huge, neg, big} {
		for _, c := range []struct{ mb, accum, pp int }{{0, 0, 1}, {1 << 62, 1, 1}, {1 << 34, 1 << 30, 1}, {-1, -1, 1}, {1, 1 << 31, 1}, {2, 1025, 2}, {1<<63 - 1, 1<<63 - 1, 1<<63 - 1}} {
			f.Add([]byte(tr), c.mb, c.accum, c.pp)
		}
	}
	f.Fuzz(func(t *testing.T, data []byte, mb, accum, pp int) {
		tr, err := torchtrace.Parse(data)
		if err != nil {
			return
		}
		if pp > 1 && accum > 64 {
			accum = 64 // a pipeline simulates every micro-step: keep execs fast
		}
		r, err := Plan(Spec{Job: Job{Trace: tr, MicroBatch: mb, Accum: accum}, Parallel: Parallel{PP: pp}})
		if err != nil {
			if strings.Contains(err.Error(), "\n") {
				t.Fatalf("error in more than one line: %q", err)
			}
			return
		}
		if p := r.Sim.Peak.Total; p < 0 || p > MaxBytes {
			t.Fatalf("micro-batch %d accum %d pp %d: peak %d out of [0, 2^62]", mb, accum, pp, p)
		}
	})
}
