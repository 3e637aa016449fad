package engine

import (
	"fmt"
	"strings"
	"testing"

	"pgregory.net/rapid"

	"github.com/memplan/memplan/hw"
	"github.com/memplan/memplan/ir"
	"github.com/memplan/memplan/lower"
	"github.com/memplan/memplan/models/build"
	"github.com/memplan/memplan/ops"
	"github.com/memplan/memplan/strategy"
)

// A pipeline stage built from its own layers (stageSlice) is the stage cut
// from the whole model's program: the same peak, phase peaks, host peak,
// parameter count and step time on every stage, under any mix of the
// options the slice allows (uneven splits, every-k checkpointing that
// starts mid-stage, tied embeddings, ZeRO, offload, TP/SP, LoRA).
func TestPropertyStageSliceEqualsWholeModel(t *testing.T) {
	names := []string{"llama-3.2-1b", "gpt2", "mixtral-8x7b", "gemma-2-9b", "pythia-160m"}
	rapid.Check(t, func(rt *rapid.T) {
		name := rapid.SampledFrom(names).Draw(rt, "model")
		a := lookup(t, name).Clone()
		a.Layers = rapid.IntRange(2, 7).Draw(rt, "layers")
		pp := rapid.IntRange(2, a.Layers).Draw(rt, "pp")
		s := Spec{Job: Job{Model: a, MicroBatch: rapid.IntRange(1, 2).Draw(rt, "b"), Seq: 64, Precision: rapid.SampledFrom([]ops.Precision{ops.BF16, ops.AMPBF16, ops.FP32}).Draw(rt, "prec"), Optimizer: lower.AdamW, Impl: rapid.SampledFrom([]lower.Impl{lower.Foreach, lower.Fused, lower.Single}).Draw(rt, "impl"), Accum: rapid.IntRange(1, 4).Draw(rt, "accum")}, Parallel: Parallel{PP: pp, PPSchedule: rapid.SampledFrom([]strategy.Schedule{strategy.OneFOneB, strategy.GPipe}).Draw(rt, "sched"), Sharding: Sharding{DP: rapid.SampledFrom([]int{1, 2, 4}).Draw(rt, "dp")}}}
		if a.NumExperts == 0 && a.Family != "gpt2" {
			s.TP = rapid.SampledFrom([]int{1, 2}).Draw(rt, "tp")
			s.SP = s.TP > 1 && rapid.Bool().Draw(rt, "sp")
		}
		drawSharding(rt, &s)
		switch rapid.IntRange(0, 3).Draw(rt, "ckpt") {
		case 1:
			s.Checkpoint = CheckpointPolicy{Kind: CheckpointFull}
		case 2:
			s.Checkpoint = CheckpointPolicy{Kind: CheckpointEvery, Every: rapid.IntRange(2, 3).Draw(rt, "every")}
		case 3:
			s.Checkpoint = CheckpointPolicy{Kind: CheckpointSelective}
			s.Attention = build.Eager // selective recomputes the eager attention core
		}
		if rapid.Bool().Draw(rt, "lora") {
			s.LoRA = &build.LoRA{Rank: 4, Alpha: 8, Targets: []string{"all-linear"}}
		}
		s.GPU, _ = hw.Lookup("h100")
		rs, err := Plan(s)
		if err != nil {
			rt.Fatalf("sliced: %v", err)
		}
		rw, err := PlanWith(s, Options{wholeStages: true})
		if err != nil {
			rt.Fatalf("whole: %v", err)
		}
		for st := range rw.StagePeaks {
			if rs.StagePeaks[st] != rw.StagePeaks[st] {
				rt.Fatalf("stage %d peaks at %s sliced, %s cut from the whole model", st, rs.StagePeaks[st], rw.StagePeaks[st])
			}
		}
		if rs.Stage != rw.Stage {
			rt.Fatalf("worst stage %d sliced, %d whole", rs.Stage, rw.Stage)
		}
		for ph := range rw.Sim.PhasePeak {
			if a, b := rs.Sim.PhasePeak[ph].Total, rw.Sim.PhasePeak[ph].Total; a != b {
				rt.Fatalf("%s peak %s sliced, %s whole", ir.Phase(ph), a, b)
			}
		}
		if rs.Sim.HostPeak != rw.Sim.HostPeak || rs.Sim.Params != rw.Sim.Params || rs.Sim.SavedTotal != rw.Sim.SavedTotal {
			rt.Fatalf("host %s/%s, params %d/%d, saved %s/%s (sliced/whole)", rs.Sim.HostPeak, rw.Sim.HostPeak,
				rs.Sim.Params, rw.Sim.Params, rs.Sim.SavedTotal, rw.Sim.SavedTotal)
		}
		if rs.Timing.Step != rw.Timing.Step {
			rt.Fatalf("step %v sliced, %v whole", rs.Timing.Step, rw.Timing.Step)
		}
		if rs.Program.Ops[rs.Sim.Peak.Op].Module != rw.Program.Ops[rw.Sim.Peak.Op].Module {
			rt.Fatalf("peak in %q sliced, %q whole", rs.Program.Ops[rs.Sim.Peak.Op].Module, rw.Program.Ops[rw.Sim.Peak.Op].Module)
		}
	})
}

