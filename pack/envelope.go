package pack

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/memplan/memplan/allocator"
	"github.com/memplan/memplan/engine"
	"github.com/memplan/memplan/explain"
	"github.com/memplan/memplan/hw"
	"github.com/memplan/memplan/internal/yamlerr"
	"github.com/memplan/memplan/ir"
	"github.com/memplan/memplan/recipe"
	"github.com/memplan/memplan/serve"
	"github.com/memplan/memplan/units"
)

// Sample is the memory of a curve at time T (seconds from the start of
// the period).
type Sample struct {
	T     float64     `json:"t_s"`
	Bytes units.Bytes `json:"bytes"`
}

// maxSamples bounds the samples a curve keeps (each bucket keeps its
// largest, so the peak survives).
const maxSamples = 256

// Envelope is one process's device memory: every figure includes the
// process's CUDA context (Context), which lives outside PyTorch's
// allocator.
type Envelope struct {
	Job    string `json:"job"`
	Source string `json:"source"` // train, serve, plan or snapshot
	// A job of several GPUs is a gang of processes, one per GPU: Gang
	// names the job (a replica's name), Rank is this process's rank of
	// Ranks, Stage its pipeline stage, and SameNode says every rank must
	// be on one node. A one-GPU job leaves them zero (its gang is Job).
	Gang     string `json:"gang,omitempty"`
	Rank     int    `json:"rank,omitempty"`
	Ranks    int    `json:"ranks,omitempty"`
	Stage    int    `json:"stage,omitempty"`
	SameNode bool   `json:"same_node,omitempty"`
	// Members are the gang's processes in rank order (this one among
	// them) on the envelope Envelopes gives by job name; nil otherwise.
	Members []*Envelope `json:"-"`
	// Context is the memory outside the caching allocator: the CUDA
	// context (and libraries) of the process.
	Context units.Bytes `json:"context_bytes"`
	// ModelSize is the static model_size: the 16-bit weights (2 bytes per
	// parameter), the number a scheduler records for a model; a job of
	// several GPUs spreads it evenly over its ranks.
	ModelSize units.Bytes `json:"model_size_bytes"`
	// Request is the user-declared size (0: none declared).
	Request units.Bytes `json:"request_bytes,omitempty"`
	// Allocated is Context plus the highest allocated bytes (whole
	// blocks): what the process holds at its busiest moment even if its
	// allocator cached nothing. Co-located processes whose Allocated sum
	// over the capacity run out of memory once their phases meet.
	Allocated units.Bytes `json:"allocated_peak_bytes"`
	// Peak is Context plus the caching allocator's reserved peak with no
	// limit: what the process holds once it has run a few steps (the
	// allocator keeps freed segments cached).
	Peak units.Bytes `json:"peak_bytes"`
	// Cap is Context plus the smallest per-process limit
	// (torch.cuda.set_per_process_memory_fraction × total memory) under
	// which the allocator, freeing its cache and retrying when it reaches
	// the limit, never fails; Fraction is that limit as the fraction to
	// pass, 0 when one GPU cannot hold the process (no fraction does).
	Cap      units.Bytes `json:"cap_bytes"`
	Fraction float64     `json:"memory_fraction"`
	// Setting is how to run the process so it stays within Cap, or, when
	// one GPU cannot hold it, "none: does not fit" and why.
	Setting string `json:"setting,omitempty"`
	// Floor is the lowest point of the allocated curve over a steady
	// period (Context plus what stays live between steps).
	Floor units.Bytes `json:"floor_bytes"`
	// Period is one step (training) or one batch (inference), seconds.
	Period float64 `json:"period_s"`
	// Curve is Context plus the allocated bytes over one steady period;
	// Reserved is Context plus what the allocator reserves over the same
	// period without a limit, Capped under the limit Cap sets.
	Curve    []Sample `json:"curve"`
	Reserved []Sample `json:"reserved_curve,omitempty"`
	Capped   []Sample `json:"capped_curve,omitempty"`
}

// Need is the memory policy p counts for e.
func (e *Envelope) Need(p Policy) units.Bytes {
	switch p {
	case Static:
		if e.Request > 0 {
			return e.Request
		}
		return e.ModelSize
	case Peaks:
		return e.Peak
	case Curve:
		return e.Cap
	}
	return e.Peak
}

