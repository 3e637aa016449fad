// Package explain says where a real run's memory went: it replays a CUDA
// memory snapshot through the allocator model, finds the allocated and
// reserved peaks, and sorts every allocation into memplan's ledger
// categories from its stack frames and its lifetime.
//
// Phases come from the frames of each allocation (the event's stack as
// torch.cuda.memory._record_memory_history recorded it):
//   - optimizer: a frame of torch/optim or a step() in a file named
//     optim*/optimizer*; zero_grad: a zero_grad() frame;
//   - backward: a frame named backward (torch.Tensor.backward, an autograd
//     Function's backward), an autograd engine frame in C++, or no Python
//     frame at all (the autograd engine's own thread records none);
//   - loss: a frame of cross_entropy / nll_loss / a *loss* function;
//   - forward: a frame of nn.Module's call or a forward();
//   - other: Python frames of none of those (data loading, .to(device)).
//
// Categories follow from the phase an allocation is made in and the phase it
// dies in (ir.Category's ledger):
//   - made in the optimizer step: optimizer state when it outlives the step,
//     temporaries when it dies in it;
//   - made in backward: gradients when they outlive the backward pass (the
//     .grad AccumulateGrad keeps), temporaries (activation gradients,
//     workspaces) when they die in it;
//   - made in forward or loss: activations when backward frees them (saved
//     for backward, or the output the loss keeps), temporaries when the
//     forward frees them, other when they outlive a window without backward
//     (an inference's outputs);
//   - cuBLAS workspaces: temporaries;
//   - made before recording began: their dump frames decide when the dump has
//     them; else optimizer state when the step frees them (a state that the
//     step replaces), gradients when zero_grad or backward frees them,
//     activations (kept by the loop from the previous iteration) when the
//     forward frees them, and parameters when they live to the dump.
package explain

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/memplan/memplan/allocator"
	"github.com/memplan/memplan/ir"
	"github.com/memplan/memplan/snapshot"
	"github.com/memplan/memplan/units"
)

// Phase of an allocation.
type Phase uint8

// Phases.
const (
	PhaseUnknown Phase = iota
	PhaseForward
	PhaseLoss
	PhaseBackward
	PhaseZeroGrad
	PhaseOptimizer
	PhaseOther
	PhaseBefore // allocated before recording began
)

var phaseNames = []string{"unknown", "forward", "loss", "backward", "zero_grad", "optimizer", "other", "before recording"}

func (p Phase) String() string { return phaseNames[p] }

// Unknown is the category of an allocation explain cannot place.
const Unknown = ir.NumCategories

// CategoryName names a category, Unknown included.
func CategoryName(c ir.Category) string {
	if c == Unknown {
		return "unknown"
	}
	return c.String()
}

// Allocation is one block's life as the trace shows it.
type Allocation struct {
	Addr, Requested, Block int64
	Alloc, Free            int // event indexes; Alloc -1: before recording; Free -1: alive at the dump
	Phase, FreePhase       Phase
	Category               ir.Category
	Site                   string // innermost frame of user code: "function (file:line)"
}

// Share is bytes of one name.
type Share struct {
	Name  string `json:"name"`
	Bytes int64  `json:"bytes"`
}

// Peak is a peak of the device.
type Peak struct {
	Bytes      int64   `json:"bytes"`
	BlockBytes int64   `json:"block_bytes,omitempty"` // allocated in whole blocks
	Reserved   int64   `json:"reserved_bytes"`
	Event      int     `json:"event"`             // -1: before the first event; a profiler timeline's time point
	TimeUS     int64   `json:"time_us,omitempty"` // a profiler timeline's peak, from its first point
	Phase      string  `json:"phase"`
	Site       string  `json:"site,omitempty"`
	ByCategory []Share `json:"by_category"`
	BySite     []Share `json:"by_site"`
	// Classified is the fraction of the live bytes in a category other than
	// unknown.
	Classified float64 `json:"classified"`
	// ProfilerCategories are a profiler timeline's live bytes in its own
	// categories (ProfilerLedger maps them to the ledger).
	ProfilerCategories []Share `json:"profiler_categories,omitempty"`
}

