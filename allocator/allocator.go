// Package allocator models PyTorch's CUDA caching allocator
// (DeviceCachingAllocator in c10/cuda/CUDACachingAllocator.cpp, pytorch/pytorch
// @ 001074d2, the 2.x allocator; the rules below carry the names of the C++
// functions they follow). It replays alloc and free events and tells what the
// allocator reserves: segments, the blocks it splits them into, the cache it
// keeps, and where it has to ask the device for more.
//
// Rules (constants and functions of CUDACachingAllocator.cpp):
//   - round_size: requests round up to 512 bytes (kMinBlockSize), or to a
//     power-of-two division when roundup_power2_divisions says so;
//   - get_pool: ≤ 1 MiB (kSmallSize) from the small pool, larger from the
//     large pool, per stream;
//   - get_allocation_size: a new segment is 2 MiB (kSmallBuffer) for small
//     requests, 20 MiB (kLargeBuffer) for requests under 10 MiB
//     (kMinLargeAlloc), else the request rounded up to 2 MiB (kRoundLarge);
//   - get_free_block: best fit (smallest cached block of the stream that is
//     large enough, lowest address among equals); a request under
//     max_split_size never takes a block of max_split_size or more, a request
//     of max_split_size or more only a block under request + 20 MiB;
//   - should_split: a small-pool block (or any block of an expandable
//     segment) splits when ≥ 512 bytes remain, a large-pool block when the
//     request is under max_split_size and more than 1 MiB remains;
//   - free_block / try_merge_blocks: a freed block merges with free
//     neighbours of its segment;
//   - alloc_block, release_available_cached_blocks, release_cached_blocks:
//     when no cached block fits, a new segment; when the device has no room,
//     free oversize cached blocks, then every unsplit cached segment, and
//     retry;
//   - garbage_collect_cached_blocks: with a memory fraction set and
//     garbage_collection_threshold > 0, free unsplit cached blocks older than
//     the average before allocating a segment once reserved memory passes the
//     threshold;
//   - expandable segments (try_allocate_expandable_block, map_block,
//     unmap_block): one growing segment per stream and pool, mapped in pages
//     of 2 MiB (small pool) or 20 MiB (large pool) at the lowest address with
//     room.
package allocator

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"slices"
)

// Constants of CUDACachingAllocator.cpp.
const (
	MinBlockSize  = 512      // kMinBlockSize
	SmallSize     = 1 << 20  // kSmallSize: largest small-pool request
	SmallBuffer   = 2 << 20  // kSmallBuffer: small-pool segment
	LargeBuffer   = 20 << 20 // kLargeBuffer: segment for 1–10 MiB requests
	MinLargeAlloc = 10 << 20 // kMinLargeAlloc
	RoundLarge    = 2 << 20  // kRoundLarge
)

// Config is the allocator's configuration (PYTORCH_CUDA_ALLOC_CONF, as a
// snapshot's allocator_settings records it).
type Config struct {
	// MaxSplitSize in bytes (max_split_size_mb); math.MaxInt64 when
	// unlimited (the default). 0 also means unlimited.
	MaxSplitSize int64
	// RoundupPower2Divisions per power-of-two interval from 1 MiB
	// (index 0: sizes below 2 MiB) to 32 GiB and above (index 15).
	RoundupPower2Divisions [16]int64
	// GCThreshold is garbage_collection_threshold (0: off). It acts only
	// with a memory fraction set (AllowedMemory > 0), as in the C++.
	GCThreshold float64
	// Expandable is expandable_segments:True.
	Expandable bool
	// AllowedMemory is torch.cuda.set_per_process_memory_fraction × the
	// device's memory; 0: no fraction set.
	AllowedMemory int64
}

func (c *Config) maxSplit() int64 {
	if c.MaxSplitSize <= 0 {
		return math.MaxInt64
	}
	return c.MaxSplitSize
}