// GangName is the job e belongs to: its gang, or itself alone.
func (e *Envelope) GangName() string {
	if e.Gang != "" {
		return e.Gang
	}
	return e.Job
}

// members is the gang e leads (Members), or e alone.
func (e *Envelope) members() []*Envelope {
	if len(e.Members) > 0 {
		return e.Members
	}
	return []*Envelope{e}
}

// envelopesOf computes job j's envelopes on GPU g, one per GPU it runs on
// (its ranks, in rank order).
func envelopesOf(ctx context.Context, j *Job, g *hw.GPU) ([]*Envelope, error) {
	ranks, err := sourceEnvelopes(ctx, j, g)
	if err != nil {
		return nil, fmt.Errorf("job %q: %w", j.Name, err)
	}
	for r, e := range ranks {
		e.Job = j.Name
		if j.Request != "" {
			e.Request, _ = units.ParseBytes(j.Request)
		}
		if e.ModelSize == 0 && e.Request == 0 {
			return nil, bad(fmt.Sprintf("job %q", j.Name), "a snapshot tells no model size: give request (the size a static scheduler is told)")
		}
		switch total := g.Capacity(); {
		case total <= 0 || e.Setting != "": // a server's own setting (vLLM's)
		case e.Cap > total:
			// No fraction holds it (torch refuses one over 1): say so, not
			// a setting that cannot be run.
			e.Fraction, e.Setting = 0, doesNotFit(g, fmt.Sprintf("its limit and CUDA context need %s of %s", e.Cap, total))
		default:
			e.Fraction = math.Ceil(float64(e.Cap-e.Context)/float64(total)*1e4) / 1e4
			e.Setting = fmt.Sprintf("torch.cuda.set_per_process_memory_fraction(%.4f)", e.Fraction)
		}
		if len(ranks) > 1 {
			e.Gang, e.Rank, e.Ranks, e.SameNode = j.Name, r, len(ranks), j.SameNode
		}
	}
	return ranks, nil
}

// sourceEnvelopes are the envelopes of what j says runs, one per rank: a
// plan JSON or a snapshot is one process's.
func sourceEnvelopes(ctx context.Context, j *Job, g *hw.GPU) ([]*Envelope, error) {
	var (
		s      engine.Spec
		err    error
		source string
	)
	switch {
	case j.Serve != nil && j.Serve.server() == "vllm":
		e, err := vllmEnvelope(ctx, j.Serve, g)
		if err != nil {
			return nil, err
		}
		return spread(copies(e, max(j.Serve.TP, 1)), e.ModelSize), nil
	case j.planData != nil:
		e, err := planEnvelope(j.planData)
		return copies(e, 1), err
	case j.snap != nil:
		e, err := snapshotEnvelope(j)
		return copies(e, 1), err
	case j.Train != nil:
		source = "train"
		s, err = j.Train.Spec()
	case j.Serve != nil:
		source = "serve"
		s, err = j.Serve.Spec()
	case j.pubSpec != nil:
		s, source = *j.pubSpec, "published"
	default:
		return nil, fmt.Errorf("the file it names was not read (pack.ReadFile reads it)")
	}
	if err != nil {
		return nil, err
	}
	return specEnvelopes(ctx, s, g, source)
}

// copies is n ranks of one envelope (nil when e is nil).
func copies(e *Envelope, n int) []*Envelope {
	if e == nil {
		return nil
	}
	return rankCopies([]*Envelope{e}, n)
}

// rankCopies is n ranks of the stages' envelopes, stage-major: Megatron-LM
// numbers ranks in the order tp-cp-ep-dp-pp by default, the pipeline stage
// varying slowest (megatron/core/parallel_state.py initialize_model_parallel,
// order: str = "tp-cp-ep-dp-pp", NVIDIA/Megatron-LM @934c8260), so rank r
// runs stage r / (n / len(stages)). The ranks of one stage (tensor-parallel
// shards, data-parallel replicas, ZeRO shards) are planned alike: the
// engine shards state evenly over them.
func rankCopies(stages []*Envelope, n int) []*Envelope {
	out := make([]*Envelope, n)
	per := max(n/len(stages), 1)
	for r := range out {
		c := *stages[min(r/per, len(stages)-1)]
		out[r] = &c
	}
	return out
}

