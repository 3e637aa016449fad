package snapshot

import (
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"math/big"

	"github.com/memplan/memplan/internal/boundedio"
	"github.com/memplan/memplan/units"
)

// This file reads torch.profiler's memory timeline, the files
// profile(profile_memory=True).export_memory_timeline(path) writes
// (torch/profiler/profiler.py and torch/profiler/_memory_profiler.py,
// MemoryProfileTimeline, @ v2.14.1), chosen there by the path's suffix:
//
//   - .json (or .json.gz, the same gzipped): [times, sizes], one entry per
//     distinct timestamp (_coalesce_timeline): times in microseconds (the
//     event's nanoseconds as int(t / 1000); pre-existing tensors at the
//     smallest time), sizes the live bytes by category after every event of
//     that timestamp, as 9 integers: a 0 that is never written, then one per
//     category in _CATEGORY_TO_INDEX's order (ProfilerCategory);
//   - .raw.json.gz: one [time_ns, action, numbytes, category] per memory
//     event (export_memory_timeline_raw): time -1 for tensors that existed
//     before profiling, action an Action's value (1 PREEXISTING, 2 CREATE,
//     3 INCREMENT_VERSION, 4 DESTROY), numbytes negative for a DESTROY and
//     for the first of INCREMENT_VERSION's two events (the bytes leave the
//     old version's category and enter the new one's), category an index of
//     _CATEGORY_TO_INDEX;
//   - .html: a matplotlib PNG of the same plot, which holds no numbers.
//
// A raw file is coalesced the way _coalesce_timeline coalesces, so both
// forms of one profile give the same timeline.

// ProfilerCategory is a category of torch.profiler's memory profile
// (torch.profiler._memory_profiler.Category), numbered as
// _CATEGORY_TO_INDEX numbers them.
type ProfilerCategory uint8

// torch.profiler's categories, in _CATEGORY_TO_INDEX's order.
const (
	ProfParameter ProfilerCategory = iota
	ProfOptimizerState
	ProfInput
	ProfTemporary
	ProfActivation
	ProfGradient
	ProfAutogradDetail
	ProfUnknown // None: a tensor the profiler did not categorise
	NumProfilerCategories
)

var profilerCategoryNames = [NumProfilerCategories]string{"PARAMETER", "OPTIMIZER_STATE", "INPUT", "TEMPORARY", "ACTIVATION", "GRADIENT", "AUTOGRAD_DETAIL", "unknown"}

// String is the name torch.profiler gives the category (Category.name;
// "unknown" for None).
func (c ProfilerCategory) String() string {
	if c < NumProfilerCategories {
		return profilerCategoryNames[c]
	}
	return fmt.Sprintf("category %d", c)
}

// The actions of a raw timeline (torch.profiler._memory_profiler.Action).
const (
	profPreexisting = 1 + iota
	profCreate
	profIncrementVersion
	profDestroy
)

// Timeline is a torch.profiler memory timeline of one device.
type Timeline struct {
	// Form is "coalesced" ([times, sizes]) or "raw" (one entry per event).
	Form    string
	Gzipped bool
	// RawEvents is the number of events of a raw file.
	RawEvents int
	// Times are the time points in microseconds, Sizes the live bytes of
	// each category after every event of that time.
	Times []int64
	Sizes [][NumProfilerCategories]int64
}

// Total is the live bytes at point i. A timeline the reader accepted sums
// to at most units.MaxBytes at every point, so this does not wrap.
func (t *Timeline) Total(i int) int64 {
	var s int64
	for _, b := range t.Sizes[i] {
		s += b
	}
	return s
}

