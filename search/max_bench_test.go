package search

import (
	"testing"

	"github.com/memplan/memplan/engine"
	"github.com/memplan/memplan/hw"
	"github.com/memplan/memplan/lower"
	"github.com/memplan/memplan/models"
	"github.com/memplan/memplan/models/build"
	"github.com/memplan/memplan/ops"
)

// maxBench solves dimension d of llama-3-70b (bf16, AdamW, sequence 4096)
// on H100s over tp 8 × dp 8 with ZeRO-3. Issue 12's target: under 1 s.
func maxBench(b *testing.B, d Dim) {
	a, err := models.Lookup("llama-3-70b")
	if err != nil {
		b.Fatal(err)
	}
	g, _ := hw.Lookup("h100")
	s := engine.Spec{Job: engine.Job{Model: a, MicroBatch: 1, Seq: 4096, Precision: ops.BF16, Optimizer: lower.AdamW},
		Parallel: engine.Parallel{TP: 8, Sharding: engine.Sharding{DP: 8, ZeRO: 3}}, Target: engine.Target{GPU: g, FirstStep: true}}
	b.ReportAllocs()
	for b.Loop() {
		r, err := Max(s, d)
		if err != nil {
			b.Fatal(err)
		}
		if r.At == nil || !r.At.Fits {
			b.Fatalf("no fitting answer: %+v", r)
		}
		b.ReportMetric(float64(r.Value), "answer")
		b.ReportMetric(float64(r.Plans), "plans")
	}
}

// BenchmarkMaxMicroBatchLlama3_70B: the largest micro-batch that fits.
func BenchmarkMaxMicroBatchLlama3_70B(b *testing.B) { maxBench(b, DimMicroBatch) }

// BenchmarkMaxSeqLlama3_70B: the longest sequence that fits at micro-batch 1.
func BenchmarkMaxSeqLlama3_70B(b *testing.B) { maxBench(b, DimSeq) }

// BenchmarkMaxSeqEagerLlama3_2_1B: the longest sequence of llama-3.2-1b
// (AMP bf16, AdamW, micro-batch 1) on an H100 under eager attention, whose
// scores grow with the square of the sequence: the secant of round 23 took
// 22 plans, creeping up on the answer from one side.
func BenchmarkMaxSeqEagerLlama3_2_1B(b *testing.B) {
	s := baseSpec(b, "llama-3.2-1b", "h100", 0)
	s.Attention = build.Eager
	b.ReportAllocs()
	for b.Loop() {
		r, err := Max(s, DimSeq)
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(r.Value), "answer")
		b.ReportMetric(float64(r.Plans), "plans")
	}
}
