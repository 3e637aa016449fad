package snapshot

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/big"
	"strconv"

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

// maxTimelineBytes bounds what a gzipped timeline may expand to.
const maxTimelineBytes = 4 << 30

// IsTimeline says whether data looks like a torch.profiler memory timeline
// (JSON, gzip or an HTML export) rather than a snapshot pickle.
func IsTimeline(data []byte) bool {
	t := bytes.TrimSpace(data)
	return len(t) > 0 && (t[0] == '[' || t[0] == '<') || bytes.HasPrefix(data, []byte{0x1f, 0x8b})
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
	gz := bytes.HasPrefix(data, []byte{0x1f, 0x8b})
	if gz {
		r, err := gzip.NewReader(bytes.NewReader(data))
		if err != nil {
			return nil, fmt.Errorf("not a gzipped memory timeline: %v", err)
		}
		data, err = io.ReadAll(io.LimitReader(r, maxTimelineBytes+1))
		if err != nil {
			return nil, fmt.Errorf("gzipped memory timeline: %v", err)
		}
		if len(data) > maxTimelineBytes {
			return nil, fmt.Errorf("gzipped memory timeline expands past %d bytes", maxTimelineBytes)
		}
	}
	t := bytes.TrimSpace(data)
	switch {
	case len(t) == 0:
		return nil, errors.New("empty memory timeline")
	case t[0] == '<':
		return nil, errors.New("an HTML memory timeline holds only a picture of the plot; export it to a .json or .raw.json.gz path instead")
	case t[0] != '[':
		return nil, errors.New("not a torch.profiler memory timeline: want a JSON array ([times, sizes] or raw events)")
	}
	var top []json.RawMessage
	if err := json.Unmarshal(t, &top); err != nil {
		return nil, fmt.Errorf("not a torch.profiler memory timeline: %v", oneLine(err))
	}
	var tl *Timeline
	var err error
	if coalescedShape(top) {
		tl, err = coalesced(top)
	} else {
		tl, err = raw(top)
	}
	if err != nil {
		return nil, err
	}
	tl.Gzipped = gz
	return tl, nil
}

// coalescedShape: [times, sizes] with sizes an array of arrays (a raw file's
// second element is one event, an array of numbers).
func coalescedShape(top []json.RawMessage) bool {
	if len(top) != 2 {
		return false
	}
	s := bytes.TrimSpace(top[1])
	if len(s) < 2 || s[0] != '[' {
		return false
	}
	s = bytes.TrimSpace(s[1:])
	return len(s) > 0 && (s[0] == '[' || s[0] == ']')
}