// Report is what explain says about one device.
type Report struct {
	Schema   string  `json:"schema"`
	Source   string  `json:"source"` // SourceSnapshot or SourceProfiler
	File     string  `json:"file"`
	Layout   string  `json:"layout"`
	Device   int64   `json:"device"`
	Devices  []int64 `json:"devices"`
	Events   int     `json:"events"`
	Settings struct {
		Recorded     bool    `json:"recorded"`
		Expandable   bool    `json:"expandable_segments"`
		MaxSplitSize int64   `json:"max_split_size,omitempty"`
		GCThreshold  float64 `json:"garbage_collection_threshold,omitempty"`
	} `json:"allocator_settings"`
	// Baseline is the requested bytes allocated before recording began.
	Baseline      int64 `json:"baseline_bytes"`
	PeakAllocated Peak  `json:"peak_allocated"`
	PeakReserved  Peak  `json:"peak_reserved"`
	// Fragmentation at the reserved peak: reserved bytes no block uses, and
	// how many segments hold them.
	FragmentationBytes    int64 `json:"fragmentation_bytes"`
	FragmentationSegments int   `json:"fragmentation_segments"`
	Replay                struct {
		Exact         bool   `json:"exact"`
		SegmentEvents int    `json:"segment_events"`
		Addresses     int    `json:"addresses_checked"`
		Diverged      string `json:"diverged,omitempty"`
		FinalMismatch string `json:"final_mismatch,omitempty"`
	} `json:"replay"`
	Paragraph string `json:"summary"`

	Allocations []Allocation `json:"-"`
	// Timeline: the live requested bytes by category after each event
	// (index 0: before the first), and the reserved bytes.
	Timeline []Point `json:"-"`
}

// Point is the state after an event.
type Point struct {
	Phase    Phase
	ByCat    [ir.NumCategories + 1]int64
	Reserved int64
}

// Explain explains device dev of s (dev < 0: the device with the largest
// allocated peak).
func Explain(s *snapshot.Snapshot, file string, dev int64) (*Report, error) {
	return ExplainContext(context.Background(), s, file, dev)
}

// ExplainContext is Explain returning ctx's cause once ctx is done: the
// replays of the devices' traces look at it every 65,536 events
// (allocator.ReplayDeviceContext).
func ExplainContext(ctx context.Context, s *snapshot.Snapshot, file string, dev int64) (*Report, error) {
	devs := s.Devices()
	if len(devs) == 0 {
		return nil, fmt.Errorf("%s: the snapshot holds no segments and no trace events", file)
	}
	replays := map[int64]*allocator.Replay{}
	for _, d := range devs {
		if dev >= 0 && d != dev {
			continue
		}
		r, err := allocator.ReplayDeviceContext(ctx, s, d)
		if ctx.Err() != nil {
			return nil, context.Cause(ctx)
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", file, err)
		}
		replays[d] = r
	}
	if dev >= 0 && replays[dev] == nil {
		return nil, &DeviceError{File: file, Device: dev, Have: devs}
	}
	if dev < 0 {
		for _, d := range devs {
			if dev < 0 || replays[d].PeakRequested.Requested > replays[dev].PeakRequested.Requested {
				dev = d
			}
		}
	}
	r := replays[dev]
	rep := &Report{Schema: "memplan.explain/v1", Source: SourceSnapshot, File: file, Layout: s.Layout, Device: dev, Devices: devs}
	rep.Settings.Recorded = s.Settings.Recorded
	rep.Settings.Expandable = s.Settings.Expandable
	if s.Settings.MaxSplitSize < 1<<62 {
		rep.Settings.MaxSplitSize = s.Settings.MaxSplitSize
	}
	rep.Settings.GCThreshold = s.Settings.GCThreshold
	rep.Replay.Exact = r.Diverged == "" && r.FinalMismatch == ""
	rep.Replay.SegmentEvents, rep.Replay.Addresses = r.SegmentEvents, r.AddressChecks
	rep.Replay.Diverged, rep.Replay.FinalMismatch = r.Diverged, r.FinalMismatch
	var trace []snapshot.Event
	if int(dev) < len(s.Traces) {
		trace = s.Traces[dev]
	}
	if r.Diverged != "" {
		trace = trace[:len(r.After)]
	}
	rep.Events = len(trace)
	allocs := lifetimes(s, dev, trace, r)
	rep.Allocations = allocs
	for _, a := range allocs {
		if a.Alloc < 0 {
			rep.Baseline += a.Requested
		}
	}
	rep.timeline(trace, r)
	rep.PeakAllocated = rep.peakAt(r.PeakRequested.Event, r, trace)
	rep.PeakAllocated.BlockBytes = r.Peak.Allocated
	// The reserved peak: where reserved memory is highest, and among such
	// events the one with the most allocated (the allocated peak when the
	// reserve did not grow after it).
	pr := r.PeakReserved
	if r.Peak.Reserved == pr.Reserved {
		pr = r.Peak
	}
	rep.PeakReserved = rep.peakAt(pr.Event, r, trace)
	rep.PeakReserved.BlockBytes = pr.Allocated
	rep.FragmentationBytes = pr.Reserved - pr.Allocated
	rep.FragmentationSegments = fragmentedSegments(s, dev, pr.Event)
	rep.Paragraph = rep.paragraph()
	return rep, nil
}

