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
	if id, a, b, ok := TiedTraceParam(s.Trace); ok && s.Mode == Train {
		return invalid(FieldPP, "{pp} %d: %s's parameter (storage %d) is read by %s and by %s, a tied input embedding and output layer: a pipeline keeps a copy of it on each stage with a gradient of its own, all-reduced between them (Megatron-LM), but the trace's backward sums both gradients into one on one GPU and cannot be cut so; plan the model by name or config.json with {pp}, or the trace with {pp} 1",
			s.PP, name, id, partName(a), partName(b))
	}
	return nil
}

// TiedTraceParam is a trainable parameter of t (one with a gradient in a
// trace that pairs them, else any parameter) that forward events of two
// parts of the model read, and those parts: the blocks a pipeline cuts
// between (strategy.PipelineBlock) and each module outside them. An input
// embedding tied to the output layer is one. Its backward sums the parts'
// gradients into one (a recorded add), where a pipeline holds a copy per
// stage, each with its own gradient: strategy.Pipeline would send one
// part's gradient to the other stage as if it were an activation, and the
// stage that sent it would hold no gradient (gpt2_2l_tied under --pp 2: a
// 154 MB transfer each micro-step, and the last stage 154 MB short).
func TiedTraceParam(t *torchtrace.Trace) (id int, a, b string, ok bool) {
	trainable := map[int]bool{}
	for i := range t.Initial {
		if st := &t.Initial[i]; st.Category == torchtrace.CatParameter && !st.Buffer {
			trainable[st.ID] = t.ParamGrads == nil
		}
	}
	for _, pg := range t.ParamGrads {
		if _, isParam := trainable[pg.Param]; isParam {
			trainable[pg.Param] = true
		}
	}
	reader := map[int]string{}
	for i := range t.Events {
		e := &t.Events[i]
		if e.Phase != torchtrace.PhaseForward {
			continue
		}
		part := e.Module
		if blk, in := strategy.PipelineBlock(e.Module); in {
			part = blk
		}
		for _, in := range e.Inputs {
			if !trainable[in] {
				continue
			}
			if r, seen := reader[in]; !seen {
				reader[in] = part
			} else if r != part {
				return in, r, part, true
			}
		}
	}
	return 0, "", "", false
}

// partName names a part of a trace's model in a message.
func partName(module string) string {
	if module == "" {
		return "the root module"
	}
	return module
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
