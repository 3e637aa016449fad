package engine

import (
	"github.com/memplan/memplan/importer/torchtrace"
	"github.com/memplan/memplan/ir"
	"github.com/memplan/memplan/lower"
	"github.com/memplan/memplan/ops"
)

// validateTrace checks a spec whose job is a recorded PyTorch trace rather
// than a model architecture: options that rebuild the graph do not apply.
func (s *Spec) validateTrace() error {
	switch {
	case s.Mode != Train:
		return invalid(FieldMode, "a trace records a training step; {mode} infer needs a {model}")
	case s.TP > 1 || s.SP || s.EP > 1 || s.LoRA != nil || s.QLoRA:
		return invalid(FieldTrace, "{tp}, {sp}, {ep}, {lora} and {qlora} rebuild the model's graph; they need a {model} (a catalog name or config.json), not a {graph}")
	case (s.DP > 1 || s.ZeRO > 0) && s.Trace.ParamGrads == nil:
		return invalid(FieldDP, "trace %s is %s, which does not record which gradient belongs to which parameter: re-export it with memplan_torch (memplan.trace/v2 records param_grads) to plan {dp} or {zero}", s.JobName(), s.Trace.Schema)
	case s.Seq != 0 && !s.Trace.HasSeq():
		return invalid(FieldSeq, "{seq} %d: trace %s was exported without a sequence dimension, so its sequence cannot change (export it with memplan_torch export --seq-dim)", s.Seq, s.Trace.Name)
	}
	if s.Seq == 0 && s.Trace.HasSeq() {
		s.Seq = int(s.Trace.TraceSeq) // the sequence planned, as reports show it
	}
	return nil
}

// Counter is how a trace's allocations are counted. The zero value counts
// as the job's device does: the CUDA caching allocator's 512-byte blocks
// without CPU-only in-kernel scratch, or with CPU kernels every recorded
// allocation, scratch included. A measurement's counter (Measured) counts
// as its tracker did.
type Counter struct {
	// Measured replaces the device's counting by the fields below.
	Measured bool
	// MinBytes: storages smaller than this count 0 bytes (a tracker's
	// threshold); Granularity rounds every storage up to a multiple of it.
	MinBytes, Granularity int64
	// Scratch includes the trace's recorded in-kernel scratch.
	Scratch bool
	// WholeBatch builds the inputs as the whole batch of an optimizer step
	// and splits them into micro-batch views, as memplan_torch's
	// measurement does.
	WholeBatch bool
}

// traceProgram replays the trace at the spec's micro-batch, counting as
// s.Count says.
func traceProgram(s *Spec, first bool) (*ir.Program, error) {
	c := s.Count
	o := torchtrace.Options{Batch: s.MicroBatch, Seq: s.Seq, Accum: s.Accum, FirstStep: first, FullBatchInputs: c.WholeBatch, Hold: s.Sem.Hold}
	switch {
	case c.Measured:
		o.MinBytes, o.Granularity, o.NoScratch = c.MinBytes, c.Granularity, !c.Scratch
	case s.Device == ops.CUDA:
		o.NoScratch, o.Granularity = true, 512
	}
	if s.TraceOptimizer {
		o.Optimizer = &lower.TrainConfig{Optimizer: s.Optimizer, Impl: s.Impl, Precision: s.Precision, WeightDecay: -1, PagedState: s.Sem.PagedOptimizer}
	}
	return s.Trace.Program(o)
}
