package engine

import (
	"github.com/memplan/memplan/importer/torchtrace"
	"github.com/memplan/memplan/ir"
	"github.com/memplan/memplan/lower"
	"github.com/memplan/memplan/ops"
	"github.com/memplan/memplan/strategy"
	"github.com/memplan/memplan/units"
)

// validateTrace checks a spec whose job is a recorded PyTorch trace rather
// than a model architecture: options that rebuild the graph do not apply.
func (s *Spec) validateTrace() error {
	switch {
	case s.Mode != Train:
		return invalid(FieldMode, "a trace records a training step; {mode} infer needs a {model}")
	case s.TP > 1 || s.SP || s.EP > 1 || s.LoRA != nil || s.QLoRA:
		return invalid(FieldTrace, "{tp}, {sp}, {ep}, {lora} and {qlora} rebuild the model's graph; they need a {model} (a catalog name or config.json), not a {graph}")
	case s.ZeRO == 3 && s.Trace.ParamGrads == nil:
		// DDP and stages 1-2 need only gradients' sizes and readiness, the
		// same under any matching of equal-size tensors; stage 3 gathers
		// each parameter with its module and reduces its gradient there.
		return invalid(FieldZeRO, "{zero} 3: trace %s is %s, which does not record which gradient belongs to which parameter: re-export it with memplan_torch (memplan.trace/v2 records param_grads)", s.JobName(), s.Trace.Schema)
	case s.Seq != 0 && !s.Trace.ReplaysSeq(int64(s.Seq)):
		return invalid(FieldSeq, "{seq} %d: %s", s.Seq, s.Trace.FixedSeq())
	}
	if rec, priced := s.TracePriceDType(); s.GPU != nil && s.GPU.PeakFLOPs(priced) <= 0 {
		return invalid(FieldGPU, "the %s has no %s arithmetic, which the trace's matmuls run in: plan it on a {gpu} that has it", s.GPU.Name, rec)
	}
	if s.Seq == 0 && s.Trace.HasSeq() {
		s.Seq = int(s.Trace.TraceSeq) // the sequence planned, as reports show it
	}
	return s.validateTracePipeline()
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
	p, err := s.Trace.Program(o)
	if err != nil || s.PP < 2 || s.Mode != Train {
		return p, err
	}
	// A pipeline holds a tied parameter per stage, each with its own
	// gradient: untie the trace's sum of them.
	q, err := strategy.UntieTraceGrads(p)
	if err != nil {
		return nil, invalid(FieldPP, "{pp} %d: %v; plan the model by name or config.json with {pp}, or the trace with {pp} 1", s.PP, err)
	}
	return q, nil
}

// TracePriceDType is the dtype a trace job's step is priced in: recorded,
// the dtype its matmuls and convolutions ran in (torchtrace's
// ComputeDType; --precision does not change a recorded step), and priced,
// the same unless s.GPU has no peak FLOP rate for a 16-bit dtype, which is
// then priced at the GPU's fp32 rate: PyTorch runs bf16 on a GPU without
// bf16 tensor cores (torch.cuda.is_bf16_supported() is true below sm_80
// whenever a bf16 tensor can be made, torch/cuda/__init__.py @17e3b6a9),
// on CUDA cores, so the fp32 rate bounds its speed as the roofline does.
func (s *Spec) TracePriceDType() (recorded, priced units.DType) {
	recorded = s.Trace.ComputeDType()
	priced = recorded
	if g := s.GPU; g != nil && g.PeakFLOPs(recorded) <= 0 && (recorded == units.BF16 || recorded == units.F16) {
		priced = units.F32
	}
	return recorded, priced
}

// PrecisionName is the precision a report names: --precision's for a
// model; for a trace, which ran in the dtypes it recorded (--precision is
// refused there), the dtype its matrix products wrote (TracePriceDType's
// recorded), never the flag's default it did not use.
func (s *Spec) PrecisionName() string {
	if s.Trace != nil {
		return s.Trace.ComputeDType().String()
	}
	return s.Precision.String()
}

// OptimizerName and ImplName are the optimizer step a report names:
// Optimizer/Impl for a model, and for a trace whose recorded step is
// replaced (TraceOptimizer: --optimizer, or a workload's optimizer); for
// a trace replaying its own step, what the trace recorded (its optimizer's
// name; foreach or single where it records which), "" where it records
// nothing, never the flags' defaults the trace did not run.
func (s *Spec) OptimizerName() string {
	if s.Trace != nil && !s.TraceOptimizer {
		return s.Trace.Optimizer
	}
	return s.Optimizer.String()
}

// ImplName is the implementation of OptimizerName's step (see there).
func (s *Spec) ImplName() string {
	if s.Trace == nil || s.TraceOptimizer {
		return s.Impl.String()
	}
	switch f := s.Trace.Foreach; {
	case f == nil:
		return ""
	case *f:
		return lower.Foreach.String()
	}
	return lower.Single.String()
}

// priceDType is the dtype s is priced in: a model's ComputeDType, a
// trace's TracePriceDType.
func (s *Spec) priceDType() units.DType {
	if s.Trace == nil {
		return s.ComputeDType()
	}
	_, priced := s.TracePriceDType()
	return priced
}
