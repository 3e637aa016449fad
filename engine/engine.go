// Package engine answers memplan's main question for one job: it turns a
// model, a workload and a recipe (Spec) into the program of one iteration,
// simulates it, and says whether it fits a GPU. It does no I/O.
package engine

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/memplan/memplan/cost"
	"github.com/memplan/memplan/hw"
	"github.com/memplan/memplan/importer/torchtrace"
	"github.com/memplan/memplan/ir"
	"github.com/memplan/memplan/lower"
	"github.com/memplan/memplan/models"
	"github.com/memplan/memplan/models/build"
	"github.com/memplan/memplan/ops"
	"github.com/memplan/memplan/sim"
	"github.com/memplan/memplan/strategy"
	"github.com/memplan/memplan/units"
)

// Mode is training or inference.
type Mode uint8

const (
	Train Mode = iota
	Infer
)

func (m Mode) String() string {
	if m == Infer {
		return "infer"
	}
	return "train"
}

// ParseMode reads "train" or "infer".
func ParseMode(s string) (Mode, error) {
	switch s {
	case "train", "training":
		return Train, nil
	case "infer", "inference":
		return Infer, nil
	}
	return 0, fieldErr(FieldMode, "{mode} %q: want train or infer", s)
}

// Spec is one job. The zero value (with a Model) is a valid spec: Validate
// fills the defaults, as documented on each field. It is grouped into
// comparable parts — the job, the recipe's semantics, the parallel layout,
// the memory savings and the target it must fit — so every key a cache or a
// search keeps is a Spec with the parts it ignores zeroed (keys.go), never
// a list of fields; how a plan is computed (cache, timeline, stages) is
// planning Options, not part of the job.
type Spec struct {
	Job
	// Sem are the running framework's semantics (recipe); the zero value
	// is transformers/peft on PyTorch 2 with no overhead counted.
	Sem Semantics
	Parallel
	Savings
	Target
}

// Job is what runs: the model (or a recorded trace), the shape of one
// micro-step, the dtypes, the optimizer, the kernels and the adapters.
type Job struct {
	Model *models.Arch
	// Trace, when set, is the job instead of Model: a recorded PyTorch
	// training step (memplan_torch export) replayed at MicroBatch/Seq.
	// TraceOptimizer replaces its recorded optimizer step by Optimizer/Impl.
	Trace          *torchtrace.Trace
	TraceOptimizer bool
	Mode           Mode
	// MicroBatch (default 1) and Seq (default min(2048, MaxPositions); ViT
	// ignores it) size one micro-step.
	MicroBatch, Seq int
	// Accum micro-steps per optimizer step (default 1).
	Accum     int
	Precision ops.Precision
	Optimizer lower.Optimizer
	Impl      lower.Impl
	Attention build.Attention
	Device    ops.Device
	// GenTokens is how many tokens inference generates after the prompt of
	// Seq tokens; the KV cache holds Seq+GenTokens per sequence.
	GenTokens int
	// LoRA adapters (nil: full fine-tuning); QLoRA stores the frozen base
	// weights in NF4.
	LoRA  *build.LoRA
	QLoRA bool
	// Count is how a trace's allocations are counted (the device's
	// allocator, or the tracker a measurement used); the zero value is the
	// device's default (Counter).
	Count Counter
}

// Parallel is how the job is split over GPUs: TP, SP, EP (tensor, sequence
// and expert parallelism, degrees; 0 or 1 is none) build the graph of one
// GPU (models/build); PP is the pipeline-parallel degree (every stage is
// planned and the worst reported), PPSchedule its schedule (default 1F1B)
// and PPInterleave the virtual stages per rank; Sharding the data-parallel
// replicas.
type Parallel struct {
	TP, EP           int
	SP               bool
	PP, PPInterleave int
	PPSchedule       strategy.Schedule
	Sharding
}

// Sharding is the data-parallel layout: DP replicas (1: one), ZeRO the
// stage their model state is sharded at (0: plain DDP over DP ranks; 3 is
// FSDP FULL_SHARD), ZeROBucketElems stage 2's reduce_bucket_size in
// elements (0: DeepSpeed's default, strategy.DefaultReduceBucketElems; 1
// reduces each gradient as it is ready). Sharding is applied after the
// program a Cache keeps.
type Sharding struct {
	DP, ZeRO        int
	ZeROBucketElems int64
}

// Savings trade time for memory without changing the training result:
// activation checkpointing (training only) and offload to host memory.
type Savings struct {
	Checkpoint CheckpointPolicy
	Offload    Offload
}

// Target is what the job must fit and what is asked of it: GPU, when set,
// decides Fits and prices the step; Capacity overrides the GPU's usable
// memory when positive; FirstStep also simulates the first iteration, whose
// optimizer step creates the optimizer state. HostMemory, when positive, is
// the host memory of one node the job may pin (offloaded state and
// activations of every GPU on the node); a plan over it does not fit.
// GPUsPerNode is how many of the job's GPUs share a node's host memory
// (default 8, an HGX/DGX node; fewer when the job has fewer GPUs).
//
// A job of more GPUs than a node holds spans nodes: its ranks are placed
// as cost.Topology says (tensor parallel innermost) and collectives whose
// group spans nodes are priced on InterNode, each GPU's link to the other
// nodes (zero: the GPU catalog's node network, hw.GPU.Node; when neither
// is known every group is priced as if inside one node).
type Target struct {
	GPU         *hw.GPU
	Capacity    units.Bytes
	FirstStep   bool
	HostMemory  units.Bytes
	GPUsPerNode int
	InterNode   cost.Link
}

// DefaultGPUsPerNode is the GPUs of one node when neither the spec nor
// the GPU catalog gives one (an 8-GPU HGX/DGX board).
const DefaultGPUsPerNode = 8

// NodeGPUs is the GPUs of one node: GPUsPerNode when given, else the GPU
// catalog's node size, else DefaultGPUsPerNode.
func (s *Spec) NodeGPUs() int {
	if s.GPUsPerNode > 0 {
		return s.GPUsPerNode
	}
	if s.GPU != nil && s.GPU.Node != nil {
		return s.GPU.Node.GPUs
	}
	return DefaultGPUsPerNode
}

// JobGPUs is dp × tp × pp.
func (s *Spec) JobGPUs() int { return max(s.DP, 1) * max(s.TP, 1) * max(s.PP, 1) }

// GPUsOnNode is how many of the job's GPUs (dp × tp × pp) share one node:
// NodeGPUs, or the job's GPUs when fewer.
func (s *Spec) GPUsOnNode() int {
	return min(s.NodeGPUs(), s.JobGPUs())
}

// Nodes is how many nodes the job's GPUs fill.
func (s *Spec) Nodes() int {
	n := s.NodeGPUs()
	return (s.JobGPUs() + n - 1) / n
}

// InterNodeLink is the link collectives across nodes are priced on:
// InterNode when given, else the GPU catalog's node network; ok is false
// when neither is known.
func (s *Spec) InterNodeLink() (cost.Link, bool) {
	if s.InterNode != (cost.Link{}) {
		return s.InterNode, true
	}
	if s.GPU != nil && s.GPU.Node != nil {
		return cost.Link{Bandwidth: s.GPU.Node.NetworkPerDirection}, true
	}
	return cost.Link{}, false
}

