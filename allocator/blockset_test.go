package allocator

import (
	"math"
	"math/rand"
	"reflect"
	"slices"
	"testing"
)

// cmpSize and cmpAddr are the pools' orders as the comparators the pools
// used before their sets carried keys by value (BlockComparatorSize and
// BlockComparatorAddress, CUDACachingAllocator.cpp @ 001074d2).
func cmpSize(a, b *Block) int {
	if a.Stream != b.Stream {
		return cmpInt(a.Stream, b.Stream)
	}
	if a.Size != b.Size {
		return cmpInt(a.Size, b.Size)
	}
	return cmpInt(a.Ptr, b.Ptr)
}

func cmpAddr(a, b *Block) int {
	if a.Stream != b.Stream {
		return cmpInt(a.Stream, b.Stream)
	}
	return cmpInt(a.Ptr, b.Ptr)
}

// bySlot breaks cmp's ties by the blocks' slots, as a blockSet does (ties
// never happen in a pool, whose blocks are distinct memory).
func bySlot(cmp func(a, b *Block) int) func(a, b *Block) int {
	return func(a, b *Block) int {
		if c := cmp(a, b); c != 0 {
			return c
		}
		return cmpInt(int64(a.slot), int64(b.slot))
	}
}

// sortedModel is the reference a blockSet must match: the sorted slice the
// pools were before (insert at the lower bound, erase by identity).
type sortedModel struct {
	s   []*Block
	cmp func(a, b *Block) int
}

func (m *sortedModel) insert(b *Block) {
	i, _ := slices.BinarySearchFunc(m.s, b, m.cmp)
	m.s = slices.Insert(m.s, i, b)
}

func (m *sortedModel) remove(b *Block) bool {
	i := slices.Index(m.s, b)
	if i < 0 {
		return false
	}
	m.s = slices.Delete(m.s, i, i+1)
	return true
}

func (m *sortedModel) lowerBound(key *Block) int {
	i, _ := slices.BinarySearchFunc(m.s, key, m.cmp)
	return i
}

// Random inserts and erases, with many blocks equal under cmp: the set
// keeps the sorted slice's order, its lower bound and the block before a
// key or a block.
func TestBlockSetMatchesSortedSlice(t *testing.T) {
	for _, c := range []struct {
		name   string
		cmp    func(a, b *Block) int
		bySize bool
	}{{"by size", cmpSize, true}, {"by address", cmpAddr, false}} {
		t.Run(c.name, func(t *testing.T) {
			rng := rand.New(rand.NewSource(1))
			set, model := newBlockSet(c.bySize), &sortedModel{cmp: bySlot(c.cmp)}
			random := func() Block {
				return Block{Stream: rng.Int63n(2), Size: rng.Int63n(4) * 512, Ptr: rng.Int63n(8) * 512}
			}
			for step := range 6000 {
				if len(model.s) > 0 && rng.Intn(5) < 2 {
					b := model.s[rng.Intn(len(model.s))]
					if k := random(); rng.Intn(2) == 0 && set.lowerBound(set.key(k.Stream, k.Size, k.Ptr)) != nil {
						b = set.lowerBound(set.key(k.Stream, k.Size, k.Ptr)) // erased where the search found it
					}
					if !set.remove(b) || !model.remove(b) {
						t.Fatalf("step %d: %+v not removed", step, *b)
					}
				} else {
					b := random()
					set.insert(&b)
					model.insert(&b)
				}
				if stray := random(); set.remove(&stray) {
					t.Fatalf("step %d: removed a block never inserted", step)
				}
				checkBlockSet(t, step, &set, model, random())
			}
			checkTree(t, &set.tree)
			// Drain it in random order: every merge and borrow up the tree.
			for step := 0; len(model.s) > 0; step++ {
				b := model.s[rng.Intn(len(model.s))]
				if !set.remove(b) || !model.remove(b) {
					t.Fatalf("drain %d: %+v not removed", step, *b)
				}
				if step%7 == 0 {
					checkBlockSet(t, step, &set, model, random())
					checkTree(t, &set.tree)
				}
			}
			checkBlockSet(t, -1, &set, model, random())
		})
	}
}

