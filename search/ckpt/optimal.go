package ckpt

import (
	"fmt"
	"math"
	"math/bits"
	"sort"
)

// Options tunes OptimalWith.
type Options struct {
	// Resolution is the size in bytes of one memory slot of the dynamic
	// program. Each block's extra bytes (Saved − Input) are rounded UP to
	// whole slots and each block's headroom is rounded DOWN, so a returned
	// policy always fits the budget exactly (Evaluate(...) ≤ budget); it is
	// optimal whenever every block's Saved − Input is a multiple of the
	// resolution, and otherwise optimal for the rounded-up sizes, which
	// costs at most one slot per block of headroom: its recompute is no
	// more than the exact optimum's under budget − n·Resolution.
	//
	// Zero picks automatically: the greatest common divisor of the blocks'
	// Saved − Input (exact) when that needs at most 1<<24 DP cells, else
	// DefaultResolution(budget), coarsened if needed to fit MaxCells.
	Resolution int64
	// MaxCells bounds (n−1)·slots, the DP's time and its decision bits
	// (one bit a cell). Zero means 1<<28 (32 MiB of bits). An explicit
	// Resolution that needs more cells fails with ErrTooLarge; the
	// automatic one is coarsened instead.
	MaxCells int64
	// NoPolish skips the exact-bytes greedy pass that, after the DP,
	// un-checkpoints blocks (most expensive first) while the true bytes
	// still fit. The pass can only lower recompute; it never changes an
	// exact (Plan.Exact) optimum's recompute.
	NoPolish bool
}

// DefaultResolution is the automatic slot size when exact bytes are too
// fine: the larger of 1 MiB and budget/16384 (at most 16385 slots:
// ~15 ms for 1,000 blocks, within ~0.4% of a 4× finer grid on
// the benchmark chain, where budget/4096 is 4× faster and ~1.3% off).
func DefaultResolution(budget int64) int64 {
	r := budget / 16384
	if r < 1<<20 {
		r = 1 << 20
	}
	return r
}

const (
	defaultMaxCells = 1 << 28
	autoExactCells  = 1 << 24
)

// Plan is OptimalWith's answer.
type Plan struct {
	Policy    Policy
	Peak      int64   // Evaluate's peak of Policy (≤ the budget)
	Recompute float64 // Evaluate's recompute of Policy
	// Resolution is the slot size the DP used, in bytes.
	Resolution int64
	// Exact reports that rounding lost nothing (every Saved − Input is a
	// multiple of Resolution), so Recompute is the true minimum.
	Exact bool
	// Slots is the number of memory slots of the DP (its M).
	Slots int
}

// Optimal returns the checkpointing policy with the least recompute whose
// peak (Evaluate) is at most budget, by OptimalWith with default Options.
// Errors wrap ErrInfeasible (budget below MinPeak), ErrInvalid or
// ErrTooLarge.
func Optimal(blocks []Block, budget int64) (Policy, error) {
	p, err := OptimalWith(blocks, budget, Options{})
	return p.Policy, err
}

// OptimalWith solves the placement problem by a dynamic program over
// (block, held bytes) in O(n·M) time and O(M) floats plus n·M bits of
// decisions, M = slots = headroom/Resolution + 1.
//
// Reformulation: write E_i = Σ_{j<i, j kept} (Saved_j − Input_j), the extra
// bytes held before block i because of un-checkpointed predecessors. Block
// i's backward fits iff E_i ≤ cap_i = budget − Σ_{j<i} Input_j − Saved_i −
// Peak_i. E is non-decreasing in i, so the constraints collapse to
// E_i ≤ lim_i = min_{k≥i} cap_k, a non-decreasing staircase. The DP scans
// blocks first to last; dp[m] is the least recompute of a prefix policy
// whose rounded E is m slots, and block i either is checkpointed
// (dp[m] + Forward_i) or kept (dp[m − w_i], w_i = ⌈(Saved_i − Input_i)/r⌉),
// a 0/1 knapsack whose capacity grows along the chain. The last block is
// never checkpointed: its Saved is rematerialised at once, so
// checkpointing it saves nothing and costs its forward.
func OptimalWith(blocks []Block, budget int64, opt Options) (Plan, error) {
	if err := check(blocks, budget); err != nil {
		return Plan{}, err
	}
	n := len(blocks)
	if n == 0 {
		return Plan{Policy: Policy{}, Resolution: 1, Exact: true, Slots: 1}, nil
	}
	if peak, _ := Evaluate(blocks, None(n)); peak <= budget {
		return Plan{Policy: None(n), Peak: peak, Resolution: 1, Exact: true, Slots: 1}, nil
	}
	k := &knapsack{blocks: blocks, budget: budget, opt: opt, n: n, items: n - 1} // the last block is always kept
	if err := k.grid(); err != nil {
		return Plan{}, err
	}
	k.fill()
	p, err := k.policy()
	if err != nil {
		return Plan{}, err
	}
	if !opt.NoPolish {
		polish(blocks, budget, p)
	}
	peak, rc := Evaluate(blocks, p)
	if peak > budget {
		return Plan{}, fmt.Errorf("internal error: policy peak %d exceeds budget %d", peak, budget)
	}
	return Plan{Policy: p, Peak: peak, Recompute: rc, Resolution: k.r, Exact: k.exact, Slots: k.slots}, nil
}

