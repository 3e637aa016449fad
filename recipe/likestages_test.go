package recipe

import (
	"math"
	"slices"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/memplan/memplan/engine"
	"github.com/memplan/memplan/models/build"
)

// The three rules that leave out work a plan's numbers do not need hold
// under every recipe's semantics, with adapters, offload and ZeRO, on
// pipelines of stages of unequal sizes: a middle stage like an earlier
// one, or like the first layers of an earlier one of more layers, is left
// out of a plan read for its numbers (engine's likeEarlier and
// fewerThanEarlier) with the same peak, stage, host peak and verdict as
// every stage planned; and a priced plan of more micro-steps than it
// simulates (a like stage extrapolated by an earlier one's slope, a job on
// the compute stream alone by its middle micro-step) steps as all of them
// planned and priced, to a nanosecond per micro-step of rounding, in every
// stage's FLOPs too. The engine's own properties draw its default
// semantics only. (Of 300 draws, about 150 compare a pipeline's stages, 80
// with stages left out, and 180 a step extrapolated; sharing the slope of
// an unlike stage, or a middle micro-step off by a microsecond, fails it.)
func TestPropertyLeftOutWorkAcrossRecipes(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		// The layers are drawn below, by the pipeline's stages.
		name, s := drawJob(t, rt, []string{"gpt2", "llama-3.2-1b", "mixtral-8x7b", "deepseek-v2-lite", "gemma-3-1b"}, []string{"h100", "a100-40gb"}, nil, 9)
		var err error
		if s.Checkpoint, err = engine.ParseCheckpoint(rapid.SampledFrom([]string{"none", "full", "every=2", "selective-op"}).Draw(rt, "checkpoint")); err != nil {
			t.Fatal(err)
		}
		s.Offload = engine.Offload{Activations: rapid.Bool().Draw(rt, "offload activations"), Optimizer: rapid.Bool().Draw(rt, "offload optimizer")}
		if rapid.Bool().Draw(rt, "dp") {
			s.DP, s.ZeRO = 2, rapid.IntRange(0, 3).Draw(rt, "zero")
		}
		if rapid.Bool().Draw(rt, "lora") {
			if s.LoRA, err = build.ParseLoRA("r=8"); err != nil {
				t.Fatal(err)
			}
			s.QLoRA = rapid.Bool().Draw(rt, "qlora")
		}
		pipeline := rapid.Bool().Draw(rt, "pipeline")
		if pipeline {
			s.PP = rapid.IntRange(3, 5).Draw(rt, "stages")
			s.Model.Layers = s.PP*rapid.IntRange(1, 2).Draw(rt, "layers per stage") + rapid.IntRange(0, s.PP-1).Draw(rt, "layers past whole stages")
			s.Accum = rapid.IntRange(s.PP+1, 2*s.PP+6).Draw(rt, "accum")
		} else {
			s.Model.Layers = rapid.IntRange(1, 3).Draw(rt, "layers")
			s.Accum = rapid.IntRange(4, 7).Draw(rt, "accum")
		}
		if pipeline {
			o := engine.Options{NoTiming: true, NumbersOnly: true, NoTimeline: true}
			like, err := engine.PlanWith(s, o)
			if err != nil {
				rt.Skip(err)
			}
			for st := range s.PP {
				o.Stages = append(o.Stages, st)
			}
			all, err := engine.PlanWith(s, o)
			if err != nil {
				t.Fatalf("%s %s: like stages left out planned, every stage did not: %v", name, s.JobName(), err)
			}
			if like.PeakBytes() != all.PeakBytes() || like.HostPeak != all.HostPeak || like.Fits != all.Fits || like.Stage != all.Stage {
				t.Fatalf("%s %s layers %d accum %d ckpt %v: stages left out: peak %d on stage %d, host %d; every stage: %v, host %d",
					name, s.JobName(), s.Model.Layers, s.Accum, s.Checkpoint, like.PeakBytes(), like.Stage, like.HostPeak, all.StagePeaks, all.HostPeak)
			}
		}
		// Priced: the step of the micro-steps simulated, extrapolated.
		short, err := engine.PlanWith(s, engine.Options{NoTimeline: true})
		if err != nil {
			rt.Skip(err)
		}
		full, err := engine.PlanWith(s, engine.Options{NoTimeline: true, AllAccum: true})
		if err != nil {
			t.Fatalf("%s %s: planned short, not in full: %v", name, s.JobName(), err)
		}
		a, b := short.Timing, full.Timing
		if short.SimAccum == 0 || a == nil || b == nil {
			return // every micro-step simulated: nothing extrapolated
		}
		tol := time.Duration(s.Accum)
		if d := a.Step - b.Step; d < -tol || d > tol || !near(a.FLOPs, b.FLOPs) || !near(short.StepFLOPs, full.StepFLOPs) || !near(a.MFU, b.MFU) || short.PeakBytes() != full.PeakBytes() ||
			!slices.Equal(short.StagePeaks, full.StagePeaks) {
			t.Fatalf("%s %s layers %d accum %d ckpt %v: simulated %d: step %v, FLOPs %g (every stage's %g), MFU %g, peak %d %v; all: %v, %g (%g), %g, %d %v",
				name, s.JobName(), s.Model.Layers, s.Accum, s.Checkpoint, short.SimAccum, a.Step, a.FLOPs, short.StepFLOPs, a.MFU, short.PeakBytes(), short.StagePeaks,
				b.Step, b.FLOPs, full.StepFLOPs, b.MFU, full.PeakBytes(), full.StagePeaks)
		}
		for i := range a.Phases {
			if d := a.Phases[i].Wall - b.Phases[i].Wall; d < -tol || d > tol {
				t.Fatalf("%s %s: phase %d wall %v simulating %d, %v in full", name, s.JobName(), i, a.Phases[i].Wall, short.SimAccum, b.Phases[i].Wall)
			}
		}
	})
}

func near(a, b float64) bool { return math.Abs(a-b) <= 1e-9*math.Max(math.Abs(a), math.Abs(b))+1e-12 }