// Topology is the placement Price uses: nil when the job fits on one node
// or no inter-node link is known.
func (s *Spec) Topology() *cost.Topology {
	link, ok := s.InterNodeLink()
	if s.Nodes() < 2 || !ok {
		return nil
	}
	return &cost.Topology{GPUsPerNode: s.NodeGPUs(), InterNode: link, TP: s.TP, DP: s.DP}
}

// Options say how a plan is computed; they never change its numbers.
type Options struct {
	// Context, when set, stops the plan between its phases (building,
	// lowering and transforming each program, simulating it, pricing it,
	// replaying it through the allocator, each strategy of Compare and the
	// lever): the call then returns the context's cause. A phase runs to
	// its end; deepseek-v3's longest, lowering or simulating its 1.3
	// million ops, take about 0.3 s on this project's machine. The
	// service's request deadline and a client that went away stop a plan
	// through it.
	Context context.Context
	// Cache, when set, memoizes programs across plans (a search's).
	Cache *Cache
	// NoTimeline leaves Result.Sim.Timeline empty (sim.Options): for
	// searches that only need peaks.
	NoTimeline bool
	// Totals fills Result.Sim.Totals with each op's device total
	// (sim.Options.Totals).
	Totals bool
	// NoTiming leaves Result.Timing nil and StepFLOPs 0: for plans whose
	// step time nobody reads (the next step's strategies, judged by their
	// peaks). A plan of more than three micro-steps then builds no
	// two-micro-step program to extrapolate its step from (planShortAccum),
	// and a 1F1B pipeline of p+2 to 2p+3 micro-steps simulates the p+1 that
	// show every stage's peak (pipelineShortAccum) instead of all of them
	// (planPipelineShortAccum).
	NoTiming bool
	// OpTimes keeps each op's times in Result.Timing.Ops (pack's envelope
	// lays the curves on the step's time axis); without it the timing holds
	// the step's and the phases' times alone (cost.PriceOptions.NoOps).
	OpTimes bool
	// Stages, when set, plans only these pipeline stages. The search plans
	// the first and the last: with identical layers they bound the others
	// (a middle stage holds the same layers as the first with fewer
	// micro-batches in flight and no embedding, and the same as the last
	// without the head and loss).
	Stages []int
	// AllAccum simulates every micro-step; by default a plan of more than
	// three micro-steps without pipelining simulates the three that show its
	// peak and extrapolates its step time (shortAccum), and a 1F1B pipeline
	// simulates p+1, its step time extrapolated from p+1 and p+2
	// (pipelineShortAccum, planPipelineShortAccum).
	AllAccum bool
	// wholeStages builds the whole model for every pipeline stage (the
	// reference stageSlice is tested against).
	wholeStages bool
	// shortAccum: this plan is planFewer's, of the micro-steps that show
	// the peak of a longer one.
	shortAccum bool
	// graphs are forward graphs already built for the spec, by stage
	// (planShortAccum's, built for its program of two micro-steps).
	graphs map[int]*ir.Graph
	// NumbersOnly: the caller reads the result's numbers (the peaks, their
	// ops by name, sim.Result.PeakOp), never its programs (the lever's
	// strategies, diagnose's variations), so each program is dropped once
	// simulated (Result.Compact) and the steady step's is not live while
	// the first step's is built (with leverBound, deepseek-v3 --accum 8:
	// 2.67 → 2.41 GB of peak RSS).
	NumbersOnly bool
	// PeakOnly: the caller reads the result's numbers and the programs of
	// its peak's stage, never another stage's numbers (Result.StagePeaks
	// may lack stages) or programs (diagnose's baseline, whose objects are
	// the peak's storages): unpriced, its pipeline stages are planned as
	// for NumbersOnly, each with the micro-steps that show its own peak
	// (stageAccum) and like middle stages left out (likeStages), and the
	// peak's programs are kept.
	PeakOnly bool
	// ReplayPeak: PeakOnly, and the peak's stage planned again as a full
	// plan plans it, its steady and first-step programs of the micro-steps
	// a full plan simulates, for a caller that replays them through the
	// caching allocator (diagnose --reserved), whose fragmentation may
	// grow with the micro-steps: planReplayPeak.
	ReplayPeak bool
	// StopOver, when positive, ends the plan after the first stage (or
	// steady step) whose peak is over it, and StopUnfit after the first
	// over the plan's capacity: the result holds the stages planned, no
	// first step, and is not judged (Fits false), for a caller that asks
	// only whether the plan fits or peaks under a bound (diagnose's next
	// step: deepseek-v3 --pp 8 --accum 16 planned every stage of each
	// strategy to learn it did not fit, where the first stage showed it).
	StopOver  units.Bytes
	StopUnfit bool
	// stageShort: a numbers-only plan of a 1F1B pipeline's p+1 micro-steps
	// (planPipelineShortAccum) plans each stage with the fewer that show
	// its own peak (stageAccum).
	stageShort bool
	// stageSteps, when set, is the micro-steps each pipeline stage is
	// planned with (planStagewise's).
	stageSteps []int
	// stagewise plans a priced 1F1B pipeline of more than p+1 micro-steps
	// a stage at a time whatever its size (tests of planStagewise).
	stagewise bool
	// stopAt (the lever's, LargestLeverContext) says whether to end the
	// plan of the variant of an index of eachVariant's after a stage,
	// given its peak so far and whether stages are left: it cannot be the
	// best, or is put off. eachVariant hands each plan its own as
	// stopAbove.
	stopAt func(int, units.Bytes, bool) bool
	// resumeAt (the lever's) is the result to resume (Options.resume) for
	// the variant of an index of eachVariant's, or nil.
	resumeAt func(int) *Result
	// resume, when set, is the result of this plan stopAbove ended with
	// stages left (Result.stopped, numbers only): the plan goes on from
	// the stage after its last, its peaks, host peak and peak stage so far
	// those of resume (the lever's put-off strategy, planned again,
	// planned its first stages again: deepseek-v3 --pp 8 --accum 16 --dp 4
	// --zero 3's "checkpoint every block", 1.1 s).
	resume *Result
	// stopAbove, when set, ends the plan after the first stage (or steady
	// step) for which it says so, given the peak so far and whether
	// stages are left: its result holds the stages planned, no first
	// step, and only its peak (a lower bound of the full plan's, which
	// could only be higher) is read. The lever's strategies that cannot
	// be the best plan one or two pipeline stages, not all of them.
	stopAbove func(peak units.Bytes, more bool) bool
	// rankTimes, when set, gets each planned stage's timing before the
	// bubble (priceRank), in stage order (planPipelineShortAccum).
	rankTimes *[]*cost.Timing
	// leverBound: the strategies after this one may be ruled out by the
	// bound its peak tightens (LargestLever), so the cache keeps none of
	// its programs for them (eachVariant).
	leverBound bool
}

// forNumbers says whether the caller reads no stage but the peak's
// (NumbersOnly, PeakOnly): each stage is planned with the micro-steps that
// show its own peak, like middle stages and a first step that peaks no
// higher are left out.
func (o *Options) forNumbers() bool { return o.NumbersOnly || o.PeakOnly }

