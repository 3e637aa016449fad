// Package report renders engine results for people (text, terminal charts,
// SVG/PNG) and for programs (JSON). It sits at the edge: nothing in the core
// imports it.
package report

import (
	"encoding/json"
	"io"

	"github.com/memplan/memplan/engine"
	"github.com/memplan/memplan/ir"
	"github.com/memplan/memplan/sim"
	"github.com/memplan/memplan/units"
)

// Schema names the JSON layout; bump it when a field changes meaning.
const Schema = "memplan.plan/v1"

// PointJSON is a ledger moment.
type PointJSON struct {
	Bytes     units.Bytes `json:"bytes"`
	Phase     string      `json:"phase"`
	Op        string      `json:"op"`
	Module    string      `json:"module"`
	OpIndex   int         `json:"op_index"`
	MicroStep int         `json:"micro_step"`
}

// PhaseJSON is one phase's peak.
type PhaseJSON struct {
	PeakBytes units.Bytes `json:"peak_bytes"`
	Op        string      `json:"op"`
	Module    string      `json:"module"`
	OpIndex   int         `json:"op_index"`
}

// LedgerJSON is bytes by category.
type LedgerJSON struct {
	Parameters     units.Bytes `json:"parameters"`
	Gradients      units.Bytes `json:"gradients"`
	OptimizerState units.Bytes `json:"optimizer_state"`
	Activations    units.Bytes `json:"activations"`
	Temporaries    units.Bytes `json:"temporaries"`
	KVCache        units.Bytes `json:"kv_cache"`
	Other          units.Bytes `json:"other"`
}

func ledger(l sim.Ledger) LedgerJSON {
	return LedgerJSON{l[ir.Parameter], l[ir.Gradient], l[ir.OptimizerState], l[ir.Activation], l[ir.Temporary], l[ir.KVCache], l[ir.Other]}
}

// EventJSON is one timeline entry: the memory at the high-water mark of an op.
type EventJSON struct {
	Op        string      `json:"op"`
	Module    string      `json:"module,omitempty"`
	Phase     string      `json:"phase"`
	MicroStep int         `json:"micro_step"`
	Total     units.Bytes `json:"total"`
	LedgerJSON
	Recompute bool `json:"recompute,omitempty"`
	// OpIndex and Ops, in a timeline of more ops than the points asked
	// for: the op the event is (the highest of Ops ops in a row, which it
	// stands for). Absent, the event is op i of the timeline's i.
	OpIndex int `json:"op_index,omitempty"`
	Ops     int `json:"ops,omitempty"`
}

// DefaultTimelinePoints is how many events a JSON timeline holds at most
// (--timeline-points): the plans of the README's examples have 1,400-2,900
// ops, and a chart is no finer than its pixels, where deepseek-v3's plan of
// three micro-steps has 1.4 million ops (555 MB of JSON, 3.2 GB to write).
// MaxTimelinePoints is the most it may ask for.
const (
	DefaultTimelinePoints = 10_000
	MaxTimelinePoints     = 200_000
)

