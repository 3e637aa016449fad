package engine

import (
	"errors"
	"strings"
	"testing"

	"github.com/memplan/memplan/hw"
	"github.com/memplan/memplan/lower"
	"github.com/memplan/memplan/ops"
	"github.com/memplan/memplan/units"
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

// Overheads whose sum passes what a size holds are refused, and the usable
// memory never wraps: cuda.overhead and nccl.overhead of 4194303 TiB (set
// in a Spec, past the recipe's own limit) summed negative, and plan said
// "Fits (4194307.08 TiB usable)".
func TestOverheadsDoNotWrap(t *testing.T) {
	h100, err := hw.Lookup("h100")
	if err != nil {
		t.Fatal(err)
	}
	huge := units.Bytes(4194303) * units.TiB
	for _, c := range []struct {
		overhead, comm units.Bytes
		dp, tp, pp     int
	}{
		{huge, huge, 2, 2, 1},
		{0, 3000000 * units.TiB, 2, 2, 2},
		{units.MaxBytes, units.MaxBytes, 2, 1, 1},
		{1 << 62, 0, 1, 1, 1},
	} {
		s := Spec{Job: Job{Model: lookup(t, "llama-3.2-1b"), MicroBatch: 1, Seq: 64, Precision: ops.AMPBF16, Optimizer: lower.AdamW}, Target: Target{GPU: h100}}
		s.DP, s.TP, s.PP, s.Accum = c.dp, c.tp, c.pp, 2
		s.Sem.Overhead, s.Sem.CommOverhead = c.overhead, c.comm
		if capacity := s.CapacityBytes(); capacity < 0 || capacity > h100.Capacity() {
			t.Errorf("%+v: usable %d, more than the GPU's %d", c, capacity, h100.Capacity())
		}
		if out := s.OutsideAllocator(); out < 0 {
			t.Errorf("%+v: outside the allocator %d", c, out)
		}
		var fe *FieldError
		if err := s.Validate(); !errors.As(err, &fe) || fe.Field != FieldSet || !strings.Contains(err.Error(), "leave") {
			t.Errorf("%+v: %v, want a refusal of the overheads", c, err)
		}
	}
}