func coalesced(top []json.RawMessage) (*Timeline, error) {
	times, err := intArray(top[0], "the times (first array)")
	if err != nil {
		return nil, err
	}
	var rows []json.RawMessage
	if err := json.Unmarshal(top[1], &rows); err != nil {
		return nil, fmt.Errorf("the sizes (second array): %v", oneLine(err))
	}
	if len(rows) != len(times) {
		return nil, fmt.Errorf("%d times but %d rows of sizes", len(times), len(rows))
	}
	if len(rows) == 0 {
		return nil, errors.New("the memory timeline has no time points")
	}
	tl := &Timeline{Form: "coalesced", Times: times, Sizes: make([][NumProfilerCategories]int64, len(rows))}
	for i, r := range rows {
		if times[i] < -1 || times[i] > maxTimeUS {
			return nil, fmt.Errorf("time point %d: %d µs (want -1, or a time from 0 to 2^62 µs)", i, times[i])
		}
		what := fmt.Sprintf("sizes at time point %d", i)
		v, err := intArray(r, what)
		if err != nil {
			return nil, err
		}
		if len(v) != int(NumProfilerCategories)+1 {
			return nil, fmt.Errorf("%s: %d numbers, want %d (a leading 0, then the %d categories of torch.profiler)", what, len(v), NumProfilerCategories+1, NumProfilerCategories)
		}
		if v[0] != 0 {
			return nil, fmt.Errorf("%s: the leading number is %d, want 0 (no category has index -1)", what, v[0])
		}
		copy(tl.Sizes[i][:], v[1:])
		if i > 0 && times[i] < times[i-1] {
			return nil, fmt.Errorf("time point %d (%d µs) is before the one preceding it (%d µs)", i, times[i], times[i-1])
		}
	}
	return tl, tl.checkSizes()
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

// raw coalesces raw events as _coalesce_timeline does: a new point at every
// new microsecond, pre-existing tensors (time -1) at the smallest time.
func raw(top []json.RawMessage) (*Timeline, error) {
	if len(top) == 0 {
		return nil, errors.New("the memory timeline has no events")
	}
	tl := &Timeline{Form: "raw", RawEvents: len(top)}
	var cur [NumProfilerCategories]int64
	tMin, prevNS := int64(-1), int64(-1)
	pendingIncrement := int64(0) // the bytes an INCREMENT_VERSION moves, between its two events
	for i, e := range top {
		what := fmt.Sprintf("raw event %d", i)
		v, err := intArray(e, what)
		if err != nil {
			return nil, err
		}
		if len(v) != 4 {
			return nil, fmt.Errorf("%s: %d numbers, want 4 (time in ns, action, bytes, category)", what, len(v))
		}
		ns, action, n, c := v[0], v[1], v[2], v[3]
		if err := rawEventOK(what, ns, prevNS, action, n, c, pendingIncrement); err != nil {
			return nil, err
		}
		prevNS = ns
		if action == profIncrementVersion {
			if pendingIncrement == 0 {
				pendingIncrement = -n
			} else {
				pendingIncrement = 0
			}
		}
		t := ns
		if t != -1 {
			// _coalesce_timeline's int(t / 1000): Python's true division
			// rounds the exact quotient to the nearest float, then int()
			// truncates (at today's epoch nanoseconds, past 2^53, that is
			// not t / 1000 in integers).
			f, _ := new(big.Rat).SetFrac64(t, 1000).Float64()
			t = int64(f)
		}
		if tMin == -1 || (t < tMin && t > 0) {
			tMin = t
		}
		if len(tl.Times) == 0 || t != tl.Times[len(tl.Times)-1] {
			if len(tl.Times) > 0 {
				tl.Sizes = append(tl.Sizes, cur)
			}
			tl.Times = append(tl.Times, t)
		}
		// Within a time the running sum may dip below 0 (checkSizes
		// judges each point's end), but never leave ±maxLive: past it,
		// the next event could wrap int64.
		switch {
		case n > 0 && cur[c] > maxLive-n:
			return nil, fmt.Errorf("%s (time point %d): the live bytes of %s pass 4 EiB (2^62 bytes), more than any device holds", what, len(tl.Times)-1, ProfilerCategory(c))
		case n < 0 && cur[c] < -maxLive-n:
			return nil, fmt.Errorf("%s (time point %d): the live bytes of %s fall below -4 EiB (-2^62 bytes)", what, len(tl.Times)-1, ProfilerCategory(c))
		}
		cur[c] += n
	}
	if pendingIncrement != 0 {
		return nil, fmt.Errorf("raw event %d: an INCREMENT_VERSION (action 3) without its second half", len(top)-1)
	}
	tl.Sizes = append(tl.Sizes, cur)
	for i := range tl.Times {
		if tl.Times[i] < 0 {
			tl.Times[i] = tMin
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

// intArray decodes a JSON array of integers.
func intArray(m json.RawMessage, what string) ([]int64, error) {
	var items []json.RawMessage
	if err := json.Unmarshal(m, &items); err != nil {
		return nil, fmt.Errorf("%s: want an array of integers: %v", what, oneLine(err))
	}
	out := make([]int64, len(items))
	for i, it := range items {
		s := string(bytes.TrimSpace(it))
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("%s, item %d: %s is not an integer", what, i, truncate(s))
		}
		out[i] = v
	}
	return out, nil
}

func oneLine(err error) string {
	return string(bytes.ReplaceAll([]byte(err.Error()), []byte("\n"), []byte(" ")))
}