// PlanJSON is the machine form of `memplan plan`.
type PlanJSON struct {
	Schema     string `json:"schema"`
	Model      string `json:"model"`
	Family     string `json:"family"`
	Mode       string `json:"mode"`
	MicroBatch int    `json:"micro_batch"`
	Seq        int    `json:"seq"`
	Accum      int    `json:"accum"`
	// SimulatedAccum is the micro-steps the timeline holds when fewer than
	// accum were simulated (the same peak: engine.Result.SimAccum).
	SimulatedAccum int    `json:"simulated_accum,omitempty"`
	GenTokens      int    `json:"gen_tokens,omitempty"`
	Precision      string `json:"precision,omitempty"`   // the --precision planned; none for a trace, which ran in the dtypes it recorded
	TraceDType     string `json:"trace_dtype,omitempty"` // a trace's: the dtype its matrix products wrote, the one its step is priced in
	Optimizer      string `json:"optimizer,omitempty"`
	OptimizerImpl  string `json:"optimizer_impl,omitempty"`
	// Attention is the --attention planned; none for a trace, which ran
	// the attention it recorded.
	Attention string `json:"attention,omitempty"`
	// OptimizerRecorded: a trace's recorded optimizer step was replayed
	// (optimizer and optimizer_impl are what it recorded, each left out
	// where it records none), not replaced by --optimizer or a workload's.
	OptimizerRecorded bool          `json:"optimizer_recorded,omitempty"`
	Checkpoint        string        `json:"checkpoint,omitempty"`
	Recipe            string        `json:"recipe,omitempty"`
	Checkpointed      []string      `json:"checkpointed_modules,omitempty"`
	AutoNoneFits      bool          `json:"checkpoint_auto_none_fits,omitempty"` // auto planned every block: no choice fits
	GPU               string        `json:"gpu,omitempty"`
	TP                int           `json:"tp,omitempty"`
	SP                bool          `json:"sp,omitempty"`
	EP                int           `json:"ep,omitempty"`
	LoRARank          int           `json:"lora_rank,omitempty"`
	LoRATargets       []string      `json:"lora_targets,omitempty"`
	QLoRA             bool          `json:"qlora,omitempty"`
	DP                int           `json:"dp,omitempty"`
	ZeRO              int           `json:"zero,omitempty"`
	PP                int           `json:"pp,omitempty"`
	PPStage           int           `json:"pp_stage"`
	StagePeaks        []units.Bytes `json:"pp_stage_peaks_bytes,omitempty"`
	Offload           string        `json:"offload,omitempty"`
	HostPeak          units.Bytes   `json:"host_peak_bytes"`
	// HostPerNode is HostPeak × the job's GPUs on one node (GPUsPerNode);
	// HostMemory the per-node limit given, HostShortfall how far over it.
	HostPerNode   units.Bytes   `json:"host_per_node_bytes"`
	GPUsPerNode   int           `json:"gpus_per_node"`
	HostMemory    units.Bytes   `json:"host_memory_bytes,omitempty"`
	HostShortfall units.Bytes   `json:"host_shortfall_bytes,omitempty"`
	Params        int64         `json:"params"`
	Peak          PointJSON     `json:"peak"`
	Phases        phasesJSON    `json:"phases"`
	Ledger        LedgerJSON    `json:"ledger"`
	ModelStates   statesJSON    `json:"model_states"`
	Saved         savedJSON     `json:"saved_activations"`
	Fits          bool          `json:"fits"`
	CapacityBytes units.Bytes   `json:"capacity_bytes"`
	Shortfall     units.Bytes   `json:"shortfall_bytes"`
	Headroom      units.Bytes   `json:"headroom_bytes"`
	FirstStep     *firstJSON    `json:"first_step,omitempty"`
	Reserved      *reservedJSON `json:"reserved,omitempty"`
	Time          *timeJSON     `json:"time,omitempty"`
	Ops           int           `json:"ops"`
	// NextStep is the largest lever of compare when the job does not fit
	// (set by the CLI, which plans it); Warnings name inputs the plan
	// ignored or found implausible.
	NextStep *NextStepJSON `json:"next_step,omitempty"`
	Warnings []string      `json:"warnings,omitempty"`
	// TimelineOps is the ops of a timeline of more than its points (each
	// event then the highest of the ops it stands for, the peak's op one
	// of them); absent when it holds every op.
	TimelineOps int         `json:"timeline_ops,omitempty"`
	Timeline    []EventJSON `json:"timeline,omitempty"`
}

// NextStepJSON is the strategy of compare that lowers the peak the most.
type NextStepJSON struct {
	Strategy  string      `json:"strategy"`
	Changes   string      `json:"changes"`
	PeakBytes units.Bytes `json:"peak_bytes"`
	Fits      bool        `json:"fits"`
	Shortfall units.Bytes `json:"shortfall_bytes"`
}

// NextStep is row's JSON form (nil for nil).
func NextStep(row *engine.Row) *NextStepJSON {
	if row == nil {
		return nil
	}
	r := row.Result
	return &NextStepJSON{Strategy: row.Name, Changes: row.Changes, PeakBytes: r.PeakBytes(), Fits: r.Fits, Shortfall: r.Shortfall}
}

