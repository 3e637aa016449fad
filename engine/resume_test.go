package engine

import (
	"reflect"
	"slices"
	"testing"

	"pgregory.net/rapid"

	"github.com/memplan/memplan/units"
)

// A plan stopped after any of its stages (Options.stopAbove, as the lever
// puts a strategy off) and resumed from there (Options.resume) is the plan
// that was never stopped: its peak and where it falls, every stage's peaks
// and phase peaks, the host peak and the verdict. Pipelines of two to five
// stages of one or two layers over up to 2p+3 micro-steps, under
// checkpointing, activation offload and data parallelism, planned for
// their numbers alone (the lever's options) so that like middle stages are
// left out, and compared by the graphs of stages planned before the stop.
func TestPropertyResumedPlanIsWhole(t *testing.T) {
	resumed := 0
	rapid.Check(t, func(rt *rapid.T) {
		s := leverSpec(t, rt)
		s.PP = rapid.IntRange(2, 5).Draw(rt, "pp")
		s.Model.Layers = s.PP * rapid.IntRange(1, 2).Draw(rt, "layers per stage")
		s.Accum = rapid.IntRange(1, 2*s.PP+3).Draw(rt, "accum")
		var err error
		if s.Checkpoint, err = ParseCheckpoint(rapid.SampledFrom([]string{"none", "full", "every=2"}).Draw(rt, "checkpoint")); err != nil {
			t.Fatal(err)
		}
		s.Offload.Activations = rapid.Bool().Draw(rt, "offload activations")
		o := Options{NoTiming: true, NoTimeline: true, NumbersOnly: true}
		whole, err := PlanWith(s, o)
		if err != nil {
			rt.Skip(err)
		}
		after := rapid.IntRange(1, len(whole.StagePeaks)).Draw(rt, "stop after stages")
		n := 0
		so := o
		so.stopAbove = func(units.Bytes, bool) bool { n++; return n == after }
		part, err := PlanWith(s, so)
		if err != nil {
			t.Fatalf("stopped after %d stages: %v", after, err)
		}
		if part.stopped == nil {
			if after < len(whole.StagePeaks) {
				t.Fatalf("stopped after %d of %d stages, with none left to plan", after, len(whole.StagePeaks))
			}
			return
		}
		ro := o
		ro.resume = part
		res, err := PlanWith(s, ro)
		if err != nil {
			t.Fatalf("resumed after %d stages: %v", after, err)
		}
		resumed++
		if res.PeakBytes() != whole.PeakBytes() || res.Stage != whole.Stage || !reflect.DeepEqual(res.Sim.Peak, whole.Sim.Peak) {
			t.Fatalf("%s pp %d accum %d, resumed after %d stages: peak %d on stage %d, never stopped %d on stage %d",
				s.JobName(), s.PP, s.Accum, after, res.PeakBytes(), res.Stage, whole.PeakBytes(), whole.Stage)
		}
		if !slices.Equal(res.StagePeaks, whole.StagePeaks) || !slices.Equal(res.StagePhasePeaks, whole.StagePhasePeaks) {
			t.Fatalf("%s pp %d accum %d, resumed after %d stages: stage peaks %v, never stopped %v", s.JobName(), s.PP, s.Accum, after, res.StagePeaks, whole.StagePeaks)
		}
		if res.HostPeak != whole.HostPeak || res.Fits != whole.Fits || res.Shortfall != whole.Shortfall || (res.First == nil) != (whole.First == nil) {
			t.Fatalf("resumed: host %d fits %v short %d first %v; never stopped %d %v %d %v", res.HostPeak, res.Fits, res.Shortfall, res.First != nil,
				whole.HostPeak, whole.Fits, whole.Shortfall, whole.First != nil)
		}
	})
	if resumed == 0 {
		t.Fatal("no draw was resumed")
	}
}