// specEnvelopes plans s on g, each pipeline stage on its own (its layers,
// its micro-batches in flight, its first step), and gives every rank its
// stage's envelope; a pipeline's stages step together, at the slowest
// stage's period.
func specEnvelopes(ctx context.Context, s engine.Spec, g *hw.GPU, source string) ([]*Envelope, error) {
	stages := make([]*Envelope, max(s.PP, 1))
	period := 0.0
	for k := range stages {
		e, err := specEnvelope(ctx, s, g, k)
		if err != nil {
			return nil, err
		}
		e.Source, e.Stage = source, k
		stages[k] = e
		period = max(period, e.Period)
	}
	for _, e := range stages {
		e.Period = period
	}
	ranks := rankCopies(stages, s.JobGPUs())
	if len(ranks) > 1 {
		spread(ranks, units.Bytes(s.Model.ParamCount())*2)
	}
	return ranks, nil
}

// spread gives each of a job's ranks an even share of its static
// model_size (the whole model's 16-bit weights): what a scheduler told one
// model_size and a GPU count per job counts on each GPU.
func spread(ranks []*Envelope, modelSize units.Bytes) []*Envelope {
	for _, e := range ranks {
		e.ModelSize = modelSize / units.Bytes(len(ranks))
	}
	return ranks
}

// vllmEnvelope is a vLLM deployment (package serve) whose KV cache holds
// Concurrency requests of Context+GenTokens tokens and no more: the
// smallest gpu_memory_utilization (in thousandths) at which serve.Plan's
// concurrency at that context reaches it. vLLM allocates the whole KV
// cache at start-up and keeps the profile run's activations cached, so its
// memory is flat: budget plus the CUDA graphs it captures after the KV
// cache (outside the budget).
func vllmEnvelope(ctx context.Context, v *Serve, g *hw.GPU) (*Envelope, error) {
	s, err := v.VLLM(g)
	if err != nil {
		return nil, err
	}
	r, err := serve.Plan(s)
	if err != nil {
		return nil, err
	}
	total := float64(r.Spec.TotalMemory)
	perReq := int64((r.Spec.Context + r.Spec.BlockSize - 1) / r.Spec.BlockSize)
	kv := units.Bytes(int64(v.Concurrency) * perReq * int64(r.BlockBytes))
	u := math.Ceil(float64(r.Weights+r.Activation+r.NonTorch+kv)/total*1000) / 1000
	for ; u <= 1; u += 0.001 {
		if err := context.Cause(ctx); err != nil {
			return nil, err // up to 1,000 plans of a few ms
		}
		s.Utilization = u
		if r, err = serve.Plan(s); err != nil {
			return nil, err
		}
		if r.ConcurrencyAtContext >= int64(v.Concurrency) && r.Fits {
			break
		}
	}
	e := &Envelope{Source: "serve", Context: r.NonTorch, ModelSize: units.Bytes(s.Model.ParamCount()) * 2, Period: 1}
	used := r.NonTorch + r.Weights + r.Activation + units.Bytes(r.Blocks)*r.BlockBytes + r.CUDAGraphs
	if u > 1 { // no utilization holds it: what it would take
		used = r.NonTorch + r.Weights + r.Activation + kv + r.CUDAGraphs
	}
	e.Allocated, e.Peak, e.Cap, e.Floor = used, used, used, used
	if r.Timing != nil && r.Timing.DecodeStep > 0 {
		e.Period = r.Timing.DecodeStep.Seconds()
	}
	e.Curve = []Sample{{0, used}, {e.Period, used}}
	e.Reserved, e.Capped = e.Curve, e.Curve
	if u > 1 {
		e.Setting = doesNotFit(g, fmt.Sprintf("no --gpu-memory-utilization up to 1 holds %d requests of %d tokens", v.Concurrency, r.Spec.Context))
		return e, nil
	}
	e.Fraction = u
	e.Setting = fmt.Sprintf("vllm serve --gpu-memory-utilization %.3f --max-model-len %d --max-num-seqs %d", e.Fraction, s.MaxModelLen, s.MaxNumSeqs)
	return e, nil
}

