package strategy

import (
	"slices"
	"strings"
	"testing"

	"github.com/memplan/memplan/ir"
	"pgregory.net/rapid"
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

// TestPropertyBlockOfModuleIsPPBlock: the kept block (reused for every
// module under the same indexed block) is ppBlock's for any sequence of
// module paths, indexed ("layers.3"), named ("h_3") or neither.
func TestPropertyBlockOfModuleIsPPBlock(t *testing.T) {
	parts := []string{"model", "layers", "h", "h_3", "block_12", "3", "17", "0", "mlp", "experts", "gate_proj", "x1", ""}
	rapid.Check(t, func(rt *rapid.T) {
		var c blockOfModule
		prev := ""
		for i, n := 0, rapid.IntRange(1, 40).Draw(rt, "n"); i < n; i++ {
			k := rapid.IntRange(0, 6).Draw(rt, "depth")
			path := make([]string, k)
			for j := range path {
				path[j] = rapid.SampledFrom(parts).Draw(rt, "part")
			}
			m := strings.Join(path, ".")
			if prev != "" && m != "" && rapid.Bool().Draw(rt, "under the last") {
				m = prev + "." + m
			}
			prev = m
			gb, gok := c.of(m)
			wb, wok := ppBlock(m)
			if gb != wb || gok != wok {
				rt.Fatalf("module %q: kept %q %v, ppBlock %q %v", m, gb, gok, wb, wok)
			}
		}
	})
}
