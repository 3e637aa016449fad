package lower_test

import (
	"testing"

	"github.com/memplan/memplan/lower"
	"github.com/memplan/memplan/models"
	"github.com/memplan/memplan/models/build"
	"github.com/memplan/memplan/ops"
)

// BenchmarkTrainDeepseekV2 lowers the training graph of the catalog's
// deepseek-v2 (60 layers of 160 routed experts: about 155,000 nodes, a
// 300,000-op program) with foreach AdamW with bf16 parameters and float32 masters: the large-MoE
// path whose per-op cost the plan pays twice (steady and first step).
func BenchmarkTrainDeepseekV2(b *testing.B) {
	a, err := models.Lookup("deepseek-v2")
	if err != nil {
		b.Fatal(err)
	}
	g, err := build.Graph(a, build.Options{MicroBatch: 1, Seq: 512, Precision: ops.BF16, Training: true})
	if err != nil {
		b.Fatal(err)
	}
	c := lower.TrainConfig{Optimizer: lower.AdamW, Precision: ops.BF16, WeightDecay: -1}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := lower.Train(g, c); err != nil {
			b.Fatal(err)
		}
	}
}