// doesNotFit is the Setting of a process no GPU of g's kind holds, and why.
func doesNotFit(g *hw.GPU, why string) string {
	return fmt.Sprintf("none: does not fit one %s (%s)", g.Name, why)
}

// specEnvelope plans s on g: the allocated curve on the roofline time
// axis, the caching allocator's reserved peak (allocator.ReplayProgram
// through engine.Result.PredictReserved) and the smallest per-process
// limit it survives. It is a driver over an enveloper's phases: plan,
// reserve, limit, curves.
func specEnvelope(ctx context.Context, s engine.Spec, g *hw.GPU, stage int) (*Envelope, error) {
	s.GPU, s.Capacity = g, 0
	ev := &enveloper{ctx: ctx, stage: stage}
	for _, phase := range []func(engine.Spec) error{ev.plan, ev.reserve, ev.limit, ev.curves} {
		if err := phase(s); err != nil {
			return nil, err
		}
	}
	return ev.e, nil
}

// enveloper holds what specEnvelope's phases share.
type enveloper struct {
	// ctx stops each phase's plans and replays (engine.Options.Context).
	ctx       context.Context
	e         *Envelope
	stage     int // the pipeline stage planned
	res       *engine.Result
	rv        *engine.Reserved
	allocated int64 // the highest block bytes of either iteration
	capped    *allocator.ProgramResult
}

// plan plans the job; the context is the recipe's CUDA overhead.
func (ev *enveloper) plan(s engine.Spec) (err error) {
	o := engine.Options{Context: ev.ctx, OpTimes: true} // curves reads each op's end
	if s.PP > 1 {
		o.Stages = []int{ev.stage}
	}
	if ev.res, err = engine.PlanWith(s, o); err != nil {
		return err
	}
	ev.e = &Envelope{Context: ev.res.Spec.Sem.Overhead, ModelSize: units.Bytes(ev.res.Sim.Params) * 2}
	return nil
}

// reserve replays both iterations through the caching allocator without a
// limit: the allocated and reserved peaks.
func (ev *enveloper) reserve(engine.Spec) (err error) {
	if ev.rv, err = ev.res.PredictReservedContext(ev.ctx, allocator.Config{}, false, true); err != nil {
		return err
	}
	ev.allocated = ev.rv.Steady.PeakAllocated
	if ev.rv.First != nil {
		ev.allocated = max(ev.allocated, ev.rv.First.PeakAllocated)
	}
	ev.e.Allocated = ev.e.Context + units.Bytes(ev.allocated)
	ev.e.Peak = ev.e.Context + ev.rv.Peak
	return nil
}

// limit finds the smallest per-process limit: bisected on the iteration
// that reserves more (the first, whose optimizer step creates the state,
// as a rule), then checked on the other and on the steady one, whose
// curve under it is drawn. The search assumes failing is monotone in the
// limit, which the allocator does not promise: where a check fails, the
// process gets its unlimited peak.
func (ev *enveloper) limit(engine.Spec) error {
	res, rv := ev.res, ev.rv
	worst, worstPeak := res.Program, rv.Steady.PeakReserved
	if rv.First != nil && rv.First.PeakReserved > worstPeak {
		worst, worstPeak = res.FirstProgram, rv.First.PeakReserved
	}
	limit, err := smallestLimit(ev.ctx, worst, ev.allocated, worstPeak)
	if err != nil {
		return err
	}
	unlimited := (int64(rv.Peak) + limitStep - 1) / limitStep * limitStep
	if worst == res.Program && res.FirstProgram != nil {
		r, err := allocator.ReplayProgramContext(ev.ctx, res.FirstProgram, allocator.Config{AllowedMemory: limit}, 0, false)
		if err != nil {
			return err
		}
		if r.OOM {
			limit = unlimited
		}
	}
	if ev.capped, err = allocator.ReplayProgramContext(ev.ctx, res.Program, allocator.Config{AllowedMemory: limit}, 0, true); err != nil {
		return err
	}
	if ev.capped.OOM {
		limit = unlimited
		if ev.capped, err = allocator.ReplayProgramContext(ev.ctx, res.Program, allocator.Config{AllowedMemory: limit}, 0, true); err != nil {
			return err
		}
	}
	ev.e.Cap = ev.e.Context + units.Bytes(min(limit, int64(rv.Peak)))
	return nil
}