// A memory timeline's size is bounded by what torch.profiler writes for the
// largest profile it can take, so that a small gzipped file cannot expand
// into gigabytes of work (a 51 KB file of 50 MB of "0," took 1.8 GB and 6 s,
// a 2 MB one of 2 GiB of spaces 4.6 GB and 10 s):
//
//   - maxTimelinePoints: a training step of a large model has some 10^4
//     distinct microseconds with memory events (cpu_mlp_step.json, one step
//     of a small MLP, has 714), and a profile schedule records a few steps;
//     2^21 points is a hundred times that, and more than the profiler itself
//     holds (its Python objects take about a kilobyte per event);
//   - maxRawEvents: four raw events per point;
//   - maxTimelineBytes: a point as export_memory_timeline writes it
//     (json.dump, ", " separators) is at most about 140 bytes (a 16-digit
//     time, nine sizes of at most 12 digits) and a raw event about 45, so
//     256 bytes a point (512 MiB) holds any real file. Plain or gzipped,
//     the data is read as a stream (timeline_scan.go), holding only the
//     points.
const (
	maxTimelinePoints = 1 << 21
	maxRawEvents      = 4 * maxTimelinePoints
	maxTimelineBytes  = 256 * maxTimelinePoints
)

// IsTimeline says whether data looks like a torch.profiler memory timeline
// (JSON, gzip or an HTML export) rather than a snapshot pickle.
func IsTimeline(data []byte) bool {
	t := bytes.TrimSpace(boundedio.TrimBOM(data))
	if len(t) == 0 {
		// Only whitespace: no pickle starts so, and the timeline reader
		// says what it holds.
		return len(data) > 0
	}
	return t[0] == '[' || t[0] == '<' || bytes.HasPrefix(data, []byte{0x1f, 0x8b})
}

