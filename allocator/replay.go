package allocator

import (
	"fmt"
	"math"
	"slices"

	"github.com/memplan/memplan/snapshot"
)

// ConfigOf is the allocator configuration a snapshot recorded (PyTorch's
// defaults when it recorded none).
func ConfigOf(st snapshot.Settings) Config {
	return Config{MaxSplitSize: st.MaxSplitSize, RoundupPower2Divisions: st.RoundupPower2Divisions, GCThreshold: st.GCThreshold, Expandable: st.Expandable}
}

// Replay is the allocator model run on one device's recorded trace.
type Replay struct {
	Device int64
	// Initial: the state before the first event, reconstructed from the
	// final segments and the trace (PreExisting blocks were allocated before
	// recording began).
	InitialReserved, InitialAllocated, InitialRequested int64
	PreExisting                                         []PreBlock
	// After[i] is the model's state after event i.
	After []State
	// SegmentEvents is how many segment events the trace has; each was
	// reproduced (same action, address and size) unless Diverged says
	// otherwise.
	SegmentEvents int
	// Checks counts the recorded reserved-byte totals compared (one per
	// segment event) and the allocation addresses compared.
	ReservedChecks, AddressChecks int
	// Diverged is the first event where the model and the trace disagree
	// ("" when they never do); the replay stops there.
	Diverged string
	// FinalMismatch says how the model's end state differs from the
	// snapshot's segments ("" when it is the same, block for block).
	FinalMismatch string
	Peak          State // the state at the largest Allocated; its Event is the index
	PeakReserved  State
	PeakRequested State
}

// State is what the model holds after an event.
type State struct {
	Event                          int
	Reserved, Allocated, Requested int64
}

// PreBlock is a block alive before recording began.
type PreBlock struct {
	Addr, Size, Requested int64
	Stream                int64
	FreedAt               int // the trace event that frees it; -1: alive at the dump
}

// replayDevice answers the model's requests for memory from the trace.
type replayDevice struct {
	queue []snapshot.Event // recorded segment_alloc / segment_map not yet reproduced
	err   string
}

func (d *replayDevice) fail(format string, args ...any) {
	if d.err == "" {
		d.err = fmt.Sprintf(format, args...)
	}
}

func (d *replayDevice) Malloc(size int64) (int64, bool) {
	if len(d.queue) == 0 || d.queue[0].Action != snapshot.SegmentAlloc {
		d.fail("the model allocates a new %d-byte segment where the trace has none", size)
		return 1 << 62, true
	}
	e := d.queue[0]
	d.queue = d.queue[1:]
	if e.Size != size {
		d.fail("the model allocates a %d-byte segment where the trace allocates %d bytes", size, e.Size)
	}
	return e.Addr, true
}

func (d *replayDevice) Free(ptr, size int64) {}

func (d *replayDevice) Reserve(size int64) int64 {
	if len(d.queue) == 0 || d.queue[0].Action != snapshot.SegmentMap {
		d.fail("the model creates a new expandable segment where the trace maps nothing")
		return 1 << 62
	}
	return d.queue[0].Addr
}

func (d *replayDevice) Map(ptr, size int64) bool {
	if len(d.queue) == 0 || d.queue[0].Action != snapshot.SegmentMap {
		d.fail("the model maps %d bytes at %#x where the trace maps nothing", size, ptr)
		return true
	}
	e := d.queue[0]
	d.queue = d.queue[1:]
	if e.Addr != ptr || e.Size != size {
		d.fail("the model maps %d bytes at %#x where the trace maps %d bytes at %#x", size, ptr, e.Size, e.Addr)
	}
	return true
}

func (d *replayDevice) Unmap(ptr, size int64) {}

// ReplayDevice runs the allocator model over device dev's trace of s.
func ReplayDevice(s *snapshot.Snapshot, dev int64) (*Replay, error) {
	r, _, err := replay(s, dev, -2)
	return r, err
}

// StateAt is the model's segments after event ev of device dev's trace (ev
// -1: before the first).
func StateAt(s *snapshot.Snapshot, dev int64, ev int) ([]SegmentState, error) {
	_, a, err := replay(s, dev, ev)
	if err != nil {
		return nil, err
	}
	return a.Segments(), nil
}

