package ckpt

import (
	"math/rand/v2"
	"testing"
)

// hetero1000 is a 1,000-block heterogeneous chain: transformer-like
// attention/MLP pairs with per-block jitter in bytes (not multiples of any
// convenient unit, so the DP runs on its rounded grid) plus occasional
// larger blocks, and its budget: half the no-checkpoint peak.
func hetero1000() ([]Block, int64) {
	rng := rand.New(rand.NewPCG(7, 11))
	bs := make([]Block, 1000)
	for i := range bs {
		in := 48<<20 + rng.Int64N(32<<20)
		var extra int64
		var f float64
		if i%2 == 0 { // attention-like: costly, small
			extra = 64<<20 + rng.Int64N(96<<20)
			f = 4 + 2*rng.Float64()
		} else { // MLP-like: cheap, large
			extra = 256<<20 + rng.Int64N(256<<20)
			f = 1 + rng.Float64()
		}
		if i%97 == 0 {
			extra *= 3
		}
		bs[i] = Block{Input: in, Saved: in + extra, Forward: f, Peak: rng.Int64N(64 << 20)}
	}
	none, _ := Evaluate(bs, None(len(bs)))
	return bs, none / 2
}

func BenchmarkOptimal1000(b *testing.B) {
	bs, budget := hetero1000()
	plan, err := OptimalWith(bs, budget, Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Optimal(bs, budget); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(plan.Slots), "slots")
	b.ReportMetric(plan.Recompute, "recompute")
}

// BenchmarkOptimal1000Fine is the same chain on a 16× finer grid
// (budget/65536 per slot), for the cost of resolution.
func BenchmarkOptimal1000Fine(b *testing.B) {
	bs, budget := hetero1000()
	opt := Options{Resolution: budget / 65536}
	plan, err := OptimalWith(bs, budget, opt)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := OptimalWith(bs, budget, opt); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(plan.Slots), "slots")
	b.ReportMetric(plan.Recompute, "recompute")
}

func BenchmarkChenGreedy1000(b *testing.B) {
	bs, budget := hetero1000()
	p, err := ChenGreedy(bs, budget)
	if err != nil {
		b.Fatal(err)
	}
	_, rc := Evaluate(bs, p)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ChenGreedy(bs, budget); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(rc, "recompute")
}
