package build

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/memplan/memplan/ir"
	"github.com/memplan/memplan/ops"
)

// savedList is what layer's nodes save for backward, one "name dtype shape"
// per tensor, the layer's prefix cut, sorted.
func savedList(g *ir.Graph, layer string) []string {
	seen := map[ir.TensorID]bool{}
	var out []string
	for _, nd := range g.Nodes {
		if !strings.HasPrefix(nd.Module, layer+".") && nd.Module != layer {
			continue
		}
		for _, id := range nd.Saved {
			if !seen[id] {
				seen[id] = true
				t := &g.Tensors[id]
				out = append(out, fmt.Sprintf("%s %s %v", strings.TrimPrefix(t.Name, layer+"."), t.DType, t.Shape))
			}
		}
	}
	slices.Sort(out)
	return out
}

func minus(a, b []string) []string {
	var out []string
	for _, s := range a {
		if !slices.Contains(b, s) {
			out = append(out, s)
		}
	}
	return out
}

// The hand-written activations of the CS336 course models (kernels.silu and
// kernels.softmax = hand-written): what a decoder layer saves for backward,
// tensor by tensor, against F.silu and softmax. In float32, x * sigmoid(x)
// keeps the sigmoid (one more [B, S, d_ff]) and exp(x - max) / sum keeps
// exp's result (one more [B, heads, S, S]), the row sums and max's indices.
// Under autocast exp runs in float32 where softmax(dtype=float32) did, so
// only the sums and indices are added; the sigmoid is bf16.
func TestHandWrittenActivationsSaved(t *testing.T) {
	const B, S = 2, 32
	a := lookup(t, "llama-3.2-1b")
	I, A := a.Intermediate, a.Heads
	layer := "model.layers.0"
	for _, c := range []struct {
		precision ops.Precision
		o         Options
		want      []string // saved by the hand-written layer only
	}{
		{ops.FP32, Options{HandSiLU: true}, []string{fmt.Sprintf("mlp.act_fn.sigmoid float32 [%d %d %d]", B, S, I)}},
		{ops.FP32, Options{HandSoftmax: true}, []string{
			fmt.Sprintf("self_attn.core_attention.softmax_exp float32 [%d %d %d %d]", B, A, S, S),
			fmt.Sprintf("self_attn.core_attention.softmax_max.indices int64 [%d %d %d 1]", B, A, S),
			fmt.Sprintf("self_attn.core_attention.softmax_sum float32 [%d %d %d 1]", B, A, S)}},
		{ops.AMPBF16, Options{HandSiLU: true}, []string{fmt.Sprintf("mlp.act_fn.sigmoid bfloat16 [%d %d %d]", B, S, I)}},
		{ops.AMPBF16, Options{HandSoftmax: true}, []string{
			fmt.Sprintf("self_attn.core_attention.softmax_exp float32 [%d %d %d %d]", B, A, S, S),
			fmt.Sprintf("self_attn.core_attention.softmax_max.indices int64 [%d %d %d 1]", B, A, S),
			fmt.Sprintf("self_attn.core_attention.softmax_sum float32 [%d %d %d 1]", B, A, S)}},
	} {
		build := func(o Options) []string {
			o.MicroBatch, o.Seq, o.Training, o.Precision, o.Attention = B, S, true, c.precision, Eager
			g, err := Graph(a, o)
			if err != nil {
				t.Fatal(err)
			}
			return savedList(g, layer)
		}
		fused, hand := build(Options{}), build(c.o)
		name := fmt.Sprintf("%s silu=%v softmax=%v", c.precision, c.o.HandSiLU, c.o.HandSoftmax)
		t.Logf("%s: %s saves\n  %s", name, layer, strings.Join(hand, "\n  "))
		if got := minus(hand, fused); !slices.Equal(got, c.want) {
			t.Errorf("%s: saved besides the fused layer's %q, want %q", name, got, c.want)
		}
		gone := minus(fused, hand)
		switch {
		case c.o.HandSoftmax && c.precision == ops.AMPBF16:
			// softmax's float32 output gives way to exp's, the same size.
			if want := []string{fmt.Sprintf("self_attn.core_attention.probs float32 [%d %d %d %d]", B, A, S, S)}; !slices.Equal(gone, want) {
				t.Errorf("%s: the fused layer saves %q the hand-written one does not, want %q", name, gone, want)
			}
		case len(gone) != 0:
			t.Errorf("%s: the fused layer saves %q the hand-written one does not", name, gone)
		}
	}
}
