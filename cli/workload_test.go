package cli

import (
	"bytes"
	"encoding/json"
	"path/filepath"
	"reflect"
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
