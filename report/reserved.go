package report

import (
	"fmt"
	"strings"

	"github.com/memplan/memplan/engine"
	"github.com/memplan/memplan/units"
)

// reservedJSON is the caching allocator's prediction (engine.Reserved).
type reservedJSON struct {
	PeakBytes            units.Bytes `json:"peak_bytes"`
	AllocatedAtPeakBytes units.Bytes `json:"allocated_at_peak_bytes"`
	FragmentationBytes   units.Bytes `json:"fragmentation_bytes"`
	Segments             int         `json:"segments"`
	Phase                string      `json:"phase"`
	Op                   string      `json:"op"`
	OpIndex              int         `json:"op_index"`
	FirstStep            bool        `json:"first_step,omitempty"`
	Fits                 bool        `json:"fits"`
	DecidesFit           bool        `json:"decides_fit"`
	OOMOpIndex           *int        `json:"oom_op_index,omitempty"`
	Settings             struct {
		Expandable             bool    `json:"expandable_segments"`
		MaxSplitSize           int64   `json:"max_split_size,omitempty"`
		RoundupPower2Divisions []int64 `json:"roundup_power2_divisions,omitempty"`
		GCThreshold            float64 `json:"garbage_collection_threshold,omitempty"`
	} `json:"allocator_settings"`
}

type reservedAt struct {
	op, phase string
	index     int
	first     bool
}

// reservedWorst is the replay that reached the reported reserved peak, with
// its program's op at the peak.
func reservedWorst(res *engine.Result) (at reservedAt, seg int, alloc units.Bytes) {
	rv := res.Reserved
	w, prog, first := rv.Steady, res.Program, false
	if rv.First != nil && rv.First.PeakReserved > w.PeakReserved {
		w, prog, first = rv.First, res.FirstProgram, true
	}
	out := reservedAt{op: "resident state", phase: "before the iteration", index: w.PeakOp, first: first}
	if w.PeakOp >= 0 {
		op := &prog.Ops[w.PeakOp]
		out.op, out.phase = where(op.Name, op.Module), op.Phase.String()
	}
	return out, w.Segments, units.Bytes(w.AllocatedAtPeak)
}

func buildReserved(res *engine.Result) *reservedJSON {
	rv := res.Reserved
	if rv == nil {
		return nil
	}
	at, seg, alloc := reservedWorst(res)
	j := &reservedJSON{PeakBytes: rv.Peak, AllocatedAtPeakBytes: alloc, FragmentationBytes: rv.Fragmentation, Segments: seg,
		Phase: at.phase, Op: at.op, OpIndex: at.index, FirstStep: at.first, Fits: rv.FitsOnReserved, DecidesFit: rv.DecidesFit}
	if rv.Capped != nil && rv.Capped.OOM {
		j.OOMOpIndex = &rv.Capped.OOMOp
	}
	c := rv.Config
	j.Settings.Expandable, j.Settings.GCThreshold = c.Expandable, c.GCThreshold
	if c.MaxSplitSize > 0 && c.MaxSplitSize < 1<<62 {
		j.Settings.MaxSplitSize = c.MaxSplitSize
	}
	if c.RoundupPower2Divisions != ([16]int64{}) {
		j.Settings.RoundupPower2Divisions = c.RoundupPower2Divisions[:]
	}
	return j
}

// writeReservedLine says what the caching allocator reserves and where the
// OOM line falls.
func writeReservedLine(b *strings.Builder, res *engine.Result) {
	rv := res.Reserved
	if rv == nil {
		return
	}
	at, seg, alloc := reservedWorst(res)
	first := ""
	if at.first {
		first = " of the first step"
	}
	fmt.Fprintf(b, "Reserved %s predicted by the caching allocator (%s in blocks, %s cached or split off in %d segments) in %s%s at %s",
		rv.Peak, alloc, rv.Fragmentation, seg, at.phase, first, at.op)
	if res.Capacity > 0 {
		switch {
		case rv.Capped != nil && rv.Capped.OOM && rv.Capped.OOMOp < 0:
			b.WriteString("; out of memory placing the resident state (parameters, optimizer state) before the first op")
		case rv.Capped != nil && rv.Capped.OOM:
			prog := res.Program
			if at.first {
				prog = res.FirstProgram // the capped replay ran the worst program
			}
			op := prog.Ops[rv.Capped.OOMOp]
			fmt.Fprintf(b, "; out of memory at %s (%s) even after freeing the cache", where(op.Name, op.Module), op.Phase)
		case rv.Capped != nil:
			b.WriteString("; over the capacity, it fits only by freeing its cache")
		}
		if rv.DecidesFit {
			b.WriteString(" (fits decided on reserved)")
		}
	}
	b.WriteString("\n")
}

// reservedSeries is the reserved bytes the caching allocator model predicts
// at each point of r's timeline (its op's high-water mark in the replay of
// r.Program), nil when the reserved prediction is off or was made without a
// timeline.
func reservedSeries(r *engine.Result) []units.Bytes {
	if r.Reserved == nil || r.Reserved.Steady == nil || len(r.Reserved.Steady.Timeline) != len(r.Program.Ops) {
		return nil
	}
	rt := r.Reserved.Steady.Timeline
	out := make([]units.Bytes, len(r.Sim.Timeline))
	for i, pt := range r.Sim.Timeline {
		out[i] = units.Bytes(rt[pt.Op])
	}
	return out
}