// checkTree checks the B+ tree's shape: every leaf at one depth, every
// node but the root at least half full and none over full, every item
// within its separators, the leaves linked in order.
func checkTree(t *testing.T, tr *itemTree) {
	t.Helper()
	var leaves []*treeNode
	depth := -1
	var walk func(n *treeNode, d int, lo, hi *setItem)
	walk = func(n *treeNode, d int, lo, hi *setItem) {
		if n != tr.root && (n.size() < treeMax/2 || n.size() > treeMax) {
			t.Fatalf("a node of %d at depth %d", n.size(), d)
		}
		if !n.leaf() && len(n.items) != len(n.kids)-1 {
			t.Fatalf("an inner node with %d separators and %d children", len(n.items), len(n.kids))
		}
		for _, it := range n.items {
			if lo != nil && itemLess(it, *lo) || hi != nil && !itemLess(it, *hi) {
				t.Fatalf("item %+v outside its separators", it)
			}
		}
		if n.leaf() {
			if depth >= 0 && d != depth {
				t.Fatalf("leaves at depths %d and %d", depth, d)
			}
			depth = d
			leaves = append(leaves, n)
			return
		}
		for i, k := range n.kids {
			l, h := lo, hi
			if i > 0 {
				l = &n.items[i-1]
			}
			if i < len(n.items) {
				h = &n.items[i]
			}
			walk(k, d+1, l, h)
		}
	}
	if tr.root == nil {
		return
	}
	walk(tr.root, 0, nil, nil)
	for i, l := range leaves {
		if i > 0 && l.prev != leaves[i-1] || i+1 < len(leaves) && l.next != leaves[i+1] {
			t.Fatalf("leaf %d is linked out of order", i)
		}
	}
}

func checkBlockSet(t *testing.T, step int, set *blockSet, model *sortedModel, k Block) {
	t.Helper()
	all := set.all()
	if set.len() != len(model.s) || !slices.Equal(all, model.s) {
		t.Fatalf("step %d: the set holds %d blocks, the sorted slice %d, or in another order", step, set.len(), len(model.s))
	}
	key := set.key(k.Stream, k.Size, k.Ptr)
	k.slot = math.MinInt32 // before every block equal to k
	i := model.lowerBound(&k)
	var wantLB, wantBefore *Block
	if i < len(model.s) {
		wantLB = model.s[i]
	}
	if i > 0 {
		wantBefore = model.s[i-1]
	}
	if got := set.lowerBound(key); got != wantLB {
		t.Fatalf("step %d: lower bound of %+v is %v, want %v", step, k, got, wantLB)
	}
	if got := set.before(key); got != wantBefore {
		t.Fatalf("step %d: before %+v is %v, want %v", step, k, got, wantBefore)
	}
	if len(all) > 0 {
		j := rand.New(rand.NewSource(int64(step))).Intn(len(all))
		var want *Block
		if j > 0 {
			want = all[j-1]
		}
		if got := set.before(set.itemOf(all[j])); got != want {
			t.Fatalf("step %d: before block %d is %v, want %v", step, j, got, want)
		}
		var from []*Block
		set.ascendFrom(set.itemOf(all[j]), func(b *Block) bool { from = append(from, b); return len(from) < 3 })
		if !slices.Equal(from, all[j:min(j+3, len(all))]) {
			t.Fatalf("step %d: the walk from block %d is not the sorted slice's", step, j)
		}
	}
}

