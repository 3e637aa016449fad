package workload

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/memplan/memplan/engine"
	"github.com/memplan/memplan/importer/torchtrace"
	"github.com/memplan/memplan/lower"
	"github.com/memplan/memplan/ops"
	"github.com/memplan/memplan/units"
)

// Spec is the job w describes, replayed from tr, the trace of its model
// (memplan_torch export). It is the one path from a workload to a
// prediction: plan --graph --workload and validate both plan what it
// returns, so the accuracy validate reports is that of what users run.
//
// base gives what the file does not say (the mode, the GPU or budget, the
// recipe's semantics, the parallel layout: a mode other than training is
// the engine's to refuse, as for a trace without a workload); Spec sets
// the rest as memplan_torch
// runs the workload: the micro-batch, accumulation and sequence, the
// optimizer (the recorded step when the trace ran the same one, else
// lower.OptimizerStep's), non-reentrant checkpointing of every block of the
// block list (checkpoint_blocks, else the module path with the most indexed
// children, as memplan_torch picks), activation offload, how long the loop
// keeps the model's output (hold_outputs), the kernels of
// the device, and memory counted as the device's measurement counts it
// (Counter), with the batch built whole and split into micro-batches.
func (w *Workload) Spec(tr *torchtrace.Trace, base engine.Spec) (engine.Spec, error) {
	s := base
	if err := w.checkTrace(tr); err != nil {
		return s, err
	}
	s.Model, s.Trace = nil, tr
	s.MicroBatch, s.Accum = w.MicroBatch(), w.Strategy.Accumulation
	s.Seq = 0
	if w.SeqLen != nil {
		// A length a trace without a sequence dimension does not record
		// is descriptive: nothing to check it against.
		switch n := int64(*w.SeqLen); {
		case tr.HasSeq():
			s.Seq = *w.SeqLen
		case tr.TraceSeq != 0 && !tr.ReplaysSeq(n):
			return s, fmt.Errorf("seq_len %d: %s", n, tr.FixedSeq())
		}
	}
	opt, err := lower.ParseOptimizer(w.Optimizer)
	if err != nil {
		return s, fmt.Errorf("optimizer: %w", err)
	}
	// foreach null is torch's default (torch/optim/optimizer.py
	// _default_to_fused_or_foreach @v2.5.1, the torch of the CUDA
	// validation): the foreach step when every parameter is a CUDA tensor,
	// the per-tensor loop otherwise. The device is CUDA unless cpu, as
	// planned below; null had planned the loop on CUDA too, replacing a
	// trace's recorded foreach step (trace sweep, round 24: lm's optimizer
	// phase 12% low).
	foreach := w.Device != DeviceCPU
	if w.Foreach != nil {
		foreach = *w.Foreach
	}
	s.Optimizer, s.Impl = opt, lower.Single
	if foreach {
		s.Impl = lower.Foreach
	}
	traced := tr.Foreach != nil && *tr.Foreach
	s.TraceOptimizer = w.Optimizer != tr.Optimizer || foreach != traced
	s.Checkpoint = engine.CheckpointPolicy{}
	if w.Checkpointed() {
		blocks := BlockList(tr)
		if w.Strategy.CheckpointBlocks != nil {
			blocks = *w.Strategy.CheckpointBlocks
		}
		if blocks == "" {
			return s, fmt.Errorf("strategy.checkpoint blocks: the trace has no indexed module list (name one with checkpoint_blocks)")
		}
		s.Checkpoint = engine.CheckpointModulesOf(blocks + ".*")
	}
	s.Offload.Activations = w.Strategy.Offload == OffloadActivations
	s.Sem.Hold = []lower.Hold{lower.HoldNone, lower.HoldBackward, lower.HoldNextForward}[slices.Index(Holds, w.HoldOutputs)]
	s.Device = ops.CUDA
	if w.Device == DeviceCPU {
		s.Device = ops.CPU
	}
	s.Count = DeviceCounter(w.Device, tr)
	return s, nil
}

