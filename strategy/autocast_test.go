package strategy_test

import (
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