// manyCachedBlocks is an MoE-sized workload for the pools: n requests of 6
// to 9.5 MiB (expert weights) that each take part of a 20 MiB segment and
// leave the rest cached, then as many 1.5 to 5 MiB requests (activations)
// served from and freed back into that cache, eight alive at a time. It
// returns the cached blocks at the end.
func manyCachedBlocks(tb testing.TB, n int) int {
	a := New(Config{}, &capacityDevice{})
	for i := range n {
		if _, err := a.Malloc(6<<20+int64(i*7919%8)<<19, 0); err != nil {
			tb.Fatal(err)
		}
	}
	var window [8]int64
	for i := range n {
		if i >= len(window) {
			if err := a.Free(window[i%len(window)]); err != nil {
				tb.Fatal(err)
			}
		}
		b, err := a.Malloc(3<<19+int64(i*104729%8)<<19, 0)
		if err != nil {
			tb.Fatal(err)
		}
		window[i%len(window)] = b.Ptr
	}
	return a.pools[1].blocks.len()
}

// BenchmarkManyCachedBlocks: 200,000 weights and 200,000 activations, with
// 62,494 blocks cached at the end and some 260,000 blocks in all, the scale
// of deepseek-v3's replay (about 252,000 segments): every insert and erase
// of the large pool's ordered set.
func BenchmarkManyCachedBlocks(b *testing.B) {
	b.ReportAllocs()
	var cached int
	for b.Loop() {
		cached = manyCachedBlocks(b, 200_000)
	}
	b.ReportMetric(float64(cached), "cached-blocks")
}

// get_free_block's walks over the ordered set from the lower bound
// (CUDACachingAllocator.cpp @ 001074d2): with expandable segments off, past
// the blocks of expandable segments to the first cudaMalloc block of the
// stream; on, to the next block while what it can grow into is smaller.
func TestBestFitWalks(t *testing.T) {
	const mib = 1 << 20
	es := &expandable{}
	unmappedTail := &Block{Size: 100 * mib, seg: es}
	grows := &Block{Ptr: 0, Size: 4 * mib, seg: es, mapped: true, next: unmappedTail} // can grow to 104 MiB
	fixed := &Block{Ptr: 1 << 30, Size: 6 * mib, seg: es, mapped: true}
	plain := &Block{Ptr: 2 << 30, Size: 8 * mib, mapped: true}
	other := &Block{Ptr: 3 << 30, Size: 5 * mib, Stream: 1, mapped: true}
	for _, c := range []struct {
		name       string
		blocks     []*Block
		size       int64
		expandable bool
		want       *Block
	}{
		{"off: past expandable blocks to a cudaMalloc one", []*Block{grows, fixed, plain, other}, 3 * mib, false, plain},
		{"off: none of the stream after them", []*Block{grows, fixed, other}, 3 * mib, false, nil},
		{"off: a cudaMalloc block at the bound", []*Block{grows, fixed, plain}, 7 * mib, false, plain},
		{"on: the block that grows into less", []*Block{grows, fixed, plain}, 3 * mib, true, fixed},
		{"on: stops at the stream's end", []*Block{grows, other}, 3 * mib, true, grows},
		{"nothing large enough", []*Block{grows, fixed, plain}, 9 * mib, true, nil},
		{"another stream only", []*Block{other}, 1 * mib, false, nil},
	} {
		p := newPool(false)
		for _, b := range c.blocks {
			p.insert(b)
		}
		if got := p.bestFit(c.size, 0, c.expandable); got != c.want {
			t.Errorf("%s: got %v, want %v", c.name, got, c.want)
		}
		for _, b := range c.blocks {
			p.remove(b)
		}
	}
}