// stopped is the cause of o.Context once it is done (nil without one, or
// before).
func (o *Options) stopped() error {
	if o.Context == nil {
		return nil
	}
	return context.Cause(o.Context)
}

// ErrSpec wraps every invalid-spec error.
var ErrSpec = errors.New("invalid spec")

// Validate fills defaults and checks ranges.
func (s *Spec) Validate() error {
	s.Sem.resolve(s.GPU, s.Device)
	// The step the plan lowers, so the spec a result reports names it
	// (lion's single loop, bitsandbytes' kernel): the lowering would plan
	// it anyway, and a report of the one asked for misread the peak.
	s.Impl = s.Optimizer.Planned(s.Impl)
	if s.Sem.Workspace < 0 || s.Sem.Overhead < 0 || s.Sem.CommOverhead < 0 {
		return invalid(FieldSet, "the cuBLAS workspace and the memory overheads must not be negative")
	}
	if g := s.GPU; g != nil && s.Capacity <= 0 {
		// A usable memory of 0 would read as no GPU given: no verdict.
		n := s.groups()
		if out, ok := s.outside(); !ok || out >= g.Capacity() {
			if n == 0 {
				return invalid(FieldSet, "cuda.overhead %s leaves none of the %s's %s for tensors", s.Sem.Overhead, g.Name, g.Capacity())
			}
			return invalid(FieldSet, "cuda.overhead %s and %d × nccl.overhead %s (a communicator per parallel group) leave none of the %s's %s for tensors", s.Sem.Overhead, n, s.Sem.CommOverhead, g.Name, g.Capacity())
		}
	}
	if s.Trace != nil {
		if err := s.validateTraceJob(); err != nil {
			return err
		}
		return s.validateLimits()
	}
	if s.Model == nil {
		return invalid(FieldModel, "no {model}")
	}
	if q := s.Model.Quant; q != nil {
		// A pre-quantized checkpoint's weights are not the training
		// dtype's; planning it as if they were would ignore the config.
		return invalid(FieldModel, "%s's config.json has a quantization_config (%s): training and inference plans take unquantized weights; plan serving it ({mode} serve), or plan the unquantized model (QLoRA quantizes it: {qlora})", s.Model.Name, q)
	}
	if err := s.validateSizes(); err != nil {
		return err
	}
	if err := s.validateLimits(); err != nil {
		return err
	}
	return s.validateOptions()
}

// validateTraceJob fills and checks the job of a trace.
func (s *Spec) validateTraceJob() error {
	if s.Model != nil {
		return invalid(FieldTrace, "give a {model} or a {graph}, not both")
	}
	if s.MicroBatch == 0 {
		s.MicroBatch = int(s.Trace.TraceBatch)
	}
	if s.Accum == 0 {
		s.Accum = 1
	}
	if s.MicroBatch < 0 || s.Accum < 0 || s.Seq < 0 {
		return invalid(FieldMicroBatch, "{micro-batch}, {accum} and {seq} must be positive")
	}
	if err := s.validateParallel(); err != nil {
		return err
	}
	if err := s.validateInterleave(); err != nil {
		return err
	}
	return s.validateTrace()
}

// validateSizes fills the defaults of a model's job (micro-batch 1, seq 2048 or the model's positions,
// accum 1) and checks its sizes.
func (s *Spec) validateSizes() error {
	if s.MicroBatch == 0 {
		s.MicroBatch = 1
	}
	if s.MicroBatch < 0 {
		return invalid(FieldMicroBatch, "{micro-batch} must be positive, got %d", s.MicroBatch)
	}
	if s.Seq == 0 {
		s.Seq = 2048
		if mp := s.Model.MaxPositions; mp > 0 && mp < s.Seq {
			s.Seq = mp
		}
	}
	if s.Seq < 0 {
		return invalid(FieldSeq, "{seq} must be positive, got %d", s.Seq)
	}
	// Each bounded before their sum, which wrapped (gen-tokens 2^63-1
	// made --seq -9223372036854773761 in the token-limit message).
	if s.Seq > MaxTokens {
		return invalid(FieldSeq, "{seq} %d is over the limit of 2^34 tokens", s.Seq)
	}
	if s.GenTokens > MaxTokens {
		return invalid(FieldGenTokens, "{gen-tokens} %d is over the limit of 2^34 tokens", s.GenTokens)
	}
	if s.Model.PosEmbedding == models.PosLearned && s.Model.Family != models.FamilyViT && s.Seq+s.GenTokens > s.Model.MaxPositions {
		if s.GenTokens > 0 {
			// Said as the sum it is: "{seq} 1088" named a value nobody gave
			// (--seq 1024 --gen-tokens 64; issue 15's sweep).
			return invalid(FieldSeq, "{seq} %d + {gen-tokens} %d = %d tokens exceed %s's %d learned positions", s.Seq, s.GenTokens, s.Seq+s.GenTokens, s.Model.Name, s.Model.MaxPositions)
		}
		return invalid(FieldSeq, "{seq} %d exceeds %s's %d learned positions", s.Seq, s.Model.Name, s.Model.MaxPositions)
	}
	if s.Accum == 0 {
		s.Accum = 1
	}
	if s.Accum < 0 {
		return invalid(FieldAccum, "{accum} must be positive, got %d", s.Accum)
	}
	if s.GenTokens < 0 {
		return invalid(FieldGenTokens, "{gen-tokens} must not be negative, got %d", s.GenTokens)
	}
	if s.Capacity < 0 {
		return invalid(FieldCapacity, "{budget} must be positive")
	}
	if s.HostMemory < 0 {
		return invalid(FieldHostMemory, "{host-memory} must be positive")
	}
	if s.GPUsPerNode < 0 {
		return invalid(FieldGPUsPerNode, "{gpus-per-node} must be positive, got %d", s.GPUsPerNode)
	}
	return nil
}

