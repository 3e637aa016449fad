package strategy_test

import (
	"reflect"
	"strings"
	"testing"

	"github.com/memplan/memplan/ir"
	"github.com/memplan/memplan/sim"
	"github.com/memplan/memplan/strategy"
)

// TestAutocastCacheHoldsCastsToForwardEnd: under checkpointing the forward
// saves no weight copy, so without the cache each block's float16 copies die
// at their matmul; autocast keeps them until the region exits. At the exit,
// the device holds exactly 2 bytes per parameter of the blocks' linears
// (weights and biases) more than it would without it — what the CPU
// measurement (README, autocast's weight-cast cache) found dropped at the
// region's exit: 2 bytes per trainable parameter.
func TestAutocastCacheHoldsCastsToForwardEnd(t *testing.T) {
	p := strategy.AutocastTestProgram(t)
	q, err := strategy.Chain(p, &strategy.Checkpoint{Patterns: []string{"transformer.h.*"}}, &strategy.AutocastCache{})
	if err != nil {
		t.Fatal(err)
	}
	exit := -1
	for i := range q.Ops {
		if q.Ops[i].Name == "autocast.exit" && q.Ops[i].Phase == ir.Forward {
			exit = i
			break
		}
	}
	if exit < 0 || exit+1 >= len(q.Ops) || q.Ops[exit+1].Name != "loss.backward" {
		t.Fatalf("no forward exit right before loss.backward (at %d)", exit)
	}
	var blockLinear int64
	for _, id := range q.Params {
		if pt := &q.Tensors[id]; strings.HasPrefix(pt.Name, "transformer.h.") && !strings.Contains(pt.Name, ".ln_") {
			blockLinear += pt.Numel()
		}
	}
	// The same program with an exit that reads nothing.
	none := strategy.Clone(q)
	none.Ops[exit].In = nil
	with, err := sim.Run(q)
	if err != nil {
		t.Fatal(err)
	}
	without, err := sim.Run(none)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := int64(with.Timeline[exit].Total-without.Timeline[exit].Total), 2*blockLinear; got != want {
		t.Errorf("the exit holds %d bytes, want 2 × %d block linear parameters = %d", got, blockLinear, want)
	}
	// Each segment's replay ends its own region: one exit per block in backward, right after its last
	// recomputed op.
	var replays int
	for i := range q.Ops {
		if op := &q.Ops[i]; op.Name == "autocast.exit" && op.Recompute {
			replays++
			if !q.Ops[i-1].Recompute || q.Ops[i+1].Recompute {
				t.Errorf("replay exit at %d is not at the end of a replay", i)
			}
		}
	}
	if replays != 2 {
		t.Errorf("%d replay exits, want one per checkpointed block (2)", replays)
	}
}

// WithoutExits undoes AutocastCache: the program it makes is the one the
// cache was applied to, op for op and tensor for tensor, with or without
// checkpointing before it, and ChainOwned on it rewrites it as Chain does
// on the original (engine.LeverCache holds a plan's program in place of
// the one it was made from, and makes that one again this way).
func TestWithoutExitsUndoesAutocastCache(t *testing.T) {
	base := strategy.AutocastTestProgram(t)
	ck, err := strategy.Chain(base, &strategy.Checkpoint{Patterns: []string{"transformer.h.*"}})
	if err != nil {
		t.Fatal(err)
	}
	for name, p := range map[string]*ir.Program{"plain": base, "checkpointed": ck} {
		q, err := strategy.Chain(p, &strategy.AutocastCache{})
		if err != nil {
			t.Fatal(err)
		}
		if len(q.Ops) == len(p.Ops) {
			t.Fatalf("%s: the autocast cache inserted no exit", name)
		}
		back := strategy.WithoutExits(q)
		if !reflect.DeepEqual(back.Ops, p.Ops) || !reflect.DeepEqual(back.Tensors, p.Tensors) ||
			!reflect.DeepEqual(back.Params, p.Params) || back.MicroBatches != p.MicroBatches || back.SharedTensors {
			t.Fatalf("%s: WithoutExits(AutocastCache(p)) is not p", name)
		}
		ts := []strategy.Transform{&strategy.OptimizerOffload{}, &strategy.AutocastCache{}}
		want, err := strategy.Chain(p, ts...)
		if err != nil {
			t.Fatal(err)
		}
		got, err := strategy.ChainOwned(strategy.WithoutExits(q), ts...)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got.Ops, want.Ops) || !reflect.DeepEqual(got.Tensors, want.Tensors) {
			t.Fatalf("%s: ChainOwned on the program made again differs from Chain on the original", name)
		}
	}
}