// curves lays the allocated, reserved and capped curves of the steady
// iteration on the roofline's time axis (op index when it has none).
func (ev *enveloper) curves(engine.Spec) error {
	res, e, ctx := ev.res, ev.e, ev.e.Context
	ends := make([]float64, len(res.Program.Ops))
	if res.Timing != nil && len(res.Timing.Ops) == len(ends) {
		for i, o := range res.Timing.Ops {
			ends[i] = o.End.Seconds()
		}
		e.Period = res.Timing.Step.Seconds()
	}
	if e.Period <= 0 {
		for i := range ends {
			ends[i] = float64(i + 1)
		}
		e.Period = float64(len(ends))
	}
	e.Floor = e.Allocated
	var curve, reserved, capped []Sample
	for _, pt := range res.Sim.Timeline {
		curve = append(curve, Sample{ends[pt.Op], ctx + pt.Total})
		e.Floor = min(e.Floor, ctx+pt.Total)
	}
	for i, r := range ev.rv.Steady.Timeline {
		reserved = append(reserved, Sample{ends[i], ctx + units.Bytes(r)})
	}
	for i, r := range ev.capped.Timeline {
		capped = append(capped, Sample{ends[i], ctx + units.Bytes(r)})
	}
	e.Curve, e.Reserved, e.Capped = downsample(curve), downsample(reserved), downsample(capped)
	return nil
}

// limitStep is the granularity of the limit search (a multiple of the
// caching allocator's 2 MiB segment rounding).
const limitStep = 64 << 20

// smallestLimit bisects for the smallest per-process limit in
// [lo, hi] (multiples of limitStep) under which p's two replayed iterations do
// not run out of memory; hi, the reserved peak without a limit, always
// suffices. The allocator frees its cache and retries at the limit
// (CUDACachingAllocator.cpp alloc_block, release_cached_blocks), so the
// limit can sit below the unlimited reserved peak.
//
// The allocator reads a limit of 0 as none (allocator.Config.AllowedMemory),
// so 0 is never a candidate: a replay "under" it always succeeds. lo, the
// allocated peak, rounds down to the step below it but no lower than one
// step; an iteration that allocates less than a step gets hi.
func smallestLimit(ctx context.Context, p *ir.Program, lo, hi int64) (int64, error) {
	ok := func(limit int64) (bool, error) {
		r, err := allocator.ReplayProgramContext(ctx, p, allocator.Config{AllowedMemory: limit}, 0, false)
		if err != nil {
			return false, err
		}
		return !r.OOM, nil
	}
	lo = max(lo/limitStep*limitStep, limitStep)
	hi = (hi + limitStep - 1) / limitStep * limitStep
	if lo >= hi {
		return hi, nil
	}
	fits, err := ok(lo)
	if err != nil || fits {
		return lo, err
	}
	for hi-lo > limitStep {
		mid := (lo + hi) / 2 / limitStep * limitStep
		if mid <= lo {
			break
		}
		fits, err := ok(mid)
		if err != nil {
			return 0, err
		}
		if fits {
			hi = mid
		} else {
			lo = mid
		}
	}
	return hi, nil
}

// downsample keeps at most maxSamples samples: of each bucket its
// lowest and its highest, in time order, so both the peaks and the troughs
// between them survive.
func downsample(s []Sample) []Sample {
	slices.SortStableFunc(s, func(a, b Sample) int { return cmpFloat(a.T, b.T) })
	if len(s) <= maxSamples {
		return s
	}
	step := (len(s) + maxSamples/2 - 1) / (maxSamples / 2)
	out := make([]Sample, 0, maxSamples)
	for lo := 0; lo < len(s); lo += step {
		hi, low := lo, lo
		for i := lo; i < min(lo+step, len(s)); i++ {
			if s[i].Bytes > s[hi].Bytes {
				hi = i
			}
			if s[i].Bytes < s[low].Bytes {
				low = i
			}
		}
		out = append(out, s[min(hi, low)])
		if hi != low {
			out = append(out, s[max(hi, low)])
		}
	}
	return out
}

