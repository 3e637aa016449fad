package allocator

import (
	"math"
)

// blockSet is an ordered set of blocks, as the C++ keeps a BlockPool's
// blocks and its expandable segments' unmapped blocks in a
// std::set<Block*, Comparison> (BlockPool::blocks and BlockPool::unmapped,
// CUDACachingAllocator.cpp, pytorch/pytorch @ 001074d2): insert, erase and
// lower_bound in O(log n). A replay holds hundreds of thousands of cached
// blocks; a sorted slice moved all of them on every insert and erase.
//
// The tree (itemTree, a B+ tree) holds setItems, each carrying its sort key
// by value and its block as an index into slots: a comparison reads no
// block, and the items hold no pointer, so the collector neither scans them
// nor puts write barriers on their moves.
//
// Blocks equal under the order (never two blocks of one pool, which would be
// the same memory twice; the C++ set would keep only the first) are kept
// both, ordered by slot.
type blockSet struct {
	tree   itemTree
	bySize bool     // ordered by (stream, size, address), else by (stream, address)
	slots  []*Block // the blocks of the items (nil: a free slot)
	free   []int32  // free slots
	// found is where lowerBound found its block, until the set changes:
	// get_free_block erases the block it found, here without a search.
	found treeCursor
}

// setItem is a block's place in a blockSet, in the order of its fields:
// stream, size (0 in a set by address), address, then slot, the block's
// index in slots (32 bytes).
type setItem struct {
	stream, size, ptr int64
	slot              int32
}

func itemLess(a, b setItem) bool {
	switch {
	case a.stream != b.stream:
		return a.stream < b.stream
	case a.size != b.size:
		return a.size < b.size
	case a.ptr != b.ptr:
		return a.ptr < b.ptr
	}
	return a.slot < b.slot
}

func newBlockSet(bySize bool) blockSet {
	return blockSet{bySize: bySize}
}

// key is a search key that sorts before every block of stream, size (in a
// set by size) and address ptr, and after every block before them (a
// lower_bound key).
func (s *blockSet) key(stream, size, ptr int64) setItem {
	if !s.bySize {
		size = 0
	}
	return setItem{stream: stream, size: size, ptr: ptr, slot: math.MinInt32}
}

// itemOf is the item of b, a block of the set.
func (s *blockSet) itemOf(b *Block) setItem {
	it := s.key(b.Stream, b.Size, b.Ptr)
	it.slot = b.slot
	return it
}

func (s *blockSet) len() int { return s.tree.n }

// has says whether b is in the set: its slot holds it (a slot is cleared
// when its block leaves).
func (s *blockSet) has(b *Block) bool {
	return int(b.slot) < len(s.slots) && s.slots[b.slot] == b
}

func (s *blockSet) insert(b *Block) {
	if n := len(s.free); n > 0 {
		b.slot = s.free[n-1]
		s.free = s.free[:n-1]
		s.slots[b.slot] = b
	} else {
		b.slot = int32(len(s.slots))
		s.slots = append(s.slots, b)
	}
	s.found = treeCursor{}
	s.tree.insert(s.itemOf(b))
}

// remove erases b; false when b is not in the set.
func (s *blockSet) remove(b *Block) bool {
	if !s.has(b) {
		return false
	}
	if it := s.itemOf(b); !s.tree.removeAt(s.found, it) {
		s.tree.remove(it)
	}
	s.found = treeCursor{}
	s.slots[b.slot] = nil
	s.free = append(s.free, b.slot)
	return true
}

// ascendFrom calls f on the blocks from key's lower bound on (key: a key,
// or the item of a block of the set), in order, until f says false. f must
// not change the set.
func (s *blockSet) ascendFrom(key setItem, f func(*Block) bool) {
	for c := s.tree.seek(key); c.valid() && f(s.slots[c.item().slot]); c.forward() {
	}
}

// lowerBound is the first block not before key, or nil.
func (s *blockSet) lowerBound(key setItem) *Block {
	if c := s.tree.seek(key); c.valid() {
		s.found = c
		return s.slots[c.item().slot]
	}
	return nil
}

// before is the last block before x (a key, or the item of a block of the
// set), or nil.
func (s *blockSet) before(x setItem) *Block {
	if c := s.tree.before(x); c.valid() {
		return s.slots[c.item().slot]
	}
	return nil
}

// each calls f on every block in order until f says false. f must not
// change the set.
func (s *blockSet) each(f func(*Block) bool) {
	for c := s.tree.first(); c.valid() && f(s.slots[c.item().slot]); c.forward() {
	}
}

// all is the blocks in order, a copy to walk while the set changes.
func (s *blockSet) all() []*Block {
	out := make([]*Block, 0, s.len())
	s.each(func(b *Block) bool { out = append(out, b); return true })
	return out
}