// replay runs the model to the end of the trace (stop -2) or to just after
// event stop.
func replay(s *snapshot.Snapshot, dev int64, stop int) (*Replay, *Allocator, error) {
	var trace []snapshot.Event
	if dev >= 0 && int(dev) < len(s.Traces) {
		trace = s.Traces[dev]
	}
	var segs []snapshot.Segment
	for _, sg := range s.Segments {
		if sg.Device == dev {
			segs = append(segs, sg)
		}
	}
	cfg := ConfigOf(s.Settings)
	rd := &replayDevice{}
	a := New(cfg, rd)
	r := &Replay{Device: dev}
	if err := initialState(a, r, cfg, segs, trace); err != nil {
		return nil, nil, fmt.Errorf("device %d: %w", dev, err)
	}
	r.InitialReserved, r.InitialAllocated, r.InitialRequested = a.Reserved, a.Allocated, a.Requested
	a.PeakReserved, a.PeakAllocated = a.Reserved, a.Allocated
	var emitted []SegmentEvent
	a.OnSegment = func(e SegmentEvent) { emitted = append(emitted, e) }
	recorded := a.Reserved
	r.Peak = State{Event: -1, Reserved: a.Reserved, Allocated: a.Allocated, Requested: a.Requested}
	r.PeakReserved, r.PeakRequested = r.Peak, r.Peak
	r.After = make([]State, 0, len(trace))
	for i, e := range trace {
		if stop >= -1 && i > stop {
			break
		}
		emitted = emitted[:0]
		fail := func(format string, args ...any) {
			r.Diverged = fmt.Sprintf("event %d (%s of %d bytes at %#x): ", i, e.Action, e.Size, e.Addr) + fmt.Sprintf(format, args...)
		}
		switch e.Action {
		case snapshot.SegmentAlloc, snapshot.SegmentMap:
			rd.queue = append(rd.queue, e)
			recorded += e.Size
			r.SegmentEvents++
		case snapshot.Alloc:
			b, err := a.Malloc(e.Size, e.Stream)
			switch {
			case err != nil:
				fail("%v", err)
			case rd.err != "":
				fail("%s", rd.err)
			case len(rd.queue) > 0:
				fail("the trace's %s of %d bytes at %#x was not needed by the model", rd.queue[0].Action, rd.queue[0].Size, rd.queue[0].Addr)
			case b.Ptr != e.Addr:
				fail("the model hands out %#x (block of %d bytes)", b.Ptr, b.Size)
			}
			r.AddressChecks++
		case snapshot.FreeRequested:
			b, err := a.FreeRequested(e.Addr)
			if err != nil {
				fail("%v", err)
			} else if b.Requested != e.Size {
				fail("the model's block there was requested with %d bytes", b.Requested)
			}
		case snapshot.FreeCompleted:
			if err := a.FreeCompleted(e.Addr); err != nil {
				fail("%v", err)
			}
		case snapshot.SegmentFree:
			// empty_cache or an allocation's retry freed cached segments:
			// the trace says which; the model frees the same one.
			r.SegmentEvents++
			recorded -= e.Size
			p, b := a.freeBlockAt(e.Addr)
			if b == nil || b.seg != nil || b.isSplit() || b.Size != e.Size {
				fail("the model has no whole cached segment of that size there")
				break
			}
			a.releaseBlock(p, b)
		case snapshot.SegmentUnmap:
			r.SegmentEvents++
			recorded -= e.Size
			p, b := a.freeBlockContaining(e.Addr)
			if b == nil {
				fail("the model has no cached block of an expandable segment there")
				break
			}
			a.unmapBlock(p, b)
			if len(emitted) != 1 || emitted[0].Addr != e.Addr || emitted[0].Size != e.Size {
				fail("the model unmaps %v", emitted)
			}
		}
		if r.Diverged == "" && (e.Action == snapshot.SegmentFree || e.Action == snapshot.SegmentUnmap || (e.Action == snapshot.Alloc && i > 0 && isSegmentGrow(trace[i-1].Action))) {
			r.ReservedChecks++
			if a.Reserved != recorded {
				fail("the model reserves %d bytes, the trace %d", a.Reserved, recorded)
			}
		}
		st := State{Event: i, Reserved: a.Reserved, Allocated: a.Allocated, Requested: a.Requested}
		r.After = append(r.After, st)
		if st.Allocated > r.Peak.Allocated {
			r.Peak = st
		}
		if st.Reserved > r.PeakReserved.Reserved {
			r.PeakReserved = st
		}
		if st.Requested > r.PeakRequested.Requested {
			r.PeakRequested = st
		}
		if r.Diverged != "" {
			return r, a, nil
		}
	}
	if stop >= -1 {
		return r, a, nil // a state within the trace
	}
	if len(rd.queue) > 0 {
		r.Diverged = fmt.Sprintf("the trace ends with %s of %d bytes at %#x that no allocation used", rd.queue[0].Action, rd.queue[0].Size, rd.queue[0].Addr)
		return r, a, nil
	}
	r.FinalMismatch = compareFinal(a.Segments(), segs)
	return r, a, nil
}

