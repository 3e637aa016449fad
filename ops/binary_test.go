package ops

import (
	"slices"
	"testing"

	"github.com/memplan/memplan/units"
)

// TestBinaryBroadcasts: an elementwise op's result has the broadcast shape
// of its operands, whichever is broadcast. Found by issue 15's sweep
// (cmd/memplan TestSweep): HF's RMSNorm multiplies weight [H] by the
// normalized hidden states [B, S, H]; at one token per rank both have H
// elements and the result took the weight's shape [H], so max --model
// llama-2-13b --micro-batch 8 --seq ? --tp 2 --sp (whose comparison plans
// micro-batch 1 × seq 2) panicked in sequence parallelism's gather.
func TestBinaryBroadcasts(t *testing.T) {
	for _, c := range []struct{ a, c, want []int64 }{
		{[]int64{16}, []int64{1, 1, 16}, []int64{1, 1, 16}},
		{[]int64{1, 1, 16}, []int64{16}, []int64{1, 1, 16}},
		{[]int64{2, 8, 16}, []int64{16}, []int64{2, 8, 16}},
		{[]int64{16}, []int64{2, 8, 16}, []int64{2, 8, 16}},
		{[]int64{2, 8, 1}, []int64{2, 8, 16}, []int64{2, 8, 16}},
		{[]int64{2, 1, 8, 4}, []int64{1, 3, 8, 4}, []int64{2, 3, 8, 4}},
		{[]int64{2, 8, 16}, []int64{2, 8, 16}, []int64{2, 8, 16}},
		{[]int64{2, 8, 16}, []int64{3, 16}, []int64{2, 8, 16}}, // not broadcastable: the larger
	} {
		b := NewBuilder(Config{Precision: FP32, Training: true})
		x := b.Input("x", units.F32, c.a...)
		y := b.Input("y", units.F32, c.c...)
		if got := b.Shape(b.Binary("mul", "out", x, y)); !slices.Equal(got, c.want) {
			t.Errorf("%v * %v: shape %v, want %v", c.a, c.c, got, c.want)
		}
	}
}