// planJSON is the part of 'memplan plan --json' (report.PlanJSON,
// memplan.plan/v1) a job needs.
type planJSON struct {
	Schema string `json:"schema"`
	Model  string `json:"model"`
	Mode   string `json:"mode"`
	Recipe string `json:"recipe"`
	Params int64  `json:"params"`
	Peak   struct {
		Bytes units.Bytes `json:"bytes"`
	} `json:"peak"`
	FirstStep *struct {
		Peak struct {
			Bytes units.Bytes `json:"bytes"`
		} `json:"peak"`
	} `json:"first_step"`
	Reserved *struct {
		PeakBytes units.Bytes `json:"peak_bytes"`
	} `json:"reserved"`
	Time *struct {
		StepS      float64 `json:"step_s"`
		ForwardS   float64 `json:"forward_s"`
		BackwardS  float64 `json:"backward_s"`
		OptimizerS float64 `json:"optimizer_s"`
	} `json:"time"`
	Timeline []struct {
		Phase string      `json:"phase"`
		Total units.Bytes `json:"total"`
	} `json:"timeline"`
}

const planSchema = "memplan.plan/v1"

func parsePlan(data []byte) (*planJSON, error) {
	var p planJSON
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&p); err != nil {
		return nil, fmt.Errorf("not a plan JSON: %s", yamlerr.Message(err))
	}
	switch {
	case p.Schema != planSchema:
		return nil, fmt.Errorf("schema %q is not %s (write it with memplan plan --json)", cut(p.Schema), planSchema)
	case p.Time == nil || p.Time.StepS <= 0:
		return nil, fmt.Errorf("no step time: plan it with --gpu")
	case len(p.Timeline) == 0:
		return nil, fmt.Errorf("no timeline: plan it without --no-timeline")
	case p.Params <= 0 || p.Peak.Bytes <= 0:
		return nil, fmt.Errorf("no parameters or peak")
	}
	for _, ev := range p.Timeline {
		if ev.Total < 0 {
			return nil, fmt.Errorf("a timeline total is negative")
		}
	}
	return &p, nil
}

// planEnvelope reads a plan JSON: the timeline's events spread evenly over
// their phase's time (the JSON keeps per-phase times, not per-op ones), the
// reserved peak when the plan has one (the allocated peak otherwise), the
// recipe's CUDA context. A plan JSON carries no program, so its limit is
// the reserved peak.
func planEnvelope(data []byte) (*Envelope, error) {
	p, err := parsePlan(data)
	if err != nil {
		return nil, err
	}
	ctx, err := contextOf(p.Recipe)
	if err != nil {
		return nil, err
	}
	e := &Envelope{Source: "plan", Context: ctx, ModelSize: units.Bytes(p.Params) * 2, Period: p.Time.StepS}
	alloc := p.Peak.Bytes
	if p.FirstStep != nil {
		alloc = max(alloc, p.FirstStep.Peak.Bytes)
	}
	e.Allocated = ctx + alloc
	e.Peak = e.Allocated
	if p.Reserved != nil && p.Reserved.PeakBytes > alloc {
		e.Peak = ctx + p.Reserved.PeakBytes
	}
	e.Cap = e.Peak
	dur := map[string]float64{"forward": p.Time.ForwardS, "backward": p.Time.BackwardS, "optimizer": p.Time.OptimizerS}
	count := map[string]int{}
	for _, ev := range p.Timeline {
		count[ev.Phase]++
	}
	start, seen := 0.0, map[string]int{}
	order := []string{}
	for _, ev := range p.Timeline {
		if _, ok := seen[ev.Phase]; !ok {
			order = append(order, ev.Phase)
		}
		seen[ev.Phase]++
	}
	offset := map[string]float64{}
	for _, ph := range order {
		offset[ph] = start
		start += dur[ph]
	}
	if start <= 0 {
		start = p.Time.StepS
	}
	e.Period = max(start, p.Time.StepS)
	e.Floor = math.MaxInt64
	var curve []Sample
	k := map[string]int{}
	for i, ev := range p.Timeline {
		k[ev.Phase]++
		t := offset[ev.Phase] + dur[ev.Phase]*float64(k[ev.Phase])/float64(count[ev.Phase])
		if dur[ev.Phase] == 0 {
			t = e.Period * float64(i+1) / float64(len(p.Timeline))
		}
		curve = append(curve, Sample{t, ctx + ev.Total})
		e.Floor = min(e.Floor, ctx+ev.Total)
	}
	e.Curve = downsample(curve)
	return e, nil
}