// validateOptions checks what applies to training only, the parallel layout, QLoRA, and that the GPU has
// the precision's arithmetic.
func (s *Spec) validateOptions() error {
	if s.Mode == Infer && s.Accum != 1 {
		return invalid(FieldAccum, "{accum} applies to training only")
	}
	if s.TP < 0 || s.EP < 0 {
		return invalid(FieldTP, "{tp} and {ep} must be positive")
	}
	if err := s.validateParallel(); err != nil {
		return err
	}
	if s.Sem.GroupedExperts && s.Sem.Code == build.CodeLitGPT && s.Trace == nil {
		return invalid(FieldSet, "moe.experts grouped-mm is transformers 5.x's experts; model.code litgpt runs lit-gpt's own loop over per-expert linears: give --set moe.experts=loop (or --set model.code=hf)")
	}
	if s.EP > 1 && s.Sem.GroupedExperts && s.Trace == nil {
		return invalid(FieldEP, "{ep} %d shards per-expert linears; the recipe's moe.experts grouped-mm (transformers 5.x's 3-D expert parameters) is not modelled under expert parallelism: give --set moe.experts=loop, or {ep} 1", s.EP)
	}
	if s.QLoRA && s.LoRA == nil {
		return invalid(FieldQLoRA, "{qlora} needs {lora} (QLoRA trains LoRA adapters on a 4-bit base)")
	}
	if s.Mode == Infer && s.Checkpoint.Kind != NoCheckpoint {
		return invalid(FieldCheckpoint, "{checkpoint} applies to training only")
	}
	if err := s.validateInterleave(); err != nil {
		return err
	}
	if err := s.validateStages(); err != nil {
		return err
	}
	if err := s.validatePipelineWork(); err != nil {
		return err
	}
	if s.Checkpoint.Kind == CheckpointSelective && s.Trace == nil && s.Attention != build.Eager {
		// Selective recompute replays eager attention's core_attention
		// module (its score matrices); SDPA keeps no scores to replay.
		return invalid(FieldCheckpoint, "{checkpoint} selective recomputes eager attention's score matrices and needs {attention} eager; with {attention} %s, {checkpoint} selective-op or full save memory", s.Attention)
	}
	if s.Mode == Infer && s.GenTokens > 0 && s.Model.Encoder {
		return invalid(FieldGenTokens, "%s is an encoder; it has no KV cache to generate {gen-tokens} with", s.Model.Name)
	}
	if g := s.GPU; g != nil && g.PeakFLOPs(s.ComputeDType()) <= 0 {
		var ok []string
		for _, p := range ops.Precisions() {
			q := *s
			q.Precision = p
			if g.PeakFLOPs(q.ComputeDType()) > 0 {
				ok = append(ok, p.String())
			}
		}
		return invalid(FieldPrecision, "the %s has no %s arithmetic ({precision} %s); it runs {precision} %s", g.Name, s.ComputeDType(), s.Precision, strings.Join(ok, ", "))
	}
	return nil
}

// JobName names the job: the model's name or the trace's.
func (s *Spec) JobName() string {
	if s.Trace != nil {
		if s.Trace.Name != "" {
			return s.Trace.Name
		}
		return "trace"
	}
	return s.Model.Name
}

// CapacityBytes is the memory the job may use: Capacity, else the GPU's
// memory less what lives outside the caching allocator (Sem.Overhead), else
// 0 (unknown). plan, compare and fit all decide "fits" against it.
func (s *Spec) CapacityBytes() units.Bytes {
	if s.Capacity > 0 {
		return s.Capacity
	}
	if s.GPU != nil {
		out, ok := s.outside()
		if !ok {
			return 0
		}
		return max(s.GPU.Capacity()-out, 0)
	}
	return 0
}

// groups counts the parallel groups of more than one GPU (one NCCL
// communicator each).
func (s *Spec) groups() int {
	n := 0
	for _, d := range []int{s.DP, s.TP, s.PP, s.EP} {
		if d > 1 {
			n++
		}
	}
	return n
}

// trainConfig is how the spec's iteration is lowered.
func (s *Spec) trainConfig(first bool) lower.TrainConfig {
	return lower.TrainConfig{Optimizer: s.Optimizer, Impl: s.Impl, Precision: s.Precision, Accum: s.Accum, FirstStep: first, WeightDecay: -1,
		PagedState: s.Sem.PagedOptimizer, Hold: s.Sem.Hold, ZeroGrad: s.Sem.ZeroGrad, Workspace: s.Sem.Workspace, InBackward: s.Sem.OptimizerInBackward, StateDType: s.Sem.StateDType,
		SeparateCopies: s.PP > 1, OutOfPlaceSums: s.Sem.OutOfPlaceSums}
}

// Result of planning one job.
type Result struct {
	Spec    Spec
	Program *ir.Program
	Sim     *sim.Result
	// First is the first iteration (lazy optimizer state), when asked for:
	// its peaks, phases and totals, without a timeline (what the reports
	// read of it; simulate FirstProgram for its curve). deepseek-v3's
	// first-step timeline was 130 MB at --accum 8, live to the end of plan.
	FirstProgram *ir.Program
	First        *sim.Result
	// Capacity is 0 when no GPU or budget was given; then Fits is false and
	// Shortfall is 0.
	Capacity units.Bytes
	Fits     bool
	// Shortfall is peak − capacity when it does not fit; Headroom is
	// capacity − peak when it does.
	Shortfall, Headroom units.Bytes
	// HostPeak is the host memory one GPU pins at its peak (offloaded
	// state and activations; the largest of every stage and the first
	// step); HostPerNode is HostPeak × Spec.GPUsOnNode. HostShortfall is
	// HostPerNode − Spec.HostMemory when a host limit is given and
	// exceeded (then Fits is false).
	HostPeak, HostPerNode, HostShortfall units.Bytes
	// Timing is the priced step (roofline upper bound on speed), when a GPU
	// is given; under pipeline parallelism, the slowest stage's.
	Timing *cost.Timing
	// StepFLOPs is the FLOPs of one step of every pipeline stage together
	// (each stage's priced FLOPs; with one stage, Timing.FLOPs), 0 without
	// a GPU. The slowest stage's FLOPs are no measure of what a strategy
	// adds: it may make another stage the slowest (compare's extra FLOPs).
	StepFLOPs float64
	// Stage is the pipeline stage reported (the one with the highest peak);
	// StagePeaks the peak of every stage (one entry without pipelining).
	Stage      int
	StagePeaks []units.Bytes
	// StagePhasePeaks is the peak of each phase of every stage (0 for a
	// phase a stage has no op in): each is non-decreasing in a dimension
	// that every tensor's size follows, as the peak, their maximum, is;
	// max follows them apart, as the peak bends where another takes over.
	StagePhasePeaks [][ir.NumPhases]units.Bytes
	// AutoCheckpointed lists the blocks --checkpoint auto chose (nil
	// otherwise). AutoNoneFits says no choice fits: auto planned every
	// block checkpointed, the lowest peak it reaches, and the plan does not
	// fit (a job too big is an answer, not bad input: plan reports it, max
	// bisects over it).
	AutoCheckpointed []string
	AutoNoneFits     bool
	// Reserved is the caching allocator's prediction, when PredictReserved
	// was asked for it.
	Reserved *Reserved
	// SimAccum is the micro-steps Program and Sim hold when fewer than
	// Spec.Accum were simulated (they show the same peak; Timing, when
	// priced, is the step of Spec.Accum), else 0.
	SimAccum int

	// owned: Program was made for this result alone (Release may recycle
	// it), not taken from a Cache.
	owned bool
	// lent: the programs of the result a cache holds (Cache.lend), which
	// it gives back as they are dropped (Release, Compact).
	lent     []*ir.Program
	lentFrom *Cache
	// stopped, of a plan stopAbove ended with stages left: what its plan
	// continues from (Options.resume).
	stopped *stoppedAt
}

// stoppedAt is where a plan stopAbove ended stopped: after stage, its peak
// stage planned with peakAccum micro-steps, and the forward graphs its
// stages were compared by (likeEarlier).
type stoppedAt struct {
	stage, peakAccum int
	graphs           map[int]*ir.Graph
}

// borrow records with c (nil: none) that r holds those of its programs c
// holds, so that no plan takes them (Cache.take) while r does.
func (r *Result) borrow(c *Cache) {
	if c == nil {
		return
	}
	for _, p := range []*ir.Program{r.Program, r.FirstProgram} {
		if p != nil && !(p == r.Program && r.owned) && c.lend(p) {
			r.lent = append(r.lent, p)
			r.lentFrom = c
		}
	}
}

