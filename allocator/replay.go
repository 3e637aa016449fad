package allocator

import (
	"context"
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
	return ReplayDeviceContext(context.Background(), s, dev)
}

// ReplayDeviceContext is ReplayDevice stopped by ctx: every stopEvery
// events it returns ctx's cause once ctx is done (a snapshot at the
// readers' limits holds millions of events).
func ReplayDeviceContext(ctx context.Context, s *snapshot.Snapshot, dev int64) (*Replay, error) {
	r, _, err := replay(ctx, s, dev, -2)
	return r, err
}

// StateAt is the model's segments after event ev of device dev's trace (ev
// -1: before the first).
func StateAt(s *snapshot.Snapshot, dev int64, ev int) ([]SegmentState, error) {
	_, a, err := replay(context.Background(), s, dev, ev)
	if err != nil {
		return nil, err
	}
	return a.Segments(), nil
}

// replay runs the model to the end of the trace (stop -2) or to just after
// event stop. It is a driver over a replayer's phases: the initial state
// (initialState), then each event in order (applied to the model, the
// reserved total checked where the trace records one, the peaks tracked)
// until the model diverges, and at the end the segment events no allocation
// used and the final segments compared block for block.
func replay(ctx context.Context, s *snapshot.Snapshot, dev int64, stop int) (*Replay, *Allocator, error) {
	rp := newReplayer(s, dev)
	if err := initialState(rp.a, rp.r, rp.cfg, rp.segs, rp.trace); err != nil {
		return nil, nil, fmt.Errorf("device %d: %w", dev, err)
	}
	rp.start()
	for i, e := range rp.trace {
		if stop >= -1 && i > stop {
			break
		}
		if i%stopEvery == 0 && ctx.Err() != nil {
			return nil, nil, context.Cause(ctx)
		}
		rp.event(i, e)
		if rp.r.Diverged != "" {
			return rp.r, rp.a, nil
		}
	}
	if stop >= -1 {
		return rp.r, rp.a, nil // a state within the trace
	}
	rp.end()
	return rp.r, rp.a, nil
}

// replayer is one replay of a device's trace: the model, the device that
// answers its segment requests from the trace, and the replay's result.
type replayer struct {
	trace    []snapshot.Event
	segs     []snapshot.Segment // the device's segments at the dump
	cfg      Config
	rd       *replayDevice
	a        *Allocator
	r        *Replay
	emitted  []SegmentEvent // the model's segment events during the current event
	recorded int64          // the reserved bytes the trace's segment events add up to
	i        int            // the current event and its index
	e        snapshot.Event
}

func newReplayer(s *snapshot.Snapshot, dev int64) *replayer {
	rp := &replayer{cfg: ConfigOf(s.Settings), rd: &replayDevice{}, r: &Replay{Device: dev}}
	if dev >= 0 && int(dev) < len(s.Traces) {
		rp.trace = s.Traces[dev]
	}
	for _, sg := range s.Segments {
		if sg.Device == dev {
			rp.segs = append(rp.segs, sg)
		}
	}
	rp.a = New(rp.cfg, rp.rd)
	return rp
}

// start takes the initial state as the first peak and listens to the
// model's segment events.
func (rp *replayer) start() {
	a, r := rp.a, rp.r
	r.InitialReserved, r.InitialAllocated, r.InitialRequested = a.Reserved, a.Allocated, a.Requested
	a.PeakReserved, a.PeakAllocated = a.Reserved, a.Allocated
	a.OnSegment = func(e SegmentEvent) { rp.emitted = append(rp.emitted, e) }
	rp.recorded = a.Reserved
	r.Peak = State{Event: -1, Reserved: a.Reserved, Allocated: a.Allocated, Requested: a.Requested}
	r.PeakReserved, r.PeakRequested = r.Peak, r.Peak
	r.After = make([]State, 0, len(rp.trace))
}

// fail records the divergence at the current event.
func (rp *replayer) fail(format string, args ...any) {
	e := rp.e
	rp.r.Diverged = fmt.Sprintf("event %d (%s of %d bytes at %#x): ", rp.i, e.Action, e.Size, e.Addr) + fmt.Sprintf(format, args...)
}

// event replays event i: the model does what the trace did, then the
// reserved total and the peaks.
func (rp *replayer) event(i int, e snapshot.Event) {
	rp.i, rp.e = i, e
	rp.emitted = rp.emitted[:0]
	switch e.Action {
	case snapshot.SegmentAlloc, snapshot.SegmentMap:
		rp.rd.queue = append(rp.rd.queue, e)
		rp.recorded += e.Size
		rp.r.SegmentEvents++
	case snapshot.Alloc:
		rp.alloc()
	case snapshot.FreeRequested:
		b, err := rp.a.FreeRequested(e.Addr)
		if err != nil {
			rp.fail("%v", err)
		} else if b.Requested != e.Size {
			rp.fail("the model's block there was requested with %d bytes", b.Requested)
		}
	case snapshot.FreeCompleted:
		if err := rp.a.FreeCompleted(e.Addr); err != nil {
			rp.fail("%v", err)
		}
	case snapshot.SegmentFree:
		rp.segmentFree()
	case snapshot.SegmentUnmap:
		rp.segmentUnmap()
	}
	rp.checkReserved()
	rp.track()
}

