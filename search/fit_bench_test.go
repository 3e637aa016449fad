package search

import (
	"runtime/debug"
	"runtime/metrics"
	"testing"

	"github.com/memplan/memplan/engine"
	"github.com/memplan/memplan/hw"
	"github.com/memplan/memplan/lower"
	"github.com/memplan/memplan/models"
	"github.com/memplan/memplan/ops"
)

// BenchmarkFitLlama3_70B searches plans for llama-3-70b at sequence 4096
// on 64 H100s with a global batch of 512: about 20,000 candidate plans.
// Issue 3's target is under 2 s on 2 cores; see the README for where it
// stands. It collects at 400% heap growth, as memplan fit does (cli/fit.go).
func BenchmarkFitLlama3_70B(b *testing.B) {
	defer debug.SetGCPercent(debug.SetGCPercent(400))
	a, err := models.Lookup("llama-3-70b")
	if err != nil {
		b.Fatal(err)
	}
	g, _ := hw.Lookup("h100")
	base := engine.Spec{Job: engine.Job{Model: a, MicroBatch: 1, Seq: 4096, Precision: ops.BF16, Optimizer: lower.AdamW}, Target: engine.Target{GPU: g}}
	for b.Loop() {
		r, err := Fit(base, Options{GPUs: 64, GlobalBatch: 512})
		if err != nil {
			b.Fatal(err)
		}
		if r.Considered < 10000 {
			b.Fatalf("only %d candidates", r.Considered)
		}
		b.ReportMetric(float64(r.Considered), "plans")
	}
}

// BenchmarkFitMixtralAllow is issue 15's fit that grew to 21 GB and was
// killed after 9 minutes: mixtral-8x7b at sequence 4096 on 64 A100-40GBs,
// a global batch of 512, with LoRA, QLoRA, 8-bit optimizers and lower
// precision allowed (135,072 candidate plans). Run it with -benchtime 1x
// -benchmem; max-live-MB is the largest live heap (after a collection)
// seen between states, which the default memory budget bounds. It
// collects as memplan fit does (cli/fit.go: 400% growth, the heap held
// under 1.5× the budget).
func BenchmarkFitMixtralAllow(b *testing.B) {
	defer debug.SetGCPercent(debug.SetGCPercent(400))
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(int64(DefaultMemoryBudget) / 2 * 3))
	base := baseSpec(b, "mixtral-8x7b", "a100-40gb", 0)
	base.Seq = 4096
	allow := engine.Allow{LoRA: true, QLoRA: true, EightBit: true, LowerPrecision: true}
	sample := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	for b.Loop() {
		var live uint64
		r, err := Fit(base, Options{GPUs: 64, GlobalBatch: 512, Allow: allow, Progress: func(int, int) {
			metrics.Read(sample)
			live = max(live, sample[0].Value.Uint64())
		}})
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(r.Considered), "plans")
		b.ReportMetric(float64(live)/(1<<20), "max-live-MB")
	}
}