// timeJSON is the priced step: a roofline upper bound on speed on the GPU,
// with ideal efficiency unless configured otherwise.
type timeJSON struct {
	StepS            float64 `json:"step_s"`
	ForwardS         float64 `json:"forward_s"`
	BackwardS        float64 `json:"backward_s"`
	OptimizerS       float64 `json:"optimizer_s"`
	RecomputeS       float64 `json:"recompute_s"`
	ExposedCommS     float64 `json:"exposed_comm_s"`
	ExposedTransferS float64 `json:"exposed_transfer_s"`
	FLOPs            float64 `json:"flops"`
	RecomputeFLOPs   float64 `json:"recompute_flops"`
	TokensPerS       float64 `json:"tokens_per_s"`
	SamplesPerS      float64 `json:"samples_per_s"`
	MFU              float64 `json:"mfu"`
	HFU              float64 `json:"hfu"`
}

type phasesJSON struct {
	Forward   *PhaseJSON `json:"forward,omitempty"`
	Backward  *PhaseJSON `json:"backward,omitempty"`
	Optimizer *PhaseJSON `json:"optimizer,omitempty"`
}

type statesJSON struct {
	Parameters     units.Bytes `json:"parameters"`
	Gradients      units.Bytes `json:"gradients"`
	OptimizerState units.Bytes `json:"optimizer_state"`
	BytesPerParam  float64     `json:"bytes_per_param"`
}

type savedJSON struct {
	TotalBytes units.Bytes            `json:"total_bytes"`
	ByModule   map[string]units.Bytes `json:"by_module"`
}

type firstJSON struct {
	Peak   PointJSON  `json:"peak"`
	Phases phasesJSON `json:"phases"`
	// OptimizerStateCreated is the state the first step allocates lazily.
	OptimizerStateCreated units.Bytes `json:"optimizer_state_created_bytes"`
}

func point(p *ir.Program, pt sim.Point) PointJSON {
	j := PointJSON{Bytes: pt.Total, Phase: pt.Phase.String(), OpIndex: pt.Op, MicroStep: pt.Micro}
	if pt.Op >= 0 && pt.Op < len(p.Ops) { // -1: a program of no op
		j.Op, j.Module = p.Ops[pt.Op].Name, p.Ops[pt.Op].Module
	}
	return j
}

func phases(p *ir.Program, r *sim.Result) phasesJSON {
	var out phasesJSON
	for ph := ir.Phase(0); ph < ir.NumPhases; ph++ {
		pp := r.PhasePeak[ph]
		if pp.Op < 0 {
			continue
		}
		op := &p.Ops[pp.Op]
		j := &PhaseJSON{PeakBytes: pp.Total, Op: op.Name, Module: op.Module, OpIndex: pp.Op}
		switch ph {
		case ir.Forward:
			out.Forward = j
		case ir.Backward:
			out.Backward = j
		case ir.Optimizer:
			out.Optimizer = j
		}
	}
	return out
}