// fragmentedSegments counts the segments with a free block at event ev, by
// replaying to it.
func fragmentedSegments(s *snapshot.Snapshot, dev int64, ev int) int {
	st, err := allocator.StateAt(s, dev, ev)
	if err != nil {
		return 0
	}
	n := 0
	for _, sg := range st {
		for _, b := range sg.Blocks {
			if !b.Allocated {
				n++
				break
			}
		}
	}
	return n
}

// phaseOf is the phase an allocation's frames put it in.
func phaseOf(frames []snapshot.Frame) Phase {
	python := false
	var fwd, loss bool
	for _, f := range frames {
		isPy := strings.HasSuffix(f.File, ".py")
		if !isPy {
			if strings.Contains(f.Name, "autograd::Engine") || strings.Contains(f.Name, "PythonEngine::thread") {
				return PhaseBackward
			}
			continue
		}
		python = true
		file := f.File[strings.LastIndexAny(f.File, `/\`)+1:]
		switch {
		case f.Name == "zero_grad":
			return PhaseZeroGrad
		case strings.Contains(f.File, "/optim/") || strings.Contains(f.File, `\optim\`) ||
			(f.Name == "step" && (strings.HasPrefix(file, "optim") || strings.Contains(file, "optimizer"))):
			return PhaseOptimizer
		case f.Name == "backward" || f.Name == "_make_grads":
			return PhaseBackward
		case strings.Contains(f.Name, "cross_entropy") || strings.Contains(f.Name, "nll_loss") || strings.Contains(strings.ToLower(f.Name), "loss"):
			loss = true
		case f.Name == "forward" || f.Name == "_call_impl" || f.Name == "_wrapped_call_impl":
			fwd = true
		}
	}
	switch {
	case !python:
		return PhaseBackward
	case loss:
		return PhaseLoss
	case fwd:
		return PhaseForward
	}
	return PhaseOther
}

func isCublasWorkspace(frames []snapshot.Frame) bool {
	for _, f := range frames {
		if strings.Contains(f.Name, "getCurrentCUDABlasHandle") || strings.Contains(f.Name, "CublasHandle") || strings.Contains(f.Name, "cublasWorkspace") || strings.Contains(f.Name, "getCUDABlasLtWorkspace") {
			return true
		}
	}
	return false
}

// site is the innermost frame of the program's own code.
func site(frames []snapshot.Frame) string {
	for _, f := range frames {
		if !strings.HasSuffix(f.File, ".py") {
			continue
		}
		if strings.Contains(f.File, "site-packages") || strings.Contains(f.File, "/torch/") || strings.Contains(f.File, `\torch\`) || strings.Contains(f.File, "/lib/python") {
			continue
		}
		return fmt.Sprintf("%s (%s:%d)", f.Name, f.File[strings.LastIndexAny(f.File, `/\`)+1:], f.Line)
	}
	for _, f := range frames {
		if strings.HasSuffix(f.File, ".py") {
			return fmt.Sprintf("%s (%s:%d)", f.Name, f.File[strings.LastIndexAny(f.File, `/\`)+1:], f.Line)
		}
	}
	if len(frames) == 0 {
		return ""
	}
	return "autograd engine"
}

// lifetimes pairs allocations with their frees and classifies them.
func lifetimes(s *snapshot.Snapshot, dev int64, trace []snapshot.Event, r *allocator.Replay) []Allocation {
	// The running phase: the phase of the latest allocation.
	running := make([]Phase, len(trace))
	evPhase := make([]Phase, len(trace))
	cur := PhaseUnknown
	for i, e := range trace {
		if e.Action == snapshot.Alloc {
			evPhase[i] = phaseOf(e.Frames)
			cur = evPhase[i]
		}
		running[i] = cur
	}
	sawBackward := false
	lastBackward := -1
	for i := range trace {
		if running[i] == PhaseBackward {
			sawBackward = true
			lastBackward = i
		}
	}
	dumpFrames := map[int64][]snapshot.Frame{}
	for _, sg := range s.Segments {
		if sg.Device == dev {
			for _, b := range sg.Blocks {
				if b.State != "inactive" && len(b.Frames) > 0 {
					dumpFrames[b.Address] = b.Frames
				}
			}
		}
	}
	var out []Allocation
	live := map[int64]int{}
	for _, p := range r.PreExisting {
		a := Allocation{Addr: p.Addr, Requested: p.Requested, Block: p.Size, Alloc: -1, Free: -1, Phase: PhaseBefore}
		if p.FreedAt >= 0 && p.FreedAt < len(trace) {
			a.Free = p.FreedAt
		} else if p.FreedAt < 0 {
			if f, ok := dumpFrames[p.Addr]; ok {
				a.Site = site(f)
				a.Phase = phaseOf(f)
			}
		}
		out = append(out, a)
	}
	for i, e := range trace {
		switch e.Action {
		case snapshot.Alloc:
			live[e.Addr] = len(out)
			out = append(out, Allocation{Addr: e.Addr, Requested: e.Size, Alloc: i, Free: -1, Phase: evPhase[i], Site: site(e.Frames)})
			if isCublasWorkspace(e.Frames) {
				out[len(out)-1].Site = "cuBLAS workspace"
			}
		case snapshot.FreeRequested:
			if k, ok := live[e.Addr]; ok {
				out[k].Free = i
				delete(live, e.Addr)
			}
		}
	}
	for k := range out {
		a := &out[k]
		if a.Free >= 0 {
			// The free's own stack when it has one (record_memory_history's
			// default context "all" records where a block is freed), else
			// the phase running then.
			a.FreePhase = running[a.Free]
			if f := trace[a.Free].Frames; len(f) > 0 {
				a.FreePhase = phaseOf(f)
			}
		}
		a.Category = categorize(a, sawBackward, lastBackward)
	}
	return out
}

func categorize(a *Allocation, sawBackward bool, lastBackward int) ir.Category {
	if a.Site == "cuBLAS workspace" {
		return ir.Temporary
	}
	dies := a.FreePhase
	alive := a.Free < 0
	switch a.Phase {
	case PhaseBefore:
		switch {
		case alive:
			return ir.Parameter
		case dies == PhaseOptimizer:
			return ir.OptimizerState
		case dies == PhaseZeroGrad || dies == PhaseBackward:
			return ir.Gradient
		case dies == PhaseForward || dies == PhaseLoss:
			return ir.Activation
		}
		return ir.Other
	case PhaseOptimizer:
		if alive || dies != PhaseOptimizer {
			return ir.OptimizerState
		}
		return ir.Temporary
	case PhaseBackward:
		if alive || dies != PhaseBackward {
			return ir.Gradient
		}
		return ir.Temporary
	case PhaseForward, PhaseLoss:
		switch {
		case dies == PhaseBackward || (sawBackward && (alive || a.Free > lastBackward) && a.Alloc < lastBackward):
			return ir.Activation
		case !alive && (dies == PhaseForward || dies == PhaseLoss):
			return ir.Temporary
		}
		return ir.Other
	case PhaseZeroGrad, PhaseOther:
		return ir.Other
	}
	return Unknown
}

// timeline walks the trace with the live bytes of each category.
func (rep *Report) timeline(trace []snapshot.Event, r *allocator.Replay) {
	var cur Point
	cur.Reserved = r.InitialReserved
	byAlloc := map[int]*Allocation{}
	byFree := map[int]*Allocation{}
	for k := range rep.Allocations {
		a := &rep.Allocations[k]
		if a.Alloc < 0 {
			cur.ByCat[a.Category] += a.Requested
		} else {
			byAlloc[a.Alloc] = a
		}
		if a.Free >= 0 {
			byFree[a.Free] = a
		}
	}
	rep.Timeline = append(rep.Timeline[:0], cur)
	for i := range trace {
		if a, ok := byAlloc[i]; ok {
			cur.ByCat[a.Category] += a.Requested
			cur.Phase = a.Phase
		}
		if a, ok := byFree[i]; ok {
			cur.ByCat[a.Category] -= a.Requested
		}
		cur.Reserved = r.After[i].Reserved
		rep.Timeline = append(rep.Timeline, cur)
	}
}

func (rep *Report) peakAt(ev int, r *allocator.Replay, trace []snapshot.Event) Peak {
	p := Peak{Event: ev}
	pt := rep.Timeline[ev+1]
	var total int64
	for c := ir.Category(0); c <= Unknown; c++ {
		if pt.ByCat[c] != 0 {
			p.ByCategory = append(p.ByCategory, Share{CategoryName(c), pt.ByCat[c]})
		}
		total += pt.ByCat[c]
	}
	slices.SortStableFunc(p.ByCategory, func(a, b Share) int { return cmp.Compare(b.Bytes, a.Bytes) })
	p.Bytes = total
	if total > 0 {
		p.Classified = float64(total-pt.ByCat[Unknown]) / float64(total)
	}
	p.Reserved = r.InitialReserved
	if ev >= 0 {
		p.Reserved = r.After[ev].Reserved
		p.Phase = pt.Phase.String()
		if trace[ev].Action == snapshot.Alloc {
			p.Site = site(trace[ev].Frames)
		}
	} else {
		p.Phase = PhaseBefore.String()
	}
	sites := map[string]int64{}
	for _, a := range rep.Allocations {
		if a.Alloc <= ev && (a.Free < 0 || a.Free > ev) {
			name := a.Site
			switch {
			case a.Alloc < 0 && name == "":
				name = "allocated before recording"
			case name == "":
				name = "autograd engine"
			}
			sites[name] += a.Requested
		}
	}
	for n, b := range sites {
		p.BySite = append(p.BySite, Share{n, b})
	}
	slices.SortFunc(p.BySite, func(a, b Share) int {
		if a.Bytes != b.Bytes {
			return cmp.Compare(b.Bytes, a.Bytes)
		}
		return strings.Compare(a.Name, b.Name)
	})
	if len(p.BySite) > 10 {
		p.BySite = p.BySite[:10]
	}
	return p
}

func gib(b int64) string { return units.Bytes(b).String() }

func (rep *Report) paragraph() string {
	pa, pr := rep.PeakAllocated, rep.PeakReserved
	var b strings.Builder
	fmt.Fprintf(&b, "Device %d: peak %s reserved / %s allocated", rep.Device, gib(pr.Reserved), gib(pa.Bytes))
	if pa.Event >= 0 {
		fmt.Fprintf(&b, " in %s", pa.Phase)
		if pa.Site != "" {
			fmt.Fprintf(&b, " at %s", pa.Site)
		}
		fmt.Fprintf(&b, " (event %d of %d)", pa.Event, rep.Events)
	} else {
		b.WriteString(" (the end state: no trace)")
	}
	b.WriteString("; ")
	var parts []string
	for _, s := range pa.ByCategory {
		if pa.Bytes > 0 && float64(s.Bytes)/float64(pa.Bytes) >= 0.01 {
			parts = append(parts, fmt.Sprintf("%.0f%% %s", 100*float64(s.Bytes)/float64(pa.Bytes), strings.ReplaceAll(s.Name, "_", " ")))
		}
	}
	b.WriteString(strings.Join(parts, ", "))
	if rep.Baseline > 0 {
		fmt.Fprintf(&b, "; %s was allocated before recording began", gib(rep.Baseline))
	}
	fmt.Fprintf(&b, "; %s held by fragmentation in %d segments at the reserved peak.", gib(rep.FragmentationBytes), rep.FragmentationSegments)
	if !rep.Replay.Exact {
		b.WriteString(" The allocator model did not reproduce this trace exactly: ")
		b.WriteString(rep.Replay.Diverged + rep.Replay.FinalMismatch)
		b.WriteString(".")
	}
	return b.String()
}
