package engine

import (
	"errors"
	"strings"
	"testing"

	"github.com/memplan/memplan/hw"
	"github.com/memplan/memplan/lower"
	"github.com/memplan/memplan/ops"
)

// A step the pricer saturates (longer than a time.Duration holds) is
// refused naming the GPU, not reported as 2562047h47m16s: a cluster file's
// link of 1e-300 Gb/s printed that maximum as plan's step time.
func TestSaturatedStepRefused(t *testing.T) {
	h100, err := hw.Lookup("h100")
	if err != nil {
		t.Fatal(err)
	}
	slow := *h100
	slow.MemBandwidth = 1e-300
	s := Spec{Job: Job{Model: lookup(t, "gpt2"), MicroBatch: 1, Seq: 64, Precision: ops.AMPBF16, Optimizer: lower.AdamW}, Target: Target{GPU: &slow}}
	_, err = Plan(s)
	var fe *FieldError
	if err == nil || !errors.As(err, &fe) || fe.Field != FieldGPU || !strings.Contains(err.Error(), "too slow to time") {
		t.Fatalf("got %v, want a refusal naming the GPU", err)
	}
}