// divisions is CUDAAllocatorConfig::roundup_power2_divisions(size).
func (c *Config) divisions(size int64) int64 {
	logSize := 63 - bits.LeadingZeros64(uint64(size))
	const start = 20 // log2(1 MiB)
	idx := 0
	if logSize > start {
		idx = logSize - start
	}
	idx = min(idx, 15)
	return c.RoundupPower2Divisions[idx]
}

// RoundSize is round_size: the block size of a request.
func (c *Config) RoundSize(size int64) int64 {
	if size < MinBlockSize {
		return MinBlockSize
	}
	if d := c.divisions(size); d > 1 && size > MinBlockSize*d {
		return roundupPower2NextDivision(size, d)
	}
	return MinBlockSize * ((size + MinBlockSize - 1) / MinBlockSize)
}

// roundupPower2NextDivision is roundup_power2_next_division.
func roundupPower2NextDivision(size, divisions int64) int64 {
	if size&(size-1) == 0 {
		return size
	}
	floor := int64(1) << (63 - bits.LeadingZeros64(uint64(size)))
	div := floor >> (63 - bits.LeadingZeros64(uint64(divisions)))
	if div == 0 {
		return floor << 1
	}
	rf := size &^ (div - 1)
	if rf == size {
		return size
	}
	return rf + div
}

// AllocationSize is get_allocation_size: the size of a new segment for a
// block of size bytes.
func AllocationSize(size int64) int64 {
	switch {
	case size <= SmallSize:
		return SmallBuffer
	case size < MinLargeAlloc:
		return LargeBuffer
	}
	return RoundLarge * ((size + RoundLarge - 1) / RoundLarge)
}

// Device is what the allocator asks of the GPU. Replays answer from the
// recorded trace; simulations from a capacity.
type Device interface {
	// Malloc is cudaMalloc of a segment: its address, or false when the
	// device has no room.
	Malloc(size int64) (int64, bool)
	// Free is cudaFree of a segment.
	Free(ptr, size int64)
	// Reserve reserves the address space of a new expandable segment.
	Reserve(size int64) int64
	// Map maps physical pages at [ptr, ptr+size) of an expandable segment,
	// or says false when the device has no room.
	Map(ptr, size int64) bool
	// Unmap gives such pages back.
	Unmap(ptr, size int64)
}

// Block is a block of a segment.
type Block struct {
	Ptr, Size, Requested int64
	Stream               int64
	Small                bool
	Allocated            bool
	pending              bool // freed by the program, not yet back in the cache (stream uses)
	mapped               bool
	prev, next           *Block
	lprev, lnext         *Block      // neighbours in the allocator's list of handed-out blocks
	seg                  *expandable // nil for cudaMalloc segments
	gcBase               int64
	slot                 int32 // its index in the slots of the blockSet that holds it
}

func (b *Block) isSplit() bool { return b.prev != nil || b.next != nil }

type expandable struct {
	base, size, page int64
	stream           int64
	small            bool
}

// pool is a BlockPool: cached blocks ordered by (stream, size, address) and
// unmapped blocks of expandable segments by (stream, address).
type pool struct {
	small    bool
	blocks   blockSet
	unmapped blockSet
	gcCalls  int64
}

