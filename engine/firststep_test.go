package engine

import (
	"testing"

	"github.com/memplan/memplan/lower"
	"github.com/memplan/memplan/ops"
)

// A plan read for its numbers alone leaves the first step out where it
// peaks no higher (firstNoHigher: any model, offloaded or not, not a
// trace), with the peak, the host peak and the verdict of the plan that
// builds it.
func TestNumbersOnlyLeavesTheFirstStepOut(t *testing.T) {
	a := lookup(t, "gpt2").Clone()
	a.Layers = 2
	s := Spec{Job: Job{Model: a, MicroBatch: 1, Seq: 128, Precision: ops.AMPBF16, Optimizer: lower.AdamW, Accum: 2},
		Target: Target{Capacity: 1 << 30, FirstStep: true}}
	for _, off := range []Offload{{}, {Activations: true}, {Optimizer: true}} {
		s.Offload = off
		full, err := PlanWith(s, Options{NoTiming: true})
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range []Options{{NoTiming: true, NumbersOnly: true}, {NoTiming: true, PeakOnly: true}} {
			r, err := PlanWith(s, o)
			if err != nil {
				t.Fatal(err)
			}
			if r.First != nil || full.First == nil {
				t.Errorf("offload %+v, numbers only %v, peak only %v: first step built %v, in full %v", off, o.NumbersOnly, o.PeakOnly, r.First != nil, full.First != nil)
			}
			if r.PeakBytes() != full.PeakBytes() || r.HostPeak != full.HostPeak || r.Fits != full.Fits {
				t.Errorf("offload %+v: peak %d host %d fits %v, with the first step %d %d %v", off, r.PeakBytes(), r.HostPeak, r.Fits, full.PeakBytes(), full.HostPeak, full.Fits)
			}
		}
	}
}
