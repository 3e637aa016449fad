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
// Each pool keeps a few arrays per capacity class: class k holds arrays of
// capacity at least 1<<k, and a request for capacity c takes from class
// ⌈log2 c⌉. A bounded free list, not a sync.Pool: what it holds counts as
// live heap, and an unbounded pool raised the collector's goal (and the
// page faults of a larger heap) more than it saved.
type pool[T any] struct {
	mu   sync.Mutex
	free [40][][]T
}

// poolDepth is how many arrays a class keeps: a few per worker.
const poolDepth = 8

var (
	opPool     pool[ir.Op]
	tensorPool pool[ir.Tensor]
)

// get is an array of length n and capacity at least c (≥ n), zeroed past
// n. The caller overwrites the first n elements (they may hold a released
// program's values).
func (p *pool[T]) get(n, c int) []T {
	k := bits.Len(uint(c - 1)) // 1<<k ≥ c
	if k < len(p.free) {
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
	}
	return make([]T, n, c)
}

// put keeps a for reuse if its class has room.
func (p *pool[T]) put(a []T) {
	if cap(a) == 0 {
		return
	}
	k := bits.Len(uint(cap(a))) - 1 // 1<<k ≤ cap
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
func Release(p *ir.Program) {
	if p == nil {
		return
	}
	opPool.put(p.Ops)
	tensorPool.put(p.Tensors)
	p.Ops, p.Tensors = nil, nil
}
