package diagnose

import (
	"slices"
	"testing"

	"pgregory.net/rapid"

	"github.com/memplan/memplan/allocator"
	"github.com/memplan/memplan/engine"
	"github.com/memplan/memplan/hw"
	"github.com/memplan/memplan/lower"
	"github.com/memplan/memplan/models"
	"github.com/memplan/memplan/ops"
)

// The baseline planned for its peak alone (engine.Options.PeakOnly: each
// pipeline stage with the micro-steps that show its own peak, like middle
// stages left out) gives the report the baseline planned in full gives: its
// row (peak, phase, ledger, op), its objects at the peak, the verdict and
// the next step. Uniform 1F1B pipelines of three to five stages, one or
// two layers each, over more micro-steps than stages, under each
// checkpointing diagnose plans, offload and ZeRO.
func TestPropertyPeakOnlyBaseReportsAsFull(t *testing.T) {
	left := 0
	rapid.Check(t, func(rt *rapid.T) {
		s := peakOnlySpec(t, rt)
		full, err := engine.PlanWith(s, engine.Options{Cache: engine.LeverCache(s), NoTimeline: true, NoTiming: true})
		if err != nil {
			rt.Skip(err)
		}
		cache := engine.LeverCache(s)
		peak, err := engine.PlanWith(s, engine.Options{Cache: cache, NoTimeline: true, NoTiming: true, PeakOnly: true})
		if err != nil {
			t.Fatalf("planned in full, for its peak: %v", err)
		}
		sameRowAndObjects(t, s, "the peak", peak, full)
		if peak.Fits != full.Fits || peak.HostPeak != full.HostPeak || peak.Stage != full.Stage {
			t.Fatalf("fits %v host %d stage %d for the peak, %v %d %d in full", peak.Fits, peak.HostPeak, peak.Stage, full.Fits, full.HostPeak, full.Stage)
		}
		left += len(full.StagePeaks) - len(peak.StagePeaks)
		peak.Compact()
		full.Compact()
		n1, w1 := nextStep(peak, cache)
		n2, w2 := nextStep(full, engine.LeverCache(s))
		if n1 != n2 || w1 != w2 {
			t.Fatalf("next step for the peak %q (%s), in full %q (%s)", n1, w1, n2, w2)
		}
	})
	if left == 0 {
		t.Fatal("no draw left a stage out")
	}
}

// With --reserved the baseline is planned for its peak and its peak's stage
// again as in full (engine.Options.ReplayPeak): its row, objects, verdict,
// host peak and stage, and the caching allocator's replay of its steady
// and first-step programs (the reserved peak and its fragmentation), are
// those of the baseline planned in full.
func TestPropertyReplayPeakReportsAsFull(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		s := peakOnlySpec(t, rt)
		s.FirstStep = true // the replay reads the first step's program too
		if rapid.Bool().Draw(rt, "host memory") {
			s.HostMemory = 1 << 20 // over it only with offload
		}
		full, err := engine.PlanWith(s, engine.Options{Cache: engine.LeverCache(s), NoTimeline: true, NoTiming: true})
		if err != nil {
			rt.Skip(err)
		}
		replay, err := engine.PlanWith(s, engine.Options{Cache: engine.LeverCache(s), NoTimeline: true, NoTiming: true, ReplayPeak: true})
		if err != nil {
			t.Fatalf("planned in full, for its peak's replay: %v", err)
		}
		sameRowAndObjects(t, s, "the replay", replay, full)
		if replay.Fits != full.Fits || replay.HostPeak != full.HostPeak || replay.HostShortfall != full.HostShortfall || replay.Stage != full.Stage ||
			replay.Shortfall != full.Shortfall || replay.Headroom != full.Headroom {
			t.Fatalf("fits %v host %d short %d stage %d for the replay, %v %d %d %d in full", replay.Fits, replay.HostPeak, replay.HostShortfall, replay.Stage,
				full.Fits, full.HostPeak, full.HostShortfall, full.Stage)
		}
		a, err := replay.PredictReserved(allocator.Config{}, false, false)
		if err != nil {
			t.Fatal(err)
		}
		b, err := full.PredictReserved(allocator.Config{}, false, false)
		if err != nil {
			t.Fatal(err)
		}
		if a.Peak != b.Peak || a.Fragmentation != b.Fragmentation || (a.First == nil) != (b.First == nil) {
			t.Fatalf("%s pp %d accum %d: reserved %d (fragmentation %d) for the replay, %d (%d) in full", s.JobName(), s.PP, s.Accum,
				a.Peak, a.Fragmentation, b.Peak, b.Fragmentation)
		}
	})
}

// sameRowAndObjects fails the test unless the baseline planned for what
// gives the row and objects of the baseline planned in full.
func sameRowAndObjects(t *testing.T, s engine.Spec, what string, got, full *engine.Result) {
	t.Helper()
	if a, b := rowOf("base", got, nil), rowOf("base", full, nil); a != b {
		t.Fatalf("%s pp %d accum %d: row for %s %+v, in full %+v", s.JobName(), s.PP, s.Accum, what, a, b)
	}
	if a, b := objects(got), objects(full); !slices.Equal(a, b) {
		t.Fatalf("%s pp %d accum %d: objects for %s %v, in full %v", s.JobName(), s.PP, s.Accum, what, a, b)
	}
}

// peakOnlySpec draws a uniform 1F1B pipeline job for
// TestPropertyPeakOnlyBaseReportsAsFull.
func peakOnlySpec(t *testing.T, rt *rapid.T) engine.Spec {
	m, err := models.Lookup(rapid.SampledFrom([]string{"gpt2", "llama-3.2-1b", "mixtral-8x7b"}).Draw(rt, "model"))
	if err != nil {
		t.Fatal(err)
	}
	g, err := hw.Lookup(rapid.SampledFrom([]string{"rtx-4090", "h100"}).Draw(rt, "gpu"))
	if err != nil {
		t.Fatal(err)
	}
	a := m.Clone()
	pp := rapid.IntRange(3, 5).Draw(rt, "pp")
	a.Layers = pp * rapid.IntRange(1, 2).Draw(rt, "layers per stage")
	s := engine.Spec{Job: engine.Job{Model: a, MicroBatch: 1 << rapid.IntRange(0, 2).Draw(rt, "log2 micro-batch"),
		Seq: 1 << rapid.IntRange(6, 10).Draw(rt, "log2 seq"), Precision: rapid.SampledFrom([]ops.Precision{ops.AMPBF16, ops.BF16}).Draw(rt, "precision"),
		Optimizer: lower.AdamW, Accum: rapid.IntRange(pp+1, 2*pp+3).Draw(rt, "accum")}, Target: engine.Target{GPU: g}}
	s.PP = pp
	s.FirstStep = rapid.Bool().Draw(rt, "first step")
	ck := rapid.SampledFrom([]string{"none", "full", "every=2", "auto", "modules=*mlp*"}).Draw(rt, "checkpoint")
	if s.Checkpoint, err = engine.ParseCheckpoint(ck); err != nil {
		t.Fatal(err)
	}
	if rapid.Bool().Draw(rt, "dp") {
		s.DP = 2
		s.ZeRO = rapid.IntRange(0, 3).Draw(rt, "zero")
	}
	s.Offload.Activations = rapid.Bool().Draw(rt, "offload activations")
	s.Offload.Optimizer = rapid.Bool().Draw(rt, "offload optimizer")
	return s
}