// contextOf is the CUDA context a recipe counts (its cuda.overhead; the
// hf recipe's cited figure when the plan names none).
func contextOf(name string) (units.Bytes, error) {
	if name == "" {
		name = "hf"
	}
	r, err := recipe.Load(name)
	if err != nil {
		return 0, fmt.Errorf("recipe: %v", oneLine(err.Error()))
	}
	v := r.Value("cuda.overhead")
	if v == "" {
		return 0, nil
	}
	b, err := units.ParseBytes(v)
	if err != nil {
		return 0, fmt.Errorf("recipe %s: cuda.overhead: %v", name, err)
	}
	return b, nil
}

// parsePeriod reads a duration ("1.5s", "450ms").
func parsePeriod(s string) (float64, error) {
	d, err := time.ParseDuration(strings.TrimSpace(s))
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("%q is not a positive duration such as 450ms", cut(s))
	}
	return d.Seconds(), nil
}

// snapshotEnvelope is a snapshot's measured curve (explain's timeline:
// the live requested bytes and the reserved bytes after each event), on
// the trace's own clock when it recorded one (time_us), else spread over
// the job's period. What the snapshot shows is one process's reserved
// memory; the CUDA context is the hf recipe's figure.
func snapshotEnvelope(j *Job) (*Envelope, error) {
	dev := int64(-1)
	if j.Device != nil {
		dev = *j.Device
	}
	rep, err := explain.Explain(j.snap, j.Snapshot, dev)
	if err != nil {
		return nil, err
	}
	ctx, err := contextOf("hf")
	if err != nil {
		return nil, err
	}
	tl := rep.Timeline
	if len(tl) < 2 {
		return nil, fmt.Errorf("snapshot %s: its trace has no events to make a curve of", j.Snapshot)
	}
	var times []int64
	if int(rep.Device) < len(j.snap.Traces) {
		for _, ev := range j.snap.Traces[rep.Device] {
			times = append(times, ev.TimeUS)
		}
	}
	clocked := len(times) == len(tl)-1 && times[len(times)-1] > times[0]
	period := 0.0
	if j.Period != "" {
		period, _ = parsePeriod(j.Period)
	}
	if !clocked && period == 0 {
		return nil, fmt.Errorf("snapshot %s recorded no times: give period (the wall time its trace covers)", j.Snapshot)
	}
	if clocked && period == 0 {
		period = float64(times[len(times)-1]-times[0]) / 1e6
	}
	e := &Envelope{Source: "snapshot", Context: ctx, Period: period, Floor: math.MaxInt64}
	var curve, reserved []Sample
	for i, pt := range tl {
		var live int64
		for _, b := range pt.ByCat {
			live += b
		}
		t := period * float64(i) / float64(len(tl)-1)
		if clocked && i > 0 {
			t = period * float64(times[i-1]-times[0]) / float64(times[len(times)-1]-times[0])
		}
		curve = append(curve, Sample{t, ctx + units.Bytes(live)})
		reserved = append(reserved, Sample{t, ctx + units.Bytes(pt.Reserved)})
		e.Floor = min(e.Floor, ctx+units.Bytes(live))
	}
	e.Allocated = ctx + units.Bytes(rep.PeakAllocated.Bytes)
	e.Peak = ctx + units.Bytes(max(rep.PeakReserved.Reserved, rep.PeakAllocated.Bytes))
	e.Cap = e.Peak
	e.Curve, e.Reserved = downsample(curve), downsample(reserved)
	return e, nil
}