// alloc: the model serves the request at the trace's address, using
// exactly the segments the trace allocated or mapped for it.
func (rp *replayer) alloc() {
	e, rd := rp.e, rp.rd
	b, err := rp.a.Malloc(e.Size, e.Stream)
	switch {
	case err != nil:
		rp.fail("%v", err)
	case rd.err != "":
		rp.fail("%s", rd.err)
	case len(rd.queue) > 0:
		rp.fail("the trace's %s of %d bytes at %#x was not needed by the model", rd.queue[0].Action, rd.queue[0].Size, rd.queue[0].Addr)
	case b.Ptr != e.Addr:
		rp.fail("the model hands out %#x (block of %d bytes)", b.Ptr, b.Size)
	}
	rp.r.AddressChecks++
}

// segmentFree: empty_cache or an allocation's retry freed cached segments;
// the trace says which, and the model frees the same one.
func (rp *replayer) segmentFree() {
	e := rp.e
	rp.r.SegmentEvents++
	rp.recorded -= e.Size
	p, b := rp.a.freeBlockAt(e.Addr)
	if b == nil || b.seg != nil || b.isSplit() || b.Size != e.Size {
		rp.fail("the model has no whole cached segment of that size there")
		return
	}
	rp.a.releaseBlock(p, b)
}

// segmentUnmap: the model unmaps the same range of an expandable segment.
func (rp *replayer) segmentUnmap() {
	e := rp.e
	rp.r.SegmentEvents++
	rp.recorded -= e.Size
	p, b := rp.a.freeBlockContaining(e.Addr)
	if b == nil {
		rp.fail("the model has no cached block of an expandable segment there")
		return
	}
	rp.a.unmapBlock(p, b)
	if len(rp.emitted) != 1 || rp.emitted[0].Addr != e.Addr || rp.emitted[0].Size != e.Size {
		rp.fail("the model unmaps %v", rp.emitted)
	}
}

// checkReserved compares the model's reserved bytes with the trace's after
// a segment is freed or unmapped, or an allocation used the segment the
// trace grew for it.
func (rp *replayer) checkReserved() {
	e, i := rp.e, rp.i
	if rp.r.Diverged != "" {
		return
	}
	if e.Action == snapshot.SegmentFree || e.Action == snapshot.SegmentUnmap || (e.Action == snapshot.Alloc && i > 0 && isSegmentGrow(rp.trace[i-1].Action)) {
		rp.r.ReservedChecks++
		if rp.a.Reserved != rp.recorded {
			rp.fail("the model reserves %d bytes, the trace %d", rp.a.Reserved, rp.recorded)
		}
	}
}

// track records the state after the current event and the peaks.
func (rp *replayer) track() {
	a, r := rp.a, rp.r
	st := State{Event: rp.i, Reserved: a.Reserved, Allocated: a.Allocated, Requested: a.Requested}
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
}