// giveBack gives p back to the cache it was lent from, if it was.
func (r *Result) giveBack(p *ir.Program) {
	if i := slices.Index(r.lent, p); p != nil && i >= 0 {
		r.lentFrom.giveBack(p)
		r.lent = slices.Delete(r.lent, i, i+1)
	}
	if len(r.lent) == 0 {
		r.lentFrom = nil // the cache (and its forward graph) is not kept alive by r
	}
}

// Release recycles r's program (strategy.Release) when planning made it for
// r alone; r.Program is nil afterwards. For callers that plan thousands of
// results and keep only their numbers, such as a search.
func (r *Result) Release() {
	if r.owned {
		strategy.Release(r.Program)
	}
	r.giveBack(r.Program)
	r.Program, r.owned = nil, false
}

// Compact drops from r what is not read once a plan is judged (its
// programs, timelines and per-op times), keeping its peaks, host memory
// and phase timings: a fit search that kept every judged plan's program
// grew by megabytes per plan (mixtral-8x7b with --allow
// lora,qlora,8bit,precision: 21 GB after 9 minutes), and a lever kept
// whole holds a program of a deepseek-v3's 470,000 ops. Safe on nil.
func (r *Result) Compact() {
	if r == nil {
		return
	}
	r.Release()
	r.giveBack(r.FirstProgram)
	r.FirstProgram = nil
	for _, p := range []**sim.Result{&r.Sim, &r.First} {
		if *p != nil {
			s := **p
			s.Timeline, s.Totals = nil, nil
			*p = &s
		}
	}
	if r.Timing != nil {
		t := *r.Timing
		t.Ops = nil
		r.Timing = &t
	}
}

// TokensPerStep is the tokens one optimizer step consumes per data-parallel
// replica (samples for a trace without a sequence dimension).
func (s *Spec) TokensPerStep() float64 {
	if s.Trace != nil {
		seq := int64(1)
		if s.Trace.HasSeq() {
			seq = s.Trace.TraceSeq
			if s.Seq > 0 {
				seq = int64(s.Seq)
			}
		}
		return float64(s.MicroBatch) * float64(seq) * float64(s.Accum)
	}
	seq := s.Seq
	if s.Model.Family == models.FamilyViT {
		seq = s.Model.NumPatches() + 1
	}
	return float64(s.MicroBatch) * float64(seq) * float64(s.Accum)
}

// ComputeDType is the dtype the matmuls run in.
func (s *Spec) ComputeDType() units.DType {
	if d := s.Precision.AutocastDType(); d != units.Invalid {
		return d
	}
	return s.Precision.ParamDType()
}

// Price times program p of spec s on s.GPU: the step's and the phases'
// times, no op's (Timing.Ops is empty).
func Price(s *Spec, p *ir.Program) (*cost.Timing, error) {
	t, err := priceRank(s, p, false)
	if err != nil {
		return nil, err
	}
	addBubble(s, t)
	return t, checkStep(s, t)
}

// checkStep refuses a step the pricer saturated (longer than a Duration
// holds: a link or GPU slower than any, which printed 2562047h47m16s as the
// step time), naming the GPU.
func checkStep(s *Spec, t *cost.Timing) error {
	if t != nil && t.Step >= math.MaxInt64 {
		return invalid(FieldGPU, "one step would take longer than %s on the %s and its links: too slow to time", time.Duration(math.MaxInt64).Round(time.Hour), s.GPU.Name)
	}
	return nil
}

// priceRank times program p of spec s on s.GPU as the rank runs it, without
// the time it idles in a pipeline's bubble (nil without a GPU), with each
// op's times when ops is set.
func priceRank(s *Spec, p *ir.Program, ops bool) (*cost.Timing, error) {
	if s.GPU == nil {
		return nil, nil
	}
	dp := float64(max(s.DP, 1))
	t, err := cost.Price(p, s.GPU, cost.PriceOptions{DType: s.priceDType(), TokensPerStep: s.TokensPerStep() * dp,
		SamplesPerStep: float64(s.MicroBatch) * float64(s.Accum) * dp, Topology: s.Topology(), NoOps: !ops})
	if err != nil {
		return nil, err
	}
	return t, checkStep(s, t)
}

// pipelineUtilization sets res.Timing's MFU and HFU to the pipeline's when
// every stage was planned: the model FLOPs (and all FLOPs) of every stage
// over pp GPUs' peak for the step (PaLM's MFU, cost.MFU: the job's model
// FLOPs over its devices' peak), not the slowest stage's over one GPU. The
// stages differ (the last holds the head): llama-3.2-1b under --pp 4 said
// 0.2297 where the model's FLOPs give 0.1411 (physical sweep, round 24).
func pipelineUtilization(res *Result, modelFLOPs float64) error {
	t := res.Timing
	pp := max(res.Spec.PP, 1)
	if t == nil || pp < 2 || len(res.StagePeaks) != pp || t.Step <= 0 || t.PeakFLOPs <= 0 {
		return nil
	}
	u := *t
	var err error
	if u.MFU, err = cost.MFU(modelFLOPs/float64(pp), u.Step, u.PeakFLOPs); err != nil {
		return err
	}
	if u.HFU, err = cost.MFU(res.StepFLOPs/float64(pp), u.Step, u.PeakFLOPs); err != nil {
		return err
	}
	res.Timing = &u
	return nil
}

// addBubble adds to t (a rank's timing, nil: none) the time a pipeline rank
// idles for the bubble: with p stages, v virtual stages per rank and m
// micro-batches, (p−1)/(v·m) of the forward and backward time (Narayanan et
// al., SC'21, §2.2).
func addBubble(s *Spec, t *cost.Timing) {
	if t == nil || s.PP < 2 {
		return
	}
	v := float64(max(s.PPInterleave, 1))
	fb := t.Phases[ir.Forward].Wall + t.Phases[ir.Backward].Wall
	t.AddIdle(time.Duration(float64(fb) * float64(s.PP-1) / (v * float64(max(s.Accum, 1)))))
}

// Program builds the program of s (validated); under pipeline parallelism,
// the program of the first stage.
func Program(s *Spec, first bool) (*ir.Program, error) {
	pl := &planner{s: s}
	p, _, err := pl.stageProgram(first, 0)
	return p, err
}

// PipelineInput is the program of s's whole model that strategy.Pipeline
// cuts into s.PP stages, before any other transform: lowered with each tied
// parameter's copies apart, one per stage, as the stages hold them
// (lower.TrainConfig.SeparateCopies). Program is its first stage's.
func PipelineInput(s *Spec, first bool) (*ir.Program, error) {
	q := *s
	q.PP, q.PPInterleave, q.PPSchedule = 1, 0, 0
	pl := &planner{s: &q, separate: true}
	p, _, err := pl.stageProgram(first, 0)
	return p, err
}

// planner plans one spec under its options.
type planner struct {
	s *Spec
	o Options
	// separate lowers tied parameters as separate copies whatever s.PP
	// (PipelineInput).
	separate bool
	// auto caches what --checkpoint auto chose for the spec (nil: not
	// chosen yet).
	auto *autoChoice
	// graphs are the forward graphs built, by stage: the first step's
	// program is lowered from the same graph as the steady one (lowering
	// reads a graph, never writes it), so the model is built once a plan.
	graphs map[int]*ir.Graph
}

