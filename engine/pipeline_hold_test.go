package engine

import (
	"strings"
	"testing"

	"github.com/memplan/memplan/hw"
	"github.com/memplan/memplan/lower"
	"github.com/memplan/memplan/ops"
)

// TestPipelineHeldOutputs: a loop that holds its logits into the next
// forward (lower.HoldNextForward: the litgpt and pytorch recipes) pipelines,
// the held logits on the last stage alone. Found by issue 15's sweep
// (cmd/memplan TestSweep): plan --model gpt2 --pp 2 --accum 4 --recipe
// litgpt was refused with "pipeline cannot place op 133 (logits =
// model(...) (rebinds)) on a stage". Zeroing gradients between forward and
// backward, whose carried gradients are one tensor of the whole model, is
// refused in words.
func TestPipelineHeldOutputs(t *testing.T) {
	gpu, err := hw.Lookup("h100")
	if err != nil {
		t.Fatal(err)
	}
	s := Spec{Job: Job{Model: lookup(t, "gpt2"), MicroBatch: 1, Seq: 1024, Accum: 4, Precision: ops.AMPBF16, Optimizer: lower.AdamW},
		Target: Target{GPU: gpu}}
	s.PP = 2
	free := mustPlan(t, s)
	s.Sem.Hold = lower.HoldNextForward
	held := mustPlan(t, s)
	// bf16 logits [1, 1024, 50257] (the lm_head's output under autocast).
	logits := int64(1024 * 50257 * 2)
	d := int64(held.StagePeaks[1] - free.StagePeaks[1])
	if held.StagePeaks[0] != free.StagePeaks[0] || d < logits-4096 || d > logits+4096 {
		t.Errorf("stage peaks %v holding the logits, %v not: want the first equal, the last %d bytes higher", held.StagePeaks, free.StagePeaks, logits)
	}
	s.Sem.ZeroGrad = lower.ZeroAfterForward
	if _, err := Plan(s); err == nil || !strings.Contains(err.Error(), "does not model zero_grad between forward and backward") {
		t.Errorf("zero_grad after forward under --pp: %v", err)
	}
}