func isSegmentGrow(a snapshot.Action) bool {
	return a == snapshot.SegmentAlloc || a == snapshot.SegmentMap
}

// compareFinal checks the model's segments against the snapshot's, block
// for block.
func compareFinal(got []SegmentState, want []snapshot.Segment) string {
	want = slices.Clone(want)
	slices.SortFunc(want, func(x, y snapshot.Segment) int { return cmpInt(x.Address, y.Address) })
	if len(got) != len(want) {
		return fmt.Sprintf("the model ends with %d segments, the snapshot has %d", len(got), len(want))
	}
	for i := range got {
		g, w := &got[i], &want[i]
		if g.Address != w.Address || g.TotalSize != w.TotalSize || g.Small == w.Large || len(g.Blocks) != len(w.Blocks) {
			return fmt.Sprintf("segment %#x: the model has %d bytes in %d blocks, the snapshot %d bytes in %d blocks at %#x", g.Address, g.TotalSize, len(g.Blocks), w.TotalSize, len(w.Blocks), w.Address)
		}
		for j := range g.Blocks {
			gb, wb := g.Blocks[j], w.Blocks[j]
			if gb.Address != wb.Address || gb.Size != wb.Size || gb.Allocated != (wb.State != "inactive") {
				return fmt.Sprintf("block %#x: the model has %d bytes allocated=%v, the snapshot %d bytes %s", gb.Address, gb.Size, gb.Allocated, wb.Size, wb.State)
			}
		}
	}
	return ""
}

// span is an address range of a segment alive at the start.
type span struct {
	addr, size, stream int64
	small, expandable  bool
}

