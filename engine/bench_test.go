package engine

import (
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/memplan/memplan/hw"
	"github.com/memplan/memplan/internal/heapwatch"
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

// BenchmarkNextStepPipeline is plan's path for a job that does not fit:
// qwen3-30b-a3b (transformers 4.x's loop over its 128 experts) on an h100
// over two pipeline stages of eight micro-steps, planned
// through LeverCache, then its next step (LargestLever). max-live-MB is the
// largest live heap (after a collection, sampled every 5 ms). Eight
// micro-steps are past 2p+3: the plan simulates three and extrapolates the
// step (planPipelineShortAccum), and the next step plans from its programs.
func BenchmarkNextStepPipeline(b *testing.B) {
	gpu, err := hw.Lookup("h100")
	if err != nil {
		b.Fatal(err)
	}
	s := Spec{Job: Job{Model: lookup(b, "qwen3-30b-a3b"), MicroBatch: 1, Seq: 2048, Precision: ops.AMPBF16, Optimizer: lower.AdamW, Accum: 8},
		Parallel: Parallel{PP: 2}, Target: Target{GPU: gpu}}
	b.ReportAllocs()
	for b.Loop() {
		live := maxLive(func() {
			c := LeverCache(s)
			r, err := PlanWith(s, Options{Cache: c})
			if err != nil {
				b.Fatal(err)
			}
			if r.Fits || LargestLever(r, c) == nil {
				b.Fatal("the job fits, or no strategy lowers its peak")
			}
		})
		b.ReportMetric(float64(live)/(1<<20), "max-live-MB")
	}
}

// BenchmarkNextStep is plan's path for a job without pipelining that does
// not fit: the baseline through LeverCache (three micro-steps of eight,
// steady and first step), then LargestLever from its cached programs, with
// the largest live heap while it runs.
func BenchmarkNextStep(b *testing.B) {
	gpu, err := hw.Lookup("h100")
	if err != nil {
		b.Fatal(err)
	}
	s := Spec{Job: Job{Model: lookup(b, "qwen3-30b-a3b"), MicroBatch: 1, Seq: 2048, Precision: ops.AMPBF16, Optimizer: lower.AdamW, Accum: 8},
		Target: Target{GPU: gpu, FirstStep: true}}
	b.ReportAllocs()
	for b.Loop() {
		c := LeverCache(s)
		var r *Result
		plan := maxLive(func() {
			var err error
			if r, err = PlanWith(s, Options{Cache: c}); err != nil {
				b.Fatal(err)
			}
		})
		lever := maxLive(func() {
			if r.Fits || LargestLever(r, c) == nil {
				b.Fatal("the job fits, or no strategy lowers its peak")
			}
		})
		b.ReportMetric(float64(plan)/(1<<20), "plan-max-live-MB")
		b.ReportMetric(float64(lever)/(1<<20), "lever-max-live-MB")
	}
}

// maxLive runs f and returns the largest live heap sampled while it runs.
// It collects first: the live heap sampled is the last collection's, and
// would otherwise start at what was live before f.
func maxLive(f func()) uint64 {
	runtime.GC()
	var live atomic.Uint64
	stop := heapwatch.Every(5*time.Millisecond, func(v uint64) {
		if v > live.Load() {
			live.Store(v)
		}
	})
	f()
	stop()
	return live.Load()
}

// BenchmarkVerify checks a planned program's invariants (ir.Program.Verify),
// which strategy.Chain runs after every transform: deepseek-v2's steady
// step, eight micro-steps through a ZeRO-3 sharding, 1.6 million ops. In
// fit's mixtral search it was 4 % of the CPU.
func BenchmarkVerify(b *testing.B) {
	s := Spec{Job: Job{Model: lookup(b, "deepseek-v2"), MicroBatch: 1, Seq: 4096, Precision: ops.BF16, Optimizer: lower.AdamW, Accum: 8},
		Parallel: Parallel{Sharding: Sharding{DP: 8, ZeRO: 3}}}
	r, err := PlanWith(s, Options{NoTiming: true, AllAccum: true})
	if err != nil {
		b.Fatal(err)
	}
	p := r.Program
	for b.Loop() {
		if err := p.Verify(); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(len(p.Ops)), "ops")
}
