package recipe

import (
	"slices"
	"testing"

	"github.com/memplan/memplan/engine"
	"github.com/memplan/memplan/hw"
	"github.com/memplan/memplan/ir"
	"github.com/memplan/memplan/models"
	"github.com/memplan/memplan/models/build"
)

// Every stage of a LoRA pipeline steps its own adapters in the steady step,
// as in the first, under every recipe: Megatron's (and DeepSpeed's) fused
// Adam reads the float32 gradient copies of the parameters with main
// weights, which only the last stage holds (the model's head), and the
// first stages once dropped their whole optimizer step for that
// (strategy's cutOptimizerOp), with their optimizer state: bert-base --pp 3
// kept it on the last stage alone, and the first step, which creates the
// state, pinned 3× the steady step's host memory under --offload optimizer.
func TestLoRAPipelineStepsEveryStage(t *testing.T) {
	m, err := models.Lookup("bert-base")
	if err != nil {
		t.Fatal(err)
	}
	g, err := hw.Lookup("h100")
	if err != nil {
		t.Fatal(err)
	}
	state := func(p *ir.Program) []string {
		var names []string
		for _, tt := range p.Tensors {
			if tt.Cat == ir.OptimizerState && tt.Bytes > 0 {
				names = append(names, tt.Name)
			}
		}
		slices.Sort(names)
		return names
	}
	for _, name := range Names() {
		if name == "litgpt" {
			continue // its adapters are parts of a fused qkv linear, which bert-base has not
		}
		r, err := Load(name)
		if err != nil {
			t.Fatal(err)
		}
		for _, offload := range []bool{false, true} {
			a := m.Clone()
			a.Layers = 3
			s := engine.Spec{Job: engine.Job{Model: a, MicroBatch: 1, Seq: 32}, Target: engine.Target{GPU: g}}
			if err := r.Apply(&s, nil); err != nil {
				t.Fatal(err)
			}
			s.Accum, s.PP, s.FirstStep = 1, 3, true
			s.Offload = engine.Offload{Optimizer: offload}
			if s.LoRA, err = build.ParseLoRA("r=8"); err != nil {
				t.Fatal(err)
			}
			for st := range s.PP {
				res, err := engine.PlanWith(s, engine.Options{NoTiming: true, NoTimeline: true, Stages: []int{st}})
				if err != nil {
					t.Fatalf("%s stage %d: %v", name, st, err)
				}
				steady, first := state(res.Program), state(res.FirstProgram)
				if len(first) == 0 || !slices.Equal(steady, first) {
					t.Errorf("%s --offload optimizer=%v stage %d: the steady step holds optimizer state %v, the first step creates %v",
						name, offload, st, steady, first)
				}
				if res.First.HostPeak > res.Sim.HostPeak {
					t.Errorf("%s --offload optimizer=%v stage %d: the first step pins %d bytes of host memory, the steady step %d",
						name, offload, st, res.First.HostPeak, res.Sim.HostPeak)
				}
			}
		}
	}
}