// stageProgram builds the program of pipeline stage stage and counts the
// parameters of this GPU before data-parallel sharding.
func (pl *planner) stageProgram(first bool, stage int) (*ir.Program, int64, error) {
	s, c := pl.s, pl.o.Cache
	if err := pl.o.stopped(); err != nil {
		return nil, 0, err
	}
	if s.Trace != nil {
		p, err := traceProgram(s, first)
		if err != nil {
			return nil, 0, err
		}
		return pl.transform(p, false, stage, slice{})
	}
	key, cacheable := pl.cacheKey(first, stage)
	if cacheable {
		if e := c.get(key); e != nil {
			q, err := c.post(key, e, s, c.take(key, e))
			return q, e.params, err
		}
		if e := c.get(key.lowering()); e != nil {
			p, _ := c.program(e, false)
			return c.transform(key, s, p, false, stage, pl.stageSlice(stage))
		}
	}
	if lk, ok := pl.autoLoweringKey(first, stage); ok {
		if e := c.get(lk); e != nil {
			p, _ := c.program(e, false)
			return pl.transform(p, false, stage, slice{})
		}
	}
	o, sl := pl.graphOptions(stage)
	g := pl.graphs[stage]
	if g == nil {
		var err error
		if g, err = c.graphFor(s.Model, o, func() (*ir.Graph, error) { return build.Graph(s.Model, o) }); err != nil {
			return nil, 0, optionError(err)
		}
		if pl.graphs == nil {
			pl.graphs = map[int]*ir.Graph{}
		}
		pl.graphs[stage] = g
	}
	if err := pl.o.stopped(); err != nil {
		return nil, 0, err
	}
	if s.Mode == Infer {
		p, err := lower.InferWith(g, s.Sem.Workspace)
		if err != nil {
			return nil, 0, err
		}
		return p, paramCount(p), nil
	}
	cfg := s.trainConfig(first)
	cfg.SeparateCopies = cfg.SeparateCopies || pl.separate
	// A program no cache holds or will hold is transformed in place, with
	// room (a LeverCache's first step once settled: its checkpoint copied
	// deepseek-v3's 1.4 million lowered ops beside them). Under auto
	// checkpointing only once the blocks are chosen: the choice builds
	// each candidate from the same lowering, but the first step and the
	// stages after the first are built once, for the blocks chosen
	// (deepseek-v3 --accum 4 --checkpoint auto's first step copied its
	// 1.4 million ops to checkpoint them).
	own := (s.Checkpoint.Kind != CheckpointAuto || pl.auto != nil) && (!cacheable || !c.wantsLowering(key))
	cfg.InPlace, cfg.RecomputeRoom = own, own && s.Checkpoint.Kind != NoCheckpoint
	p, err := lower.Train(g, cfg)
	if err == nil {
		err = pl.o.stopped()
	}
	if err != nil {
		return nil, 0, err
	}
	if cacheable {
		return c.transform(key, s, p, own || c.owned(key.lowering(), &cacheEntry{prog: p}), stage, sl)
	}
	return pl.transform(p, own, stage, sl)
}

// graphOptions are the builder's options of stage stage's forward graph,
// and the slice of the model it is built from.
func (pl *planner) graphOptions(stage int) (build.Options, slice) {
	s := pl.s
	o := build.Options{MicroBatch: s.MicroBatch, Seq: s.Seq, Precision: s.Precision, Attention: s.Attention, Device: s.Device,
		Training: s.Mode == Train, TP: s.TP, SP: s.SP, EP: s.EP, LoRA: s.LoRA, QLoRA: s.QLoRA}
	sl := pl.stageSlice(stage)
	o.Layers = sl.layers
	s.Sem.buildOptions(&o)
	o.FSDPFlat = s.flatParams()
	if s.Mode == Infer && !s.Model.Encoder {
		o.KVContext = s.Seq + s.GenTokens
	}
	return o, sl
}

// stagePlan is one pipeline stage planned: its program, simulation and
// timing before the bubble (nil unpriced), and whether the plan owns the
// program (Result.owned).
type stagePlan struct {
	p     *ir.Program
	r     *sim.Result
	t     *cost.Timing
	owned bool
}

// planStage builds stage stage of pl's spec, simulates it and, unless
// pl.o.NoTiming, prices it, beside the simulation for a large program
// (ir.ConcurrentOps: both only read it, and plan's stages ran them in turn
// with the second core idle but for the collector).
func (pl *planner) planStage(stage int) (stagePlan, error) {
	s, o := pl.s, pl.o
	p, params, err := pl.stageProgram(false, stage)
	if err == nil {
		err = o.stopped()
	}
	if err != nil {
		return stagePlan{}, err
	}
	if err := checkProgramBytes(s, p); err != nil {
		return stagePlan{}, err
	}
	var t *cost.Timing
	var errT error
	price := func() {
		if !o.NoTiming {
			t, errT = priceRank(s, p, o.OpTimes)
		}
	}
	var beside sync.WaitGroup
	if len(p.Ops) >= ir.ConcurrentOps {
		beside.Go(price)
		price = func() {}
	}
	r, err := sim.RunWith(p, sim.Options{NoTimeline: o.NoTimeline, Totals: o.Totals})
	price()
	beside.Wait()
	if err == nil {
		err = errT // the simulation's error first, as when it ran first
	}
	if err != nil {
		return stagePlan{}, err
	}
	r.Params = params
	// A cached stage's offload transforms made p for this call alone,
	// unless they left the cached program as it was (without them, or an
	// autocast cache with no float32 parameter to cache: autocast-bf16
	// without adapters).
	_, cached := pl.cacheKey(false, stage)
	owned := cached && len(s.offloadTransforms()) > 0 && !o.Cache.holds(p)
	return stagePlan{p: p, r: r, t: t, owned: owned}, nil
}

// slice is the part of the model a pipeline stage's program is built from:
// layers [layers[0], layers[1]) (zero: the whole model) and the pipeline
// layout that gives them all to the stage.
type slice struct {
	layers [2]int
	layout []int
}

// stageSlice is the slice stage stage is built from. A stage's program
// depends only on its own blocks, the model's ends and the schedule, so
// building the whole model for each stage (and cutting the rest away)
// would do pp times the work. It slices catalog decoders trained without
// interleaving or auto checkpointing (which plans over the whole chain);
// TestPropertyStageSliceEqualsWholeModel checks the sliced stage equals the
// cut.
func (pl *planner) stageSlice(stage int) slice {
	s := pl.s
	if !pl.sliced() || stage < 0 || stage >= s.PP {
		return slice{}
	}
	lo, hi := stageLayers(s, stage)
	layout := make([]int, s.PP)
	layout[stage] = hi - lo
	return slice{layers: [2]int{lo, hi}, layout: layout}
}

// sliced says whether pl builds each pipeline stage from its own layers
// (stageSlice): a model's training pipeline that wholeStages gives no
// reason against.
func (pl *planner) sliced() bool {
	s := pl.s
	if s.PP < 2 || pl.o.wholeStages || s.Trace != nil || s.Model == nil || s.Mode != Train {
		return false
	}
	why, _ := s.wholeStages()
	return why == ""
}

