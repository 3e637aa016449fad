package ops

import (
	"testing"

	"github.com/memplan/memplan/units"
)

// TestFLOPsDoNotWrap: a FLOP count is a product of dimensions taken in
// float64, never an int64 product converted afterwards. Found by CI's
// random seed of engine's TestPropertyTotalsAtTheLimits: mixtral-8x7b's
// eager attention scores at micro-batch 2 × 2^25 tokens are
// 2·(2·32)·2^25·128·2^25 = 2^64 FLOPs, which the int64 product wrapped to
// −2^64 (MatMul) and pricing refused without naming a field.
func TestFLOPsDoNotWrap(t *testing.T) {
	const s = 1 << 25
	for _, c := range []struct {
		what  string
		build func(b *Builder)
		want  float64
	}{
		{"matmul", func(b *Builder) {
			q := b.Input("q", units.BF16, 2, 32, s, 128)
			k := b.Input("k", units.BF16, 2, 32, 128, s)
			b.MatMul("scores", q, k)
		}, 2 * 2 * 32 * s * 128 * s},
		// batch × heads alone past 2^63 (only the FLOP count is read here):
		// the int64 product B*A was 0
		{"sdpa", func(b *Builder) {
			q := b.Input("q", units.BF16, 1<<31, 1<<33, 1, 1)
			k := b.Input("k", units.BF16, 1<<31, 1<<33, 1, 1)
			v := b.Input("v", units.BF16, 1<<31, 1<<33, 1, 1)
			b.SDPA("attn", q, k, v, false)
		}, 4 * (1 << 31) * (1 << 33)},
	} {
		b := NewBuilder(Config{Precision: BF16})
		c.build(b)
		if got := b.last().FLOPs; got != c.want {
			t.Errorf("%s: %v FLOPs, want %v", c.what, got, c.want)
		}
	}
}