func cmpInt(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func newPool(small bool) pool {
	return pool{small: small, blocks: newBlockSet(true), unmapped: newBlockSet(false)}
}

func (p *pool) insert(b *Block) {
	b.gcBase = p.gcCalls
	p.blocks.insert(b)
}

func (p *pool) remove(b *Block) bool { return p.blocks.remove(b) }

// SegmentEvent is a segment action of the model, as a trace records it.
type SegmentEvent struct {
	Action     string // segment_alloc, segment_free, segment_map, segment_unmap
	Addr, Size int64
}

// Allocator is one device's caching allocator.
type Allocator struct {
	cfg    Config
	dev    Device
	pools  [2]pool          // small, large
	active map[int64]*Block // handed-out blocks by address; nil when the caller frees by block
	live   *Block           // the handed-out blocks (allocated or pending), a list through lprev and lnext
	spare  []*Block         // blocks merged away or released, for new blocks to reuse
	// Current and peak bytes: reserved (segments, mapped pages), allocated
	// (blocks handed out), requested (what the program asked for).
	Reserved, Allocated, Requested int64
	PeakReserved, PeakAllocated    int64
	// OnSegment, when set, sees every segment action.
	OnSegment func(SegmentEvent)
}

// New makes an empty allocator.
func New(cfg Config, dev Device) *Allocator {
	a := newUnindexed(cfg, dev)
	a.active = map[int64]*Block{}
	return a
}

// newUnindexed is an allocator whose blocks are freed by block (freeBlock),
// not by address: it keeps no map of addresses.
func newUnindexed(cfg Config, dev Device) *Allocator {
	a := &Allocator{cfg: cfg, dev: dev}
	a.pools = [2]pool{newPool(true), newPool(false)}
	return a
}

// newBlock is a zero block, one merged away or released before if any (no
// caller keeps a block past its free: Malloc's callers read its address and
// size at once).
func (a *Allocator) newBlock() *Block {
	n := len(a.spare)
	if n == 0 {
		return &Block{}
	}
	b := a.spare[n-1]
	a.spare = a.spare[:n-1]
	*b = Block{}
	return b
}

// retire keeps a block no segment holds any more for newBlock.
func (a *Allocator) retire(b *Block) {
	b.prev, b.next, b.seg = nil, nil, nil
	a.spare = append(a.spare, b)
}

// handOut puts a block that is handed out in the list (and the map of
// addresses).
func (a *Allocator) handOut(b *Block) {
	if a.active != nil {
		a.active[b.Ptr] = b
	}
	b.lprev, b.lnext = nil, a.live
	if a.live != nil {
		a.live.lprev = b
	}
	a.live = b
}

// takeBack takes a block that is cached again out of the list and the map.
func (a *Allocator) takeBack(b *Block) {
	if a.active != nil {
		delete(a.active, b.Ptr)
	}
	if b.lprev != nil {
		b.lprev.lnext = b.lnext
	} else {
		a.live = b.lnext
	}
	if b.lnext != nil {
		b.lnext.lprev = b.lprev
	}
	b.lprev, b.lnext = nil, nil
}

func (a *Allocator) pool(small bool) *pool {
	if small {
		return &a.pools[0]
	}
	return &a.pools[1]
}

func (a *Allocator) emit(action string, addr, size int64) {
	if a.OnSegment != nil {
		a.OnSegment(SegmentEvent{action, addr, size})
	}
}

func (a *Allocator) reserve(d int64) {
	a.Reserved += d
	a.PeakReserved = max(a.PeakReserved, a.Reserved)
}

// ErrOOM is an allocation the device could not serve after freeing the
// cache.
var ErrOOM = errors.New("CUDA out of memory")

// Malloc is DeviceCachingAllocator::malloc: it returns the block of a
// request of size bytes on stream. The block stays the allocator's: once
// freed it may merge into a neighbour and be reused for another block, so
// a caller reads what it needs of it before freeing it.
func (a *Allocator) Malloc(size, stream int64) (*Block, error) {
	if size < 0 {
		return nil, fmt.Errorf("negative allocation of %d bytes", size)
	}
	rs := a.cfg.RoundSize(size)
	p := a.pool(rs <= SmallSize)
	allocSize := AllocationSize(rs)
	b := a.getFreeBlock(p, rs, stream)
	if b == nil {
		if a.cfg.AllowedMemory > 0 && a.cfg.GCThreshold > 0 {
			a.garbageCollect()
		}
		b = a.allocBlock(p, rs, allocSize, stream)
		if b == nil && a.releaseAvailableCachedBlocks(p, rs, stream) {
			b = a.allocBlock(p, rs, allocSize, stream)
		}
		if b == nil {
			a.ReleaseCachedBlocks()
			b = a.allocBlock(p, rs, allocSize, stream)
		}
		if b == nil {
			return nil, fmt.Errorf("%w: tried to allocate %d bytes with %d reserved, %d allocated", ErrOOM, allocSize, a.Reserved, a.Allocated)
		}
	}
	return a.allocFoundBlock(p, b, rs, size, a.shouldSplit(b, rs)), nil
}

// shouldSplit is should_split.
func (a *Allocator) shouldSplit(b *Block, size int64) bool {
	rem := b.Size - size
	if b.Small || a.cfg.Expandable {
		return rem >= MinBlockSize
	}
	return size < a.cfg.maxSplit() && rem > SmallSize
}

// getFreeBlock is get_free_block.
func (a *Allocator) getFreeBlock(p *pool, size, stream int64) *Block {
	if a.cfg.AllowedMemory > 0 && a.cfg.GCThreshold > 0 {
		p.gcCalls++
	}
	b := p.bestFit(size, stream, a.cfg.Expandable)
	if b == nil {
		return nil
	}
	ms := a.cfg.maxSplit()
	if size < ms && b.Size >= ms {
		return nil
	}
	if size >= ms && b.Size >= size+LargeBuffer {
		return nil
	}
	p.blocks.remove(b)
	return b
}

// bestFit is get_free_block's search: the lower bound of (stream, size)
// among the cached blocks; from a block of an expandable segment, the
// following one while it grows into less (expandable_segments on) or the
// first block of a cudaMalloc segment (off).
func (p *pool) bestFit(size, stream int64, expandable bool) *Block {
	first := p.blocks.lowerBound(p.blocks.key(stream, size, math.MinInt64))
	switch {
	case first == nil || first.Stream != stream:
		return nil
	case first.seg == nil:
		return first
	case expandable:
		return p.leastGrowth(first, stream)
	}
	var found *Block
	p.blocks.ascendFrom(p.blocks.itemOf(first), func(b *Block) bool {
		if b.seg != nil && b.Stream == stream {
			return true
		}
		found = b
		return false
	})
	if found == nil || found.Stream != stream {
		return nil
	}
	return found
}

// leastGrowth: best fit counts what an expandable block can grow into.
func (p *pool) leastGrowth(first *Block, stream int64) *Block {
	esize := func(b *Block) int64 {
		if b.next != nil && !b.next.mapped {
			return b.Size + b.next.Size
		}
		return b.Size
	}
	cur := first
	p.blocks.ascendFrom(p.blocks.itemOf(first), func(b *Block) bool {
		if b == first {
			return true
		}
		if cur.seg == nil || b.Stream != stream || esize(b) >= esize(cur) {
			return false
		}
		cur = b
		return true
	})
	return cur
}

// allocBlock is alloc_block: a new segment (or mapped pages).
func (a *Allocator) allocBlock(p *pool, size, allocSize, stream int64) *Block {
	if a.cfg.AllowedMemory > 0 && a.Reserved+allocSize > a.cfg.AllowedMemory && !a.cfg.Expandable {
		return nil
	}
	if a.cfg.Expandable {
		return a.tryAllocateExpandable(p, size, stream)
	}
	ptr, ok := a.dev.Malloc(allocSize)
	if !ok {
		return nil
	}
	a.reserve(allocSize)
	a.emit("segment_alloc", ptr, allocSize)
	b := a.newBlock()
	b.Ptr, b.Size, b.Stream, b.Small, b.mapped = ptr, allocSize, stream, p.small, true
	return b
}

// allocFoundBlock is alloc_found_block.
func (a *Allocator) allocFoundBlock(p *pool, b *Block, size, orig int64, split bool) *Block {
	if split {
		rem := b
		b = a.newBlock()
		b.Ptr, b.Size, b.Stream, b.Small, b.mapped, b.seg, b.prev, b.next = rem.Ptr, size, rem.Stream, rem.Small, true, rem.seg, rem.prev, rem
		if b.prev != nil {
			b.prev.next = b
		}
		rem.prev = b
		rem.Ptr += size
		rem.Size -= size
		p.insert(rem)
	}
	b.Allocated = true
	b.Requested = orig
	a.handOut(b)
	a.Allocated += b.Size
	a.Requested += orig
	a.PeakAllocated = max(a.PeakAllocated, a.Allocated)
	return b
}

// FreeRequested is free(): the program gave the block at ptr back. Its
// bytes stop counting as allocated; the block returns to the cache at
// FreeCompleted (at once when no other stream used it).
func (a *Allocator) FreeRequested(ptr int64) (*Block, error) {
	b, ok := a.active[ptr]
	if !ok || !b.Allocated {
		return nil, fmt.Errorf("free of %#x, which is not allocated", ptr)
	}
	a.freeRequested(b)
	return b, nil
}

func (a *Allocator) freeRequested(b *Block) {
	b.Allocated = false
	b.pending = true
	a.Allocated -= b.Size
	a.Requested -= b.Requested
}

// FreeCompleted is free_block: the block at ptr goes back to the cache,
// merged with free neighbours.
func (a *Allocator) FreeCompleted(ptr int64) error {
	b, ok := a.active[ptr]
	if !ok || !b.pending {
		return fmt.Errorf("free_completed of %#x, which was not freed", ptr)
	}
	a.freeCompleted(b)
	return nil
}

func (a *Allocator) freeCompleted(b *Block) {
	b.pending = false
	a.takeBack(b)
	p := a.pool(b.Small)
	a.tryMerge(p, b, b.prev)
	a.tryMerge(p, b, b.next)
	p.insert(b)
}

// Free is FreeRequested and FreeCompleted.
func (a *Allocator) Free(ptr int64) error {
	if _, err := a.FreeRequested(ptr); err != nil {
		return err
	}
	return a.FreeCompleted(ptr)
}

// freeBlock is Free of a block Malloc handed out, by block.
func (a *Allocator) freeBlock(b *Block) error {
	if !b.Allocated {
		return fmt.Errorf("free of %#x, which is not allocated", b.Ptr)
	}
	a.freeRequested(b)
	a.freeCompleted(b)
	return nil
}

// tryMerge is try_merge_blocks: src joins dst when it is free and equally
// mapped.
func (a *Allocator) tryMerge(p *pool, dst, src *Block) int64 {
	if src == nil || src.Allocated || src.pending || dst.mapped != src.mapped {
		return 0
	}
	if dst.prev == src {
		dst.Ptr = src.Ptr
		dst.prev = src.prev
		if dst.prev != nil {
			dst.prev.next = dst
		}
	} else {
		dst.next = src.next
		if dst.next != nil {
			dst.next.prev = dst
		}
	}
	dst.Size += src.Size
	if src.mapped {
		p.remove(src)
	} else {
		p.unmapped.remove(src)
	}
	size := src.Size
	a.retire(src)
	return size
}

// releaseBlock is release_block: cudaFree of a whole cached segment.
func (a *Allocator) releaseBlock(p *pool, b *Block) {
	a.emit("segment_free", b.Ptr, b.Size)
	a.dev.Free(b.Ptr, b.Size)
	a.Reserved -= b.Size
	p.remove(b)
	a.retire(b)
}

// ReleaseCachedBlocks is release_cached_blocks (torch.cuda.empty_cache, and
// the last resort of an allocation): every unsplit cached segment is freed,
// every free page of an expandable segment unmapped.
func (a *Allocator) ReleaseCachedBlocks() {
	for _, small := range []bool{false, true} { // large_blocks, then small_blocks
		p := a.pool(small)
		var unmap []*Block
		for _, b := range p.blocks.all() {
			if b.seg != nil {
				unmap = append(unmap, b)
			} else if !b.isSplit() {
				a.releaseBlock(p, b)
			}
		}
		for _, b := range unmap {
			a.unmapBlock(p, b)
		}
	}
}

// releaseAvailableCachedBlocks is release_available_cached_blocks: with a
// max_split_size, free oversize cached blocks, the smallest that suffices or
// else the largest first, until the request fits.
func (a *Allocator) releaseAvailableCachedBlocks(p *pool, size, stream int64) bool {
	ms := a.cfg.maxSplit()
	if ms == math.MaxInt64 {
		return false
	}
	keySize := max(size, ms)
	key := p.blocks.key(stream, keySize, math.MinInt64)
	b := p.blocks.lowerBound(key)
	if b == nil || b.Stream != stream {
		return a.releaseLargestBelow(p, key, ms)
	}
	if b.seg != nil || b.isSplit() {
		return false
	}
	a.releaseBlock(p, b)
	return true
}

// releaseLargestBelow walks back from key (stream, size): it frees the
// stream's oversize blocks, largest first, until key's size is freed.
func (a *Allocator) releaseLargestBelow(p *pool, key setItem, ms int64) bool {
	var released int64
	for b := p.blocks.before(key); released < key.size && b != nil && b.Size >= ms && b.Stream == key.stream; {
		released += b.Size
		if b.seg != nil || b.isSplit() {
			// The C++ frees only whole cudaMalloc segments here
			// (release_block asserts it).
			return released >= key.size
		}
		at := p.blocks.itemOf(b) // its place, before releaseBlock retires it
		a.releaseBlock(p, b)
		b = p.blocks.before(at)
	}
	return released >= key.size
}

// garbageCollect is garbage_collect_cached_blocks.
func (a *Allocator) garbageCollect() {
	threshold := int64(a.cfg.GCThreshold * float64(a.cfg.AllowedMemory))
	if a.Reserved <= threshold {
		return
	}
	target := a.Reserved - threshold
	p := a.pool(false)
	var totalAge float64
	n := 0
	p.blocks.each(func(b *Block) bool {
		if !b.isSplit() && b.seg == nil {
			totalAge += float64(p.gcCalls - b.gcBase)
			n++
		}
		return true
	})
	if n == 0 {
		return
	}
	var reclaimed int64
	freed := true
	for reclaimed < target && freed && n > 0 {
		ageThreshold := totalAge / float64(n)
		freed = false
		for _, b := range p.blocks.all() {
			age := float64(p.gcCalls - b.gcBase)
			if !b.isSplit() && b.seg == nil && age >= ageThreshold {
				freed = true
				reclaimed += b.Size
				totalAge -= age
				n--
				a.releaseBlock(p, b)
			}
		}
	}
}

// Segments lists the segments as torch.cuda.memory_snapshot() reports them:
// one per cudaMalloc, one per contiguous mapped range of an expandable
// segment, in address order.
func (a *Allocator) Segments() []SegmentState {
	var out []SegmentState
	a.eachHead(func(h *Block) {
		s := SegmentState{Address: h.Ptr, Small: h.Small, Expandable: h.seg != nil, Stream: h.Stream}
		for b := h; b != nil && b.mapped; b = b.next {
			s.Blocks = append(s.Blocks, BlockState{Address: b.Ptr, Size: b.Size, Requested: b.Requested, Allocated: b.Allocated})
			s.TotalSize += b.Size
		}
		out = append(out, s)
	})
	slices.SortFunc(out, func(x, y SegmentState) int { return cmpInt(x.Address, y.Address) })
	return out
}

// segmentCount is len(Segments()).
func (a *Allocator) segmentCount() int {
	n := 0
	a.eachHead(func(*Block) { n++ })
	return n
}

// eachHead calls f on the first block of every segment (or mapped range):
// every mapped block is cached or handed out, and a segment's first is the
// one not preceded by a mapped block.
func (a *Allocator) eachHead(f func(*Block)) {
	head := func(b *Block) bool {
		if b.prev == nil || !b.prev.mapped {
			f(b)
		}
		return true
	}
	for i := range a.pools {
		a.pools[i].blocks.each(head)
	}
	for b := a.live; b != nil; b = b.lnext {
		head(b)
	}
}

// SegmentState is a segment of Segments.
type SegmentState struct {
	Address, TotalSize, Stream int64
	Small, Expandable          bool
	Blocks                     []BlockState
}

// BlockState is a block of a SegmentState.
type BlockState struct {
	Address, Size, Requested int64
	Allocated                bool
}
