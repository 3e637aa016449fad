package engine

import (
	"context"
	"errors"
	"math"
	"testing"

	"github.com/memplan/memplan/allocator"
	"github.com/memplan/memplan/hw"
	"github.com/memplan/memplan/internal/ctxtest"
)

// stopSpecs are jobs whose plans take every path that checks the context:
// accumulation planned short and priced from two micro-steps, a priced
// 1F1B pipeline extrapolated from p+1 and p+2, the first step, --checkpoint
// auto's search.
func stopSpecs(t *testing.T) map[string]Spec {
	g, err := hw.Lookup("h100")
	if err != nil {
		t.Fatal(err)
	}
	a := lookup(t, "gpt2").Clone()
	a.Layers = 4
	// Sequences long enough that activations set the peak, not the tied
	// embedding's gradients summed out of place (three vocab × hidden
	// buffers, which no strategy of the lever lowers): the lever has
	// strategies to plan.
	base := Spec{Job: Job{Model: a, MicroBatch: 2, Seq: 1024, Accum: 8}, Target: Target{GPU: g, FirstStep: true}}
	pp := base
	pp.PP = 2
	auto := base
	auto.Accum, auto.MicroBatch, auto.Seq = 1, 8, 1024
	r, err := Plan(auto)
	if err != nil {
		t.Fatal(err)
	}
	// Over the capacity without checkpointing: auto searches its blocks.
	auto.Capacity = r.PeakBytes() * 9 / 10
	auto.Checkpoint.Kind = CheckpointAuto
	return map[string]Spec{"accum 8": base, "pp 2 accum 8": pp, "checkpoint auto": auto}
}

// A plan whose context is done stops at the next check and returns the
// context's cause, never a result: stopped at each of its checks in turn,
// every one of them is honoured.
func TestPlanStopsAtEveryCheck(t *testing.T) {
	for name, s := range stopSpecs(t) {
		t.Run(name, func(t *testing.T) {
			full := ctxtest.StopAt(math.MaxInt64)
			if _, err := PlanWith(s, Options{Context: full}); err != nil {
				t.Fatal(err)
			}
			n := full.Looks()
			if n < 4 {
				t.Fatalf("a plan looked at its context %d times", n)
			}
			for at := int64(1); at <= n; at++ {
				r, err := PlanWith(s, Options{Context: ctxtest.StopAt(at)})
				if !errors.Is(err, context.Canceled) || r != nil {
					t.Fatalf("stopped at check %d of %d: %v, %v", at, n, r, err)
				}
			}
			t.Logf("%d checks", n)
		})
	}
}

// Compare and the lever stop between strategies and inside each: no row
// is handed on once the context is done (a stopped strategy is not a row
// that failed), and the lever returns the cause, not a pick among the
// strategies planned before.
func TestCompareAndLeverStop(t *testing.T) {
	s := stopSpecs(t)["accum 8"]
	r, err := Plan(s)
	if err != nil {
		t.Fatal(err)
	}
	s.Capacity = r.PeakBytes() * 9 / 10 // over it: the lever has strategies to plan
	full := ctxtest.StopAt(math.MaxInt64)
	var rows int
	if err := CompareEachContext(full, s, Allow{}, func(Row) error { rows++; return nil }); err != nil {
		t.Fatal(err)
	}
	n := full.Looks()
	for at := int64(1); at <= n; at += max(1, n/40) {
		got := 0
		err := CompareEachContext(ctxtest.StopAt(at), s, Allow{}, func(r Row) error {
			if errors.Is(r.Err, context.Canceled) {
				t.Errorf("stopped at check %d: a row of the stop: %v", at, r.Err)
			}
			got++
			return nil
		})
		if !errors.Is(err, context.Canceled) || got >= rows {
			t.Fatalf("compare stopped at check %d of %d: %v after %d of %d rows", at, n, err, got, rows)
		}
	}
	base, err := Plan(s)
	if err != nil || base.Fits {
		t.Fatalf("the lever's base: %v (fits %v)", err, base != nil && base.Fits)
	}
	full = ctxtest.StopAt(math.MaxInt64)
	if r, err := LargestLeverContext(full, base, nil); err != nil || r == nil {
		t.Fatalf("the lever: %v, %v", r, err)
	}
	n = full.Looks()
	for at := int64(1); at <= n; at += max(1, n/40) {
		if r, err := LargestLeverContext(ctxtest.StopAt(at), base, nil); !errors.Is(err, context.Canceled) || r != nil {
			t.Fatalf("lever stopped at check %d of %d: %v, %v", at, n, r, err)
		}
	}
}

// The allocator's replay of a plan stops too, and so does the reserved
// prediction built on it.
func TestReplayStops(t *testing.T) {
	s := stopSpecs(t)["accum 8"]
	r, err := Plan(s)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := allocator.ReplayProgramContext(ctx, r.Program, allocator.Config{}, 0, false); !errors.Is(err, context.Canceled) {
		t.Errorf("replay: %v", err)
	}
	if rv, err := r.PredictReservedContext(ctx, allocator.Config{}, false, false); !errors.Is(err, context.Canceled) || rv != nil {
		t.Errorf("reserved: %v, %v", rv, err)
	}
}
