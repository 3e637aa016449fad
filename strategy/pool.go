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
// Pool k holds arrays of capacity at least 1<<k (a request for capacity c
// takes from pool ⌈log2 c⌉).
var (
	opPools     [40]sync.Pool
	tensorPools [40]sync.Pool
)

// getArray is an array of length n and capacity at least c (≥ n), zeroed
// past n, from pools or new. The caller overwrites the first n elements
// (they may hold a released program's values).
func getArray[T any](pools *[40]sync.Pool, n, c int) []T {
	k := bits.Len(uint(c - 1)) // 1<<k ≥ c
	if k < len(pools) {
		if a, ok := pools[k].Get().(*[]T); ok {
			clear((*a)[n:cap(*a)])
			return (*a)[:n]
		}
	}
	return make([]T, n, c)
}

// putArray pools a.
func putArray[T any](pools *[40]sync.Pool, a []T) {
	if cap(a) == 0 {
		return
	}
	a = a[:cap(a)]
	k := bits.Len(uint(cap(a))) - 1 // 1<<k ≤ cap
	if k < len(pools) {
		pools[k].Put(&a)
	}
}

// Release hands p's op and tensor arrays back for reuse by Clone and
// empties p. The caller guarantees nothing uses p (or shares its arrays)
// any more: a released program must come from a transform (never the
// input of one, which the transform does not own) and be released once.
func Release(p *ir.Program) {
	if p == nil {
		return
	}
	putArray(&opPools, p.Ops)
	putArray(&tensorPools, p.Tensors)
	p.Ops, p.Tensors = nil, nil
}