// knapsack is one OptimalWith's dynamic program: grid (the resolution, the rounded weights and the staircase
// in slots), fill (the DP over the blocks, remembering which were kept), then policy (the backtrack).
type knapsack struct {
	blocks []Block
	budget int64
	opt    Options
	n      int
	items  int // blocks the DP decides: all but the last

	r     int64   // bytes per slot
	exact bool    // every weight is a multiple of r
	w     []int64 // rounded weights
	slots int
	limU  []int // the staircase in slots

	dp    []float64
	words int
	keep  []uint64 // keep[i*words+m/64] bit m%64: block i kept at m
}

// grid chooses the resolution r (the gcd of the weights when that grid is small enough, else coarser until it
// fits MaxCells), rounds the weights up to slots, and converts the staircase: limU[i] = ⌊lim_i/r⌋, clamped by
// the rounded weight of the whole prefix (unreachable above).
func (k *knapsack) grid() error {
	blocks, n, items := k.blocks, k.n, k.items
	maxCells := k.opt.MaxCells
	if maxCells <= 0 {
		maxCells = defaultMaxCells
	}
	// lim[i] in bytes: non-decreasing, and ≥ 0 since checkpointing
	// everything fits.
	lim := staircase(blocks, k.budget)
	var sumExtra int64
	for _, b := range blocks[:items] {
		sumExtra += b.Saved - b.Input
	}
	// No prefix ever holds more than sumExtra extra bytes: a bound for
	// sizing the grid (the DP itself clamps by rounded prefix weights).
	span := min(lim[n-1], sumExtra)
	r := k.opt.Resolution
	auto := r <= 0
	if auto {
		var g int64
		for _, b := range blocks[:items] {
			g = gcd(g, b.Saved-b.Input)
		}
		if g > 0 && cells(items, span/g+1) <= autoExactCells {
			r = g
		} else {
			r = max(DefaultResolution(k.budget), g) // g: coarser and still exact
		}
	}
	k.w = make([]int64, items)
	var slots64 int64
	for {
		slots64 = k.round(r, lim[n-1])
		if cells(items, slots64) <= maxCells {
			break
		}
		if !auto {
			return fmt.Errorf("%w: %d blocks × %d slots at resolution %d B exceeds MaxCells %d",
				ErrTooLarge, items, slots64, r, maxCells)
		}
		r *= 2 // the automatic grid coarsens until it fits
	}
	k.r, k.slots = r, int(slots64)
	k.limU = make([]int, n)
	var prefW int64
	for i := range n {
		k.limU[i] = int(min(lim[i]/r, prefW))
		if i < items {
			prefW += k.w[i]
		}
	}
	return nil
}

// round sets the weights rounded up at resolution r (and whether that is exact) and returns the slots the
// DP needs under the top of the staircase, top.
func (k *knapsack) round(r, top int64) int64 {
	k.exact = true
	var sumW int64
	for i := range k.items {
		e := k.blocks[i].Saved - k.blocks[i].Input
		k.w[i] = (e + r - 1) / r
		sumW += k.w[i]
		if e%r != 0 {
			k.exact = false
		}
	}
	return min(top/r, sumW) + 1
}

// fill runs the DP: dp[m] is the least recompute of a prefix policy whose rounded extra bytes are m slots;
// block i is either checkpointed (dp[m] + Forward_i) or kept (dp[m − w_i]).
func (k *knapsack) fill() {
	blocks, w, limU, slots := k.blocks, k.w, k.limU, k.slots
	dp := make([]float64, slots)
	for m := range dp {
		dp[m] = math.Inf(1)
	}
	dp[0] = 0
	words := (slots + 63) / 64
	keep := make([]uint64, k.items*words)
	// Invariant before block i: dp[m] is finite only for m ≤ limU[i] (the
	// rest were never written), so reading past limU[i] yields +Inf.
	for i := range k.items {
		f := blocks[i].Forward
		wi := int(w[i])
		hi := limU[i+1]
		row := keep[i*words : (i+1)*words]
		if wi == 0 {
			// Keeping costs no memory: keep when it saves recompute.
			if f > 0 {
				for m := 0; m <= limU[i]; m++ {
					if dp[m] < math.MaxFloat64 {
						row[m>>6] |= 1 << uint(m&63)
					}
				}
			}
			continue
		}
		for m := hi; m >= wi; m-- {
			c := dp[m] + f
			if kept := dp[m-wi]; kept < c {
				dp[m] = kept
				row[m>>6] |= 1 << uint(m&63)
			} else {
				dp[m] = c
			}
		}
		for m := min(wi-1, hi); m >= 0; m-- {
			dp[m] += f
		}
	}
	k.dp, k.words, k.keep = dp, words, keep
}

