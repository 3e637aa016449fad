package build

import (
	"testing"

	"github.com/memplan/memplan/models"
	"github.com/memplan/memplan/ops"
)

// BenchmarkGraphDeepSeekV3 builds the largest catalog graph as `plan
// --model deepseek-v3` does at its defaults (one sequence of 4096 tokens,
// autocast bf16, training): 58 layers of 256 experts, the loop transformers
// runs, about 470,000 nodes.
func BenchmarkGraphDeepSeekV3(b *testing.B) {
	a, err := models.Lookup("deepseek-v3")
	if err != nil {
		b.Fatal(err)
	}
	o := Options{MicroBatch: 1, Seq: 4096, Precision: ops.AMPBF16, Training: true}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Graph(a, o); err != nil {
			b.Fatal(err)
		}
	}
}
