package ckpt

import (
	"errors"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"

	"pgregory.net/rapid"
)

const mib = 1 << 20

// genChain draws a heterogeneous chain of n blocks with sizes in multiples
// of unit bytes.
func genChain(t *rapid.T, n int, unit int64, intCosts bool) []Block {
	bs := make([]Block, n)
	for i := range bs {
		in := rapid.Int64Range(0, 200).Draw(t, "in") * unit
		extra := rapid.Int64Range(0, 2000).Draw(t, "extra") * unit
		var f float64
		if intCosts {
			f = float64(rapid.IntRange(0, 20).Draw(t, "fwd"))
		} else {
			f = rapid.Float64Range(0, 10).Draw(t, "fwd")
		}
		bs[i] = Block{
			Name:    "b" + strconv.Itoa(i),
			Input:   in,
			Saved:   in + extra,
			Forward: f,
			Peak:    rapid.Int64Range(0, 500).Draw(t, "peak") * unit,
		}
	}
	return bs
}

// genBudget draws a budget biased to the interesting range: tight (just
// above the minimum), anywhere in between, infeasible, or loose.
func genBudget(t *rapid.T, bs []Block) int64 {
	lo := MinPeak(bs)
	hi, _ := Evaluate(bs, None(len(bs)))
	switch rapid.IntRange(0, 5).Draw(t, "kind") {
	case 0:
		return lo + rapid.Int64Range(0, 300).Draw(t, "slack")
	case 1:
		return lo - rapid.Int64Range(1, 300).Draw(t, "short")
	case 2:
		return hi + rapid.Int64Range(0, 100).Draw(t, "over")
	default:
		return rapid.Int64Range(lo, hi).Draw(t, "budget")
	}
}

func near(a, b float64) bool {
	return math.Abs(a-b) <= 1e-9*math.Max(1, math.Max(math.Abs(a), math.Abs(b)))
}

type fataler interface {
	Helper()
	Fatalf(format string, args ...any)
}

func checkFits(t fataler, name string, bs []Block, p Policy, budget int64) float64 {
	t.Helper()
	if len(p) != len(bs) {
		t.Fatalf("%s: policy has %d entries for %d blocks", name, len(p), len(bs))
	}
	peak, rc := Evaluate(bs, p)
	if peak > budget {
		t.Fatalf("%s: peak %d exceeds budget %d (policy %s)", name, peak, budget, p)
	}
	return rc
}

// The DP, the exact Pareto DP and brute force agree on the least recompute,
// and every returned policy fits.
func TestOptimalMatchesBruteForce(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(0, 12).Draw(t, "n")
		bs := genChain(t, n, 1, rapid.Bool().Draw(t, "intCosts"))
		budget := genBudget(t, bs)

		bf := BruteForce(bs, budget)
		ex, errEx := OptimalExact(bs, budget)
		plan, errOpt := OptimalWith(bs, budget, Options{})
		r1, errR1 := OptimalWith(bs, budget, Options{Resolution: 1, NoPolish: true})
		if bf == nil {
			for name, err := range map[string]error{"exact": errEx, "optimal": errOpt, "res1": errR1} {
				if !errors.Is(err, ErrInfeasible) {
					t.Fatalf("%s: brute force finds nothing under %d but err = %v", name, budget, err)
				}
			}
			return
		}
		for name, err := range map[string]error{"exact": errEx, "optimal": errOpt, "res1": errR1} {
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
		}
		_, want := Evaluate(bs, bf)
		for name, p := range map[string]Policy{"exact": ex, "optimal": plan.Policy, "res1": r1.Policy} {
			if got := checkFits(t, name, bs, p, budget); !near(got, want) {
				t.Fatalf("%s: recompute %v, brute force %v (%s vs %s)", name, got, want, p, bf)
			}
		}
		if !plan.Exact || !r1.Exact {
			t.Fatalf("small chain should be solved exactly: auto %+v", plan)
		}
		if _, rc := Evaluate(bs, plan.Policy); rc != plan.Recompute {
			t.Fatalf("Plan.Recompute %v != Evaluate %v", plan.Recompute, rc)
		}
	})
}