// Plans sharing a Cache equal plans without one, whatever order specs
// that share (or do not share) cached programs come in.
func TestPropertyCacheChangesNothing(t *testing.T) {
	a := lookup(t, "llama-3.2-1b").Clone()
	a.Layers = 4
	c := &Cache{Limit: 5000}
	rapid.Check(t, func(rt *rapid.T) {
		s := Spec{Job: Job{Model: a, MicroBatch: rapid.IntRange(1, 2).Draw(rt, "b"), Seq: 64, Precision: ops.BF16, Optimizer: lower.AdamW, Impl: rapid.SampledFrom([]lower.Impl{lower.Foreach, lower.Fused}).Draw(rt, "impl"), Accum: rapid.IntRange(1, 3).Draw(rt, "accum")}, Parallel: Parallel{PP: rapid.SampledFrom([]int{1, 2, 4}).Draw(rt, "pp"), Sharding: Sharding{DP: rapid.SampledFrom([]int{1, 2, 4}).Draw(rt, "dp")}}, Target: Target{FirstStep: rapid.Bool().Draw(rt, "first")}}
		// autocast-bf16 without adapters: an autocast cache with nothing
		// to cache hands back the cached program, which Release must
		// then leave alone
		s.Precision = rapid.SampledFrom([]ops.Precision{ops.BF16, ops.AMPBF16, ops.AutocastBF16}).Draw(rt, "precision")
		drawSharding(rt, &s)
		if rapid.Bool().Draw(rt, "ckpt") {
			s.Checkpoint = CheckpointPolicy{Kind: CheckpointEvery, Every: 2}
		}
		s.GPU, _ = hw.Lookup("h100")
		want, err := Plan(s)
		if err != nil {
			rt.Fatal(err)
		}
		for i := 0; i < 2; i++ {
			got, err := PlanWith(s, Options{Cache: c})
			if err != nil {
				rt.Fatal(err)
			}
			if len(got.StagePeaks) != len(want.StagePeaks) || got.Sim.Peak.Total != want.Sim.Peak.Total ||
				got.Sim.HostPeak != want.Sim.HostPeak || got.Timing.Step != want.Timing.Step || len(got.Program.Ops) != len(want.Program.Ops) ||
				(want.First != nil && got.First.Peak.Total != want.First.Peak.Total) {
				rt.Fatalf("pass %d: cached plan differs: peak %s/%s, step %v/%v", i, got.Sim.Peak.Total, want.Sim.Peak.Total, got.Timing.Step, want.Timing.Step)
			}
			got.Release() // as compare and fit do with what they have judged
		}
	})
	if hits, _ := c.Stats(); hits < 100 {
		t.Errorf("%d cache hits in 100 repeated plans", hits)
	}
}

// Transforms share tensor shapes, operand lists and the Comm and Transfer of
// ops with their input (strategy.Clone) and must never write into them: a
// cached program stays exactly as it was while the checkpoint, sharding
// and offload variants of its spec are planned from it.
func TestPropertyTransformsLeaveCacheAlone(t *testing.T) {
	a := lookup(t, "llama-3.2-1b").Clone()
	a.Layers = 4
	snapshot := func(c *Cache) map[cacheKey]string {
		c.mu.Lock()
		defer c.mu.Unlock()
		out := map[cacheKey]string{}
		for k, e := range c.m {
			var b strings.Builder
			for _, op := range e.prog.Ops {
				fmt.Fprintf(&b, "%+v %v %v", op, op.In, op.Out)
				if op.Comm != nil {
					fmt.Fprintf(&b, " %+v", *op.Comm)
				}
				if op.Transfer != nil {
					fmt.Fprintf(&b, " %+v", *op.Transfer)
				}
				b.WriteByte('\n')
			}
			for _, t := range e.prog.Tensors {
				fmt.Fprintf(&b, "%+v\n", t)
			}
			out[k] = b.String()
		}
		return out
	}
	rapid.Check(t, func(rt *rapid.T) {
		c := &Cache{}
		s := Spec{Job: Job{Model: a, MicroBatch: rapid.IntRange(1, 2).Draw(rt, "b"), Seq: 64, Precision: ops.BF16, Optimizer: lower.AdamW, Impl: rapid.SampledFrom([]lower.Impl{lower.Foreach, lower.Fused}).Draw(rt, "impl"), Accum: rapid.IntRange(1, 3).Draw(rt, "accum")}, Parallel: Parallel{PP: rapid.SampledFrom([]int{1, 2}).Draw(rt, "pp"), Sharding: Sharding{DP: rapid.SampledFrom([]int{2, 4}).Draw(rt, "dp")}}}
		if rapid.Bool().Draw(rt, "ckpt") {
			s.Checkpoint = CheckpointPolicy{Kind: CheckpointEvery, Every: 2}
		}
		drawSharding(rt, &s)
		if _, err := PlanWith(s, Options{Cache: c}); err != nil {
			rt.Fatal(err)
		}
		before := snapshot(c)
		for i := 0; i < 3; i++ {
			v := s
			v.Offload = Offload{}
			drawSharding(rt, &v)
			v.Checkpoint = rapid.SampledFrom([]CheckpointPolicy{{}, {Kind: CheckpointFull}, {Kind: CheckpointEvery, Every: 2}}).Draw(rt, "ckpt variant")
			if _, err := PlanWith(v, Options{Cache: c}); err != nil {
				rt.Fatal(err)
			}
		}
		after := snapshot(c)
		for k, want := range before {
			if after[k] != want {
				rt.Fatalf("cached program %+v changed while planning its variants", k)
			}
		}
	})
}
