package allocator

import "math"

// The address space an expandable segment reserves: the C++ reserves 1⅛ of
// the device's memory; any size larger than what a replay maps behaves the
// same (the unmapped tail only has to be large), so the model reserves a
// fixed 1 TiB unless the device says otherwise.
const expandableSpace = 1 << 40

func (a *Allocator) pageSize(small bool) int64 {
	if small {
		return SmallBuffer
	}
	return LargeBuffer
}

func allocatable(b *Block) bool { return b != nil && !b.Allocated && !b.pending }

// findExpandableBlock is find_expandable_block: the lowest-addressed run of
// free and unmapped blocks of the stream with size bytes of room, or a new
// segment.
func (a *Allocator) findExpandableBlock(p *pool, size, stream int64) *Block {
	room := func(b *Block) bool {
		var n int64
		for n < size && allocatable(b) {
			n += b.Size
			b = b.next
		}
		return n >= size
	}
	var found *Block
	p.unmapped.ascendFrom(p.unmapped.key(stream, 0, math.MinInt64), func(c *Block) bool {
		if c.Stream != stream {
			return false
		}
		if allocatable(c.prev) {
			c = c.prev
		}
		if room(c) {
			found = c
			return false
		}
		return true
	})
	if found != nil {
		return found
	}
	page := a.pageSize(p.small)
	space := (expandableSpace + page - 1) / page * page
	base := a.dev.Reserve(space)
	es := &expandable{base: base, size: space, page: page, stream: stream, small: p.small}
	c := &Block{Ptr: base, Size: space, Stream: stream, Small: p.small, seg: es}
	p.unmapped.insert(c)
	return c
}

// mapBlock is map_block: map pages covering the first size bytes of an
// unmapped block.
func (a *Allocator) mapBlock(p *pool, b *Block, size int64) bool {
	es := b.seg
	begin := (b.Ptr - es.base) / es.page
	end := (b.Ptr + size - es.base + es.page - 1) / es.page
	mptr, msize := es.base+begin*es.page, (end-begin)*es.page
	if msize == 0 {
		return false
	}
	if !a.dev.Map(mptr, msize) {
		return false
	}
	p.unmapped.remove(b)
	b.mapped = true
	if msize < b.Size {
		rem := &Block{Ptr: b.Ptr + msize, Size: b.Size - msize, Stream: b.Stream, Small: b.Small, seg: es, prev: b, next: b.next}
		if b.next != nil {
			b.next.prev = rem
		}
		b.next = rem
		p.unmapped.insert(rem)
		b.Size = msize
	}
	a.tryMerge(p, b, b.prev)
	a.tryMerge(p, b, b.next)
	p.insert(b)
	a.reserve(msize)
	a.emit("segment_map", mptr, msize)
	return true
}

// tryAllocateExpandable is try_allocate_expandable_block.
func (a *Allocator) tryAllocateExpandable(p *pool, size, stream int64) *Block {
	c := a.findExpandableBlock(p, size, stream)
	if !c.mapped && !a.mapBlock(p, c, min(c.Size, size)) {
		return nil
	}
	for c.Size < size {
		next := c.next
		if !a.mapBlock(p, next, min(size-c.Size, next.Size)) {
			return nil
		}
		c = next
	}
	p.remove(c)
	return c
}

// unmapBlock is unmap_block: unmap the whole pages inside a free block.
func (a *Allocator) unmapBlock(p *pool, b *Block) {
	es := b.seg
	begin := (b.Ptr - es.base + es.page - 1) / es.page
	end := (b.Ptr + b.Size - es.base) / es.page
	if begin >= end {
		return
	}
	uptr, usize := es.base+begin*es.page, (end-begin)*es.page
	p.remove(b)
	if before := uptr - b.Ptr; before > 0 {
		bf := &Block{Ptr: b.Ptr, Size: before, Stream: b.Stream, Small: b.Small, seg: es, mapped: true, prev: b.prev, next: b}
		if b.prev != nil {
			b.prev.next = bf
		}
		b.prev = bf
		p.insert(bf)
	}
	if after := b.Ptr + b.Size - (uptr + usize); after > 0 {
		af := &Block{Ptr: uptr + usize, Size: after, Stream: b.Stream, Small: b.Small, seg: es, mapped: true, prev: b, next: b.next}
		if b.next != nil {
			b.next.prev = af
		}
		b.next = af
		p.insert(af)
	}
	b.Ptr, b.Size, b.mapped = uptr, usize, false
	a.tryMerge(p, b, b.prev)
	a.tryMerge(p, b, b.next)
	p.unmapped.insert(b)
	a.dev.Unmap(uptr, usize)
	a.Reserved -= usize
	a.emit("segment_unmap", uptr, usize)
	if b.prev == nil && b.next == nil {
		// release_expandable_segment: nothing of it is mapped any more.
		p.unmapped.remove(b)
	}
}

// freeBlockAt finds the cached (free, mapped) block that starts at ptr.
func (a *Allocator) freeBlockAt(ptr int64) (*pool, *Block) {
	return a.findCached(func(b *Block) bool { return b.Ptr == ptr })
}

// freeBlockContaining finds the cached block of an expandable segment that
// holds ptr.
func (a *Allocator) freeBlockContaining(ptr int64) (*pool, *Block) {
	return a.findCached(func(b *Block) bool { return b.seg != nil && b.Ptr <= ptr && ptr < b.Ptr+b.Size })
}

// findCached is the first cached block, small pool then large, each in
// order, that match says yes to.
func (a *Allocator) findCached(match func(*Block) bool) (*pool, *Block) {
	for i := range a.pools {
		var found *Block
		a.pools[i].blocks.each(func(b *Block) bool {
			if match(b) {
				found = b
			}
			return found == nil
		})
		if found != nil {
			return &a.pools[i], found
		}
	}
	return nil, nil
}