// With a coarse resolution the DP stays feasible and loses at most one slot
// per block: it is no worse than the exact optimum under budget − n·r.
func TestOptimalResolutionBound(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(1, 12).Draw(t, "n")
		bs := genChain(t, n, 1, false)
		budget := genBudget(t, bs)
		r := rapid.Int64Range(1, 700).Draw(t, "res")
		bf := BruteForce(bs, budget)
		for _, noPolish := range []bool{false, true} {
			plan, err := OptimalWith(bs, budget, Options{Resolution: r, NoPolish: noPolish})
			if bf == nil {
				if !errors.Is(err, ErrInfeasible) {
					t.Fatalf("want ErrInfeasible, got %v", err)
				}
				continue
			}
			if err != nil {
				t.Fatal(err)
			}
			got := checkFits(t, "coarse", bs, plan.Policy, budget)
			_, opt := Evaluate(bs, bf)
			if got < opt && !near(got, opt) {
				t.Fatalf("coarse DP %v beats the optimum %v", got, opt)
			}
			if tight := BruteForce(bs, budget-int64(n)*r); tight != nil {
				if _, bound := Evaluate(bs, tight); got > bound && !near(got, bound) {
					t.Fatalf("resolution %d: recompute %v > optimum %v at budget − n·r", r, got, bound)
				}
			}
		}
	})
}

// On random heterogeneous chains the DP is never worse than Chen's √n
// policy at Chen's own peak, nor than Chen's greedy at any budget.
func TestOptimalNeverWorseThanChen(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(1, 80).Draw(t, "n")
		bs := genChain(t, n, mib/4, false)
		chen := Chen(bs)
		peak, chenRC := Evaluate(bs, chen)
		p, err := Optimal(bs, peak)
		if err != nil {
			t.Fatal(err)
		}
		if got := checkFits(t, "optimal", bs, p, peak); got > chenRC && !near(got, chenRC) {
			t.Fatalf("optimal %v worse than Chen %v at Chen's peak %d", got, chenRC, peak)
		}

		budget := genBudget(t, bs)
		g, errG := ChenGreedy(bs, budget)
		o, errO := Optimal(bs, budget)
		if (errG == nil) != (errO == nil) {
			t.Fatalf("ChenGreedy err %v, Optimal err %v", errG, errO)
		}
		if errO != nil {
			if !errors.Is(errO, ErrInfeasible) || !errors.Is(errG, ErrInfeasible) {
				t.Fatalf("errors %v / %v", errO, errG)
			}
			return
		}
		greedyRC := checkFits(t, "greedy", bs, g, budget)
		if got := checkFits(t, "optimal", bs, o, budget); got > greedyRC && !near(got, greedyRC) {
			t.Fatalf("optimal %v worse than ChenGreedy %v", got, greedyRC)
		}
	})
}

// transformerChain alternates attention blocks (expensive to recompute,
// little to save) with MLP blocks (cheap, large saved activations).
func transformerChain(n int) []Block {
	bs := make([]Block, n)
	for i := range bs {
		if i%2 == 0 {
			bs[i] = Block{Name: "attn" + strconv.Itoa(i/2), Input: 1 * mib, Saved: 2 * mib, Forward: 10, Peak: mib / 2}
		} else {
			bs[i] = Block{Name: "mlp" + strconv.Itoa(i/2), Input: 1 * mib, Saved: 9 * mib, Forward: 1, Peak: mib / 2}
		}
	}
	return bs
}

// cnnChain has activations that shrink along the chain while compute grows,
// like the stages of a ResNet.
func cnnChain(n int) []Block {
	bs := make([]Block, n)
	for i := range bs {
		act := int64(64*mib) >> (4 * i / n)
		bs[i] = Block{Name: "stage" + strconv.Itoa(i), Input: act, Saved: 4 * act, Forward: float64(1 + i), Peak: act}
	}
	return bs
}

func TestOptimalStrictlyBeatsChen(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	random := make([]Block, 64)
	for i := range random {
		in := (1 + rng.Int64N(64)) * mib
		random[i] = Block{Input: in, Saved: in + rng.Int64N(512)*mib, Forward: rng.Float64() * 10, Peak: rng.Int64N(32) * mib}
	}
	for name, bs := range map[string][]Block{
		"transformer16": transformerChain(16),
		"transformer48": transformerChain(48),
		"cnn36":         cnnChain(36),
		"random64":      random,
	} {
		chen := Chen(bs)
		peak, chenRC := Evaluate(bs, chen)
		plan, err := OptimalWith(bs, peak, Options{})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !plan.Exact {
			t.Errorf("%s: MiB-multiple sizes should be solved exactly, got resolution %d", name, plan.Resolution)
		}
		got := checkFits(t, name, bs, plan.Policy, peak)
		if !(got < chenRC) {
			t.Errorf("%s: optimal recompute %v not below Chen's %v at peak %d", name, got, chenRC, peak)
		}
		t.Logf("%s: Chen %s recompute %.4g, optimal %s recompute %.4g (peak %d MiB)",
			name, chen, chenRC, plan.Policy, got, peak/mib)
	}
}