// initialState rebuilds the allocator as it was before the first event:
// the segments alive then (the final segments, minus those the trace
// allocates or maps, plus those it frees or unmaps: walked backwards), the
// blocks allocated before recording began (freed in the trace before any
// allocation at their address, or alive at the dump and never allocated in
// the trace), and free blocks in the gaps (free neighbours are always
// merged, so a gap is one free block).
func initialState(a *Allocator, r *Replay, cfg Config, segs []snapshot.Segment, trace []snapshot.Event) error {
	// Segments (cudaMalloc) and mapped ranges (expandable) at the start.
	plain := map[int64]span{}
	var mapped []span
	for _, s := range segs {
		if s.Expandable {
			mapped = append(mapped, span{s.Address, s.TotalSize, s.Stream, !s.Large, true})
		} else {
			plain[s.Address] = span{s.Address, s.TotalSize, s.Stream, !s.Large, false}
		}
	}
	for i := len(trace) - 1; i >= 0; i-- {
		e := trace[i]
		switch e.Action {
		case snapshot.SegmentAlloc:
			if _, ok := plain[e.Addr]; !ok {
				return fmt.Errorf("trace event %d allocates a segment at %#x that neither the dump nor a later segment_free knows", i, e.Addr)
			}
			delete(plain, e.Addr)
		case snapshot.SegmentFree:
			plain[e.Addr] = span{e.Addr, e.Size, e.Stream, e.Size == SmallBuffer, false}
		case snapshot.SegmentMap:
			var ok bool
			if mapped, ok = cutSpan(mapped, e.Addr, e.Size); !ok {
				return fmt.Errorf("trace event %d maps %d bytes at %#x that the dump does not hold mapped", i, e.Size, e.Addr)
			}
		case snapshot.SegmentUnmap:
			mapped = addSpan(mapped, span{e.Addr, e.Size, e.Stream, false, true})
		}
	}
	// Pool of mapped ranges that no final segment names: the first request
	// served inside them.
	for k := range mapped {
		m := &mapped[k]
		known := false
		for _, s := range segs {
			if s.Expandable && s.Address < m.addr+m.size && m.addr < s.Address+s.TotalSize {
				m.small, known = !s.Large, true
			}
		}
		if !known {
			for _, e := range trace {
				if e.Action == snapshot.Alloc && e.Addr >= m.addr && e.Addr < m.addr+m.size {
					m.small = cfg.RoundSize(e.Size) <= SmallSize
					break
				}
			}
		}
	}
	// Blocks allocated before recording.
	type pre struct {
		addr, size, req, stream int64
		known                   bool // size from the dump
		freedAt                 int
	}
	var pres []pre
	allocated := map[int64]bool{}
	everAlloc := map[int64]bool{}
	for i, e := range trace {
		switch e.Action {
		case snapshot.Alloc:
			allocated[e.Addr] = true
			everAlloc[e.Addr] = true
		case snapshot.FreeRequested:
			if allocated[e.Addr] {
				delete(allocated, e.Addr)
			} else if !everAlloc[e.Addr] {
				pres = append(pres, pre{addr: e.Addr, req: e.Size, stream: e.Stream, freedAt: i})
				everAlloc[e.Addr] = true // a later free here belongs to a later alloc
			} else {
				return fmt.Errorf("trace event %d frees %#x twice", i, e.Addr)
			}
		}
	}
	for _, s := range segs {
		for _, b := range s.Blocks {
			if b.State == "inactive" {
				continue
			}
			if !everAlloc[b.Address] {
				pres = append(pres, pre{addr: b.Address, size: b.Size, req: b.Requested, stream: s.Stream, known: true, freedAt: -1})
			} else if !allocated[b.Address] {
				return fmt.Errorf("the dump holds a block at %#x that the trace freed last", b.Address)
			}
		}
	}
	slices.SortFunc(pres, func(x, y pre) int { return cmpInt(x.addr, y.addr) })
	// Lay out every segment alive at the start.
	var all []span
	for _, s := range plain {
		all = append(all, s)
	}
	all = append(all, mapped...)
	slices.SortFunc(all, func(x, y span) int { return cmpInt(x.addr, y.addr) })
	used := 0
	type group struct {
		stream int64
		small  bool
	}
	expSegs := map[group]*expandable{}
	var expBlocks = map[*expandable][]*Block{}
	for _, s := range all {
		var es *expandable
		if s.expandable {
			g := group{s.stream, s.small}
			if es = expSegs[g]; es == nil {
				es = &expandable{base: s.addr, page: a.pageSize(s.small), stream: s.stream, small: s.small}
				es.size = (expandableSpace + es.page - 1) / es.page * es.page
				expSegs[g] = es
			}
		}
		p := a.pool(s.small)
		var blocks []*Block
		off := s.addr
		end := s.addr + s.size
		for used < len(pres) && pres[used].addr < s.addr {
			return fmt.Errorf("a block allocated before recording, at %#x, lies in no segment alive then", pres[used].addr)
		}
		addFree := func(from, to int64) {
			if to > from {
				blocks = append(blocks, &Block{Ptr: from, Size: to - from, Stream: s.stream, Small: s.small, mapped: true, seg: es})
			}
		}
		for used < len(pres) && pres[used].addr < end {
			pb := pres[used]
			used++
			size := pb.size
			if !pb.known {
				size = cfg.RoundSize(pb.req)
				next := end
				if used < len(pres) && pres[used].addr < end {
					next = pres[used].addr
				}
				gap := next - (pb.addr + size)
				// A large-pool block keeps a remainder it could not split
				// (should_split: no split unless more than 1 MiB remains,
				// none at all at max_split_size or above), so a gap it left
				// that no free block can be belongs to it.
				if !s.small && !cfg.Expandable && gap > 0 && (gap <= SmallSize || (size >= cfg.maxSplit() && gap < LargeBuffer)) {
					size += gap
				} else if !s.small && !cfg.Expandable && gap > 0 {
					// The remainder it kept is at most 1 MiB: the free
					// block after it starts where the trace first
					// allocates within that reach while it is alive.
					limit := min(pb.addr+size+SmallSize, next)
					first := int64(math.MaxInt64)
					for _, e := range trace[:pb.freedAt] {
						if e.Action == snapshot.Alloc && e.Addr > pb.addr+size && e.Addr <= limit {
							first = min(first, e.Addr)
						}
					}
					if first != math.MaxInt64 {
						size = first - pb.addr
					}
				}
			}
			if pb.addr < off || pb.addr+size > end {
				return fmt.Errorf("the block at %#x allocated before recording overlaps another or its segment's end", pb.addr)
			}
			addFree(off, pb.addr)
			blocks = append(blocks, &Block{Ptr: pb.addr, Size: size, Requested: pb.req, Stream: s.stream, Small: s.small, mapped: true, seg: es, Allocated: true})
			r.PreExisting = append(r.PreExisting, PreBlock{Addr: pb.addr, Size: size, Requested: pb.req, Stream: pb.stream, FreedAt: pb.freedAt})
			off = pb.addr + size
		}
		addFree(off, end)
		if es != nil {
			expBlocks[es] = append(expBlocks[es], blocks...)
			a.reserve(s.size)
			continue
		}
		link(blocks)
		a.reserve(s.size)
		for _, b := range blocks {
			a.place(p, b)
		}
	}
	if used < len(pres) {
		return fmt.Errorf("a block allocated before recording, at %#x, lies in no segment alive then", pres[used].addr)
	}
	// Expandable segments: mapped blocks, unmapped gaps and tail.
	for es, blocks := range expBlocks {
		p := a.pool(es.small)
		var full []*Block
		off := es.base
		for _, b := range blocks {
			if b.Ptr > off {
				full = append(full, &Block{Ptr: off, Size: b.Ptr - off, Stream: es.stream, Small: es.small, seg: es})
			}
			full = append(full, b)
			off = b.Ptr + b.Size
		}
		if tail := es.base + es.size - off; tail > 0 {
			full = append(full, &Block{Ptr: off, Size: tail, Stream: es.stream, Small: es.small, seg: es})
		}
		link(full)
		for _, b := range full {
			if !b.mapped {
				p.unmapped = insertSorted(p.unmapped, b, cmpAddr)
				continue
			}
			a.place(p, b)
		}
	}
	return nil
}

