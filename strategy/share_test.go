package strategy

import (
	"reflect"
	"slices"
	"testing"

	"github.com/memplan/memplan/ir"
	"github.com/memplan/memplan/lower"
	"github.com/memplan/memplan/models"
	"github.com/memplan/memplan/models/build"
	"github.com/memplan/memplan/ops"
)

// TestAutocastCacheSharesTensors: the autocast cache, applied to a program
// it does not own, shares that program's tensors instead of copying them,
// and the sharing stays invisible: a transform after it in a chain copies
// them before editing (Checkpoint recategorizes existing tensors in place
// when it owns the program), and releasing the result keeps them out of
// the pool, where the next Clone would overwrite them.
func TestAutocastCacheSharesTensors(t *testing.T) {
	p := AutocastTestProgram(t)
	before := slices.Clone(p.Tensors)
	q, err := Chain(p, &AutocastCache{})
	if err != nil {
		t.Fatal(err)
	}
	if !q.SharedTensors || &q.Tensors[0] != &p.Tensors[0] || cap(q.Tensors) != len(q.Tensors) {
		t.Fatal("the autocast cache copied its input's tensors (or left their spare room writable)")
	}
	if len(q.Ops) <= len(p.Ops) {
		t.Fatal("the autocast cache inserted no exit")
	}
	r, err := Chain(p, &AutocastCache{}, &Checkpoint{Patterns: []string{"transformer.h.*"}})
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(p.Tensors, before) {
		t.Fatal("a transform after the autocast cache edited the input's tensors in place")
	}
	if r.SharedTensors || &r.Tensors[0] == &p.Tensors[0] {
		t.Fatal("the checkpointed program still shares the input's tensors")
	}
	k := classOf(cap(q.Tensors)) // where Release would put them
	tensorPool.mu.Lock()
	kept := tensorPool.free[k]
	tensorPool.free[k] = nil
	tensorPool.mu.Unlock()
	Release(q)
	tensorPool.mu.Lock()
	for _, a := range tensorPool.free[k] {
		if &a[0] == &p.Tensors[0] {
			t.Error("Release handed shared tensors to the pool")
		}
	}
	tensorPool.free[k] = kept
	tensorPool.mu.Unlock()
	if !reflect.DeepEqual(p.Tensors, before) {
		t.Fatal("releasing the autocast cache's program changed its input's tensors")
	}
}

// AutocastTestProgram is a two-block gpt2 of width 64 without dropout,
// lowered for amp-fp16 training with AdamW: the small program the autocast
// cache's tests (here and in strategy_test) rewrite.
func AutocastTestProgram(t testing.TB) *ir.Program {
	t.Helper()
	a, err := models.Lookup("gpt2")
	if err != nil {
		t.Fatal(err)
	}
	a = a.Clone()
	a.Hidden, a.Heads, a.KVHeads, a.HeadDim, a.Intermediate, a.Vocab, a.MaxPositions, a.Layers = 64, 2, 2, 32, 256, 16, 16, 2
	a.AttnDropout, a.HiddenDropout, a.EmbdDropout = 0, 0, 0
	g, err := build.Graph(a, build.Options{MicroBatch: 1, Seq: 8, Precision: ops.AMPFP16, Training: true})
	if err != nil {
		t.Fatal(err)
	}
	p, err := lower.Train(g, lower.TrainConfig{Optimizer: lower.AdamW, Precision: ops.AMPFP16, WeightDecay: -1})
	if err != nil {
		t.Fatal(err)
	}
	return p
}