// Build assembles the JSON form; a timeline of at most points events is
// added when points > 0 (timelineEvents).
func Build(res *engine.Result, points int) *PlanJSON {
	s, p, r := &res.Spec, res.Program, res.Sim
	j := &PlanJSON{
		Schema: Schema, Model: s.JobName(), Mode: s.Mode.String(),
		MicroBatch: s.MicroBatch, Seq: s.Seq, Accum: s.Accum, SimulatedAccum: res.SimAccum, GenTokens: s.GenTokens,
		Precision: s.Precision.String(), Attention: s.Attention.String(), Checkpoint: s.Checkpoint.String(),
		Recipe: s.Sem.Recipe, Checkpointed: res.AutoCheckpointed, AutoNoneFits: res.AutoNoneFits,
		Params: r.Params, Peak: point(p, r.Peak), Phases: phases(p, r), Ledger: ledger(r.Peak.Cat),
		ModelStates: statesJSON{r.ModelStates.Parameters, r.ModelStates.Gradients, r.ModelStates.OptimizerState, 0},
		Saved:       savedJSON{r.SavedTotal, r.SavedByModule},
		Fits:        res.Fits, CapacityBytes: res.Capacity, Shortfall: res.Shortfall, Headroom: res.Headroom,
		Ops: len(p.Ops),
	}
	if r.Params > 0 {
		ms := r.ModelStates
		j.ModelStates.BytesPerParam = float64(ms.Parameters+ms.Gradients+ms.OptimizerState) / float64(r.Params)
	}
	if s.Model != nil {
		j.Family = s.Model.Family
	} else {
		j.Family = "trace"
	}
	if s.Trace != nil {
		j.Precision, j.TraceDType = "", s.PrecisionName()
		j.Attention = "" // a trace ran the attention it recorded, which its ops are
		j.OptimizerRecorded = !s.TraceOptimizer
	}
	if s.Mode == engine.Train {
		j.Optimizer, j.OptimizerImpl = s.OptimizerName(), s.ImplName()
	}
	if s.GPU != nil {
		j.GPU = s.GPU.Name
	}
	j.TP, j.SP, j.EP, j.QLoRA = s.TP, s.SP, s.EP, s.QLoRA
	j.DP, j.ZeRO, j.PP, j.PPStage, j.Offload, j.HostPeak = s.DP, s.ZeRO, s.PP, res.Stage, s.Offload.String(), res.HostPeak
	j.HostPerNode, j.GPUsPerNode, j.HostMemory, j.HostShortfall = res.HostPerNode, s.GPUsOnNode(), s.HostMemory, res.HostShortfall
	if len(res.StagePeaks) > 1 {
		j.StagePeaks = res.StagePeaks
	}
	if s.LoRA != nil {
		j.LoRARank, j.LoRATargets = s.LoRA.Rank, s.LoRA.Targets
	}
	if res.First != nil {
		f := &firstJSON{Peak: point(res.FirstProgram, res.First.Peak), Phases: phases(res.FirstProgram, res.First)}
		// The storages of optimizer state the first step creates and
		// keeps (ir.Tensor.Keep): the catalog's optimizer.init_state
		// writes them, a trace's recorded first step (zeros_like and the
		// like) too, which counting init_state's outputs alone had made
		// 0 for every trace (trace sweep, round 24).
		for _, t := range res.FirstProgram.Tensors {
			if t.Cat == ir.OptimizerState && t.Keep && !t.Resident && t.Base == ir.NoTensor {
				f.OptimizerStateCreated += t.Bytes
			}
		}
		j.FirstStep = f
	}
	if t := res.Timing; t != nil {
		j.Time = &timeJSON{StepS: t.Step.Seconds(), ForwardS: t.Phases[ir.Forward].Wall.Seconds(), BackwardS: t.Phases[ir.Backward].Wall.Seconds(),
			OptimizerS: t.Phases[ir.Optimizer].Wall.Seconds(), RecomputeS: t.Recompute.Seconds(), ExposedCommS: t.ExposedComm.Seconds(),
			ExposedTransferS: t.ExposedTransfer.Seconds(), FLOPs: t.FLOPs, RecomputeFLOPs: t.RecomputeFLOPs,
			TokensPerS: t.TokensPerSec, SamplesPerS: t.SamplesPerSec, MFU: t.MFU, HFU: t.HFU}
	}
	j.Reserved = buildReserved(res)
	if points > 0 {
		j.Timeline = timelineEvents(p, r.Timeline, points)
		if len(j.Timeline) < len(r.Timeline) {
			j.TimelineOps = len(r.Timeline)
		}
	}
	return j
}

// timelineEvents is one event per op of tl when it has at most points ops;
// else runs of ⌈len/points⌉ ops in a row, each as its highest op (the
// first of equals), so the peak's op is an event and no event is above it.
func timelineEvents(p *ir.Program, tl []sim.Point, points int) []EventJSON {
	event := func(pt sim.Point) EventJSON {
		op := &p.Ops[pt.Op]
		return EventJSON{Op: op.Name, Module: op.Module, Phase: pt.Phase.String(), MicroStep: pt.Micro, Total: pt.Total, LedgerJSON: ledger(pt.Cat), Recompute: op.Recompute}
	}
	if len(tl) <= points {
		out := make([]EventJSON, len(tl))
		for i, pt := range tl {
			out[i] = event(pt)
		}
		return out
	}
	k := (len(tl) + points - 1) / points
	out := make([]EventJSON, 0, (len(tl)+k-1)/k)
	for lo := 0; lo < len(tl); lo += k {
		hi := min(lo+k, len(tl))
		top := lo
		for i := lo + 1; i < hi; i++ {
			if tl[i].Total > tl[top].Total {
				top = i
			}
		}
		e := event(tl[top])
		e.OpIndex, e.Ops = tl[top].Op, hi-lo
		out = append(out, e)
	}
	return out
}

// WriteJSON writes the JSON form, indented, with a timeline of at most
// points events (none when points is 0).
func WriteJSON(w io.Writer, res *engine.Result, points int) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(Build(res, points))
}
