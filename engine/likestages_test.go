package engine

import (
	"testing"

	"pgregory.net/rapid"
)

// A middle stage of a 1F1B pipeline whose forward graph is an earlier
// middle stage's but for names peaks no higher than that one, on the
// device and on the host, as the lever plans them (each stage's own few
// micro-steps): so the lever's plan, which leaves such stages out
// (likeEarlier), has the peak, host peak and verdict of every stage
// planned. Uniform models of three to five stages, one to three layers
// each, under each checkpointing the lever tries, offload and ZeRO.
func TestPropertyLikeStagesPeakNoHigher(t *testing.T) {
	skipped := 0
	rapid.Check(t, func(rt *rapid.T) {
		s := pipelineSpec(t, rt, 5, func(pp int) (int, int) { return 1, 2*pp + 4 })
		s.PP = max(s.PP, 3)
		s.Model.Layers = s.PP * rapid.IntRange(1, 3).Draw(rt, "layers per stage")
		switch rapid.IntRange(0, 3).Draw(rt, "checkpoint kind") {
		case 1:
			s.Checkpoint = CheckpointPolicy{Kind: CheckpointEvery, Every: 2}
		case 2:
			s.Checkpoint = CheckpointPolicy{Kind: CheckpointSelective}
		}
		o := Options{NoTiming: true, NumbersOnly: true, NoTimeline: true}
		all, err := PlanWith(s, o)
		if err != nil {
			rt.Skip(err)
		}
		lo := o
		lo.leverBound = true
		like, err := PlanWith(s, lo)
		if err != nil {
			t.Fatalf("every stage planned, like stages left out: %v", err)
		}
		if like.PeakBytes() != all.PeakBytes() || like.HostPeak != all.HostPeak || like.Fits != all.Fits || like.Shortfall != all.Shortfall {
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
			for j := 2; j < s.PP-1; j++ {
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
