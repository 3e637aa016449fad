package pack

import (
	"math"
	"slices"

	"github.com/memplan/memplan/units"
)

// roomTree holds the room each GPU of a simulation has for the policy (its
// free bytes; under whole-gpu the largest size for an empty GPU and -1 for
// a busy one) as a segment tree of maxima: the most room of the pool, and
// the first GPU from an index with a given room, each in O(log n). The
// simulator scanned every GPU for both at every start, and 100,000
// arrivals on 100,000 GPUs (the documented limits) took a minute (sweep H,
// round 25).
type roomTree struct {
	size int           // leaves, a power of two at least the GPUs
	t    []units.Bytes // t[1] the root; leaf g at size+g; padding -1
}

func newRoomTree(n int, room func(g int) units.Bytes) *roomTree {
	size := 1
	for size < n {
		size *= 2
	}
	r := &roomTree{size: size, t: make([]units.Bytes, 2*size)}
	for i := range r.t {
		r.t[i] = -1
	}
	for g := 0; g < n; g++ {
		r.t[size+g] = room(g)
	}
	for i := size - 1; i >= 1; i-- {
		r.t[i] = max(r.t[2*i], r.t[2*i+1])
	}
	return r
}

// set gives GPU g room v.
func (r *roomTree) set(g int, v units.Bytes) {
	i := r.size + g
	r.t[i] = v
	for i /= 2; i >= 1; i /= 2 {
		r.t[i] = max(r.t[2*i], r.t[2*i+1])
	}
}

// get is GPU g's room.
func (r *roomTree) get(g int) units.Bytes { return r.t[r.size+g] }

// most is the most room any GPU has.
func (r *roomTree) most() units.Bytes { return r.t[1] }

// first is the first GPU g in [lo, hi) with at least need of room, or hi.
func (r *roomTree) first(lo, hi int, need units.Bytes) int {
	g := r.firstIn(1, 0, r.size, lo, hi, need)
	if g < 0 {
		return hi
	}
	return g
}

// firstIn searches node i, which covers leaves [l, h).
func (r *roomTree) firstIn(i, l, h, lo, hi int, need units.Bytes) int {
	if h <= lo || l >= hi || r.t[i] < need {
		return -1
	}
	if h-l == 1 {
		return l
	}
	m := (l + h) / 2
	if g := r.firstIn(2*i, l, m, lo, hi, need); g >= 0 {
		return g
	}
	return r.firstIn(2*i+1, m, h, lo, hi, need)
}

// roomOf is GPU g's room for the simulator's policy.
func (s *simulator) roomOf(g int) units.Bytes {
	if s.policy == WholeGPU {
		if len(s.gpus[g]) == 0 {
			return math.MaxInt64
		}
		return -1
	}
	return s.room - s.used[g]
}

// fitGang is fitGang over the room tree: each need on the first GPU from
// the range's start with room for it that no earlier process of the gang
// took (taken GPUs are set to -1 while the gang is fitted); with sameNode
// the first node, from the one holding the first GPU with room for the
// largest need, where every need finds one.
func (s *simulator) fitGang(needs []units.Bytes, sameNode bool) []int {
	n, node := len(s.gpus), s.pool.Node()
	if !sameNode {
		return s.fitRange(needs, 0, n)
	}
	for lo := 0; lo < n; lo += node {
		g := s.tree.first(lo, n, needs[0])
		if g == n {
			return nil
		}
		lo = g - g%node
		if got := s.fitRange(needs, lo, min(lo+node, n)); got != nil {
			return got
		}
	}
	return nil
}

func (s *simulator) fitRange(needs []units.Bytes, lo, hi int) []int {
	if len(needs) > hi-lo {
		return nil
	}
	out := make([]int, 0, len(needs))
	saved := make([]units.Bytes, 0, len(needs))
	defer func() {
		for k, g := range out {
			s.tree.set(g, saved[k])
		}
	}()
	for _, need := range needs {
		g := s.tree.first(lo, hi, need)
		if g == hi {
			return nil
		}
		out, saved = append(out, g), append(saved, s.tree.get(g))
		s.tree.set(g, -1)
	}
	return slices.Clone(out)
}
