package engine

import (
	"errors"
	"math/bits"
	"strings"
	"testing"

	"pgregory.net/rapid"

	"github.com/memplan/memplan/hw"
	"github.com/memplan/memplan/models/build"
	"github.com/memplan/memplan/strategy"
)

// TestPropertyStrategiesAtTheLimits drives every strategy at its edges:
// tensor (with sequence) and expert parallelism at every degree the model
// divides, pipelines of 2 and 4 stages (1F1B or GPipe, interleaved up to
// the 2^62 chunks that once wrapped) with up to the 1024 micro-steps a
// pipeline simulates, data parallelism up to 2^24 ranks under every ZeRO
// stage, every offload, every checkpointing policy, on micro-batch ×
// sequence up to the 2^34-token limit, on every catalog model cut to four
// layers (catalogModel). Each plan is refused in one line
// naming a field, or every total is in [0, 2^62] (checkTotals). Issue 15's
// audit of strategy/ and lower/ (every product bounded by these limits,
// each function says by which); --pp 4 --pp-interleave 2^62 wrapped into
// "pipeline cannot place op 435 (loss.backward) on a stage" before.
func TestPropertyStrategiesAtTheLimits(t *testing.T) {
	g, err := hw.Lookup("h100")
	if err != nil {
		t.Fatal(err)
	}
	planned, tried := 0, 0
	defer func() { t.Logf("%d of %d planned, the rest refused", planned, tried) }()
	rapid.Check(t, func(rt *rapid.T) {
		a := catalogModel(t, rt)
		// Tokens up to 2^20 (TestPropertyTotalsAtTheLimits takes them to
		// 2^34): here the strategies' own dimensions go to their limits.
		seq := 1 << rapid.IntRange(0, 14).Draw(rt, "log2 seq")
		mb := 1 << rapid.IntRange(0, 20-bits.Len(uint(seq))).Draw(rt, "log2 micro-batch")
		s := Spec{Job: Job{Model: a, MicroBatch: mb, Seq: seq}, Target: Target{GPU: g}}
		s.Attention = rapid.SampledFrom([]build.Attention{build.SDPA, build.Eager}).Draw(rt, "attention")
		s.TP = 1 << rapid.IntRange(0, bits.Len(uint(a.KVHeads))-1).Draw(rt, "log2 tp")
		s.SP = s.TP > 1 && rapid.Bool().Draw(rt, "sp")
		// transformers 5.x's grouped experts (moe.experts=grouped-mm),
		// refused under expert parallelism.
		s.Sem.GroupedExperts = a.NumExperts > 0 && rapid.Bool().Draw(rt, "grouped experts")
		if a.NumExperts > 0 && s.TP == 1 && !s.Sem.GroupedExperts {
			s.EP = 1 << rapid.IntRange(0, bits.Len(uint(a.NumExperts))-1).Draw(rt, "log2 ep")
		}
		drawPipeline(rt, &s)
		s.DP = 1 << rapid.IntRange(0, 24).Draw(rt, "log2 dp")
		if s.DP > 1 {
			s.ZeRO = rapid.IntRange(0, 3).Draw(rt, "zero")
		}
		s.Offload = Offload{Activations: rapid.Bool().Draw(rt, "offload activations"), Optimizer: rapid.Bool().Draw(rt, "offload optimizer")}
		if s.ZeRO == 3 && !s.Offload.Optimizer {
			s.Offload.Params = rapid.Bool().Draw(rt, "offload params")
		}
		s.Checkpoint = rapid.SampledFrom([]CheckpointPolicy{{}, {Kind: CheckpointFull}, {Kind: CheckpointEvery, Every: 2},
			{Kind: CheckpointSelective}, {Kind: CheckpointSelectiveOp}}).Draw(rt, "checkpoint")
		tried++
		r, err := PlanWith(s, Options{NoTimeline: true})
		if errors.Is(err, build.ErrBadOptions) && !strings.Contains(err.Error(), "\n") {
			return // the graph builder's refusal of a layout, naming it ("sequence parallel needs TP=2 to divide ...")
		}
		r, ok := planOrRefused(rt, s)
		if !ok {
			return
		}
		planned++
		checkTotals(rt, r)
	})
}

// drawPipeline draws no pipeline, or 2 or 4 stages with up to 1024
// micro-steps (a multiple of the stages when interleaved) and an
// interleave of 1, 2 or past every limit.
func drawPipeline(rt *rapid.T, s *Spec) {
	s.Accum = 1 << rapid.IntRange(0, 30).Draw(rt, "log2 accum")
	if !rapid.Bool().Draw(rt, "pipeline") {
		return
	}
	s.PP = rapid.SampledFrom([]int{2, 4}).Draw(rt, "pp")
	s.Accum = s.PP * (1 << rapid.IntRange(0, 8).Draw(rt, "log2 accum per stage"))
	s.PPSchedule = rapid.SampledFrom([]strategy.Schedule{strategy.OneFOneB, strategy.GPipe}).Draw(rt, "schedule")
	s.PPInterleave = rapid.SampledFrom([]int{1, 2, 1 << 62}).Draw(rt, "interleave")
}
