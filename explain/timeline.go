package explain

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"github.com/memplan/memplan/ir"
	"github.com/memplan/memplan/snapshot"
)

// SourceSnapshot and SourceProfiler are what a report was read from.
const (
	SourceSnapshot = "snapshot"
	SourceProfiler = "torch.profiler memory timeline"
)

// ProfilerLedger maps torch.profiler's memory categories
// (torch.profiler._memory_profiler.Category @ v2.14.1, which the profiler
// assigns from its data-flow graph of the profiled ops) to memplan's ledger:
//
//   - PARAMETER, OPTIMIZER_STATE, GRADIENT: the same lines;
//   - ACTIVATION: activations. The profiler floods forward from the inputs
//     and stops at backward (_set_activations), so it counts every tensor
//     the forward computes from the inputs, including those the forward
//     frees again, which memplan calls temporaries;
//   - TEMPORARY (a tensor created and freed within one op) and
//     AUTOGRAD_DETAIL (tensors backward computes that are not gradients of
//     parameters: the gradients of activations, _set_autograd_detail):
//     temporaries, memplan's "intermediates, activation gradients,
//     workspaces";
//   - INPUT (the tensors the profiled code was handed: the batch, labels):
//     other, memplan's line for inputs, labels and buffers;
//   - None (a tensor the profiler did not categorise): unknown.
var ProfilerLedger = [snapshot.NumProfilerCategories]ir.Category{
	snapshot.ProfParameter:      ir.Parameter,
	snapshot.ProfOptimizerState: ir.OptimizerState,
	snapshot.ProfInput:          ir.Other,
	snapshot.ProfTemporary:      ir.Temporary,
	snapshot.ProfActivation:     ir.Activation,
	snapshot.ProfGradient:       ir.Gradient,
	snapshot.ProfAutogradDetail: ir.Temporary,
	snapshot.ProfUnknown:        Unknown,
}

// ExplainTimeline explains a torch.profiler memory timeline: its peak (the
// largest live total of any time point, the file's own maximum) and the
// live bytes there by ledger category and by the profiler's own
// categories. A timeline has no allocator events, code sites or phases, and
// records no reserved bytes: the report leaves those empty.
func ExplainTimeline(tl *snapshot.Timeline, file string) *Report {
	rep := &Report{Schema: "memplan.explain/v1", Source: SourceProfiler, File: file, Events: len(tl.Times)}
	rep.Layout = "torch.profiler export_memory_timeline, " + tl.Form
	if tl.Gzipped {
		rep.Layout += ", gzipped"
	}
	rep.Timeline = make([]Point, len(tl.Times))
	best := 0
	for i, row := range tl.Sizes {
		for c, b := range row {
			rep.Timeline[i].ByCat[ProfilerLedger[c]] += b
		}
		if tl.Total(i) > tl.Total(best) {
			best = i
		}
	}
	p := Peak{Event: best, TimeUS: tl.Times[best] - tl.Times[0], Bytes: tl.Total(best)}
	pt := rep.Timeline[best]
	for c := ir.Category(0); c <= Unknown; c++ {
		if pt.ByCat[c] != 0 {
			p.ByCategory = append(p.ByCategory, Share{CategoryName(c), pt.ByCat[c]})
		}
	}
	for c, b := range tl.Sizes[best] {
		if b != 0 {
			p.ProfilerCategories = append(p.ProfilerCategories, Share{snapshot.ProfilerCategory(c).String(), b})
		}
	}
	byBytes := func(a, b Share) int { return cmp.Compare(b.Bytes, a.Bytes) }
	slices.SortStableFunc(p.ByCategory, byBytes)
	slices.SortStableFunc(p.ProfilerCategories, byBytes)
	if p.Bytes > 0 {
		p.Classified = float64(p.Bytes-pt.ByCat[Unknown]) / float64(p.Bytes)
	}
	rep.PeakAllocated = p
	rep.Paragraph = rep.timelineParagraph(tl)
	return rep
}

func (rep *Report) timelineParagraph(tl *snapshot.Timeline) string {
	p := rep.PeakAllocated
	var b strings.Builder
	span := float64(tl.Times[len(tl.Times)-1]-tl.Times[0]) / 1e3
	fmt.Fprintf(&b, "torch.profiler memory timeline (%s, %d time points over %.1f ms): peak %s of tensors at %.3f ms (point %d)",
		tl.Form, len(tl.Times), span, gib(p.Bytes), float64(p.TimeUS)/1e3, p.Event)
	var parts []string
	for _, s := range p.ByCategory {
		if p.Bytes > 0 && float64(s.Bytes)/float64(p.Bytes) >= 0.01 {
			parts = append(parts, fmt.Sprintf("%.0f%% %s", 100*float64(s.Bytes)/float64(p.Bytes), strings.ReplaceAll(s.Name, "_", " ")))
		}
	}
	if len(parts) > 0 {
		b.WriteString("; " + strings.Join(parts, ", "))
	}
	b.WriteString(". The profiler records tensors only: no reserved bytes, no fragmentation, no phases.")
	return b.String()
}
