package snapshot

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/memplan/memplan/internal/boundedio"
	"github.com/memplan/memplan/units"
)

// Action is what a trace event records (TraceEntry::Action in
// c10/cuda/CUDACachingAllocator.h, written as lower-case strings by
// torch/csrc/cuda/memory_snapshot.cpp).
type Action uint8

// Trace actions.
const (
	Alloc         Action = iota // a block handed out (addr, requested size)
	FreeRequested               // the program freed it (allocated bytes drop here)
	FreeCompleted               // the block went back to the cache (after stream uses)
	SegmentAlloc                // cudaMalloc of a segment
	SegmentFree                 // cudaFree of a segment
	SegmentMap                  // expandable segment: pages mapped
	SegmentUnmap                // expandable segment: pages unmapped
	SnapshotTaken               // _snapshot() was called (size: active bytes)
	OOM                         // an allocation failed (addr: free device bytes)
	UserDefined                 // an annotation
	numActions
)

var actionNames = [numActions]string{"alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "segment_map", "segment_unmap", "snapshot", "oom", "user_defined"}

func (a Action) String() string {
	if a < numActions {
		return actionNames[a]
	}
	return fmt.Sprintf("action(%d)", a)
}

// Frame is one stack frame of an event or block.
type Frame struct {
	Name, File string
	Line       int64
}

// Event is one entry of a device trace.
type Event struct {
	Action Action
	Addr   int64
	Size   int64 // requested bytes for alloc/free, segment bytes for segment events
	Stream int64
	TimeUS int64 // 0 when the layout has no time_us
	Frames []Frame
}

// Block is a block of a segment at dump time.
type Block struct {
	Address, Size, Requested int64
	State                    string // active_allocated, active_pending_free, inactive
	Frames                   []Frame
}

// Allocated says the block is handed out.
func (b *Block) Allocated() bool { return b.State == "active_allocated" }

// Segment is a segment (cudaMalloc, or a mapped range of an expandable
// segment) at dump time.
type Segment struct {
	Device, Address, TotalSize, AllocatedSize, RequestedSize int64
	Stream                                                   int64
	Large, Expandable                                        bool
	Blocks                                                   []Block
}

// Settings are the allocator settings a snapshot recorded
// (allocator_settings, PyTorch ≥ 2.3).
type Settings struct {
	Recorded bool // false: the snapshot has none (older layouts); defaults apply
	Conf     string
	// MaxSplitSize in bytes; math.MaxInt64 when unlimited (recorded as -1,
	// SIZE_MAX cast to a signed integer).
	MaxSplitSize           int64
	GCThreshold            float64
	Expandable             bool
	RoundupPower2Divisions [16]int64 // intervals from 1 MiB to 32 GiB
}

// DefaultSettings are PyTorch's defaults (CUDAAllocatorConfig's constructor).
func DefaultSettings() Settings { return Settings{MaxSplitSize: math.MaxInt64} }

// Snapshot is a decoded memory snapshot.
type Snapshot struct {
	Segments []Segment
	Traces   [][]Event // one per device index
	Settings Settings
	// Layout names what the file was: "dump_snapshot" (a dict with segments
	// and device_traces) or "segments" (a bare list of segments, as
	// torch.cuda.memory_snapshot() returns).
	Layout  string
	HasTime bool // trace events carry time_us
}

// Devices lists the device indexes that have segments or trace events.
func (s *Snapshot) Devices() []int64 {
	seen := map[int64]bool{}
	for i := range s.Segments {
		seen[s.Segments[i].Device] = true
	}
	for d, t := range s.Traces {
		if len(t) > 0 {
			seen[int64(d)] = true
		}
	}
	var ds []int64
	for d := range seen {
		ds = append(ds, d)
	}
	slices.Sort(ds)
	return ds
}

// ReadFile reads a snapshot pickle. Errors are one line naming the file.
func ReadFile(path string) (*Snapshot, error) {
	data, err := boundedio.ReadFile(path, boundedio.LargeFile)
	if err != nil {
		return nil, fmt.Errorf("reading snapshot: %w", err)
	}
	s, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return s, nil
}

// ErrTimelineForm is in Parse's error for data in a form of torch.profiler's
// memory timeline (JSON, gzip, HTML), which ReadTimelineFile reads.
var ErrTimelineForm = errors.New("a torch.profiler memory timeline is read as a timeline, not as a snapshot")

// Parse decodes a snapshot pickle.
func Parse(data []byte) (*Snapshot, error) {
	if len(data) > 0 && (data[0] == '{' || data[0] == '[') && looksJSON(data) {
		return nil, fmt.Errorf("this is JSON, not a snapshot pickle (%w)", ErrTimelineForm)
	}
	if bytes.HasPrefix(data, []byte{0x1f, 0x8b}) || bytes.HasPrefix(bytes.TrimSpace(data), []byte("<")) {
		return nil, fmt.Errorf("this is gzip or HTML, not a snapshot pickle (%w)", ErrTimelineForm)
	}
	v, err := Unpickle(data)
	if err != nil {
		return nil, err
	}
	return FromValue(v, len(data))
}

func looksJSON(data []byte) bool {
	t := bytes.TrimSpace(data)
	return len(t) > 1 && (t[len(t)-1] == '}' || t[len(t)-1] == ']')
}

// layoutError is a value that is a pickle but not a snapshot layout.
func layoutError(format string, args ...any) error {
	return fmt.Errorf("not a CUDA memory snapshot: "+format, args...)
}

// FromValue interprets a decoded pickle of size bytes as a snapshot. The
// size bounds what the pickle's shared references may expand to
// (maxRecords, maxFrameRefs).
func FromValue(v any, size int) (*Snapshot, error) {
	c := converter{frames: map[*List][]Frame{}, frame: map[*Dict]Frame{},
		size: size, records: maxRecords(size), frameRefs: maxFrameRefs(size)}
	s := &Snapshot{Settings: DefaultSettings()}
	switch top := v.(type) {
	case *List:
		s.Layout = "segments"
		segs, err := c.segments(top, "the list")
		if err != nil {
			return nil, err
		}
		s.Segments = segs
		return s, nil
	case *Dict:
		s.Layout = "dump_snapshot"
		sv, ok := top.Get("segments")
		if !ok {
			return nil, layoutError("a dict without \"segments\" (keys: %s)", dictKeys(top))
		}
		sl, ok := sv.(*List)
		if !ok {
			return nil, layoutError("\"segments\" is a %s, not a list", TypeName(sv))
		}
		segs, err := c.segments(sl, "segments")
		if err != nil {
			return nil, err
		}
		s.Segments = segs
		if tv, ok := top.Get("device_traces"); ok {
			tl, ok := tv.(*List)
			if !ok {
				return nil, layoutError("\"device_traces\" is a %s, not a list", TypeName(tv))
			}
			for d, t := range tl.Items {
				evs, hasTime, err := c.trace(t, d)
				if err != nil {
					return nil, err
				}
				s.HasTime = s.HasTime || hasTime
				s.Traces = append(s.Traces, evs)
			}
		}
		if av, ok := top.Get("allocator_settings"); ok && av != nil {
			st, err := settings(av)
			if err != nil {
				return nil, err
			}
			s.Settings = st
		}
		return s, nil
	}
	return nil, layoutError("the pickle holds a %s, not a dict or a list of segments", TypeName(v))
}

func dictKeys(d *Dict) string {
	var ks []string
	for _, k := range d.Keys {
		if s, ok := k.(string); ok {
			ks = append(ks, truncate(s))
		} else {
			ks = append(ks, TypeName(k))
		}
		if len(ks) == 8 {
			ks = append(ks, "…")
			break
		}
	}
	return strings.Join(ks, ", ")
}

type converter struct {
	frames map[*List][]Frame // shared (memoized) frame lists convert once
	frame  map[*Dict]Frame   // and so do shared frames
	// size is the pickle's bytes; records and frameRefs what is left of
	// the segments, blocks and trace events, and of their frame
	// references, a pickle of that size may expand to.
	size               int
	records, frameRefs int64
	// sized is the sum of every size read so far (sizeOK).
	sized int64
}

// MaxDeviceBytes bounds every size a snapshot records (a segment's
// total_size, a block's size and requested_size, a trace event's size):
// 1 TiB, 3.5 times the most memory any GPU has (288 GB: B300, MI355X; an
// expandable segment maps at most 1.125 times its device's memory), so a
// size past it is not one of a device. A 2^63−1-byte allocation was
// reported as an 8388608 TiB peak beside a 4 MiB reserved one.
const MaxDeviceBytes = int64(1) << 40

// maxAddress bounds a segment's, block's or event's address, so that an
// address plus a size (at most MaxDeviceBytes) cannot wrap: 2^62, past any
// virtual address a CUDA device hands out (at most 2^57).
const maxAddress = int64(units.MaxBytes)

// sizeOK refuses a size of what past MaxDeviceBytes or below 0, and sizes
// that sum past units.MaxBytes (2^62) over the whole snapshot: then no sum
// or difference of any of them, which explain and the allocator replay
// compute, can wrap int64. Real snapshots are far below it (a million
// trace events of 1 TiB each sum to 2^60).
func (c *converter) sizeOK(v int64, w, field string) error {
	switch {
	case v < 0:
		return layoutError("%s%s is %d bytes; want at least 0", w, field, v)
	case v > MaxDeviceBytes:
		return layoutError("%s%s is %d bytes, past 1 TiB (2^40 bytes), more than any GPU's memory", w, field, v)
	case v > int64(units.MaxBytes)-c.sized:
		return layoutError("%s%s: the sizes of the segments, blocks and trace events read so far sum past 4 EiB (2^62 bytes)", w, field)
	}
	c.sized += v
	return nil
}

// A pickle's memo lets one value be referenced many times. PyTorch's
// pickles share strings, frames and frame lists that way, but write each
// segment, block and trace event as a dict of its own: in the eight real
// snapshots of ../shared/snapshots each takes 54 bytes of pickle (Muduard's
// list of frame-less segments) to 301 bytes (Constructor-Sun's), and their
// frame references, counted once per block or event that lists them, come
// to at most one per 2.6 bytes (cranberrii's 1,006,949 in 2,591,918 bytes).
// The converter counts what the references expand to before building it
// and refuses a pickle of n bytes past maxRecords(n) segments, blocks and
// events (one per 16 bytes, 3.4 times the densest real one, plus 65,536) or
// maxFrameRefs(n) frame references (four per byte, ten times the densest,
// plus 2^20): a 16 KB pickle of 4,000 references to a segment of 4,000
// references to one block was 16 million blocks, 3.4 GB of memory and 15 s
// before an error.
func maxRecords(n int) int64   { return int64(n)/16 + 1<<16 }
func maxFrameRefs(n int) int64 { return 4*int64(n) + 1<<20 }

// expand takes n segments, blocks or events from what the pickle may
// expand to.
func (c *converter) expand(n int) error {
	if c.records -= int64(n); c.records < 0 {
		return fmt.Errorf("its shared references expand to more than %d segments, blocks and trace events, more than a snapshot of %d bytes holds (PyTorch writes each as a dict of its own); refusing to build them", maxRecords(c.size), c.size)
	}
	return nil
}

// expandFrames takes n frame references from what the pickle may expand
// to.
func (c *converter) expandFrames(n int) error {
	if c.frameRefs -= int64(n); c.frameRefs < 0 {
		return fmt.Errorf("its shared references expand to more than %d stack frames of blocks and trace events, more than a snapshot of %d bytes holds; refusing to build them", maxFrameRefs(c.size), c.size)
	}
	return nil
}

func asDict(v any, what string) (*Dict, error) {
	d, ok := v.(*Dict)
	if !ok {
		return nil, layoutError("%s is a %s, not a dict", what, TypeName(v))
	}
	return d, nil
}

func getInt(d *Dict, key, what string) (int64, error) {
	v, ok := d.Get(key)
	if !ok {
		return 0, layoutError("%s has no %q", what, key)
	}
	return toInt(v, what+"."+key)
}

func getIntOr(d *Dict, key, what string, def int64) (int64, error) {
	if _, ok := d.Get(key); !ok {
		return def, nil
	}
	return getInt(d, key, what)
}

func toInt(v any, what string) (int64, error) {
	switch x := v.(type) {
	case int64:
		return x, nil
	case bool:
		if x {
			return 1, nil
		}
		return 0, nil
	}
	return 0, layoutError("%s is a %s, not an integer that fits 64 bits", what, TypeName(v))
}

func getString(d *Dict, key, what string) (string, error) {
	v, ok := d.Get(key)
	if !ok {
		return "", layoutError("%s has no %q", what, key)
	}
	s, ok := v.(string)
	if !ok {
		return "", layoutError("%s.%s is a %s, not a string", what, key, TypeName(v))
	}
	return s, nil
}

func (c *converter) segments(l *List, what string) ([]Segment, error) {
	if err := c.expand(len(l.Items)); err != nil {
		return nil, err
	}
	segs := make([]Segment, 0, len(l.Items))
	for i, sv := range l.Items {
		s, err := c.segment(sv, fmt.Sprintf("%s[%d]", what, i))
		if err != nil {
			return nil, err
		}
		segs = append(segs, s)
	}
	return segs, nil
}

// segment reads one segment w: its place, its kind and its blocks, which
// must tile it.
func (c *converter) segment(sv any, w string) (Segment, error) {
	var s Segment
	d, err := asDict(sv, w)
	if err != nil {
		return s, err
	}
	if s.Device, err = getIntOr(d, "device", w, 0); err != nil {
		return s, err
	}
	if s.Address, err = getInt(d, "address", w); err != nil {
		return s, err
	}
	if s.TotalSize, err = getInt(d, "total_size", w); err != nil {
		return s, err
	}
	if s.Stream, err = getIntOr(d, "stream", w, 0); err != nil {
		return s, err
	}
	if s.TotalSize <= 0 || s.Address < 0 || s.Address > maxAddress || s.Device < 0 || s.Device > 1<<16 {
		return s, layoutError("%s has address %d, total_size %d, device %d", w, s.Address, s.TotalSize, s.Device)
	}
	if err := c.sizeOK(s.TotalSize, w, ".total_size"); err != nil {
		return s, err
	}
	if err := segmentKind(d, w, &s); err != nil {
		return s, err
	}
	bv, ok := d.Get("blocks")
	if !ok {
		return s, layoutError("%s has no \"blocks\"", w)
	}
	bl, ok := bv.(*List)
	if !ok {
		return s, layoutError("%s.blocks is a %s, not a list", w, TypeName(bv))
	}
	if err := c.expand(len(bl.Items)); err != nil {
		return s, err
	}
	off := s.Address
	for j, bvi := range bl.Items {
		b, err := c.block(bvi, fmt.Sprintf("%s.blocks[%d]", w, j), off)
		if err != nil {
			return s, err
		}
		if off += b.Size; off > s.Address+s.TotalSize {
			return s, layoutError("%s: its blocks up to blocks[%d] add up to %d bytes, past its total_size %d", w, j, off-s.Address, s.TotalSize)
		}
		s.Blocks = append(s.Blocks, b)
		if b.Allocated() {
			s.AllocatedSize += b.Size
			s.RequestedSize += b.Requested
		}
	}
	if len(s.Blocks) > 0 && off != s.Address+s.TotalSize {
		return s, layoutError("%s: its blocks add up to %d bytes, its total_size is %d", w, off-s.Address, s.TotalSize)
	}
	return s, nil
}

// segmentKind reads whether segment w is expandable and which pool it
// serves.
func segmentKind(d *Dict, w string, s *Segment) error {
	if e, ok := d.Get("is_expandable"); ok {
		b, ok := e.(bool)
		if !ok {
			return layoutError("%s.is_expandable is a %s", w, TypeName(e))
		}
		s.Expandable = b
	}
	t, ok := d.Get("segment_type")
	if !ok {
		// Layouts without segment_type: small segments are kSmallBuffer
		// (2 MiB); a large segment is at least kMinLargeAlloc (10 MiB)
		// or a 20 MiB kLargeBuffer (CUDACachingAllocator.cpp,
		// get_allocation_size).
		s.Large = s.TotalSize != 2<<20
		return nil
	}
	ts, ok := t.(string)
	if !ok || (ts != "large" && ts != "small") {
		return layoutError("%s.segment_type is %v, want \"large\" or \"small\"", w, t)
	}
	s.Large = ts == "large"
	return nil
}

// block reads block bw, which must start at off (where the previous one
// ended).
func (c *converter) block(bvi any, bw string, off int64) (Block, error) {
	var b Block
	bd, err := asDict(bvi, bw)
	if err != nil {
		return b, err
	}
	if b.Size, err = getInt(bd, "size", bw); err != nil {
		return b, err
	}
	if b.Address, err = getIntOr(bd, "address", bw, off); err != nil {
		return b, err
	}
	if b.Requested, err = getIntOr(bd, "requested_size", bw, b.Size); err != nil {
		return b, err
	}
	if b.State, err = getString(bd, "state", bw); err != nil {
		return b, err
	}
	switch b.State {
	case "active_allocated", "active_pending_free", "inactive":
	default:
		return b, layoutError("%s.state is %q", bw, truncate(b.State))
	}
	if b.Size <= 0 || b.Address != off || b.Requested < 0 {
		return b, layoutError("%s (address %d, size %d) does not continue its segment at %d", bw, b.Address, b.Size, off)
	}
	if err := c.sizeOK(b.Size, bw, ".size"); err != nil {
		return b, err
	}
	if err := c.sizeOK(b.Requested, bw, ".requested_size"); err != nil {
		return b, err
	}
	if fv := blockFrames(bd); fv != nil {
		if b.Frames, err = c.frameList(fv, bw); err != nil {
			return b, err
		}
	}
	return b, nil
}

// blockFrames is a block's frames: its own, or (torch 2.0) those of its
// last history entry; nil when it has none.
func blockFrames(bd *Dict) any {
	if fv, ok := bd.Get("frames"); ok {
		return fv
	}
	hv, ok := bd.Get("history")
	if !ok {
		return nil
	}
	if hl, ok := hv.(*List); ok && len(hl.Items) > 0 {
		if hd, ok := hl.Items[len(hl.Items)-1].(*Dict); ok {
			fv, _ := hd.Get("frames")
			return fv
		}
	}
	return nil
}

func (c *converter) frameList(v any, what string) ([]Frame, error) {
	l, ok := v.(*List)
	if !ok {
		return nil, layoutError("%s.frames is a %s, not a list", what, TypeName(v))
	}
	if err := c.expandFrames(len(l.Items)); err != nil {
		return nil, err
	}
	if f, ok := c.frames[l]; ok {
		return f, nil
	}
	fs := make([]Frame, 0, len(l.Items))
	for i, fv := range l.Items {
		if d, ok := fv.(*Dict); ok {
			if f, ok := c.frame[d]; ok {
				fs = append(fs, f)
				continue
			}
		}
		fw := fmt.Sprintf("%s.frames[%d]", what, i)
		d, err := asDict(fv, fw)
		if err != nil {
			return nil, err
		}
		var f Frame
		if f.Name, err = getString(d, "name", fw); err != nil {
			return nil, err
		}
		if f.File, err = getString(d, "filename", fw); err != nil {
			return nil, err
		}
		if f.Line, err = getIntOr(d, "line", fw, 0); err != nil {
			return nil, err
		}
		c.frame[d] = f
		fs = append(fs, f)
	}
	c.frames[l] = fs
	return fs, nil
}

var actionByName = func() map[string]Action {
	m := map[string]Action{}
	for a := Action(0); a < numActions; a++ {
		m[actionNames[a]] = a
	}
	return m
}()

func (c *converter) trace(v any, dev int) ([]Event, bool, error) {
	l, ok := v.(*List)
	if !ok {
		return nil, false, layoutError("device_traces[%d] is a %s, not a list", dev, TypeName(v))
	}
	if err := c.expand(len(l.Items)); err != nil {
		return nil, false, err
	}
	evs := make([]Event, 0, len(l.Items))
	hasTime := false
	for i, ev := range l.Items {
		w := fmt.Sprintf("device_traces[%d][%d]", dev, i)
		d, err := asDict(ev, w)
		if err != nil {
			return nil, false, err
		}
		name, err := getString(d, "action", w)
		if err != nil {
			return nil, false, err
		}
		a, ok := actionByName[name]
		if !ok {
			return nil, false, layoutError("%s has the unknown action %q (a layout this reader does not know)", w, truncate(name))
		}
		e := Event{Action: a}
		switch {
		case a == OOM:
			// OOM entries carry device_free in place of addr (newer layouts).
			if e.Addr, err = getIntOr(d, "device_free", w, 0); err != nil {
				return nil, false, err
			}
			if e.Addr, err = getIntOr(d, "addr", w, e.Addr); err != nil {
				return nil, false, err
			}
		case a >= SnapshotTaken:
			if e.Addr, err = getIntOr(d, "addr", w, 0); err != nil {
				return nil, false, err
			}
		default:
			if e.Addr, err = getInt(d, "addr", w); err != nil {
				return nil, false, err
			}
		}
		if e.Size, err = getIntOr(d, "size", w, -1); err != nil || (e.Size == -1 && a < SnapshotTaken) {
			if err == nil {
				err = layoutError("%s has no \"size\"", w)
			}
			return nil, false, err
		}
		if e.Stream, err = getIntOr(d, "stream", w, 0); err != nil {
			return nil, false, err
		}
		if _, ok := d.Get("time_us"); ok {
			hasTime = true
			if e.TimeUS, err = getInt(d, "time_us", w); err != nil {
				return nil, false, err
			}
		}
		if e.Size == -1 {
			e.Size = 0
		}
		if e.Size < 0 || (a <= SegmentUnmap && (e.Addr < 0 || e.Addr > maxAddress)) {
			return nil, false, layoutError("%s (%s) has addr %d, size %d", w, name, e.Addr, e.Size)
		}
		if err := c.sizeOK(e.Size, w, " ("+name+").size"); err != nil {
			return nil, false, err
		}
		if fv, ok := d.Get("frames"); ok {
			if e.Frames, err = c.frameList(fv, w); err != nil {
				return nil, false, err
			}
		}
		evs = append(evs, e)
	}
	return evs, hasTime, nil
}

func settings(v any) (Settings, error) {
	st := DefaultSettings()
	st.Recorded = true
	d, err := asDict(v, "allocator_settings")
	if err != nil {
		return st, err
	}
	if cv, ok := d.Get("PYTORCH_CUDA_ALLOC_CONF"); ok {
		if s, ok := cv.(string); ok {
			st.Conf = s
		}
	}
	if mv, ok := d.Get("max_split_size"); ok {
		m, err := toInt(mv, "allocator_settings.max_split_size")
		if err != nil {
			return st, err
		}
		if m > 0 {
			st.MaxSplitSize = m
		}
	}
	if gv, ok := d.Get("garbage_collection_threshold"); ok {
		switch g := gv.(type) {
		case float64:
			st.GCThreshold = g
		case int64:
			st.GCThreshold = float64(g)
		default:
			return st, layoutError("allocator_settings.garbage_collection_threshold is a %s", TypeName(gv))
		}
		if st.GCThreshold < 0 || st.GCThreshold >= 1 {
			return st, layoutError("allocator_settings.garbage_collection_threshold is %g, want [0, 1)", st.GCThreshold)
		}
	}
	if ev, ok := d.Get("expandable_segments"); ok {
		b, ok := ev.(bool)
		if !ok {
			return st, layoutError("allocator_settings.expandable_segments is a %s", TypeName(ev))
		}
		st.Expandable = b
	}
	if rv, ok := d.Get("roundup_power2_divisions"); ok {
		switch r := rv.(type) {
		case *Dict:
			// {"1": n, "2": n, ..., "32768": n}: interval starting at k MiB.
			for i, k := range r.Keys {
				ks, ok := k.(string)
				var mib int64
				if ok {
					_, err := fmt.Sscan(ks, &mib)
					ok = err == nil
				}
				idx := -1
				for j := 0; j < 16; j++ {
					if int64(1)<<j == mib {
						idx = j
					}
				}
				if !ok || idx < 0 {
					return st, layoutError("allocator_settings.roundup_power2_divisions has the key %v", k)
				}
				n, err := toInt(r.Vals[i], "allocator_settings.roundup_power2_divisions")
				if err != nil {
					return st, err
				}
				st.RoundupPower2Divisions[idx] = n
			}
		case *List:
			for i, x := range r.Items {
				if i >= 16 {
					break
				}
				n, err := toInt(x, "allocator_settings.roundup_power2_divisions")
				if err != nil {
					return st, err
				}
				st.RoundupPower2Divisions[i] = n
			}
		default:
			return st, layoutError("allocator_settings.roundup_power2_divisions is a %s", TypeName(rv))
		}
		for _, n := range st.RoundupPower2Divisions {
			if n < 0 || n > 1<<20 || (n != 0 && n&(n-1) != 0) {
				return st, layoutError("allocator_settings.roundup_power2_divisions holds %d, want 0 or a power of two", n)
			}
		}
	}
	return st, nil
}