// end: a segment event no allocation used is a divergence; else the final
// segments are compared with the dump's.
func (rp *replayer) end() {
	if q := rp.rd.queue; len(q) > 0 {
		rp.r.Diverged = fmt.Sprintf("the trace ends with %s of %d bytes at %#x that no allocation used", q[0].Action, q[0].Size, q[0].Addr)
		return
	}
	rp.r.FinalMismatch = compareFinal(rp.a.Segments(), rp.segs)
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
//
// It is a driver over an initializer's phases: liveSpans, poolOfUnnamed,
// preAllocated, layout (each segment's blocks, cudaMalloc segments placed
// at once) and expandables (the mapped blocks of each expandable segment
// with its unmapped gaps and tail).
func initialState(a *Allocator, r *Replay, cfg Config, segs []snapshot.Segment, trace []snapshot.Event) error {
	in := &initializer{a: a, r: r, cfg: cfg, segs: segs, trace: trace}
	if err := in.liveSpans(); err != nil {
		return err
	}
	in.poolOfUnnamed()
	if err := in.preAllocated(); err != nil {
		return err
	}
	if err := in.layout(); err != nil {
		return err
	}
	in.expandables()
	return nil
}

// preAlloc is a block allocated before recording began.
type preAlloc struct {
	addr, size, req, stream int64
	known                   bool // size from the dump
	freedAt                 int
}

// expGroup is what an expandable segment serves: one stream's small or
// large pool.
type expGroup struct {
	stream int64
	small  bool
}

// initializer holds what initialState's phases share.
type initializer struct {
	a     *Allocator
	r     *Replay
	cfg   Config
	segs  []snapshot.Segment
	trace []snapshot.Event

	plain  map[int64]span // cudaMalloc segments alive at the start, by address
	mapped []span         // expandable ranges mapped at the start
	pres   []preAlloc     // by address
	used   int            // pres[:used] are laid out

	expSegs   map[expGroup]*expandable
	expBlocks map[*expandable][]*Block
}

// liveSpans: the segments (cudaMalloc) and mapped ranges (expandable) at
// the start, the dump's undone by the trace's segment events, walked
// backwards.
func (in *initializer) liveSpans() error {
	in.plain = map[int64]span{}
	for _, s := range in.segs {
		if s.Expandable {
			in.mapped = append(in.mapped, span{s.Address, s.TotalSize, s.Stream, !s.Large, true})
		} else {
			in.plain[s.Address] = span{s.Address, s.TotalSize, s.Stream, !s.Large, false}
		}
	}
	for i := len(in.trace) - 1; i >= 0; i-- {
		e := in.trace[i]
		switch e.Action {
		case snapshot.SegmentAlloc:
			if _, ok := in.plain[e.Addr]; !ok {
				return fmt.Errorf("trace event %d allocates a segment at %#x that neither the dump nor a later segment_free knows", i, e.Addr)
			}
			delete(in.plain, e.Addr)
		case snapshot.SegmentFree:
			in.plain[e.Addr] = span{e.Addr, e.Size, e.Stream, e.Size == SmallBuffer, false}
		case snapshot.SegmentMap:
			var ok bool
			if in.mapped, ok = cutSpan(in.mapped, e.Addr, e.Size); !ok {
				return fmt.Errorf("trace event %d maps %d bytes at %#x that the dump does not hold mapped", i, e.Size, e.Addr)
			}
		case snapshot.SegmentUnmap:
			in.mapped = addSpan(in.mapped, span{e.Addr, e.Size, e.Stream, false, true})
		}
	}
	return nil
}

// poolOfUnnamed: the pool of a mapped range is that of the final segment
// overlapping it or, when no final segment names it, that of the first
// request served inside it.
func (in *initializer) poolOfUnnamed() {
	for k := range in.mapped {
		m := &in.mapped[k]
		known := false
		for _, s := range in.segs {
			if s.Expandable && s.Address < m.addr+m.size && m.addr < s.Address+s.TotalSize {
				m.small, known = !s.Large, true
			}
		}
		if known {
			continue
		}
		for _, e := range in.trace {
			if e.Action == snapshot.Alloc && e.Addr >= m.addr && e.Addr < m.addr+m.size {
				m.small = in.cfg.RoundSize(e.Size) <= SmallSize
				break
			}
		}
	}
}

// preAllocated: the blocks allocated before recording, those the trace
// frees before allocating at their address and those alive at the dump
// that the trace never allocated, in address order.
func (in *initializer) preAllocated() error {
	allocated := map[int64]bool{}
	everAlloc := map[int64]bool{}
	for i, e := range in.trace {
		switch e.Action {
		case snapshot.Alloc:
			allocated[e.Addr] = true
			everAlloc[e.Addr] = true
		case snapshot.FreeRequested:
			if allocated[e.Addr] {
				delete(allocated, e.Addr)
			} else if !everAlloc[e.Addr] {
				in.pres = append(in.pres, preAlloc{addr: e.Addr, req: e.Size, stream: e.Stream, freedAt: i})
				everAlloc[e.Addr] = true // a later free here belongs to a later alloc
			} else {
				return fmt.Errorf("trace event %d frees %#x twice", i, e.Addr)
			}
		}
	}
	for _, s := range in.segs {
		for _, b := range s.Blocks {
			if b.State == "inactive" {
				continue
			}
			if !everAlloc[b.Address] {
				in.pres = append(in.pres, preAlloc{addr: b.Address, size: b.Size, req: b.Requested, stream: s.Stream, known: true, freedAt: -1})
			} else if !allocated[b.Address] {
				return fmt.Errorf("the dump holds a block at %#x that the trace freed last", b.Address)
			}
		}
	}
	slices.SortFunc(in.pres, func(x, y preAlloc) int { return cmpInt(x.addr, y.addr) })
	return nil
}

// layout lays out every segment alive at the start, in address order.
func (in *initializer) layout() error {
	var all []span
	for _, s := range in.plain {
		all = append(all, s)
	}
	all = append(all, in.mapped...)
	slices.SortFunc(all, func(x, y span) int { return cmpInt(x.addr, y.addr) })
	in.expSegs = map[expGroup]*expandable{}
	in.expBlocks = map[*expandable][]*Block{}
	for _, s := range all {
		if err := in.layoutSpan(s); err != nil {
			return err
		}
	}
	if in.used < len(in.pres) {
		return fmt.Errorf("a block allocated before recording, at %#x, lies in no segment alive then", in.pres[in.used].addr)
	}
	return nil
}

// layoutSpan reserves one segment (or mapped range) and builds its blocks:
// a cudaMalloc segment's are placed now, an expandable segment's wait for
// expandables.
func (in *initializer) layoutSpan(s span) error {
	var es *expandable
	if s.expandable {
		es = in.expandableOf(s)
	}
	if in.used < len(in.pres) && in.pres[in.used].addr < s.addr {
		return fmt.Errorf("a block allocated before recording, at %#x, lies in no segment alive then", in.pres[in.used].addr)
	}
	blocks, err := in.blocksIn(s, es)
	if err != nil {
		return err
	}
	in.a.reserve(s.size)
	if es != nil {
		in.expBlocks[es] = append(in.expBlocks[es], blocks...)
		return nil
	}
	link(blocks)
	p := in.a.pool(s.small)
	for _, b := range blocks {
		in.a.place(p, b)
	}
	return nil
}

// expandableOf is the expandable segment a mapped range belongs to, made
// at its first range.
func (in *initializer) expandableOf(s span) *expandable {
	g := expGroup{s.stream, s.small}
	es := in.expSegs[g]
	if es == nil {
		es = &expandable{base: s.addr, page: in.a.pageSize(s.small), stream: s.stream, small: s.small}
		es.size = (expandableSpace + es.page - 1) / es.page * es.page
		in.expSegs[g] = es
	}
	return es
}

// blocksIn is the blocks of a span: the ones allocated before recording
// that lie in it and free blocks in the gaps.
func (in *initializer) blocksIn(s span, es *expandable) ([]*Block, error) {
	var blocks []*Block
	off, end := s.addr, s.addr+s.size
	addFree := func(from, to int64) {
		if to > from {
			blocks = append(blocks, &Block{Ptr: from, Size: to - from, Stream: s.stream, Small: s.small, mapped: true, seg: es})
		}
	}
	for in.used < len(in.pres) && in.pres[in.used].addr < end {
		pb := in.pres[in.used]
		in.used++
		size := pb.size
		if !pb.known {
			size = in.inferSize(pb, s, end)
		}
		if pb.addr < off || pb.addr+size > end {
			return nil, fmt.Errorf("the block at %#x allocated before recording overlaps another or its segment's end", pb.addr)
		}
		addFree(off, pb.addr)
		blocks = append(blocks, &Block{Ptr: pb.addr, Size: size, Requested: pb.req, Stream: s.stream, Small: s.small, mapped: true, seg: es, Allocated: true})
		in.r.PreExisting = append(in.r.PreExisting, PreBlock{Addr: pb.addr, Size: size, Requested: pb.req, Stream: pb.stream, FreedAt: pb.freedAt})
		off = pb.addr + size
	}
	addFree(off, end)
	return blocks, nil
}

// inferSize is the size of a block the trace frees before allocating there
// (only its requested size is recorded): its rounded size, plus a remainder
// a large-pool block kept.
func (in *initializer) inferSize(pb preAlloc, s span, end int64) int64 {
	size := in.cfg.RoundSize(pb.req)
	next := end
	if in.used < len(in.pres) && in.pres[in.used].addr < end {
		next = in.pres[in.used].addr
	}
	gap := next - (pb.addr + size)
	if s.small || in.cfg.Expandable || gap <= 0 {
		return size
	}
	// A large-pool block keeps a remainder it could not split (should_split:
	// no split unless more than 1 MiB remains, none at all at max_split_size
	// or above), so a gap it left that no free block can be belongs to it.
	if gap <= SmallSize || (size >= in.cfg.maxSplit() && gap < LargeBuffer) {
		return size + gap
	}
	// The remainder it kept is at most 1 MiB: the free block after it
	// starts where the trace first allocates within that reach while it is
	// alive.
	limit := min(pb.addr+size+SmallSize, next)
	first := int64(math.MaxInt64)
	for _, e := range in.trace[:pb.freedAt] {
		if e.Action == snapshot.Alloc && e.Addr > pb.addr+size && e.Addr <= limit {
			first = min(first, e.Addr)
		}
	}
	if first != math.MaxInt64 {
		size = first - pb.addr
	}
	return size
}

// expandables: each expandable segment's mapped blocks, with its unmapped
// gaps and tail, linked and placed.
func (in *initializer) expandables() {
	for es, blocks := range in.expBlocks {
		p := in.a.pool(es.small)
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
				p.unmapped.insert(b)
				continue
			}
			in.a.place(p, b)
		}
	}
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
		a.handOut(b)
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
