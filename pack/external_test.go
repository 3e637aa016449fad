package pack_test

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/memplan/memplan/engine"
	"github.com/memplan/memplan/hw"
	"github.com/memplan/memplan/models"
	"github.com/memplan/memplan/pack"
	"github.com/memplan/memplan/recipe"
	"github.com/memplan/memplan/report"
	"github.com/memplan/memplan/units"
)

// A plan JSON (memplan plan --json) is a job: its peak plus the recipe's
// CUDA context, its step time as the period, its timeline as the curve.
func TestPlanJSONJob(t *testing.T) {
	g, err := hw.Lookup("h100")
	if err != nil {
		t.Fatal(err)
	}
	m, err := models.Resolve("gpt2")
	if err != nil {
		t.Fatal(err)
	}
	s := engine.Spec{}
	s.Model, s.GPU, s.MicroBatch, s.Seq, s.FirstStep = m, g, 4, 512, true
	r, err := recipe.Load("hf")
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Apply(&s, nil); err != nil {
		t.Fatal(err)
	}
	res, err := engine.Plan(s)
	if err != nil {
		t.Fatal(err)
	}
	data, err := json.Marshal(report.Build(res, report.DefaultTimelinePoints))
	if err != nil {
		t.Fatal(err)
	}
	j := pack.Job{Name: "from-plan"}
	if err := j.SetPlan(data); err != nil {
		t.Fatal(err)
	}
	envs, _, err := pack.Envelopes([]pack.Job{j}, pack.Pool{GPU: g, Count: 1})
	if err != nil {
		t.Fatal(err)
	}
	e := envs[0]
	peak := res.Sim.Peak.Total
	if res.First != nil {
		peak = max(peak, res.First.Peak.Total)
	}
	ctx := units.Bytes(400_000_000) // recipe/recipes/hf.yaml cuda.overhead
	if e.Source != "plan" || e.Context != ctx || e.Allocated != ctx+peak || e.Period != res.Timing.Step.Seconds() || len(e.Curve) == 0 {
		t.Errorf("envelope %+v (peak %s, step %v)", e, peak, res.Timing.Step)
	}
	for _, bad := range []string{`{}`, `{"schema": "memplan.plan/v1"}`, `[1]`, `{"schema": "memplan.plan/v1", "params": 1, "peak": {"bytes": 5}, "time": {"step_s": 1}}`} {
		if err := (&pack.Job{Name: "x"}).SetPlan([]byte(bad)); err == nil {
			t.Errorf("SetPlan(%s) accepted", bad)
		}
	}
}

// Two processes that each hold 30 GiB share an 80 GB GPU under peaks; the
// static policy, told 10 GiB each, puts three on it and the GPU runs out.
func ExamplePackEnvelopes() {
	g, _ := hw.Lookup("h100")
	train := func(name string) *pack.Envelope {
		return &pack.Envelope{Job: name, Context: 400_000_000, ModelSize: 10 << 30,
			Allocated: 28 << 30, Cap: 29 << 30, Peak: 30 << 30, Period: 1}
	}
	res, _ := pack.PackEnvelopes([]*pack.Envelope{train("a"), train("b"), train("c")}, pack.Pool{GPU: g, Count: 4}, pack.Options{})
	for _, p := range res.Policies {
		fmt.Printf("%-9s %d GPUs, %d out of memory\n", p.Policy, p.GPUsNeeded, p.OOMGPUs)
	}
	// Output:
	// whole-gpu 3 GPUs, 0 out of memory
	// static    1 GPUs, 1 out of memory
	// peaks     2 GPUs, 0 out of memory
	// curve     2 GPUs, 0 out of memory
}
