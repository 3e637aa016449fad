package strategy_test

import (
	"testing"

	"github.com/memplan/memplan/ir"
	"github.com/memplan/memplan/lower"
	"github.com/memplan/memplan/models"
	"github.com/memplan/memplan/models/build"
	"github.com/memplan/memplan/ops"
	"github.com/memplan/memplan/strategy"
)

// deepSeekV2Program is deepseek-v2's training program (60 layers of 160
// experts; amp-bf16, AdamW), the size of the programs whose transforms
// `memplan plan` pays for on the largest catalog mixtures of experts.
func deepSeekV2Program(b *testing.B) *ir.Program {
	a, err := models.Lookup("deepseek-v2")
	if err != nil {
		b.Fatal(err)
	}
	return zTrain(b, a, ops.AMPBF16, lower.AdamW, lower.Foreach, 1, false, 2048)
}

// benchChain applies ts to p as engine's Cache.post does, and hands the
// result back to the pool as engine.Result.Release does. Each iteration after
// the first finds its arrays in the pool, as a search's plans of one size do;
// a single `memplan plan` applies each chain once, into fresh memory. Measured
// (benchstat n=6, interleaved, busy 2-core host; 8e0fdd5's strategy package vs
// 69a066a's, the rest of the tree at 69a066a): AutocastCacheDeepSeekV2 139 ->
// 33 ms, 67.5 MiB -> 3.3 MiB, 31 -> 30 allocs per op; OptimizerOffloadDeepSeekV2
// 218 -> 143 ms, 109 -> 37 MiB, 175,398 -> 448 allocs per op.
func benchChain(b *testing.B, p *ir.Program, ts ...strategy.Transform) {
	b.ReportAllocs()
	for b.Loop() {
		q, err := strategy.Chain(p, ts...)
		if err != nil {
			b.Fatal(err)
		}
		strategy.Release(q)
	}
}

// BenchmarkAutocastCacheDeepSeekV2 is the transform every planned amp
// program goes through (engine's Cache.post).
func BenchmarkAutocastCacheDeepSeekV2(b *testing.B) {
	benchChain(b, deepSeekV2Program(b), &strategy.AutocastCache{})
}

// BenchmarkOptimizerOffloadDeepSeekV2 is the chain of the "next step" that
// engine.LargestLever plans for an amp program: optimizer offload, then the
// autocast cache.
func BenchmarkOptimizerOffloadDeepSeekV2(b *testing.B) {
	benchChain(b, deepSeekV2Program(b), &strategy.OptimizerOffload{}, &strategy.AutocastCache{})
}

// BenchmarkCheckpointDeepSeekV2 checkpoints every decoder layer (compare's
// "checkpoint every block"), the transform engine caches before sharding.
func BenchmarkCheckpointDeepSeekV2(b *testing.B) {
	benchChain(b, deepSeekV2Program(b), &strategy.Checkpoint{Patterns: []string{"model.layers.*"}})
}

// BenchmarkActivationOffloadDeepSeekV2 is compare's "offload activations"
// chain after the cached program: save_on_cpu, then the autocast cache.
func BenchmarkActivationOffloadDeepSeekV2(b *testing.B) {
	benchChain(b, deepSeekV2Program(b), &strategy.ActivationOffload{}, &strategy.AutocastCache{})
}

// BenchmarkPipelineDeepSeekV2 cuts stage 1 of 4 out of deepseek-v2's
// program of four micro-steps and schedules it 1F1B (the transform engine
// applies to every pipeline stage before caching it; `memplan plan
// --pp 4` pays it once a stage, fit's search once a shallow stage).
func BenchmarkPipelineDeepSeekV2(b *testing.B) {
	a, err := models.Lookup("deepseek-v2")
	if err != nil {
		b.Fatal(err)
	}
	p := zTrain(b, a, ops.AMPBF16, lower.AdamW, lower.Foreach, 4, false, 512)
	benchChain(b, p, &strategy.Pipeline{Stages: 4, Stage: 1})
}

// BenchmarkPipelineStageDeepSeekV3 schedules the program `memplan plan
// --model deepseek-v3 --pp 4 --accum 8` builds for its second stage: layers
// 15-29 alone (engine's stage slice, with the layout that gives them all to
// the stage), eight micro-steps, about 970,000 ops once scheduled, handed
// over as engine does. Every stage of that plan, its first step's and the
// next step's pay it.
func BenchmarkPipelineStageDeepSeekV3(b *testing.B) {
	a, err := models.Lookup("deepseek-v3")
	if err != nil {
		b.Fatal(err)
	}
	g, err := build.Graph(a, build.Options{MicroBatch: 1, Seq: 2048, Precision: ops.AMPBF16, Training: true, Layers: [2]int{15, 30}})
	if err != nil {
		b.Fatal(err)
	}
	p, err := lower.Train(g, lower.TrainConfig{Optimizer: lower.AdamW, Impl: lower.Foreach, Precision: ops.AMPBF16, Accum: 8, WeightDecay: -1})
	if err != nil {
		b.Fatal(err)
	}
	// engine hands the lowered program over (ChainOwned): each iteration
	// gets its own copy of the tensors, the only part the transform writes.
	b.ReportAllocs()
	for b.Loop() {
		b.StopTimer()
		own := *p
		own.Tensors = append([]ir.Tensor(nil), p.Tensors...)
		b.StartTimer()
		q, err := strategy.ChainOwned(&own, &strategy.Pipeline{Stages: 4, Stage: 1, Layout: []int{0, 15, 0, 0}})
		if err != nil {
			b.Fatal(err)
		}
		strategy.Release(q)
	}
}