// release_available_cached_blocks with max_split_size 100 MiB on a 700 MiB
// device holding cached oversize blocks of 150, 200 and 250 MiB: a request
// no cached block serves frees the smallest block that covers it, or else
// the largest blocks first until their sum does.
func TestReleaseAvailableCachedBlocks(t *testing.T) {
	const mib = 1 << 20
	for _, c := range []struct {
		name      string
		request   int64
		wantFrees int
		wantLeft  []int64 // cached block sizes after the request, in order
	}{
		// 220 MiB: the 250 MiB block is within 20 MiB of no request, so not
		// served from the cache; it is the smallest that covers 220 MiB.
		{"the smallest block that covers the request", 220 * mib, 1, []int64{150 * mib, 200 * mib}},
		// 300 MiB: no block covers it; 250 then 200 MiB are freed (450 ≥ 300).
		{"the largest first until they cover it", 300 * mib, 2, []int64{150 * mib}},
	} {
		dev := &fakeDevice{next: 1 << 40, capacity: 700 * mib}
		a := New(Config{MaxSplitSize: 100 * mib}, dev)
		for _, size := range []int64{150 * mib, 200 * mib, 250 * mib} {
			if err := a.Free(mustMalloc(t, a, size).Ptr); err != nil {
				t.Fatal(err)
			}
		}
		b := mustMalloc(t, a, c.request)
		var left []int64
		for _, cb := range a.pools[1].blocks.all() {
			left = append(left, cb.Size)
		}
		if dev.frees != c.wantFrees || !slices.Equal(left, c.wantLeft) || b.Size != c.request {
			t.Errorf("%s: %d segments freed, cached %v, block of %d; want %d freed, cached %v", c.name, dev.frees, left, b.Size, c.wantFrees, c.wantLeft)
		}
	}
}

// An allocator freed by block (ReplayProgram's, without the map of
// addresses) behaves as one freed by address: random requests of every
// pool on two streams, under the default, max_split_size, expandable
// segments and a garbage-collection threshold, on a device small enough to
// make it free its cache, hand out the same addresses, reserve the same
// bytes, fail at the same requests and end with the same segments, which
// segmentCount counts.
func TestFreeByBlockMatchesFreeByAddress(t *testing.T) {
	const mib = 1 << 20
	for _, cfg := range []Config{
		{},
		{MaxSplitSize: 40 * mib},
		{Expandable: true},
		{GCThreshold: 0.5, AllowedMemory: 600 * mib},
	} {
		rng := rand.New(rand.NewSource(7))
		byAddr := New(cfg, &fakeDevice{capacity: 700 * mib})
		byBlock := newUnindexed(cfg, &fakeDevice{capacity: 700 * mib})
		var live []*Block // byBlock's, in byAddr's order
		var addrs []int64
		ooms := 0
		for step := range 3000 {
			if len(live) > 0 && rng.Intn(5) < 2 {
				i := rng.Intn(len(live))
				if err := byAddr.Free(addrs[i]); err != nil {
					t.Fatal(err)
				}
				if err := byBlock.freeBlock(live[i]); err != nil {
					t.Fatal(err)
				}
				live, addrs = slices.Delete(live, i, i+1), slices.Delete(addrs, i, i+1)
			} else {
				size := []int64{rng.Int63n(mib), rng.Int63n(12 * mib), rng.Int63n(80 * mib)}[rng.Intn(3)]
				stream := rng.Int63n(2)
				x, errX := byAddr.Malloc(size, stream)
				y, errY := byBlock.Malloc(size, stream)
				if (errX == nil) != (errY == nil) || errX == nil && x.Ptr != y.Ptr {
					t.Fatalf("%+v step %d: %v %v", cfg, step, errX, errY)
				}
				if errX == nil {
					live, addrs = append(live, y), append(addrs, x.Ptr)
				} else {
					ooms++
				}
			}
			if byAddr.Reserved != byBlock.Reserved || byAddr.Allocated != byBlock.Allocated {
				t.Fatalf("%+v step %d: reserved %d and %d", cfg, step, byAddr.Reserved, byBlock.Reserved)
			}
		}
		segs := byAddr.Segments()
		if !reflect.DeepEqual(segs, byBlock.Segments()) || byBlock.segmentCount() != len(segs) || len(segs) < 2 {
			t.Fatalf("%+v: %d segments by address, %d by block, counted %d", cfg, len(segs), len(byBlock.Segments()), byBlock.segmentCount())
		}
		t.Logf("expandable %v, max split %d, gc %v: %d segments, %d out of memory, %d segments freed", cfg.Expandable, cfg.MaxSplitSize, cfg.GCThreshold, len(segs), ooms, byAddr.dev.(*fakeDevice).frees)
	}
}