// checkTrace refuses a workload that contradicts what its trace recorded:
// the builder (source, when it names one: MODULE:FUNCTION), the dtype the
// model was cast to (its parameters'), the batch dimension, and a held
// output the trace does not record. What a trace does not record
// (model_args, and name, warmup, iters and seed, which only the
// measurement reads) is descriptive.
func (w *Workload) checkTrace(tr *torchtrace.Trace) error {
	if builder(tr.Source) && tr.Source != w.Model {
		return fmt.Errorf("model %s contradicts the trace's builder %s", w.Model, tr.Source)
	}
	if dt, _ := units.ParseDType(w.DType); tr.ParamDType() != units.Invalid && dt != tr.ParamDType() {
		return fmt.Errorf("dtype %s contradicts the trace's %s parameters (a trace runs in the dtypes it recorded)", w.DType, tr.ParamDType())
	}
	if tr.BatchDim != nil && *tr.BatchDim != w.BatchDim {
		return fmt.Errorf("batch_dim %d contradicts the trace's batch dimension %d", w.BatchDim, *tr.BatchDim)
	}
	if w.HoldOutputs != Holds[0] && tr.ModelOutput == nil {
		return fmt.Errorf("hold_outputs %s needs the model's output, which the trace does not record (model_output: exported before memplan_torch recorded it); re-export it, or write hold_outputs: %s", w.HoldOutputs, Holds[0])
	}
	return nil
}

// builder reports whether a trace's source names the builder it was
// exported from (memplan_torch export MODULE:FUNCTION), rather than a
// model object (memplan_torch.export) or export-hf's description.
func builder(source string) bool {
	return strings.Contains(source, ":") && !strings.ContainsAny(source, " \t\n")
}

// TrackerThreshold is the smallest allocation memplan_torch's CPU tracker
// counts unless told otherwise (python/memplan_torch/__main__.py, the
// default of measure and suite --threshold).
const TrackerThreshold = 1024

// DeviceCounter is how memplan_torch measures a workload on device: on
// CUDA the caching allocator's 512-byte blocks; on a CPU its tracker,
// which ignores allocations under TrackerThreshold bytes (threshold, when
// positive, replaces it) and sees in-kernel scratch only when the trace
// recorded it measured. Either way the batch is built whole and split into
// micro-batches.
func DeviceCounter(device Device, tr *torchtrace.Trace) engine.Counter {
	return Counter(device, 0, tr)
}

// Counter is DeviceCounter with the CPU tracker's threshold (0: the
// default).
func Counter(device Device, threshold int64, tr *torchtrace.Trace) engine.Counter {
	if device == DeviceCUDA {
		return engine.Counter{Measured: true, Granularity: 512, WholeBatch: true}
	}
	if threshold == 0 {
		threshold = TrackerThreshold
	}
	return engine.Counter{Measured: true, MinBytes: threshold, WholeBatch: true,
		Scratch: tr.TraceDevice == torchtrace.DeviceCPU && tr.ScratchKind == torchtrace.ScratchMeasured}
}

// BlockList guesses the module list a "blocks" checkpoint wraps, as
// memplan_torch does without checkpoint_blocks: the module path with the
// most indexed children ("layers" for layers.0 … layers.3).
func BlockList(tr *torchtrace.Trace) string {
	kids := map[string]map[string]bool{}
	for _, e := range tr.Events {
		parts := strings.Split(e.Module, ".")
		for i := 1; i < len(parts); i++ {
			if parts[i] != "" && strings.Trim(parts[i], "0123456789") == "" {
				parent := strings.Join(parts[:i], ".")
				if kids[parent] == nil {
					kids[parent] = map[string]bool{}
				}
				kids[parent][parts[i]] = true
			}
		}
	}
	best, n := "", 1
	names := make([]string, 0, len(kids))
	for k := range kids {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		if len(kids[k]) > n {
			best, n = k, len(kids[k])
		}
	}
	return best
}