// stageLayers is the layers [lo, hi) of stage stage of s's pipeline.
func stageLayers(s *Spec, stage int) (lo, hi int) {
	return stage * s.Model.Layers / s.PP, (stage + 1) * s.Model.Layers / s.PP
}

// preChain applies checkpointing (chosen: the blocks --checkpoint auto
// picked) and the pipeline schedule to lowered program p (rewritten in
// place when the caller owns it).
func (s *Spec) preChain(p *ir.Program, own bool, chosen []string, stage int, sl slice) (*ir.Program, error) {
	var ts []strategy.Transform
	ck, err := checkpointTransform(s.Checkpoint, p, chosen, sl.layers[0])
	if err != nil {
		return nil, err
	}
	if ck != nil {
		ts = append(ts, ck)
	}
	ts = append(ts, s.preTransforms(stage, sl)...)
	if own {
		return strategy.ChainOwned(p, ts...)
	}
	return strategy.Chain(p, ts...)
}

// transform applies the spec's strategies to a lowered training program
// p, in place when own: the caller's, lowered with room for what the
// transforms insert (lower.TrainConfig.InPlace, RecomputeRoom) and
// transformed once (not under auto checkpointing, which transforms it for
// each choice). Through no cache
// (diagnose's variations, the micro-steps a priced plan's step is
// extrapolated from), deepseek-v3's checkpointed program of 2.1 million
// ops was copied by the checkpoint and again by autocast's cache
// (TestPlanAloneCheckpointsInPlace).
func (pl *planner) transform(p *ir.Program, own bool, stage int, sl slice) (*ir.Program, int64, error) {
	s := pl.s
	var params int64
	transforms := func(chosen []string) (*ir.Program, error) {
		if err := pl.o.stopped(); err != nil {
			return nil, err // --checkpoint auto's search makes many
		}
		q, err := s.preChain(p, own, chosen, stage, sl)
		if err != nil {
			return nil, err
		}
		params = paramCount(q)
		if q != p || own {
			// preChain's program is new (or p, the caller's): the
			// transforms after it rewrite it, where autocast's cache
			// copied it once more.
			return strategy.ChainOwned(q, s.postTransforms()...)
		}
		return strategy.Chain(q, s.postTransforms()...)
	}
	var chosen []string
	if s.Checkpoint.Kind == CheckpointAuto {
		if pl.auto == nil {
			ch, q, err := autoCheckpoint(s, p, transforms)
			if err != nil {
				return nil, 0, err
			}
			pl.auto = &ch
			if q != nil && autoReuse {
				// The choice's program, built last (params is
				// its count).
				return q, params, nil
			}
		}
		chosen = pl.auto.blocks
	}
	q, err := transforms(chosen)
	return q, params, err
}

// Plan validates s, builds and simulates it.
func Plan(s Spec) (*Result, error) {
	return PlanWith(s, Options{})
}

// PlanWith is Plan computed as o says (o never changes the numbers).
func PlanWith(s Spec, o Options) (*Result, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	if err := o.stopped(); err != nil {
		return nil, err
	}
	if slices.ContainsFunc(o.Stages, func(st int) bool { return st < 0 || st >= max(s.PP, 1) }) {
		return nil, invalid(FieldPP, "pipeline stages %v are not all in [0, %d)", o.Stages, s.PP)
	}
	if o.ReplayPeak {
		return planReplayPeak(s, o)
	}
	if stagewise(&s, o) {
		return planStagewise(s, o)
	}
	if m := plannedAccum(&s, o); m < s.Accum {
		if s.PP > 1 {
			return planPipelineShortAccum(s, o, m)
		}
		return planShortAccum(s, o)
	}
	pl := &planner{s: &s, o: o, graphs: o.graphs}
	res := &Result{Spec: s, Capacity: s.CapacityBytes()}
	// Under pipeline parallelism every stage is planned and the one with
	// the highest peak is reported (stage 0 holds the most micro-batches in
	// flight, the last one the loss).
	// The step takes as long as the slowest stage.
	accum, peakAccum := s.Accum, s.Accum // peakAccum: the peak stage's micro-steps
	var modelFLOPs float64               // every stage's, for the pipeline's utilization
	from := 0
	if r := o.resume; r != nil && r.stopped != nil {
		from, peakAccum = pl.resume(res, r)
	}
	like := pl.likeStages()
	for stage := from; stage < max(s.PP, 1); stage++ {
		if o.Stages != nil && !slices.Contains(o.Stages, stage) {
			continue
		}
		if like {
			skip, err := pl.likeEarlier(stage)
			if err != nil {
				return nil, err
			}
			if skip {
				continue
			}
		}
		if o.stageShort {
			s.Accum = pl.stageAccum(accum, stage)
		} else if o.stageSteps != nil {
			s.Accum = o.stageSteps[stage]
		}
		sp, err := pl.planStage(stage)
		if err != nil {
			return nil, err
		}
		t := sp.t
		if res.addStage(stage, sp) {
			peakAccum = s.Accum
		}
		if pl.stopsAfter(stage, res) {
			if pl.stagesAfter(stage) {
				res.stopped = &stoppedAt{stage: stage, peakAccum: peakAccum, graphs: pl.graphs}
			}
			s.Accum = accum
			res.Spec = s
			if o.NumbersOnly {
				res.Compact()
			}
			res.borrow(o.Cache)
			return res, nil
		}
		if o.NoTiming {
			continue
		}
		if o.rankTimes != nil && t != nil {
			rt := *t
			*o.rankTimes = append(*o.rankTimes, &rt)
		}
		addBubble(&s, t)
		if t != nil && (res.Timing == nil || t.Step > res.Timing.Step) {
			res.Timing = t
		}
		if t != nil {
			res.StepFLOPs += t.FLOPs
			modelFLOPs += t.ModelFLOPs
		}
	}
	s.Accum = accum
	res.Spec = s
	if err := pipelineUtilization(res, modelFLOPs); err != nil {
		return nil, err
	}
	if o.NumbersOnly {
		res.Compact()
	}
	o.Cache.settle(&s, res)
	if s.FirstStep && s.Mode == Train && !(o.forNumbers() && firstNoHigher(&s)) {
		if err := pl.planFirst(res, peakAccum); err != nil {
			return nil, err
		}
	}
	if pl.auto != nil {
		res.AutoCheckpointed, res.AutoNoneFits = append([]string(nil), pl.auto.blocks...), pl.auto.noneFits
	}
	res.judge()
	res.borrow(o.Cache)
	return res, nil
}

// resume starts res from r, a result of pl's plan stopped with stages
// left (Options.resume): its stage peaks, host peak and peak so far, the
// graphs its stages were compared by. It returns the stage to go on from
// and the peak stage's micro-steps.
func (pl *planner) resume(res, r *Result) (from, peakAccum int) {
	res.StagePeaks, res.StagePhasePeaks = slices.Clone(r.StagePeaks), slices.Clone(r.StagePhasePeaks)
	res.HostPeak, res.Sim, res.Stage = r.HostPeak, r.Sim, r.Stage
	pl.graphs = r.stopped.graphs
	return r.stopped.stage + 1, r.stopped.peakAccum
}

