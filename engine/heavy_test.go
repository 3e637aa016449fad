package engine

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/memplan/memplan/hw"
	"github.com/memplan/memplan/lower"
	"github.com/memplan/memplan/ops"
)

// Every deepseek-v3 plan is heavy and a gpt2 plan is not; a pipeline
// counts each stage's micro-steps (PipelineWork), priced or not.
func TestWorkSplitsHeavyFromLight(t *testing.T) {
	job := func(model string, accum, pp int) *Spec {
		s := &Spec{Job: Job{Model: lookup(t, model), MicroBatch: 1, Seq: 512, Accum: accum, Precision: ops.AMPBF16, Optimizer: lower.AdamW}}
		s.PP = pp
		return s
	}
	for _, c := range []struct {
		s     *Spec
		heavy bool
	}{
		{job("deepseek-v3", 1, 1), true},
		{job("deepseek-v3", 8, 1), true},
		{job("gpt2", 8, 1), false},
		{job("llama-3-8b", 3, 1), false},
		{job("deepseek-v3", 16, 8), true},
	} {
		if got := Work(c.s, true) > HeavyWork; got != c.heavy {
			t.Errorf("%s accum %d pp %d: work %d, heavy %v, want %v", c.s.Model.Name, c.s.Accum, c.s.PP, Work(c.s, true), got, c.heavy)
		}
	}
	pp := job("llama-3-8b", 32, 4)
	priced := *pp
	priced.GPU = &hw.GPU{}
	if got, want := Work(pp, true), PipelineWork(&priced); got != want || got == Work(pp, false) {
		t.Errorf("llama-3-8b pp 4 accum 32 priced: work %d, want PipelineWork's %d, over the unpriced %d", got, want, Work(pp, false))
	}
	if Work(&Spec{}, true) != 0 {
		t.Error("a spec without a model has work")
	}
}

// One heavy turn at a time: a second waits until the first is given back,
// or stops with its context's cause.
func TestHeavyTurnIsOneAtATime(t *testing.T) {
	done, err := HeavyTurn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	cause := errors.New("the request ran past its time limit")
	ctx, cancel := context.WithTimeoutCause(context.Background(), 50*time.Millisecond, cause)
	defer cancel()
	if _, err := HeavyTurn(ctx); !errors.Is(err, cause) {
		t.Fatalf("a second turn while the first is held: %v, want the context's cause", err)
	}
	if _, ok := TryHeavyTurn(); ok {
		t.Fatal("the turn was taken while held")
	}
	got := make(chan error, 1)
	go func() {
		d, err := HeavyTurn(context.Background())
		if err == nil {
			d()
		}
		got <- err
	}()
	select {
	case err := <-got:
		t.Fatalf("a second turn ended (%v) while the first was held", err)
	case <-time.After(20 * time.Millisecond):
	}
	done()
	if err := <-got; err != nil {
		t.Fatalf("the second turn after the first was given back: %v", err)
	}
}