func link(blocks []*Block) {
	if len(blocks) < 2 {
		return
	}
	for i := range blocks {
		if i > 0 {
			blocks[i].prev = blocks[i-1]
		}
		if i+1 < len(blocks) {
			blocks[i].next = blocks[i+1]
		}
	}
}

// place puts a block of the initial state where it belongs.
func (a *Allocator) place(p *pool, b *Block) {
	if b.Allocated {
		a.active[b.Ptr] = b
		a.Allocated += b.Size
		a.Requested += b.Requested
		return
	}
	p.insert(b)
}

// cutSpan removes [addr, addr+size) from the mapped spans.
func cutSpan(spans []span, addr, size int64) ([]span, bool) {
	for i, s := range spans {
		if addr >= s.addr && addr+size <= s.addr+s.size {
			var out []span
			out = append(out, spans[:i]...)
			if addr > s.addr {
				out = append(out, span{s.addr, addr - s.addr, s.stream, s.small, true})
			}
			if e := s.addr + s.size; addr+size < e {
				out = append(out, span{addr + size, e - addr - size, s.stream, s.small, true})
			}
			return append(out, spans[i+1:]...), true
		}
	}
	return spans, false
}

// addSpan adds a range, merging it with ranges it touches.
func addSpan(spans []span, n span) []span {
	var out []span
	for _, s := range spans {
		if s.addr+s.size == n.addr || n.addr+n.size == s.addr {
			lo := min(s.addr, n.addr)
			n = span{lo, s.size + n.size, s.stream, s.small, true}
			continue
		}
		out = append(out, s)
	}
	return append(out, n)
}