// addStage records stage's plan sp in res: its peak and phase peaks, its
// host peak, and its program and simulation when it peaks highest so far,
// which it says.
func (res *Result) addStage(stage int, sp stagePlan) bool {
	r := sp.r
	res.StagePeaks = append(res.StagePeaks, r.Peak.Total)
	var phases [ir.NumPhases]units.Bytes
	for ph, pt := range r.PhasePeak {
		if pt.Op >= 0 {
			phases[ph] = pt.Total
		}
	}
	res.StagePhasePeaks = append(res.StagePhasePeaks, phases)
	res.HostPeak = max(res.HostPeak, r.HostPeak)
	if res.Sim == nil || r.Peak.Total > res.Sim.Peak.Total {
		res.Program, res.Sim, res.Stage, res.owned = sp.p, r, stage, sp.owned
		return true
	}
	return false
}

// stopsAfter says whether the plan ends after stage, its result so far
// res: stopAbove, StopOver or StopUnfit says so.
func (pl *planner) stopsAfter(stage int, res *Result) bool {
	o, peak := &pl.o, res.Sim.Peak.Total
	return o.stopAbove != nil && o.stopAbove(peak, pl.stagesAfter(stage)) ||
		o.StopOver > 0 && peak > o.StopOver || o.StopUnfit && res.Capacity > 0 && peak > res.Capacity
}

// stagesAfter says whether the plan has a stage after stage to plan.
func (pl *planner) stagesAfter(stage int) bool {
	if pl.o.Stages == nil {
		return stage+1 < max(pl.s.PP, 1)
	}
	return slices.ContainsFunc(pl.o.Stages, func(st int) bool { return st > stage })
}

// judge sets whether res fits its capacity and its host memory, and by how
// much it is over or under.
func (res *Result) judge() {
	s := &res.Spec
	if res.Capacity > 0 {
		peak := res.PeakBytes()
		res.Fits = peak <= res.Capacity
		if res.Fits {
			res.Headroom = res.Capacity - peak
		} else {
			res.Shortfall = peak - res.Capacity
		}
	}
	res.HostPerNode = res.HostPeak * units.Bytes(s.GPUsOnNode())
	if s.HostMemory > 0 && res.HostPerNode > s.HostMemory {
		res.Fits, res.HostShortfall = false, res.HostPerNode-s.HostMemory
	}
}

// planReplayPeak plans s (validated) for Options.ReplayPeak: unpriced, a
// pipeline's stages for their peaks alone (PeakOnly), then the peak's stage
// again (Options.Stages) as a full plan plans it, whose result it returns
// with every stage's peaks, the host peak of them all and the verdict on
// both. diagnose deepseek-v3 --pp 8 --accum 16 --reserved planned its eight
// stages with nine micro-steps each (3.8 s) to replay one of them.
// diagnose.TestPropertyReplayPeakReportsAsFull compares it with the plan in
// full.
func planReplayPeak(s Spec, o Options) (*Result, error) {
	o.ReplayPeak = false
	if pipelineShortAccum(&s) == 0 || o.Stages != nil || !o.NoTiming {
		// No stage to plan with fewer micro-steps (one stage, GPipe,
		// interleaving, no more micro-steps than p+1), or priced: as in
		// full, where the peak's stage planned again would be work added.
		return PlanWith(s, o)
	}
	po := o
	po.PeakOnly = true
	peak, err := PlanWith(s, po)
	if err != nil {
		return nil, err
	}
	peak.Compact()
	fo := o
	fo.Stages = []int{peak.Stage}
	res, err := PlanWith(s, fo)
	if err != nil {
		return nil, err
	}
	if res.Stage != peak.Stage || res.Sim.Peak.Total != peak.Sim.Peak.Total {
		return nil, fmt.Errorf("internal error: pipeline stage %d peaks at %d bytes planned alone, %d among the stages", peak.Stage+1, res.Sim.Peak.Total, peak.Sim.Peak.Total)
	}
	res.StagePeaks, res.StagePhasePeaks = peak.StagePeaks, peak.StagePhasePeaks
	res.HostPeak = max(res.HostPeak, peak.HostPeak)
	res.Fits, res.Headroom, res.Shortfall, res.HostShortfall = false, 0, 0, 0
	res.judge()
	return res, nil
}

// firstNoHigher says whether s's first step peaks no higher than its steady
// step, on the device and the host, so that a plan read for its numbers
// alone (Options.NumbersOnly, PeakOnly: the peak, the verdict and the host
// peak) need not build it: a model's first step runs the steady step's ops
// with no more storages live (the outputs and gradients a steady step
// carries in, its workspaces and its optimizer state are created during
// the first: lower.Train), activation offload moves the same activations
// to the host and back in both, and an offloaded optimizer's or paged
// optimizer's state is created on the host (or in managed memory) during
// the first step where the steady one holds it throughout
// (recipe.TestPropertyFirstStepNoHigher). Not a trace: its first step is
// the one it recorded. The first step was a third of diagnose deepseek-v3
// --accum 4's time, built for each variation and strategy. (Until b9b843c
// a LoRA pipeline's first stages lost their optimizer state in the steady
// step under the deepspeed and megatron recipes, and their first step
// pinned more host memory under optimizer offload; offload was left out
// here for it.)
func firstNoHigher(s *Spec) bool {
	return s.Trace == nil
}

// planFirst builds and simulates the first step of res's peak stage, with
// the peak stage's micro-steps (peakAccum), into res.
func (pl *planner) planFirst(res *Result, peakAccum int) error {
	s, o := pl.s, pl.o
	accum := s.Accum
	s.Accum = peakAccum
	first, params, err := pl.stageProgram(true, res.Stage)
	s.Accum = accum
	if err != nil {
		return err
	}
	res.FirstProgram = first
	if err := checkProgramBytes(s, first); err != nil {
		return err
	}
	if err := o.stopped(); err != nil {
		return err
	}
	if res.First, err = sim.RunWith(first, sim.Options{NoTimeline: true}); err != nil {
		return err
	}
	res.First.Params = params
	res.HostPeak = max(res.HostPeak, res.First.HostPeak)
	if o.NumbersOnly {
		res.FirstProgram = nil
	}
	return nil
}

// PeakOp describes the op at the peak: its name and module path.
func (r *Result) PeakOp() (name, module string) {
	if k := r.Sim.Peak.Op; k < 0 || k >= len(r.Program.Ops) {
		return "", "" // a program of no op
	}
	op := &r.Program.Ops[r.Sim.Peak.Op]
	return op.Name, op.Module
}

// optionFields are the fields of the builder's options (build.OptionError).
var optionFields = map[string]Field{"tp": FieldTP, "sp": FieldSP, "ep": FieldEP, "seq": FieldSeq}

// optionError is err, a build.OptionError as the invalid-spec error about
// its field (its message names fields by the same keys), so the CLI says
// --tp and a job file tp where the builder said TP=4096.
func optionError(err error) error {
	var oe *build.OptionError
	if errors.As(err, &oe) {
		if f, ok := optionFields[oe.Option]; ok {
			return invalid(f, "%s", oe.Msg)
		}
	}
	return err
}