// On a uniform chain only the number of kept blocks matters: with a budget
// that allows k kept blocks (the last included) the DP keeps exactly k.
func TestUniformChain(t *testing.T) {
	const n = 24
	b := Block{Input: 3 * mib, Saved: 11 * mib, Forward: 1.5, Peak: 2 * mib}
	bs := make([]Block, n)
	for i := range bs {
		bs[i] = b
	}
	// Peak with k kept blocks (block n−1 and k−1 others): the backward of the
	// last block sees n−1 held inputs, k−1 extras, its Saved and its Peak.
	budgetFor := func(k int) int64 {
		return (n-1)*b.Input + int64(k-1)*(b.Saved-b.Input) + b.Saved + b.Peak
	}
	for k := 1; k <= n; k++ {
		for _, budget := range []int64{budgetFor(k), budgetFor(k+1) - 1} {
			if k == n {
				budget = budgetFor(n)
			}
			p, err := Optimal(bs, budget)
			if err != nil {
				t.Fatalf("k=%d: %v", k, err)
			}
			checkFits(t, "uniform", bs, p, budget)
			if kept := n - p.Count(); kept != k {
				t.Fatalf("budget %d: kept %d blocks, want %d (%s)", budget, kept, k, p)
			}
			if p[n-1] {
				t.Fatalf("last block checkpointed: %s", p)
			}
		}
	}
	if _, err := Optimal(bs, budgetFor(1)-1); !errors.Is(err, ErrInfeasible) {
		t.Fatalf("below MinPeak: err = %v", err)
	}
}

func TestInfeasible(t *testing.T) {
	bs := transformerChain(8)
	minPeak := MinPeak(bs)
	for _, budget := range []int64{minPeak - 1, 0, -5} {
		_, err := Optimal(bs, budget)
		if !errors.Is(err, ErrInfeasible) {
			t.Fatalf("Optimal(%d): err = %v", budget, err)
		}
		if !strings.Contains(err.Error(), strconv.FormatInt(minPeak, 10)) {
			t.Fatalf("message %q lacks the minimum peak %d", err, minPeak)
		}
		if _, err := OptimalExact(bs, budget); !errors.Is(err, ErrInfeasible) {
			t.Fatalf("OptimalExact(%d): err = %v", budget, err)
		}
		if _, err := ChenGreedy(bs, budget); !errors.Is(err, ErrInfeasible) {
			t.Fatalf("ChenGreedy(%d): err = %v", budget, err)
		}
		if p := BruteForce(bs, budget); p != nil {
			t.Fatalf("BruteForce(%d) = %s", budget, p)
		}
	}
	p, err := Optimal(bs, minPeak)
	if err != nil {
		t.Fatal(err)
	}
	checkFits(t, "at MinPeak", bs, p, minPeak)
}

func TestInvalid(t *testing.T) {
	for _, bs := range [][]Block{
		{{Input: 10, Saved: 5}},
		{{Input: -1, Saved: 5}},
		{{Input: 1, Saved: 5, Peak: -1}},
		{{Input: 1, Saved: 5, Forward: math.NaN()}},
		{{Input: 1, Saved: 5, Forward: -1}},
		{{Saved: math.MaxInt64 / 2}, {Saved: math.MaxInt64 / 2}},
	} {
		if _, err := Optimal(bs, 100); !errors.Is(err, ErrInvalid) {
			t.Errorf("%+v: err = %v", bs, err)
		}
	}
}

