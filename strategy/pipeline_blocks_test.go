package strategy

import (
	"testing"

	"github.com/memplan/memplan/ir"
)

// TestFindBlocksOpBlock checks findBlocks' per-op block index, kept per run
// of ops that share a module, against ppBlock and blockIdx asked per op:
// blocks listed in order of first forward execution, -1 outside a block and
// in a block that only backward, recomputation or the optimizer visits.
func TestFindBlocksOpBlock(t *testing.T) {
	type o struct {
		phase     ir.Phase
		recompute bool
		module    string
	}
	seq := []o{
		{ir.Forward, false, ""},
		{ir.Forward, false, "model.embed_tokens"},
		{ir.Forward, false, "model.layers.1.self_attn"},
		{ir.Forward, false, "model.layers.1.self_attn"},
		{ir.Forward, false, "model.layers.1.mlp"},
		{ir.Forward, false, "model.layers.0"},
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
	want := []string{"model.layers.1", "model.layers.0", "encoder.layers.encoder_layer_3"}
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
