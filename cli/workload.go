package cli

import (
	"fmt"

	"github.com/memplan/memplan/engine"
	"github.com/memplan/memplan/ops"
	"github.com/memplan/memplan/plan"
	"github.com/memplan/memplan/workload"
)

// applyWorkload sets the spec from a workload file, the same file
// memplan_torch measures, so prediction and measurement cannot drift apart.
// A flag given explicitly that disagrees with the file is refused.
func (f *planFlags) applyWorkload(s *engine.Spec) error {
	w, err := workload.Load(f.workloadPath)
	if err != nil {
		return err
	}
	conflict := func(flag string, same bool) error {
		if f.changed(flag) && !same {
			return fmt.Errorf("--%s disagrees with %s; drop the flag or edit the workload", flag, f.workloadPath)
		}
		return nil
	}
	mb, accum := w.MicroBatch(), w.Strategy.Accumulation
	seq := 0
	if w.SeqLen != nil {
		seq = *w.SeqLen
	}
	opt, err := plan.ParseOptimizer(w.Optimizer)
	if err != nil {
		return fmt.Errorf("%s: optimizer: %w", f.workloadPath, err)
	}
	impl := plan.Single
	if w.Foreach != nil && *w.Foreach {
		impl = plan.Foreach
	}
	ck := engine.CheckpointPolicy{}
	if w.Checkpointed() {
		blocks := "layers"
		if w.Strategy.CheckpointBlocks != nil {
			blocks = *w.Strategy.CheckpointBlocks
		}
		ck = engine.CheckpointModulesOf(blocks + ".*")
	}
	for _, c := range []error{
		conflict("micro-batch", f.microBatch == mb), conflict("accum", f.accum == accum), conflict("seq", f.seq == seq),
		conflict("optimizer", s.Optimizer == opt), conflict("optimizer-impl", s.Impl == impl),
		conflict("checkpoint", s.Checkpoint.String() == ck.String()),
		conflict("offload", s.Offload.Activations == (w.Strategy.Offload == "activations")),
		conflict("kernels", (s.Device == ops.CPU) == (w.Device == "cpu")),
	} {
		if c != nil {
			return c
		}
	}
	s.MicroBatch, s.Accum, s.Optimizer, s.Impl, s.Checkpoint = mb, accum, opt, impl, ck
	if s.Trace != nil && s.Trace.HasSeq() {
		s.Seq = seq
	}
	s.TraceOptimizer = true
	s.Offload.Activations = w.Strategy.Offload == "activations"
	if w.Device == "cpu" {
		s.Device = ops.CPU
	}
	return nil
}