func TestEvaluateByHand(t *testing.T) {
	bs := []Block{
		{Input: 10, Saved: 50, Forward: 1, Peak: 5},
		{Input: 20, Saved: 40, Forward: 2, Peak: 0},
		{Input: 30, Saved: 60, Forward: 4, Peak: 7},
	}
	// None: max(0+50+5, 50+40, 90+60+7) = 157.
	if peak, rc := Evaluate(bs, None(3)); peak != 157 || rc != 0 {
		t.Fatalf("none: %d %v", peak, rc)
	}
	// Checkpoint 0: held 10, 40; max(55, 10+40, 50+67) = 117, recompute 1.
	if peak, rc := Evaluate(bs, Policy{true, false, false}); peak != 117 || rc != 1 {
		t.Fatalf("ckpt 0: %d %v", peak, rc)
	}
	// All: max(55, 10+40, 30+67) = 97, recompute 7.
	if peak, rc := Evaluate(bs, All(3)); peak != 97 || rc != 7 || MinPeak(bs) != 97 {
		t.Fatalf("all: %d %v", peak, rc)
	}
	p, err := Optimal(bs, 117)
	if err != nil || p.String() != "C.." {
		t.Fatalf("Optimal(117) = %s, %v", p, err)
	}
}

func TestChenRendering(t *testing.T) {
	bs := transformerChain(16)
	if got := Chen(bs).String(); got != "CCC.CCC.CCC.CCC." {
		t.Fatalf("Chen(16) = %s", got)
	}
	bs = transformerChain(10) // k = 4: keeps 3, 7 and the last block
	if got := Chen(bs).String(); got != "CCC.CCC.C." {
		t.Fatalf("Chen(10) = %s", got)
	}
}

func TestChenGreedyUsesBudget(t *testing.T) {
	bs := cnnChain(40)
	lo := MinPeak(bs)
	hi, _ := Evaluate(bs, None(len(bs)))
	prev := math.Inf(1)
	for _, budget := range []int64{lo, (3*lo + hi) / 4, (lo + hi) / 2, hi} {
		p, err := ChenGreedy(bs, budget)
		if err != nil {
			t.Fatal(err)
		}
		rc := checkFits(t, "greedy", bs, p, budget)
		if rc > prev {
			t.Fatalf("more budget, more recompute: %v > %v", rc, prev)
		}
		prev = rc
	}
}

func TestLimits(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("BruteForce(21 blocks) did not panic")
		}
	}()
	bs := make([]Block, 1000)
	for i := range bs {
		bs[i] = Block{Input: 1, Saved: 1<<30 + int64(i%7), Forward: 1}
	}
	budget := int64(len(bs)) << 29
	if _, err := OptimalWith(bs, budget, Options{Resolution: 1}); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("resolution 1 on 500 GiB: err = %v", err)
	}
	plan, err := OptimalWith(bs, budget, Options{})
	if err != nil {
		t.Fatal(err)
	}
	checkFits(t, "auto", bs, plan.Policy, budget)
	BruteForce(bs[:21], budget)
}

func TestEmptyAndSingle(t *testing.T) {
	if p, err := Optimal(nil, 0); err != nil || len(p) != 0 {
		t.Fatalf("empty: %v %v", p, err)
	}
	one := []Block{{Input: 4, Saved: 10, Forward: 3, Peak: 1}}
	if p, err := Optimal(one, 11); err != nil || p.String() != "." {
		t.Fatalf("single: %v %v", p, err)
	}
	if _, err := Optimal(one, 10); !errors.Is(err, ErrInfeasible) {
		t.Fatalf("single below peak: %v", err)
	}
}

// A large chain whose bytes share no useful divisor runs on the default
// grid (or a coarser one under MaxCells), stays feasible and beats the
// greedy baseline.
func TestOptimalLargeChain(t *testing.T) {
	bs, budget := hetero1000()
	plan, err := OptimalWith(bs, budget, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if plan.Exact || plan.Resolution != DefaultResolution(budget) || plan.Slots > 16385 {
		t.Fatalf("unexpected grid: resolution %d, slots %d, exact %v", plan.Resolution, plan.Slots, plan.Exact)
	}
	rc := checkFits(t, "default", bs, plan.Policy, budget)
	g, err := ChenGreedy(bs, budget)
	if err != nil {
		t.Fatal(err)
	}
	if grc := checkFits(t, "greedy", bs, g, budget); rc >= grc {
		t.Fatalf("optimal %v not below ChenGreedy %v", rc, grc)
	}
	small, err := OptimalWith(bs, budget, Options{MaxCells: 100_000})
	if err != nil {
		t.Fatal(err)
	}
	if int64(len(bs)-1)*int64(small.Slots) > 100_000 || small.Resolution <= plan.Resolution {
		t.Fatalf("MaxCells not honoured: %d slots at %d B", small.Slots, small.Resolution)
	}
	if src := checkFits(t, "coarse", bs, small.Policy, budget); src < rc {
		t.Logf("coarser grid happened to do better: %v < %v", src, rc)
	}
}
