package search

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/memplan/memplan/engine"
	"github.com/memplan/memplan/units"
)

// TestOpBytesMeasured: opBytes, which sizes the program caches in ops, is
// within a factor of two of what resultBytes measures per op on shallow
// programs of the kind a search caches (dense and mixture-of-experts,
// sharded and not).
func TestOpBytesMeasured(t *testing.T) {
	for _, c := range []struct {
		model  string
		layers int
		zero   int
	}{{"mixtral-8x7b", 2, 0}, {"mixtral-8x7b", 2, 3}, {"llama-3.2-1b", 2, 0}, {"gpt2", 3, 2}} {
		s := baseSpec(t, c.model, "h100", c.layers)
		s.GPU = nil
		if c.zero > 0 {
			s.DP, s.ZeRO = 8, c.zero
		}
		r, err := engine.PlanWith(s, engine.Options{NoTimeline: true})
		if err != nil {
			t.Fatal(err)
		}
		per := float64(programBytes(r.Program)) / float64(len(r.Program.Ops))
		t.Logf("%s, %d layers, ZeRO-%d: %d ops, %.0f B per op", c.model, c.layers, c.zero, len(r.Program.Ops), per)
		if per > 2*opBytes || per < opBytes/2 {
			t.Errorf("%s: %.0f B per op measured, opBytes is %d", c.model, per, opBytes)
		}
	}
}

// TestFitMemoryBudget: a search refuses, in one line wrapping
// ErrMemoryBudget, candidates over a quarter of its budget and a program
// over a worker's share.
func TestFitMemoryBudget(t *testing.T) {
	base := baseSpec(t, "gpt2", "h100", 0)
	for _, c := range []struct {
		budget int64
		want   string
	}{
		{64 << 10, "candidate plans alone take"},
		// The winner's program holds about 311 KiB; its 612 candidates about 292 KiB, under a quarter of
		// 1.25 MiB. (At 2 MiB the share, 415 KiB, took a program only while the plan's program was the
		// cached one with its spare capacity; autocast's region exits make each amp plan's program a tight
		// copy of it.)
		{5 << 18, "of program, over a worker's share"},
	} {
		_, err := Fit(base, Options{GPUs: 2, GlobalBatch: 8, Workers: 2, MemoryBudget: units.Bytes(c.budget)})
		if !errors.Is(err, ErrMemoryBudget) || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("budget %d: got %v, want one line with %q", c.budget, err, c.want)
		}
	}
	if _, err := Fit(base, Options{GPUs: 2, GlobalBatch: 8, Keep: 1}); err != nil {
		t.Errorf("the default budget: %v", err)
	}
}

// TestFitKeepsNoJudgedPrograms: the plans a search reports besides the
// winner and runners-up (verified for the report) hold no program or
// timeline: a search that kept them grew by megabytes per plan.
func TestFitKeepsNoJudgedPrograms(t *testing.T) {
	r, err := Fit(baseSpec(t, "gpt2", "h100", 2), Options{GPUs: 2, GlobalBatch: 8, Keep: 1})
	if err != nil {
		t.Fatal(err)
	}
	reported := map[*Plan]bool{r.Winner: true}
	for _, p := range r.RunnersUp {
		reported[p] = true
	}
	n := 0
	for _, p := range r.Front {
		if reported[p] || p.Result == nil {
			continue
		}
		n++
		if p.Result.Program != nil || len(p.Result.Sim.Timeline) > 0 || len(p.Result.Sim.Totals) > 0 || (p.Result.Timing != nil && p.Result.Timing.Ops != nil) {
			t.Errorf("%s keeps its program or timeline", p.Describe())
		}
	}
	t.Logf("%d front plans planned in full, none kept", n)
}

// TestFullDepthPipelineByParts: a 1F1B pipeline too shallow to shrink is
// estimated from its first and last stage at full depth, not every stage:
// the same peak as planning it whole (those stages bound the others), and
// a priced step.
func TestFullDepthPipelineByParts(t *testing.T) {
	for _, c := range []struct {
		model       string
		layers, pp  int
		every, zero int
	}{{"gpt2", 12, 4, 3, 0}, {"llama-3.2-1b", 8, 4, 2, 1}, {"gpt2", 8, 8, 0, 0}} {
		s := baseSpec(t, c.model, "h100", c.layers)
		s.PP, s.Accum, s.DP, s.ZeRO = c.pp, 2*c.pp, 2, c.zero
		if c.every > 0 {
			s.Checkpoint = engine.CheckpointPolicy{Kind: engine.CheckpointEvery, Every: c.every}
		}
		if u := unit(&s); u+s.Model.Layers%u+u < s.Model.Layers {
			t.Fatalf("%s: %d layers shrink (unit %d); the case must not", c.model, c.layers, u)
		}
		p := &Plan{Spec: s}
		newEstimator(s.Model).estimate(p)
		r, step, err := newEstimator(s.Model).run(s, 0)
		if err != nil || p.Dropped != "" {
			t.Fatalf("%s: %v %s", c.model, err, p.Dropped)
		}
		if p.Result != nil || p.EstPeak != r.PeakBytes() || p.EstStep != step {
			t.Errorf("%s pp %d: estimate %s step %v (planned whole: %v), full plan %s", c.model, c.pp, p.EstPeak, p.EstStep, p.Result != nil, r.PeakBytes())
		}
		t.Logf("%s pp %d: step %v estimated, %v planned whole", c.model, c.pp, p.EstStep, step)
	}
}

// TestExtrapolateSaturates: the shallow models' extrapolation and a step
// time saturate at 2^62 bytes and 292 years instead of wrapping negative
// (a negative bound would "fit" any budget; a negative step would win).
func TestExtrapolateSaturates(t *testing.T) {
	for _, c := range []struct {
		p1, p2 units.Bytes
		k, u   int
		want   units.Bytes
	}{
		{100, 150, 4, 2, 250},
		{100, 151, 1, 2, 176}, // rounded down
		{150, 100, 8, 1, 100}, // a falling peak keeps p2
		{0, units.MaxBytes / 2, 1 << 15, 1, units.MaxBytes},
		{0, 1 << 61, 3, 1, units.MaxBytes},
		{0, 1 << 60, 2, 1, 3 << 60},
	} {
		if got := extrapolate(c.p1, c.p2, c.k, c.u); got != c.want {
			t.Errorf("extrapolate(%d, %d, %d, %d) = %d, want %d", c.p1, c.p2, c.k, c.u, got, c.want)
		}
	}
	if d := saturate(1e30); d != time.Duration(math.MaxInt64) {
		t.Errorf("saturate(1e30) = %v", d)
	}
	if d := saturate(-5); d != 0 {
		t.Errorf("saturate(-5) = %v", d)
	}
}
