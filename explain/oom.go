package explain

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/memplan/memplan/allocator"
	"github.com/memplan/memplan/snapshot"
	"github.com/memplan/memplan/units"
)

// OOM says which phase and which lifetime objects hit the device's line.
type OOM struct {
	// Recorded: the trace holds the allocator's oom event; otherwise the
	// trace was replayed through the allocator model on Capacity bytes.
	Recorded bool  `json:"recorded"`
	Capacity int64 `json:"capacity_bytes,omitempty"`
	// Event is the failing request's trace index (-1: the memory alive
	// before recording does not fit), Request its bytes, Phase and Site
	// where it came from.
	Event   int    `json:"event"`
	Request int64  `json:"request_bytes"`
	Phase   string `json:"phase"`
	Site    string `json:"site,omitempty"`
	// Reserved and Allocated: the model's totals when it failed.
	Reserved  int64 `json:"reserved_bytes,omitempty"`
	Allocated int64 `json:"allocated_bytes,omitempty"`
	// Live is what was alive when the request failed, by category and
	// code site; Lifetimes groups the same bytes by the phases that
	// allocated them and would have freed them.
	Live      Peak    `json:"live"`
	Lifetimes []Share `json:"lifetimes"`
	Paragraph string  `json:"summary"`
}

// DiagnoseOOM finds where rep's device ran out of memory: at the trace's
// own oom event, or, when it has none and capacity > 0, where the allocator
// model replaying the trace on capacity bytes fails first.
func DiagnoseOOM(s *snapshot.Snapshot, rep *Report, capacity int64) (*OOM, error) {
	return DiagnoseOOMContext(context.Background(), s, rep, capacity)
}

// DiagnoseOOMContext is DiagnoseOOM returning ctx's cause once ctx is
// done, its replays stopped as Explain's are.
func DiagnoseOOMContext(ctx context.Context, s *snapshot.Snapshot, rep *Report, capacity int64) (*OOM, error) {
	var trace []snapshot.Event
	if int(rep.Device) < len(s.Traces) {
		trace = s.Traces[rep.Device][:rep.Events]
	}
	o := &OOM{Event: -2}
	for i, e := range trace {
		if e.Action == snapshot.OOM && capacity <= 0 {
			o.Recorded, o.Event = true, i
			// The failed request is the next alloc's size when PyTorch
			// retried; the oom event itself records the free device bytes.
			o.Request = e.Size
			break
		}
	}
	if !o.Recorded {
		if capacity <= 0 {
			return nil, &CapacityError{File: rep.File}
		}
		c, err := allocator.ReplayCappedContext(ctx, s, rep.Device, capacity)
		if ctx.Err() != nil {
			return nil, context.Cause(ctx)
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", rep.File, err)
		}
		if !c.OOM {
			return nil, &CapacityError{File: rep.File, Capacity: units.Bytes(capacity), Reserved: units.Bytes(c.Reserved)}
		}
		o.Capacity, o.Event, o.Request, o.Reserved, o.Allocated = capacity, c.Event, c.Size, c.Reserved, c.Allocated
	}
	// What is alive when the request fails: the state after the event
	// before it.
	r, err := allocator.ReplayDeviceContext(ctx, s, rep.Device)
	if ctx.Err() != nil {
		return nil, context.Cause(ctx)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", rep.File, err)
	}
	// (before recording: every block alive then, which did not all fit)
	ev := max(o.Event-1, -1)
	o.Live = rep.peakAt(ev, r, trace)
	o.Phase = PhaseBefore.String()
	if o.Event >= 0 {
		o.Phase = rep.Timeline[o.Event+1].Phase.String()
		if trace[o.Event].Action == snapshot.Alloc {
			o.Site = site(trace[o.Event].Frames)
		}
	}
	life := map[string]int64{}
	for _, a := range rep.Allocations {
		if a.Alloc <= ev && (a.Free < 0 || a.Free > ev) {
			from, until := "allocated in "+a.Phase.String(), "alive at the dump"
			if a.Alloc < 0 {
				from = "allocated before recording"
			}
			if a.Free >= 0 {
				until = "freed in " + a.FreePhase.String()
			}
			life[CategoryName(a.Category)+", "+from+", "+until] += a.Requested
		}
	}
	for n, b := range life {
		o.Lifetimes = append(o.Lifetimes, Share{n, b})
	}
	slices.SortFunc(o.Lifetimes, func(a, b Share) int {
		if a.Bytes != b.Bytes {
			return cmp.Compare(b.Bytes, a.Bytes)
		}
		return strings.Compare(a.Name, b.Name)
	})
	o.Paragraph = o.paragraph()
	return o, nil
}

func (o *OOM) paragraph() string {
	var b strings.Builder
	if o.Recorded {
		fmt.Fprintf(&b, "The run ran out of memory at event %d", o.Event)
	} else {
		fmt.Fprintf(&b, "On %s the allocator model runs out of memory at event %d", units.Bytes(o.Capacity), o.Event)
	}
	if o.Event < 0 {
		b.WriteString(" placing the memory alive before recording began")
	} else {
		fmt.Fprintf(&b, " in %s", o.Phase)
	}
	if o.Site != "" {
		fmt.Fprintf(&b, " at %s", o.Site)
	}
	fmt.Fprintf(&b, " asking for %s", units.Bytes(o.Request))
	if !o.Recorded {
		fmt.Fprintf(&b, " with %s reserved and %s in blocks", units.Bytes(o.Reserved), units.Bytes(o.Allocated))
	}
	fmt.Fprintf(&b, "; %s was alive", units.Bytes(o.Live.Bytes))
	for i, c := range o.Live.ByCategory {
		if i == 3 {
			break
		}
		sep := ", "
		if i == 0 {
			sep = ": "
		}
		fmt.Fprintf(&b, "%s%.0f%% %s", sep, 100*float64(c.Bytes)/float64(max(o.Live.Bytes, 1)), c.Name)
	}
	if len(o.Lifetimes) > 0 {
		fmt.Fprintf(&b, "; the largest lifetime group is %s (%s)", o.Lifetimes[0].Name, units.Bytes(o.Lifetimes[0].Bytes))
	}
	b.WriteString(".")
	return b.String()
}
