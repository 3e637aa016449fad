package engine

import (
	"slices"
	"testing"

	"pgregory.net/rapid"

	"github.com/memplan/memplan/lower"
	"github.com/memplan/memplan/ops"
)

// A middle stage of a 1F1B pipeline whose forward graph is an earlier
// middle stage's, or that of its first layers, but for names peaks no
// higher than that one, on the device and on the host, as an unpriced
// plan for numbers alone plans them (the lever's: each stage's own few
// micro-steps): so such a plan, which leaves those stages out
// (likeEarlier, fewerThanEarlier), has the peak, its stage and ledger, the
// host peak and the verdict of every stage planned. Uniform models of
// three to five stages, one to three layers each and as many more as
// stages less one (stages of unequal sizes), under each checkpointing the
// lever tries, offload and ZeRO.
func TestPropertyLikeStagesPeakNoHigher(t *testing.T) {
	skipped := 0
	rapid.Check(t, func(rt *rapid.T) {
		s := pipelineSpec(t, rt, 5, func(pp int) (int, int) { return 1, 2*pp + 4 })
		s.PP = max(s.PP, 3)
		rest := rapid.IntRange(0, s.PP-1).Draw(rt, "layers past whole stages")
		s.Model.Layers = s.PP*rapid.IntRange(1, 3).Draw(rt, "layers per stage") + rest
		switch rapid.IntRange(0, 3).Draw(rt, "checkpoint kind") {
		case 1:
			s.Checkpoint = CheckpointPolicy{Kind: CheckpointEvery, Every: 2}
		case 2:
			s.Checkpoint = CheckpointPolicy{Kind: CheckpointSelective}
		}
		o := Options{NoTiming: true, NumbersOnly: true, NoTimeline: true}
		every := o
		for st := range s.PP {
			every.Stages = append(every.Stages, st) // each stage named: planned
		}
		all, err := PlanWith(s, every)
		if err != nil {
			rt.Skip(err)
		}
		like, err := PlanWith(s, o)
		if err != nil {
			t.Fatalf("every stage planned, like stages left out: %v", err)
		}
		if like.PeakBytes() != all.PeakBytes() || like.HostPeak != all.HostPeak || like.Fits != all.Fits || like.Shortfall != all.Shortfall ||
			like.Stage != all.Stage || like.Sim.Peak != all.Sim.Peak {
			t.Fatalf("like stages left out: peak %d host %d fits %v; every stage: peak %d (stages %v) host %d fits %v",
				like.PeakBytes(), like.HostPeak, like.Fits, all.PeakBytes(), all.StagePeaks, all.HostPeak, all.Fits)
		}
		if n := len(all.StagePeaks) - len(like.StagePeaks); n > 0 {
			skipped += n
			// Each stage left out against the stages planned: none
			// peaks higher on the host either.
			hosts := make([]int64, s.PP)
			for st := range s.PP {
				so := o
				so.Stages = []int{st}
				r, err := PlanWith(s, so)
				if err != nil {
					t.Fatal(err)
				}
				hosts[st] = int64(r.HostPeak)
				if r.StagePeaks[0] != all.StagePeaks[st] {
					t.Fatalf("stage %d alone peaks at %d, with the others at %d", st, r.StagePeaks[0], all.StagePeaks[st])
				}
			}
			for j := 2; j < s.PP-1 && rest == 0; j++ {
				if all.StagePeaks[j] > all.StagePeaks[1] || hosts[j] > hosts[1] {
					if s.Checkpoint.Kind != CheckpointEvery || s.Model.Layers/s.PP%2 == 0 {
						t.Fatalf("%s accum %d ckpt %v offload %+v zero %d dp %d first %v: middle stage %d peaks at %d (host %d), over stage 1's %d (host %d), layers alike; stages %v", s.JobName(), s.Accum, s.Checkpoint, s.Offload, s.ZeRO, s.DP, s.FirstStep, j, all.StagePeaks[j], hosts[j], all.StagePeaks[1], hosts[1], all.StagePeaks)
					}
				}
			}
		}
	})
	if skipped == 0 {
		t.Fatal("no draw left a stage out")
	}
}

// A middle stage of fewer layers than an earlier one, like its first
// layers, is left out: gpt2 of 10 layers over 4 stages is stages of 2, 3,
// 2 and 3 layers, and stage 2 (layers 5 and 6) is stage 1's first two.
// The plan reads the peak of every stage planned.
func TestFewerThanEarlierLeavesStageOut(t *testing.T) {
	a := lookup(t, "gpt2").Clone()
	a.Layers = 10
	s := Spec{Job: Job{Model: a, MicroBatch: 1, Seq: 128, Precision: ops.AMPBF16, Optimizer: lower.AdamW, Accum: 6}}
	s.PP = 4
	o := Options{NoTiming: true, NumbersOnly: true, NoTimeline: true}
	like, err := PlanWith(s, o)
	if err != nil {
		t.Fatal(err)
	}
	o.Stages = []int{0, 1, 2, 3}
	all, err := PlanWith(s, o)
	if err != nil {
		t.Fatal(err)
	}
	if len(like.StagePeaks) != 3 || len(all.StagePeaks) != 4 {
		t.Fatalf("stages planned: %d and %d (every stage named); want 3 (stage 2 left out) and 4", len(like.StagePeaks), len(all.StagePeaks))
	}
	if all.StagePeaks[2] > all.StagePeaks[1] || like.PeakBytes() != all.PeakBytes() || like.Stage != all.Stage {
		t.Fatalf("stage peaks %v, peak %d on stage %d; left out: peak %d on stage %d", all.StagePeaks, all.PeakBytes(), all.Stage, like.PeakBytes(), like.Stage)
	}
}

// StopUnfit and StopOver end a plan at the first stage over the capacity
// or the bound: one stage planned of a pipeline whose first is over, no
// first step, not judged; a plan under them is planned whole and judged.
func TestStopUnfitAndOver(t *testing.T) {
	a := lookup(t, "gpt2").Clone()
	a.Layers = 4
	s := Spec{Job: Job{Model: a, MicroBatch: 1, Seq: 128, Precision: ops.AMPBF16, Optimizer: lower.AdamW, Accum: 6},
		Target: Target{Capacity: 1 << 20, FirstStep: true}}
	s.PP = 4
	whole, err := PlanWith(s, Options{NoTiming: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range []Options{{NoTiming: true, StopUnfit: true}, {NoTiming: true, StopOver: whole.StagePeaks[0] - 1}} {
		r, err := PlanWith(s, o)
		if err != nil {
			t.Fatal(err)
		}
		if len(r.StagePeaks) != 1 || r.First != nil || r.Fits || r.PeakBytes() != whole.StagePeaks[0] {
			t.Errorf("stop unfit %v over %d: stages %v, first step %v, fits %v, peak %d; want stage 0's %d alone",
				o.StopUnfit, o.StopOver, r.StagePeaks, r.First != nil, r.Fits, r.PeakBytes(), whole.StagePeaks[0])
		}
	}
	s.Capacity = 1 << 50
	r, err := PlanWith(s, Options{NoTiming: true, StopUnfit: true, StopOver: 1 << 50})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(r.StagePeaks, whole.StagePeaks) || r.First == nil || !r.Fits {
		t.Errorf("under both: stages %v (want %v), first step %v, fits %v", r.StagePeaks, whole.StagePeaks, r.First != nil, r.Fits)
	}
}
