package ckpt

import (
	"math"
)

// Chen is the √n baseline of Chen et al., "Training Deep Nets with
// Sublinear Memory Cost" (2016), rendered at per-block granularity.
//
// Chen's scheme cuts a chain into about √n segments, stores the tensors at
// the segment boundaries and recomputes everything inside a segment during
// the backward. With torch.utils.checkpoint applied per block every block
// boundary is stored anyway (a checkpointed block keeps its input, a kept
// block keeps its input inside Saved), so the only per-block decision is
// which blocks keep their internals instead of recomputing them. The
// faithful rendering, the one Checkmate (Jain et al. 2020,
// solve_chen_sqrtn) uses for its Chen baseline, marks every k-th node a
// stored checkpoint and recomputes the rest: with k = ⌈√n⌉, block i is kept
// when (i+1) mod k = 0, and every other block is checkpointed. The last block
// is always kept as well: at per-block granularity checkpointing it saves no
// memory (its backward rematerialises Saved at once) and only costs its
// forward, so omitting it would handicap the baseline for nothing.
//
// (torch.utils.checkpoint.checkpoint_sequential renders Chen differently,
// recomputing whole segments; that is segment granularity, which a
// per-block Policy cannot express.)
func Chen(blocks []Block) Policy {
	n := len(blocks)
	p := make(Policy, n)
	if n == 0 {
		return p
	}
	k := int(math.Ceil(math.Sqrt(float64(n))))
	for i := range p {
		p[i] = (i+1)%k != 0 && i != n-1
	}
	return p
}

// chenGreedyRun is Algorithm 3 of Chen et al. ("memory planning with
// budget") at per-block granularity: walk the chain accumulating the bytes
// each block would hold (temp += Saved_i); when temp exceeds b the block
// becomes a stage split point, stored rather than recomputed (kept, not
// checkpointed), and temp restarts at 0. x sums the stored split points'
// bytes and y is the largest temp seen (the memory of one stage).
func chenGreedyRun(blocks []Block, b float64, p Policy) (x, y float64) {
	var temp float64
	for i, blk := range blocks {
		temp += float64(blk.Saved)
		y = max(y, temp)
		if temp > b {
			p[i] = false
			x += float64(blk.Saved)
			temp = 0
		} else {
			p[i] = true
		}
	}
	if len(p) > 0 {
		p[len(p)-1] = false // as in Chen: checkpointing the last block only costs
	}
	return x, y
}

// ChenGreedy is Chen et al.'s Algorithm 3 under a memory budget. The paper
// runs the greedy with b = 0 to get x and y, then searches b on a small
// grid around √(x·y) (six points over [√(xy)/√2, √2·√(xy)], as in its
// appendix A). With a hard budget the grid is extended geometrically (steps
// of √2) up to the total Saved bytes, where nearly every block is
// checkpointed, and down until every block is a split point (kept), and
// checkpointing every block but the last is the final fallback. Each
// candidate is priced with Evaluate; ChenGreedy returns the one with the
// least recompute whose peak fits budget (ties: lower peak). It returns an
// error wrapping ErrInfeasible when budget is below MinPeak, or ErrInvalid.
func ChenGreedy(blocks []Block, budget int64) (Policy, error) {
	if err := check(blocks, budget); err != nil {
		return nil, err
	}
	n := len(blocks)
	if n == 0 {
		return Policy{}, nil
	}
	var best Policy
	var bestRC float64
	var bestPeak int64
	try := func(p Policy) {
		peak, rc := Evaluate(blocks, p)
		if peak > budget {
			return
		}
		if best == nil || rc < bestRC || (rc == bestRC && peak < bestPeak) {
			best = append(best[:0], p...)
			bestRC, bestPeak = rc, peak
		}
	}
	p := make(Policy, n)
	x, y := chenGreedyRun(blocks, 0, p)
	try(p)
	b0 := math.Sqrt(x * y)
	const grid = 6
	lo, hi := b0/math.Sqrt2, b0*math.Sqrt2
	for g := 0; g <= grid; g++ {
		chenGreedyRun(blocks, lo+(hi-lo)*float64(g)/grid, p)
		try(p)
	}
	var total float64
	minSaved := math.Inf(1)
	for _, blk := range blocks {
		total += float64(blk.Saved)
		if blk.Saved > 0 {
			minSaved = min(minSaved, float64(blk.Saved))
		}
	}
	// Extend the grid both ways: smaller b keeps more blocks (for loose
	// budgets), larger b checkpoints more (for tight ones).
	for b := max(hi, 1); b < total; b *= math.Sqrt2 {
		chenGreedyRun(blocks, b, p)
		try(p)
	}
	for b := lo / math.Sqrt2; b >= minSaved; b /= math.Sqrt2 {
		chenGreedyRun(blocks, b, p)
		try(p)
	}
	last := All(n)
	last[n-1] = false
	try(last) // same peak as All(n), which MinPeak ≤ budget guarantees
	return best, nil
}