// ReadTimelineFile reads a torch.profiler memory timeline. Errors are one
// line naming the file.
func ReadTimelineFile(path string) (*Timeline, error) {
	data, err := boundedio.ReadFile(path, boundedio.LargeFile)
	if err != nil {
		return nil, fmt.Errorf("reading memory timeline: %w", err)
	}
	tl, err := ParseTimeline(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return tl, nil
}

// ParseTimeline decodes a memory timeline in any of the data forms
// export_memory_timeline writes (plain or gzipped JSON, coalesced or raw).
func ParseTimeline(data []byte) (*Timeline, error) {
	var r io.Reader = bytes.NewReader(boundedio.TrimBOM(data))
	gz := bytes.HasPrefix(data, []byte{0x1f, 0x8b})
	if gz {
		z, err := gzip.NewReader(r)
		if err != nil {
			return nil, fmt.Errorf("not a gzipped memory timeline: %v", err)
		}
		r = z
	}
	tl, err := readTimelineData(newScanner(r, gz))
	if err != nil {
		return nil, errors.New(oneLine(err))
	}
	tl.Gzipped = gz
	return tl, nil
}

// readTimelineData reads the top array and tells the forms apart by its second
// element: [times, sizes] has an array of arrays (or an empty one) there,
// a raw file one event, an array of numbers.
func readTimelineData(s *tlScanner) (*Timeline, error) {
	c, ok, err := s.peek()
	switch {
	case err != nil:
		return nil, err
	case !ok && s.read > 0:
		return nil, errors.New("empty memory timeline: it holds only whitespace")
	case !ok:
		return nil, errors.New("empty memory timeline")
	case c == '<':
		return nil, errors.New("an HTML memory timeline holds only a picture of the plot; export it to a .json or .raw.json.gz path instead")
	case c != '[':
		return nil, errors.New("not a torch.profiler memory timeline: want a JSON array ([times, sizes] or raw events)")
	}
	s.pos++
	if c, err = s.next("the first element"); err != nil {
		return nil, err
	}
	if c == ']' {
		return nil, errNoEvents
	}
	// The first element: the times, or raw event 0.
	const first = "the first array (the times, or raw event 0)"
	if err := s.open(first); err != nil {
		return nil, err
	}
	var head []int64
	if _, err := s.ints(first, func(_ int, v int64) error {
		if len(head) == maxTimelinePoints {
			return fmt.Errorf("%s: more than %d items, the most memplan reads (%d time points)", first, maxTimelinePoints, maxTimelinePoints)
		}
		head = append(head, v)
		return nil
	}); err != nil {
		return nil, err
	}
	rc := &rawCoalescer{tl: &Timeline{Form: "raw"}, tMin: -1, prevNS: -1}
	if c, err = s.next("] or , after the first array"); err != nil {
		return nil, err
	}
	if c == ']' {
		s.pos++
		if err := rc.add(0, head, len(head)); err != nil {
			return nil, err
		}
		return rc.finish(s)
	}
	if c != ',' {
		return nil, syntaxErr("want , or ] after the first array, got %s", s.token())
	}
	s.pos++
	if err := s.open("the second element (the sizes, or raw event 1)"); err != nil {
		return nil, err
	}
	if c, err = s.next("the second element"); err != nil {
		return nil, err
	}
	if c == '[' || c == ']' {
		return coalesced(s, head)
	}
	if err := rc.add(0, head, len(head)); err != nil {
		return nil, err
	}
	return rc.rest(s)
}

// coalesced reads the sizes of a [times, sizes] file whose second array's
// '[' is read, row by row.
func coalesced(s *tlScanner, times []int64) (*Timeline, error) {
	tl := &Timeline{Form: "coalesced", Times: times, Sizes: make([][NumProfilerCategories]int64, 0, len(times))}
	rows, err := s.array("the sizes (second array)", func(i int) error {
		if i >= len(times) { // counted for the message, not kept
			if err := s.open("the sizes (second array)"); err != nil {
				return err
			}
			_, err := s.ints("the sizes (second array)", func(int, int64) error { return nil })
			return err
		}
		return tl.row(s, i)
	})
	if err != nil {
		return nil, err
	}
	if rows != len(times) {
		return nil, fmt.Errorf("%d times but %d rows of sizes", len(times), rows)
	}
	if rows == 0 {
		return nil, errors.New("the memory timeline has no time points")
	}
	if c, err := s.next("the ] that closes the timeline"); err != nil {
		return nil, err
	} else if c != ']' {
		return nil, syntaxErr("want [times, sizes], got %s after the sizes", s.token())
	}
	s.pos++
	if err := s.atEnd(); err != nil {
		return nil, err
	}
	return tl, tl.checkSizes()
}

// row reads the sizes at time point i and checks its time.
func (tl *Timeline) row(s *tlScanner, i int) error {
	times := tl.Times
	if times[i] < -1 || times[i] > maxTimeUS {
		return fmt.Errorf("time point %d: %d µs (want -1, or a time from 0 to 2^62 µs)", i, times[i])
	}
	if i > 0 && times[i] < times[i-1] {
		return fmt.Errorf("time point %d (%d µs) is before the one preceding it (%d µs)", i, times[i], times[i-1])
	}
	what := fmt.Sprintf("sizes at time point %d", i)
	if err := s.open(what); err != nil {
		return err
	}
	var v [NumProfilerCategories + 1]int64
	n, err := s.ints(what, func(j int, x int64) error {
		if j < len(v) {
			v[j] = x
		}
		return nil
	})
	if err != nil {
		return err
	}
	if n != len(v) {
		return fmt.Errorf("%s: %d numbers, want %d (a leading 0, then the %d categories of torch.profiler)", what, n, NumProfilerCategories+1, NumProfilerCategories)
	}
	if v[0] != 0 {
		return fmt.Errorf("%s: the leading number is %d, want 0 (no category has index -1)", what, v[0])
	}
	var sizes [NumProfilerCategories]int64
	copy(sizes[:], v[1:])
	tl.Sizes = append(tl.Sizes, sizes)
	return nil
}

// maxLive bounds the live bytes of a time point, and of one category and one
// raw event: 2^62 bytes (units.MaxBytes), far past any device, so that a
// sum of two stays inside int64. A total past int64 wrapped, and explain
// reported the wrong point as the peak.
const maxLive = int64(units.MaxBytes)

// maxTimeUS bounds a [times, sizes] file's times. The profiler writes -1
// or int(ns / 1000) of an int64 ns, so any real time is under it, and the
// span explain reports (last − first) cannot wrap: times far apart made it
// negative.
const maxTimeUS = int64(1) << 62

// checkSizes refuses a negative live size, and a point whose sizes sum
// past maxLive (each size is then at most maxLive, and so is Total).
func (t *Timeline) checkSizes() error {
	for i, row := range t.Sizes {
		var total int64
		for c, b := range row {
			if b < 0 {
				return fmt.Errorf("%s is %d bytes at time point %d (%d µs): live memory cannot be negative", ProfilerCategory(c), b, i, t.Times[i])
			}
			if b > maxLive-total {
				return fmt.Errorf("time point %d (%d µs): the live bytes sum past 4 EiB (2^62 bytes), more than any device holds", i, t.Times[i])
			}
			total += b
		}
	}
	return nil
}

// rawCoalescer coalesces raw events as _coalesce_timeline does: a new
// point at every new microsecond, pre-existing tensors (time -1) at the
// smallest time.
type rawCoalescer struct {
	tl               *Timeline
	cur              [NumProfilerCategories]int64
	tMin, prevNS     int64
	prevUS           int64 // the microseconds of prevNS
	pendingIncrement int64 // the bytes an INCREMENT_VERSION moves, between its two events
}

// rest reads raw events 1 on, the second's '[' read, and the top array's ']'.
func (rc *rawCoalescer) rest(s *tlScanner) (*Timeline, error) {
	var ev [4]int64
	for i := 1; ; i++ {
		if i == maxRawEvents {
			return nil, fmt.Errorf("more than %d raw events, the most memplan reads (4 for each of %d time points)", maxRawEvents, maxTimelinePoints)
		}
		what := fmt.Sprintf("raw event %d", i)
		if i > 1 {
			if err := s.open(what); err != nil {
				return nil, err
			}
		}
		n, err := s.ints(what, func(j int, v int64) error {
			if j < len(ev) {
				ev[j] = v
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
		if err := rc.add(i, ev[:], n); err != nil {
			return nil, err
		}
		c, err := s.next("] or , after " + what)
		if err != nil {
			return nil, err
		}
		s.pos++
		if c == ']' {
			return rc.finish(s)
		}
		if c != ',' {
			s.pos--
			return nil, syntaxErr("want , or ] after %s, got %s", what, s.token())
		}
	}
}

// add coalesces raw event i, of count numbers (the first of them in v).
func (rc *rawCoalescer) add(i int, v []int64, count int) error {
	what := fmt.Sprintf("raw event %d", i)
	if count != 4 {
		return fmt.Errorf("%s: %d numbers, want 4 (time in ns, action, bytes, category)", what, count)
	}
	ns, action, n, c := v[0], v[1], v[2], v[3]
	if err := rawEventOK(what, ns, rc.prevNS, action, n, c, rc.pendingIncrement); err != nil {
		return err
	}
	if action == profIncrementVersion {
		if rc.pendingIncrement == 0 {
			rc.pendingIncrement = -n
		} else {
			rc.pendingIncrement = 0
		}
	}
	t := rc.micros(ns)
	rc.prevNS = ns
	if rc.tMin == -1 || (t < rc.tMin && t > 0) {
		rc.tMin = t
	}
	tl := rc.tl
	if len(tl.Times) == 0 || t != tl.Times[len(tl.Times)-1] {
		if len(tl.Times) == maxTimelinePoints {
			return fmt.Errorf("%s: more than %d time points, the most memplan reads", what, maxTimelinePoints)
		}
		if len(tl.Times) > 0 {
			tl.Sizes = append(tl.Sizes, rc.cur)
		}
		tl.Times = append(tl.Times, t)
	}
	// Within a time the running sum may dip below 0 (checkSizes judges
	// each point's end), but never leave ±maxLive: past it, the next event
	// could wrap int64.
	switch {
	case n > 0 && rc.cur[c] > maxLive-n:
		return fmt.Errorf("%s (time point %d): the live bytes of %s pass 4 EiB (2^62 bytes), more than any device holds", what, len(tl.Times)-1, ProfilerCategory(c))
	case n < 0 && rc.cur[c] < -maxLive-n:
		return fmt.Errorf("%s (time point %d): the live bytes of %s fall below -4 EiB (-2^62 bytes)", what, len(tl.Times)-1, ProfilerCategory(c))
	}
	rc.cur[c] += n
	rc.tl.RawEvents = i + 1
	return nil
}

// micros is _coalesce_timeline's int(t / 1000) of an event's ns: Python's
// true division rounds the exact quotient to the nearest float, then int()
// truncates (at today's epoch nanoseconds, past 2^53, that is not t / 1000
// in integers). Events of one ns share it, computed once.
func (rc *rawCoalescer) micros(ns int64) int64 {
	if ns == -1 {
		return -1
	}
	if ns == rc.prevNS && ns != -1 {
		return rc.prevUS
	}
	f, _ := new(big.Rat).SetFrac64(ns, 1000).Float64()
	rc.prevUS = int64(f)
	return rc.prevUS
}

// finish checks what follows the top array and closes the last point.
func (rc *rawCoalescer) finish(s *tlScanner) (*Timeline, error) {
	if err := s.atEnd(); err != nil {
		return nil, err
	}
	tl := rc.tl
	if rc.pendingIncrement != 0 {
		return nil, fmt.Errorf("raw event %d: an INCREMENT_VERSION (action 3) without its second half", tl.RawEvents-1)
	}
	tl.Sizes = append(tl.Sizes, rc.cur)
	for i := range tl.Times {
		if tl.Times[i] < 0 {
			tl.Times[i] = rc.tMin
		}
	}
	return tl, tl.checkSizes()
}

// rawEventOK checks one raw event against the one before it.
func rawEventOK(what string, ns, prevNS, action, n, c, pendingIncrement int64) error {
	switch {
	case n > maxLive || n < -maxLive: // first: -n of int64's least wraps
		return fmt.Errorf("%s: %d bytes, past 4 EiB (2^62 bytes), more than any device holds", what, n)
	case ns < -1:
		return fmt.Errorf("%s: time %d ns (want -1 for a tensor that existed before profiling, or a timestamp)", what, ns)
	case ns < prevNS:
		return fmt.Errorf("%s: time %d ns is before the preceding event's %d ns (torch.profiler sorts its events by time)", what, ns, prevNS)
	case action < profPreexisting || action > profDestroy:
		return fmt.Errorf("%s: action %d (want 1 PREEXISTING, 2 CREATE, 3 INCREMENT_VERSION or 4 DESTROY)", what, action)
	case c < 0 || c >= int64(NumProfilerCategories):
		return fmt.Errorf("%s: category %d (want 0 to %d, torch.profiler's categories)", what, c, NumProfilerCategories-1)
	case pendingIncrement != 0 && (action != profIncrementVersion || n != pendingIncrement || ns != prevNS):
		return fmt.Errorf("%s: the second half of an INCREMENT_VERSION must follow its first (action 3, %d bytes, the same time)", what, pendingIncrement)
	case pendingIncrement == 0 && action == profIncrementVersion && n > 0:
		return fmt.Errorf("%s: an INCREMENT_VERSION starts with the bytes leaving the old version (negative), got %d", what, n)
	case (action == profPreexisting || action == profCreate) && n < 0:
		return fmt.Errorf("%s: a %s of %d bytes (want a size of at least 0)", what, map[int64]string{profPreexisting: "PREEXISTING", profCreate: "CREATE"}[action], n)
	case action == profDestroy && n > 0:
		return fmt.Errorf("%s: a DESTROY of +%d bytes (torch.profiler writes the bytes a DESTROY frees as negative)", what, n)
	case action == profPreexisting && ns != -1:
		return fmt.Errorf("%s: a PREEXISTING tensor at time %d ns (want -1)", what, ns)
	}
	return nil
}

func oneLine(err error) string {
	return string(bytes.ReplaceAll([]byte(err.Error()), []byte("\n"), []byte(" ")))
}
