package engine

import (
	"testing"

	"github.com/memplan/memplan/lower"
	"github.com/memplan/memplan/ops"
)

// BenchmarkPlanLlama3_70B plans one training iteration of llama-3-70b at
// sequence 8192 with the full per-op timeline. Target (issue 2): under 20 ms
// and under 50 MB allocated per plan. Compare runs with benchstat.
func BenchmarkPlanLlama3_70B(b *testing.B) {
	a := lookup(b, "llama-3-70b")
	s := Spec{Job: Job{Model: a, MicroBatch: 1, Seq: 8192, Precision: ops.BF16, Optimizer: lower.AdamW}}
	b.ReportAllocs()
	for b.Loop() {
		r, err := Plan(s)
		if err != nil {
			b.Fatal(err)
		}
		if len(r.Sim.Timeline) != len(r.Program.Ops) {
			b.Fatal("timeline is not per op")
		}
	}
}

// BenchmarkPlanLlama3_70BPipeline plans every stage of llama-3-70b over
// tp 8 × pp 8 with 16 micro-steps of 4096 tokens: each stage is built from
// its own 10 layers (stageSlice).
func BenchmarkPlanLlama3_70BPipeline(b *testing.B) {
	a := lookup(b, "llama-3-70b")
	s := Spec{Job: Job{Model: a, MicroBatch: 1, Seq: 4096, Precision: ops.BF16, Optimizer: lower.AdamW, Accum: 16}, Parallel: Parallel{TP: 8, PP: 8}}
	b.ReportAllocs()
	for b.Loop() {
		r, err := Plan(s)
		if err != nil {
			b.Fatal(err)
		}
		if len(r.StagePeaks) != 8 {
			b.Fatalf("%d stages planned", len(r.StagePeaks))
		}
	}
}
