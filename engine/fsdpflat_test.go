package engine

import (
	"github.com/memplan/memplan/sim"
	"reflect"
	"testing"

	"pgregory.net/rapid"

	"github.com/memplan/memplan/lower"
	"github.com/memplan/memplan/models"
	"github.com/memplan/memplan/models/build"
	"github.com/memplan/memplan/ops"
	"github.com/memplan/memplan/strategy"
)

// fsdpJob is litgpt's LoRA job shape on a small Llama: bf16-true, LoRA on
// q_proj and v_proj with bf16 adapters, FULL_SHARD over dp ranks, every
// layer checkpointed, three micro-steps.
func fsdpJob(t testing.TB, dp int, flat bool) Spec {
	a, err := models.Lookup("llama-3.2-1b")
	if err != nil {
		t.Fatal(err)
	}
	a = a.Clone()
	a.Hidden, a.Heads, a.KVHeads, a.HeadDim, a.Intermediate, a.Layers, a.Vocab = 128, 2, 2, 64, 256, 3, 512
	return Spec{Job: Job{Model: a, MicroBatch: 2, Seq: 128, Accum: 3, Precision: ops.PureBF16, Optimizer: lower.AdamW, LoRA: &build.LoRA{Rank: 8, Alpha: 16, Targets: []string{"q_proj", "v_proj"}}}, Sem: Semantics{LoRAModelDType: true, FSDPFlat: flat}, Parallel: Parallel{Sharding: Sharding{DP: dp, ZeRO: 3}}, Savings: Savings{Checkpoint: CheckpointPolicy{Kind: CheckpointFull}}, Target: Target{FirstStep: true}}
}

// Without Sem.FSDPFlat, ZeRO-3 stays the per-parameter, PEFT-aware sharding
// it was: the plan is the plain LoRA graph, lowered and checkpointed, under
// strategy.ZeRO without Flat (when FlatParameters were added its peaks were
// checked equal to commit ebd550b's, 2,799,488 and 2,495,936 bytes at dp 2
// and 4). FSDPFlat changes nothing outside ZeRO-3.
func TestFSDPFlatOffKeepsZeRO3(t *testing.T) {
	for _, dp := range []int{2, 4} {
		s := fsdpJob(t, dp, false)
		if err := s.Validate(); err != nil {
			t.Fatal(err)
		}
		got, err := Program(&s, false)
		if err != nil {
			t.Fatal(err)
		}
		o := build.Options{MicroBatch: s.MicroBatch, Seq: s.Seq, Precision: s.Precision, Training: true, LoRA: s.LoRA}
		s.Sem.buildOptions(&o)
		g, err := build.Graph(s.Model, o)
		if err != nil {
			t.Fatal(err)
		}
		lp, err := lower.Train(g, s.trainConfig(false))
		if err != nil {
			t.Fatal(err)
		}
		ck, err := s.preChain(lp, false, nil, 0, slice{})
		if err != nil {
			t.Fatal(err)
		}
		want, err := strategy.Chain(ck, &strategy.ZeRO{Stage: 3, DP: dp})
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("dp %d: without FSDPFlat the ZeRO-3 program is not per-parameter ZeRO-3's", dp)
		}
		r, err := Plan(s)
		if err != nil {
			t.Fatal(err)
		}
		rf, err := Plan(fsdpJob(t, dp, true))
		if err != nil {
			t.Fatal(err)
		}
		if rf.Sim.Peak.Total <= r.Sim.Peak.Total {
			t.Errorf("dp %d: FlatParameters peak at %d, per-parameter sharding at %d", dp, rf.Sim.Peak.Total, r.Sim.Peak.Total)
		}
	}
	for _, zero := range []int{0, 1, 2} {
		off, on := fsdpJob(t, 2, false), fsdpJob(t, 2, true)
		off.ZeRO, on.ZeRO = zero, zero
		r0, err := Plan(off)
		if err != nil {
			t.Fatal(err)
		}
		r1, err := Plan(on)
		if err != nil {
			t.Fatal(err)
		}
		if r0.Sim.Peak != r1.Sim.Peak || r0.First.Peak != r1.First.Peak || len(r0.Program.Ops) != len(r1.Program.Ops) {
			t.Errorf("ZeRO-%d: FSDPFlat changed the plan (peak %d → %d)", zero, r0.Sim.Peak.Total, r1.Sim.Peak.Total)
		}
	}
}

// FlatParameters on random jobs: the plan verifies and its categories add
// up; it never holds less than per-parameter ZeRO-3 (frozen weights get
// gradients, unsharded gradients live across micro-steps, the root stays
// gathered); the micro-steps between the first and the last are alike, so
// a fourth micro-step does not change the peak of three; and a Cache shared
// with plans of other ZeRO stages gives the same plan.
func TestPropertyFSDPFlat(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		s := fsdpJob(t, rapid.SampledFrom([]int{2, 4}).Draw(rt, "dp"), true)
		s.Model.Layers = rapid.IntRange(1, 4).Draw(rt, "layers")
		s.MicroBatch = rapid.IntRange(1, 2).Draw(rt, "b")
		s.Accum = rapid.IntRange(1, 3).Draw(rt, "accum")
		if rapid.Bool().Draw(rt, "noCkpt") {
			s.Checkpoint = CheckpointPolicy{}
		}
		s.LoRA.Targets = rapid.SampledFrom([][]string{{"q_proj", "v_proj"}, {"all-linear"}, {"model.layers.0.mlp.down_proj"}}).Draw(rt, "targets")
		s.Offload.Optimizer = rapid.Bool().Draw(rt, "offloadOpt")
		r, err := Plan(s)
		if err != nil {
			rt.Fatalf("%+v: %v", s, err)
		}
		if err := r.Program.Verify(); err != nil {
			rt.Fatal(err)
		}
		if err := sim.Check(r.Program, r.Sim); err != nil {
			rt.Fatal(err)
		}
		off := s
		off.Sem.FSDPFlat = false
		r0, err := Plan(off)
		if err != nil {
			rt.Fatal(err)
		}
		if r.Sim.Peak.Total < r0.Sim.Peak.Total {
			rt.Fatalf("FlatParameters peak at %d, per-parameter ZeRO-3 at %d", r.Sim.Peak.Total, r0.Sim.Peak.Total)
		}
		if s.Accum == 3 {
			more := s
			more.Accum = 4
			r4, err := Plan(more)
			if err != nil {
				rt.Fatal(err)
			}
			if r4.Sim.Peak.Total != r.Sim.Peak.Total {
				rt.Fatalf("peak %d with 3 micro-steps, %d with 4", r.Sim.Peak.Total, r4.Sim.Peak.Total)
			}
		}
		c := &Cache{}
		for _, zero := range []int{0, 2} {
			o := s
			o.ZeRO = zero
			if _, err := PlanWith(o, Options{Cache: c}); err != nil {
				rt.Fatal(err)
			}
		}
		rc, err := PlanWith(s, Options{Cache: c})
		if err != nil {
			rt.Fatal(err)
		}
		if rc.Sim.Peak != r.Sim.Peak || rc.First.Peak != r.First.Peak {
			rt.Fatalf("cached plan peaks at %d, uncached at %d", rc.Sim.Peak.Total, r.Sim.Peak.Total)
		}
	})
}
