package engine

import (
	"testing"

	"github.com/memplan/memplan/hw"
	"github.com/memplan/memplan/lower"
	"github.com/memplan/memplan/ops"
)

// TestStepFLOPsEveryStage: a pipelined plan's StepFLOPs is every stage's
// FLOPs together, and offloading activations (no compute added) leaves it
// unchanged. Found by issue 15's sweep (cmd/memplan TestSweep): compare
// --model vit-base --gpu a100-40gb --precision fp32 --optimizer sgd --pp 2
// --accum 4 said "offload activations" changes the FLOPs by -1.3%
// (extra_flops -2742084856): it compared the slowest stage's FLOPs, and the
// offload's copies made the other stage (without the patch embedding) the
// slowest.
func TestStepFLOPsEveryStage(t *testing.T) {
	gpu, err := hw.Lookup("a100-40gb")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []string{"vit-base", "gpt2"} {
		base := Spec{Job: Job{Model: lookup(t, m), MicroBatch: 1, Seq: 128, Accum: 4, Precision: ops.FP32, Optimizer: lower.SGD},
			Target: Target{GPU: gpu}}
		base.PP = 2
		whole := mustPlan(t, base)
		var sum float64
		for stage := range 2 {
			r, err := PlanWith(base, Options{Stages: []int{stage}})
			if err != nil {
				t.Fatal(err)
			}
			sum += r.Timing.FLOPs
		}
		if !near(whole.StepFLOPs, sum) || whole.StepFLOPs <= whole.Timing.FLOPs {
			t.Errorf("%s pp 2: StepFLOPs %g, the stages' %g, the slowest stage's %g", m, whole.StepFLOPs, sum, whole.Timing.FLOPs)
		}
		off := base
		off.Offload = Offload{Activations: true}
		r := mustPlan(t, off)
		t.Logf("%s: slowest stage FLOPs %g -> %g", m, whole.Timing.FLOPs, r.Timing.FLOPs)
		if !near(r.StepFLOPs, whole.StepFLOPs) {
			t.Errorf("%s pp 2: offloading activations changes the step's FLOPs from %g to %g (slowest stage's: %g to %g)",
				m, whole.StepFLOPs, r.StepFLOPs, whole.Timing.FLOPs, r.Timing.FLOPs)
		}
	}
	// One stage: the priced step's FLOPs, extrapolated past three micro-steps.
	s := Spec{Job: Job{Model: lookup(t, "gpt2"), MicroBatch: 1, Seq: 128, Accum: 9, Precision: ops.FP32, Optimizer: lower.SGD},
		Target: Target{GPU: gpu}}
	if r := mustPlan(t, s); r.SimAccum != 3 || r.StepFLOPs != r.Timing.FLOPs {
		t.Errorf("gpt2 accum 9: StepFLOPs %g, timing's %g (%d micro-steps simulated)", r.StepFLOPs, r.Timing.FLOPs, r.SimAccum)
	}
}
