package engine

import (
	"github.com/memplan/memplan/importer/torchtrace"
	"github.com/memplan/memplan/strategy"
)

// validateTracePipeline checks that a trace can be cut into s.PP stages
// (s.PPInterleave chunks each). strategy.Pipeline cuts a program between
// its blocks, the modules whose path ends in a list index ("layers.3",
// "transformer.h.0", "features.7": an nn.ModuleList or nn.Sequential's
// children), as the trace's forward events name them; everything outside
// the blocks goes to the first stage (before them) or the last (after).
// A trace with fewer blocks than chunks is refused here, in the user's
// terms, rather than by the transform.
func (s *Spec) validateTracePipeline() error {
	chunks := s.PP * max(s.PPInterleave, 1)
	if s.PP < 2 || s.Trace == nil {
		return nil
	}
	n := strategy.PipelineBlocks(forwardModules(s.Trace))
	name := "trace " + s.JobName()
	if s.Trace.Name == "" {
		name = "the trace"
	}
	switch {
	case n == 0:
		return invalid(FieldPP, "{pp} %d: %s has no repeated block modules to cut into stages (no module path ending in a list index, such as layers.0, layers.1, … of a PyTorch ModuleList); plan it with {pp} 1, or export a model whose repeated layers are in a ModuleList or Sequential",
			s.PP, name)
	case n < chunks && s.PPInterleave > 1:
		return invalid(FieldPP, "{pp} %d with %d virtual stages each needs %d blocks, but %s has %d (module paths ending in a list index); make stages × virtual stages %d or fewer",
			s.PP, s.PPInterleave, chunks, name, n, n)
	case n < chunks:
		return invalid(FieldPP, "{pp} %d needs %d blocks, but %s has %d (module paths ending in a list index); use {pp} %d or less",
			s.PP, chunks, name, n, n)
	}
	return nil
}

// forwardModules are the module paths of t's forward events, in order.
func forwardModules(t *torchtrace.Trace) []string {
	var ms []string
	for i := range t.Events {
		if e := &t.Events[i]; e.Phase == torchtrace.PhaseForward && e.Module != "" {
			ms = append(ms, e.Module)
		}
	}
	return ms
}
