package engine_test

import (
	"fmt"

	"github.com/memplan/memplan/engine"
	"github.com/memplan/memplan/hw"
	"github.com/memplan/memplan/lower"
	"github.com/memplan/memplan/models"
	"github.com/memplan/memplan/ops"
)

// Plan one training iteration of GPT-2 and ask whether it fits an RTX 4090.
func ExamplePlan() {
	m, _ := models.Lookup("gpt2")
	gpu, _ := hw.Lookup("rtx-4090")
	r, err := engine.Plan(engine.Spec{Job: engine.Job{Model: m, MicroBatch: 8, Seq: 1024, Precision: ops.AMPBF16, Optimizer: lower.AdamW}, Target: engine.Target{GPU: gpu}})
	if err != nil {
		fmt.Println(err)
		return
	}
	name, module := r.PeakOp()
	fmt.Printf("peak %s in %s at %s (%s); fits: %v\n", r.Sim.Peak.Total, r.Sim.Peak.Phase, name, module, r.Fits)
	ms := r.Sim.ModelStates
	fmt.Printf("model states %.0f bytes/param\n", float64(ms.Parameters+ms.Gradients+ms.OptimizerState)/float64(r.Sim.Params))
	// Output:
	// peak 8.94 GiB in backward at log_softmax_backward (loss); fits: true
	// model states 16 bytes/param
}