// policy backtracks from the cheapest final state to the blocks to checkpoint.
func (k *knapsack) policy() (Policy, error) {
	dp, words := k.dp, k.words
	best := 0
	for m := 1; m <= k.limU[k.n-1]; m++ {
		if dp[m] < dp[best] {
			best = m
		}
	}
	if math.IsInf(dp[best], 1) {
		// Unreachable: checkpointing every block (m = 0) is feasible.
		return nil, fmt.Errorf("internal error: no DP state survived")
	}
	p := make(Policy, k.n)
	m := best
	for i := k.items - 1; i >= 0; i-- {
		if k.keep[i*words+m>>6]>>uint(m&63)&1 == 1 {
			m -= int(k.w[i])
		} else {
			p[i] = true
		}
	}
	return p, nil
}

func cells(items int, slots int64) int64 {
	if items == 0 {
		return 0
	}
	hi, lo := bits.Mul64(uint64(items), uint64(slots))
	if hi != 0 || lo > math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(lo)
}

func gcd(a, b int64) int64 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// polish un-checkpoints blocks of p, most expensive forward first, while the
// exact bytes still fit budget. Keeping block j adds Saved_j − Input_j to the
// held bytes of every later block, so it fits iff that extra is at most the
// least slack among blocks after j; a segment tree keeps the slacks.
func polish(blocks []Block, budget int64, p Policy) {
	n := len(blocks)
	if n < 2 {
		return
	}
	var cand []int
	for j := 0; j < n-1; j++ {
		if p[j] && blocks[j].Forward > 0 {
			cand = append(cand, j)
		}
	}
	if len(cand) == 0 {
		return
	}
	slack := make([]int64, n)
	var held int64
	for i, b := range blocks {
		slack[i] = budget - held - b.Saved - b.Peak
		if p[i] {
			held += b.Input
		} else {
			held += b.Saved
		}
	}
	sort.SliceStable(cand, func(a, b int) bool {
		ba, bb := blocks[cand[a]], blocks[cand[b]]
		if ba.Forward != bb.Forward {
			return ba.Forward > bb.Forward
		}
		return ba.Saved-ba.Input < bb.Saved-bb.Input
	})
	t := newMinTree(slack)
	for _, j := range cand {
		e := blocks[j].Saved - blocks[j].Input
		if e <= t.min(j+1, n-1) {
			p[j] = false
			t.add(j+1, n-1, -e)
		}
	}
}

// minTree is a segment tree over int64 with range add and range minimum.
type minTree struct {
	n      int
	mn, lz []int64
}

func newMinTree(v []int64) *minTree {
	t := &minTree{n: len(v), mn: make([]int64, 4*len(v)), lz: make([]int64, 4*len(v))}
	t.build(1, 0, t.n-1, v)
	return t
}

func (t *minTree) build(x, l, r int, v []int64) {
	if l == r {
		t.mn[x] = v[l]
		return
	}
	mid := (l + r) / 2
	t.build(2*x, l, mid, v)
	t.build(2*x+1, mid+1, r, v)
	t.mn[x] = min(t.mn[2*x], t.mn[2*x+1])
}

func (t *minTree) add(ql, qr int, v int64) { t.addRec(1, 0, t.n-1, ql, qr, v) }

func (t *minTree) addRec(x, l, r, ql, qr int, v int64) {
	if qr < l || r < ql {
		return
	}
	if ql <= l && r <= qr {
		t.mn[x] += v
		t.lz[x] += v
		return
	}
	mid := (l + r) / 2
	t.addRec(2*x, l, mid, ql, qr, v)
	t.addRec(2*x+1, mid+1, r, ql, qr, v)
	t.mn[x] = min(t.mn[2*x], t.mn[2*x+1]) + t.lz[x]
}

func (t *minTree) min(ql, qr int) int64 { return t.minRec(1, 0, t.n-1, ql, qr) }

func (t *minTree) minRec(x, l, r, ql, qr int) int64 {
	if qr < l || r < ql {
		return math.MaxInt64
	}
	if ql <= l && r <= qr {
		return t.mn[x]
	}
	mid := (l + r) / 2
	a := t.minRec(2*x, l, mid, ql, qr)
	b := t.minRec(2*x+1, mid+1, r, ql, qr)
	return min(a, b) + t.lz[x]
}

// staircase is the bound on the extra bytes held before each block: block
// i fits when the bytes kept by earlier un-checkpointed blocks beyond their
// inputs are at most budget − Σ_{j<i} Input_j − Saved_i − Peak_i, and since
// those extra bytes only grow along the chain, each limit is the minimum of
// its own and every later one (the suffix minimum).
func staircase(blocks []Block, budget int64) []int64 {
	n := len(blocks)
	lim := make([]int64, n)
	var base int64
	for i, b := range blocks {
		lim[i] = budget - base - b.Saved - b.Peak
		base += b.Input
	}
	for i := n - 2; i >= 0; i-- {
		lim[i] = min(lim[i], lim[i+1])
	}
	return lim
}
