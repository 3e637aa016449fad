package strategy

import (
	"math/bits"
	"sync"

	"github.com/memplan/memplan/ir"
)

// A search clones thousands of programs of similar sizes and drops most
// at once. A caller that knows a program is dead hands its op and tensor
// arrays back (Release), and the next Clone reuses them instead of
// allocating (and faulting in) fresh memory.
//
// Each pool keeps a few arrays per capacity class. The class sizes are
// m<<e for m in 4..7, so an array is at most a quarter larger than asked
// for: a request for capacity c takes from the smallest class of size ≥ c,
// an array of capacity k goes to the largest class of size ≤ k, and a
// fresh array is made at its class's size, so a program's released array
// serves the next program of the same size (an array made at exactly c
// would land a class below c's and never be taken for it again). A bounded
// free list, not a sync.Pool: what it holds counts as live heap, and an
// unbounded pool raised the collector's goal (and the page faults of a
// larger heap) more than it saved.
type pool[T any] struct {
	mu   sync.Mutex
	free [4 * 48][][]T
}

// poolDepth is how many arrays a class keeps: a few per worker.
const poolDepth = 8

var (
	opPool     pool[ir.Op]
	tensorPool pool[ir.Tensor]
)

// classSize is the capacity of class i.
func classSize(i int) int { return (4 + i%4) << (i / 4) }

// classOf is the class of the largest size ≤ c (c ≥ 4).
func classOf(c int) int {
	e := bits.Len(uint(c)) - 3
	return 4*e + c>>e - 4
}

// classFor is the class of the smallest size ≥ c.
func classFor(c int) int {
	c = max(c, 4)
	i := classOf(c)
	if classSize(i) < c {
		i++
	}
	return i
}

// get is an array of length n and capacity at least c (≥ n), zeroed past
// n. The caller overwrites the first n elements (they may hold a released
// program's values).
func (p *pool[T]) get(n, c int) []T {
	k := classFor(c)
	if k >= len(p.free) {
		return make([]T, n, c)
	}
	p.mu.Lock()
	if l := len(p.free[k]); l > 0 {
		a := p.free[k][l-1]
		p.free[k][l-1] = nil
		p.free[k] = p.free[k][:l-1]
		p.mu.Unlock()
		clear(a[n:cap(a)])
		return a[:n]
	}
	p.mu.Unlock()
	return make([]T, n, classSize(k))
}

// put keeps a for reuse if its class has room.
func (p *pool[T]) put(a []T) {
	if cap(a) < 4 {
		return
	}
	k := classOf(cap(a))
	if k >= len(p.free) {
		return
	}
	p.mu.Lock()
	if len(p.free[k]) < poolDepth {
		p.free[k] = append(p.free[k], a[:cap(a)])
	}
	p.mu.Unlock()
}

// Release hands p's op and tensor arrays back for reuse by Clone and
// empties p. The caller guarantees nothing uses p (or shares its arrays)
// any more: a released program must come from a transform (never the
// input of one, which the transform does not own) and be released once.
// Tensors p shares with another program (SharedTensors) stay that one's.
func Release(p *ir.Program) {
	if p == nil {
		return
	}
	opPool.put(p.Ops)
	if !p.SharedTensors {
		tensorPool.put(p.Tensors)
	}
	p.Ops, p.Tensors = nil, nil
}
