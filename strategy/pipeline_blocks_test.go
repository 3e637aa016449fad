package strategy

import (
	"slices"
	"testing"

	"github.com/memplan/memplan/ir"
)

// TestFindBlocksOpBlock checks findBlocks' per-op block index, kept per run
// of ops that share a module, against ppBlock and blockIdx asked per op:
// blocks listed in order of first forward execution, -1 outside a block and
// in a block that only backward, recomputation or the optimizer visits, and
// a block's index on an op that comes before the block's first forward op
// (which its one pass does not know yet).
func TestFindBlocksOpBlock(t *testing.T) {
	type o struct {
		phase     ir.Phase
		recompute bool
		module    string
	}
	seq := []o{
		{ir.Forward, false, ""},
		{ir.Backward, false, "model.layers.5.mlp"}, // before its block's first forward op
		{ir.Forward, false, "model.embed_tokens"},
		{ir.Forward, false, "model.layers.1.self_attn"},
		{ir.Forward, false, "model.layers.1.self_attn"},
		{ir.Forward, false, "model.layers.1.mlp"},
		{ir.Forward, false, "model.layers.0"},
		{ir.Forward, false, "model.layers.5.mlp"},
		{ir.Forward, true, "model.layers.7.mlp"}, // recomputed only: not listed
		{ir.Forward, false, "encoder.layers.encoder_layer_3.mlp"},
		{ir.Forward, false, "encoder.layers.encoder_layer_3.mlp"},
		{ir.Forward, false, "lm_head"},
		{ir.Backward, false, "lm_head"},
		{ir.Backward, false, "model.layers.1.mlp"},
		{ir.Backward, false, "model.layers.9.mlp"}, // backward only: not listed
		{ir.Backward, false, "model.layers.9.mlp"},
		{ir.Backward, false, "model.layers.0"},
		{ir.Optimizer, false, "model.layers.1.self_attn"},
		{ir.Optimizer, false, ""},
	}
	p := &ir.Program{}
	for i, s := range seq {
		p.Ops = append(p.Ops, ir.Op{Name: "op", Phase: s.phase, Recompute: s.recompute, Module: s.module, Node: int32(i)})
	}
	pl := &pipeliner{p: p}
	pl.findBlocks()
	want := []string{"model.layers.1", "model.layers.0", "model.layers.5", "encoder.layers.encoder_layer_3"}
	if len(pl.blocks) != len(want) {
		t.Fatalf("blocks %q, want %q", pl.blocks, want)
	}
	for i := range want {
		if pl.blocks[i] != want[i] {
			t.Fatalf("blocks %q, want %q", pl.blocks, want)
		}
	}
	for i := range p.Ops {
		ref := int32(-1)
		if b, ok := ppBlock(p.Ops[i].Module); ok {
			if bi, ok := pl.blockIdx[b]; ok {
				ref = int32(bi)
			}
		}
		if pl.opBlock[i] != ref {
			t.Errorf("op %d (%s %q): block %d, want %d", i, p.Ops[i].Phase, p.Ops[i].Module, pl.opBlock[i], ref)
		}
	}
}

// TestNodeChunksAnyMicroStep checks that nodeChunks places the ops of a
// micro-step outside [0, MicroBatches) (which Verify does not refuse) as it
// places those of one inside: before the first block with the first chunk,
// after the micro-step's last block op with the last.
func TestNodeChunksAnyMicroStep(t *testing.T) {
	for _, micro := range []int{0, 3, -1} {
		p := &ir.Program{MicroBatches: 1}
		for i, m := range []string{"model.embed_tokens", "model.layers.0.mlp", "model.layers.1.mlp", "lm_head"} {
			p.Ops = append(p.Ops, ir.Op{Name: "op", Phase: ir.Forward, Module: m, Micro: micro, Node: int32(i)})
		}
		// Both blocks on the first stage: only the micro-step's last block
		// op puts the head on the last.
		pl := &pipeliner{pp: &Pipeline{Stages: 2, Layout: []int{2, 0}}, p: p, nChunks: 2, v: 1}
		pl.findBlocks()
		if err := pl.chunks(); err != nil {
			t.Fatal(err)
		}
		got := pl.nodeChunks()
		if want := []int32{0, 0, 0, 1}; !slices.Equal(got, want) {
			t.Errorf("micro-step %d: node chunks %v, want %v", micro, got, want)
		}
	}
}
