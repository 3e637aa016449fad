package ckpt

import (
	"fmt"
	"math"
)

// maxExactPoints bounds the total size of OptimalExact's Pareto frontiers.
const maxExactPoints = 1 << 22

type paretoPoint struct {
	e      int64   // extra bytes held before the next block
	cost   float64 // recompute so far
	parent int32   // index in the previous frontier
	kept   bool    // whether this step's block was kept (not checkpointed)
}

// OptimalExact solves the same problem as Optimal with exact bytes and no
// rounding: a DP over the Pareto frontier of (extra held bytes, recompute)
// pairs of prefix policies, pruned by the staircase limit after every
// block. The frontier holds at most one point per distinct reachable byte
// count, so it is exponential in the worst case (heterogeneous blocks, loose
// budgets); it fails with ErrTooLarge past 1<<22 points in all and is meant
// for small chains and as the reference for Optimal. It returns the same
// errors as Optimal.
func OptimalExact(blocks []Block, budget int64) (Policy, error) {
	if err := check(blocks, budget); err != nil {
		return nil, err
	}
	n := len(blocks)
	if n == 0 {
		return Policy{}, nil
	}
	lim := staircase(blocks, budget)

	layers := make([][]paretoPoint, n)
	layers[0] = []paretoPoint{{e: 0, cost: 0, parent: -1}}
	total := 1
	for i := 0; i < n-1; i++ {
		cur := layers[i]
		f := blocks[i].Forward
		ex := blocks[i].Saved - blocks[i].Input
		next := make([]paretoPoint, 0, 2*len(cur))
		push := func(q paretoPoint) {
			if q.e > lim[i+1] {
				return
			}
			if len(next) > 0 && q.cost >= next[len(next)-1].cost {
				return // dominated: no less memory, no less recompute
			}
			next = append(next, q)
		}
		a, b := 0, 0 // a: checkpoint candidates, b: keep candidates
		for a < len(cur) || b < len(cur) {
			var ca, cb paretoPoint
			ca.e, cb.e = math.MaxInt64, math.MaxInt64
			if a < len(cur) {
				ca = paretoPoint{e: cur[a].e, cost: cur[a].cost + f, parent: int32(a)}
			}
			if b < len(cur) {
				cb = paretoPoint{e: cur[b].e + ex, cost: cur[b].cost, parent: int32(b), kept: true}
			}
			switch {
			case ca.e < cb.e:
				push(ca)
				a++
			case cb.e < ca.e:
				push(cb)
				b++
			default: // same bytes: the cheaper one, checkpointing on ties
				if cb.cost < ca.cost {
					push(cb)
				} else {
					push(ca)
				}
				a++
				b++
			}
		}
		total += len(next)
		if total > maxExactPoints {
			return nil, fmt.Errorf("%w: exact frontier exceeds %d points at block %d; use Optimal", ErrTooLarge, maxExactPoints, i)
		}
		layers[i+1] = next
	}
	last := layers[n-1]
	// Costs strictly decrease along a frontier: the last point is cheapest.
	k := len(last) - 1
	p := make(Policy, n)
	for i := n - 1; i >= 1; i-- {
		q := layers[i][k]
		p[i-1] = !q.kept
		k = int(q.parent)
	}
	return p, nil
}

// BruteForce enumerates all 2^n policies and returns one with the least
// recompute whose peak fits budget (ties: lower peak, then the first in
// enumeration order), or nil when none fits. It is exponential, exists as
// the reference for tests, and panics for n > 20.
func BruteForce(blocks []Block, budget int64) Policy {
	n := len(blocks)
	if n > 20 {
		panic(fmt.Sprintf("ckpt.BruteForce: %d blocks; refusing more than 20", n))
	}
	var (
		best     Policy
		bestRC   = math.Inf(1)
		bestPeak int64
	)
	p := make(Policy, n)
	for mask := 0; mask < 1<<n; mask++ {
		for i := range p {
			p[i] = mask>>i&1 == 1
		}
		peak, rc := Evaluate(blocks, p)
		if peak > budget {
			continue
		}
		if best == nil || rc < bestRC || (rc == bestRC && peak < bestPeak) {
			best = append(Policy(nil), p...)
			bestRC, bestPeak = rc, peak
		}
	}
	if best == nil && n == 0 && budget >= 0 {
		return Policy{}
	}
	return best
}
