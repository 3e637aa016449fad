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
// for, and from 2^20 on m<<e for m in 8..15, at most an eighth larger
// (fineFrom: deepseek-v3's steady and first-step programs of 2.14 million
// ops were held in arrays of 2.62 million, 140 MB more than asked for,
// 2.36 million now): a request for capacity c takes from the smallest
// class of size ≥ c,
// an array of capacity k goes to the largest class of size ≤ k, and a
// fresh array is made at its class's size, so a program's released array
// serves the next program of the same size (an array made at exactly c
// would land a class below c's and never be taken for it again). A bounded
// free list, not a sync.Pool: what it holds counts as live heap, and an
// unbounded pool raised the collector's goal (and the page faults of a
// larger heap) more than it saved.
type pool[T any] struct {
	mu   sync.Mutex
	free [fineFrom][][]T // none of 2^20 elements or more is kept (put)
}

// fineFrom is the first class of eight per doubling: the class of size
// 2^20.
const fineFrom = 4 * 18

// poolDepth is how many arrays a class keeps: a few per worker.
const poolDepth = 8

var (
	opPool     pool[ir.Op]
	tensorPool pool[ir.Tensor]
)

// classSize is the capacity of class i.
func classSize(i int) int {
	if i < fineFrom {
		return (4 + i%4) << (i / 4)
	}
	j := i - fineFrom
	return (8 + j%8) << (17 + j/8)
}

// classOf is the class of the largest size ≤ c (c ≥ 4).
func classOf(c int) int {
	if c < 1<<20 {
		e := bits.Len(uint(c)) - 3
		return 4*e + c>>e - 4
	}
	e := bits.Len(uint(c)) - 4
	return fineFrom + 8*(e-17) + c>>e - 8
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
		return make([]T, n, classSize(k)) // its class's room, not kept (put)
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

// put keeps a for reuse if its class has room. An array of 2^20 elements
// or more is not kept: the programs that large are a plan's own few, each
// of its own size (a deepseek-v3 plan's steady and first step, the next
// step's, diagnose's variations), and what the pool held of them was live
// heap no later program took (diagnose --model deepseek-v3 --accum 4:
// 11.5-11.9 s and 1.79 GB with them kept, 8.2 s and 1.55-1.57 GB without).
func (p *pool[T]) put(a []T) {
	if cap(a) < 4 {
		return
	}
	k := classOf(cap(a))
	if k >= fineFrom {
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
