package engine

import (
	"fmt"
	"strings"

	"github.com/memplan/memplan/importer/torchtrace"
	"github.com/memplan/memplan/ir"
	"github.com/memplan/memplan/models/build"
	"github.com/memplan/memplan/strategy"
	"github.com/memplan/memplan/units"
)

// Limits on a job's dimensions. Each is derived from what a job can
// physically be, so that every size, FLOP and time total the planner
// multiplies out of them stays far inside int64 (whose wrap-around would
// otherwise turn into a silently wrong answer); each is refused in one line
// naming the field and its limit.
const (
	// MaxTokens bounds the tokens of one micro-step (micro-batch ×
	// (sequence + generated tokens)): 2^34 tokens' int64 ids alone are
	// 128 GiB, and every model's embedding output (hidden ≥ 64, 2 bytes)
	// 2 TiB, more than any GPU holds.
	MaxTokens = 1 << 34
	// MaxAccum bounds the micro-steps of one optimizer step (2^30: a step's
	// sample count stays an exact float64 even times MaxGPUs).
	MaxAccum = 1 << 30
	// MaxGPUs bounds dp × tp × pp (2^24 = 16.7M GPUs, a hundred times
	// the largest cluster built).
	MaxGPUs = 1 << 24
	// MaxBytes bounds the sum of every tensor a program allocates (2^62 B
	// = 4 EiB): under it, no sum of live bytes can wrap.
	MaxBytes = units.MaxBytes
)

// mulChecked is units.MulChecked.
func mulChecked(a, b, limit int64) (int64, bool) { return units.MulChecked(a, b, limit) }

// validateLimits checks the filled job's dimensions against the limits.
func (s *Spec) validateLimits() error {
	if s.Accum > MaxAccum {
		return invalid(FieldAccum, "{accum} %d is over the limit of %d micro-steps per optimizer step", s.Accum, MaxAccum)
	}
	if s.PP > 1 && s.Accum > MaxPipelineAccum {
		return invalid(FieldAccum, "{accum} %d is over the limit of %d micro-steps for a pipeline ({pp} %d: GPipe and interleaved schedules simulate every micro-step)", s.Accum, MaxPipelineAccum, s.PP)
	}
	seq := int64(s.Seq) + int64(s.GenTokens)
	if s.Trace != nil && seq == 0 {
		seq = 1
	}
	if _, ok := mulChecked(int64(s.MicroBatch), max(seq, 1), MaxTokens); !ok {
		return invalid(FieldMicroBatch, "{micro-batch} %d × {seq} %d is over the limit of 2^34 tokens per micro-step (their int64 ids alone would be 128 GiB)", s.MicroBatch, seq)
	}
	g := int64(1)
	for _, d := range []int{s.DP, s.TP, s.PP} {
		var ok bool
		if g, ok = mulChecked(g, int64(max(d, 1)), MaxGPUs); !ok {
			return invalid(FieldDP, "{dp} × {tp} × {pp} is over the limit of %d GPUs", MaxGPUs)
		}
	}
	if s.Trace != nil {
		return s.validateTraceSizes()
	}
	return s.validateModelSize()
}

// validateModelSize bounds the size of the program a model job builds and
// of its largest tensors, before anything is built: the blocks (layers ×
// (1 + experts), each expert its own MLP of ops) and, per micro-step, the
// elements of the widest activation (micro-batch × tokens × the widest of
// hidden, FFN, vocabulary and, for eager attention, heads × tokens).
func (s *Spec) validateModelSize() error {
	a := s.Model
	if _, ok := mulChecked(int64(a.Layers), int64(1+a.NumExperts), MaxBlocks); !ok {
		return invalid(FieldModel, "%s has %d layers × %d experts: over the limit of %d layers × (1 + experts) a plan builds (Kimi K2, the largest published, has 61 × 385)", a.Name, a.Layers, a.NumExperts, MaxBlocks)
	}
	if err := s.validateSimulatedBlocks(MaxSimBlocks, "a plan holds"); err != nil {
		return err
	}
	tokens := int64(s.Seq) + int64(s.GenTokens)
	width := int64(max(a.Hidden, a.Intermediate, a.Vocab, a.QDim(), 1))
	if s.Attention == build.Eager {
		if w, ok := mulChecked(int64(max(a.Heads, 1)), tokens, MaxElements); !ok || w > width {
			width = max(w, width)
			if !ok {
				width = MaxElements + 1
			}
		}
	}
	rows, _ := mulChecked(int64(s.MicroBatch), tokens, MaxTokens)
	if rows > build.MaxTokens {
		// The graph builder's own bound, lower than a trace's: refused here
		// on the flag rather than by the builder's internal message.
		return invalid(FieldMicroBatch, "%s is over the limit of 2^31 tokens per micro-step a model's graph is built for", s.tokensNamed())
	}
	if _, ok := mulChecked(rows, width, MaxElements); !ok {
		what := "micro-batch × tokens × width"
		if s.Attention == build.Eager {
			what += " (eager attention's scores: heads × tokens wide)"
		}
		return invalid(FieldSeq, "%s of %s is over the limit of 2^58 elements in one activation (%s; 2^58 fp32 elements are 1 EiB): no GPU holds it", s.tokensNamed(), a.Name, what)
	}
	if s.Attention == build.Eager || a.AttnLogitSoftcap > 0 { // soft-capped logits run eagerly (build.graph)
		if sc, ok := mulChecked(rows, int64(max(a.Heads, 1)), MaxElements); !ok || sc > build.MaxEagerScores/max(tokens, 1) {
			return invalid(FieldSeq, "%s of %s is over the limit of 2^56 eager attention scores (micro-batch × heads × tokens²) a model's graph is built for", s.tokensNamed(), a.Name)
		}
	}
	return nil
}

// tokensNamed is a model job's tokens a micro-step as the flags give them:
// {micro-batch} × {seq}, and the generated tokens beside the prompt (sweep
// H, round 25: an inference job of --seq 1 and 8,191 generated tokens was
// refused as --seq 8192).
func (s *Spec) tokensNamed() string {
	if s.GenTokens > 0 {
		return fmt.Sprintf("{micro-batch} %d × ({seq} %d + {gen-tokens} %d)", s.MicroBatch, s.Seq, s.GenTokens)
	}
	return fmt.Sprintf("{micro-batch} %d × {seq} %d", s.MicroBatch, s.Seq)
}

// validateSimulatedBlocks bounds the blocks a plan simulates at once: a
// pipeline stage's layers × (1 + experts), times the micro-steps its
// program holds (plannedAccum; a priced 1F1B stage is built with one more
// to extrapolate its step). The program, its timeline and its allocator
// replay take 34-41 KB of memory per block and micro-step (deepseek-v3,
// 15,677 blocks over three micro-steps: 1.6 GB; a 4,096-layer × 7-expert
// config over two: 2.6 GB), so MaxSimBlocks keeps a plan near 2 GB.
// compare holds a baseline's programs beside each strategy's (its cache)
// and gets MaxCompareBlocks (CompareEachContext).
func (s *Spec) validateSimulatedBlocks(limit int64, holds string) error {
	a := s.Model
	steps := s.heldMicroSteps()
	pp := max(s.PP, 1)
	layers := (a.Layers + pp - 1) / pp
	why, way := "", ""
	if pp > 1 && s.Mode == Train {
		why, way = s.wholeStages()
	}
	whole := why != ""
	if whole {
		// Each stage is built from the whole model and cut
		// (StageWork): deepseek-v3 --pp 8 --accum 16 --checkpoint auto
		// held 7.2 GB and ran past 2 minutes, counted as 8 layers a stage.
		layers = a.Layers
	}
	blocks := int64(layers) * int64(1+a.NumExperts)
	if blocks*steps <= limit {
		return nil
	}
	where, fix := fmt.Sprintf("%s's %d layers", a.Name, a.Layers), "cut the layers per stage with {pp}"
	switch {
	case whole:
		where, fix = fmt.Sprintf("%s's %d layers (under %s, every pipeline stage is built from all of them)", a.Name, a.Layers, why), way
	case pp > 1:
		where = fmt.Sprintf("a stage's %d of %s's %d layers", layers, a.Name, a.Layers)
	}
	return invalid(FieldModel, "%s × (1 + %d experts) = %d blocks, times the %d micro-steps %s, are over the limit of %d block-steps (about 2 GB of memory; a plan of deepseek-v3 over three micro-steps is 47,031): %s",
		where, a.NumExperts, blocks, steps, holds, limit, s.fewerHeld(fix, limit, blocks, steps))
}

// wholeStages says why a model's training pipeline of s builds each stage
// from the whole model and cuts it ("" when each is built from its own
// layers: planner.sliced), and the way out, naming the flags.
func (s *Spec) wholeStages() (why, way string) {
	a := s.Model
	switch {
	case s.Checkpoint.Kind == CheckpointAuto:
		return "{checkpoint} auto, which picks one set of blocks for the whole model", "give {checkpoint} full or every=K, whose stages are built from their own layers"
	case s.PPInterleave > 1:
		return fmt.Sprintf("{pp-interleave} %d", s.PPInterleave), "give fewer micro-steps, or the 1f1b schedule without {pp-interleave}"
	case s.PP > a.Layers:
		return fmt.Sprintf("{pp} %d over %d layers", s.PP, a.Layers), fmt.Sprintf("give {pp} %d or less", a.Layers)
	case a.Encoder:
		return "an encoder model's pipeline", "give fewer micro-steps"
	}
	if s.LoRA != nil {
		// A target naming one layer ("model.layers.3.q_proj") makes the
		// layers differ.
		for _, t := range s.LoRA.Targets {
			for _, part := range strings.Split(t, ".") {
				if ir.IsIndex(part) {
					return "{lora} targets naming one layer", "target the layers by their names without an index"
				}
			}
		}
	}
	return "", ""
}

// heldMicroSteps is the micro-steps a plan of s holds at once: those it
// plans (plannedAccum), one more for a priced pipeline stage's pricing
// (planPipelineShortAccum), one outside training.
func (s *Spec) heldMicroSteps() int64 {
	if s.Mode != Train {
		return 1
	}
	steps := max(plannedAccum(s, Options{}), 1)
	if s.PP > 1 && steps < s.Accum && s.GPU != nil {
		steps++
	}
	return int64(steps)
}

// fewerHeld is the way out of a bound on per × held micro-steps: fix
// (more stages), and, without a pipeline, the {accum} that holds few
// enough micro-steps when one does (up to three, a plan holds {accum}).
func (s *Spec) fewerHeld(fix string, limit, per, steps int64) string {
	if k := limit / max(per, 1); k >= 1 && k < steps && s.PP <= 1 {
		fix += fmt.Sprintf(", or give {accum} %d", k)
		if k > 1 {
			fix += " or less"
		}
	}
	return fix
}

// More limits (see above).
const (
	// MaxSimBlocks bounds blocks × micro-steps a plan holds at once
	// (validateSimulatedBlocks): 3 × 2^14. MaxCompareBlocks is compare's,
	// half: deepseek-v2 over three micro-steps (28,980 blocks) compared in
	// 17.7 s and 2.34 GB, a 4,096-layer × 7-expert config over one (32,768)
	// in 3.9 GB; deepseek-v3 over one (15,677) compares in 6 s and 1.5 GB.
	MaxSimBlocks     = 3 << 14
	MaxCompareBlocks = MaxSimBlocks / 2
	// MaxTraceEventSteps bounds a trace's events × micro-steps a plan
	// holds (validateTraceEvents), MaxCompareEventSteps compare's.
	MaxTraceEventSteps   = 1 << 21
	MaxCompareEventSteps = 1 << 20
	// MaxBlocks bounds layers × (1 + experts): DeepSeek-V3 has 61 × 257,
	// Kimi K2 61 × 385, Qwen3-Next 48 × 513.
	MaxBlocks = 1 << 15
	// MaxElements bounds one activation's elements (2^58: 8-byte
	// elements stay under MaxBytes/2).
	MaxElements = 1 << 58
)

// checkProgramBytes refuses a program whose tensors total more than
// MaxBytes (so no sum of live bytes can wrap).
func checkProgramBytes(s *Spec, p *ir.Program) error {
	var total units.Bytes
	for i := range p.Tensors {
		b := p.Tensors[i].Bytes
		if b < 0 || b > MaxBytes-total {
			return invalid(FieldMicroBatch, "%s at {micro-batch} %d × {seq} %d allocates more than 4 EiB (2^62 bytes) over one step: no GPU holds it", s.JobName(), s.MicroBatch, s.Seq)
		}
		total += b
	}
	return nil
}

// validateTraceSizes checks every storage of the trace at the planned
// micro-batch and sequence without wrapping: each at most MaxBytes
// (torchtrace's CheckSizes names the event and op that allocates it).
func (s *Spec) validateTraceSizes() error {
	t := s.Trace
	b, seq := int64(s.MicroBatch), t.TraceSeq
	if t.HasSeq() && s.Seq > 0 {
		seq = int64(s.Seq)
	}
	if err := t.CheckSizes(b, seq); err != nil {
		return invalid(FieldMicroBatch, "{micro-batch} %d × {seq} %d: %s", b, seq, err)
	}
	return s.validateTraceEvents(MaxTraceEventSteps, "a plan holds")
}

// validateTraceEvents bounds a trace's events × the micro-steps a plan
// holds at once, as validateSimulatedBlocks bounds a model's blocks: a
// trace of 1.5 million events took 1.65 GB over one micro-step and 3.2 GB
// over three (second adversarial sweep; deepseek-v3's 470,000 ops a step
// over three take 1.6 GB). A pipeline stage holds its share of them.
func (s *Spec) validateTraceEvents(limit int64, holds string) error {
	steps := s.heldMicroSteps()
	n := int64(len(s.Trace.Events)) / int64(max(s.PP, 1))
	if n*steps <= limit {
		return nil
	}
	return invalid(FieldTrace, "%s's %d events, times the %d micro-steps %s, are over the limit of %d event-steps (about 2 GB of memory): %s",
		s.JobName(), len(s.Trace.Events), steps, holds, limit, s.fewerHeld("cut it into stages with {pp}", limit, n, steps))
}

// storageSize is st.Size(b, seq) with every product and sum checked
// against MaxBytes (ok false past it).
func storageSize(st *torchtrace.Storage, b, seq int64) (int64, bool) { return st.SizeChecked(b, seq) }

// validateInterleave checks --pp-interleave against --pp before anything
// multiplies them: pp × interleave chunks at most MaxBlocks (a chunk holds
// at least one block; the product wrapped into a pipeline that could not
// place the loss's backward: --pp 4 --pp-interleave 2^62), the 1F1B
// schedule, and micro-batches a multiple of the stages (the strategy's own
// checks, refused here on the flags).
func (s *Spec) validateInterleave() error {
	v := s.PPInterleave
	switch {
	case v < 0:
		return invalid(FieldPPInterleave, "{pp-interleave} must be positive, got %d", v)
	case v <= 1 || s.PP <= 1:
		return nil
	case !withinChunks(s.PP, v):
		return invalid(FieldPPInterleave, "{pp} %d × {pp-interleave} %d is over the limit of %d pipeline chunks (each holds at least one layer)", s.PP, v, MaxBlocks)
	case s.PPSchedule != strategy.OneFOneB:
		return invalid(FieldPPInterleave, "{pp-interleave} %d needs the 1f1b pipeline schedule, not %s (Megatron-LM interleaves 1F1B only)", v, s.PPSchedule)
	case s.Accum%s.PP != 0:
		return invalid(FieldPPInterleave, "{pp-interleave} %d needs {accum} (the micro-batches) to be a multiple of {pp} %d, got %d", v, s.PP, s.Accum)
	}
	return nil
}

// validateStages refuses a pipeline of more chunks (stages × interleave)
// than the model has layers: each chunk holds at least one.
func (s *Spec) validateStages() error {
	chunks, v := s.PP*max(s.PPInterleave, 1), max(s.PPInterleave, 1) // ≤ MaxBlocks: withinChunks
	switch {
	case s.PP < 2 || chunks <= s.Model.Layers:
		return nil
	case v > 1:
		return invalid(FieldPP, "{pp} %d stages × {pp-interleave} %d chunks each are more than %s's %d layers (a chunk holds at least one)", s.PP, v, s.Model.Name, s.Model.Layers)
	}
	return invalid(FieldPP, "{pp} %d stages are more than %s's %d layers (a stage holds at least one)", s.PP, s.Model.Name, s.Model.Layers)
}

// MaxPipelineWork bounds the ops a model job's pipeline stages build
// together when its schedule simulates every micro-step (GPipe, which
// holds every micro-batch, and interleaved 1F1B, whose stages are built
// from the whole model), where no fewer micro-steps show its peak
// (pipelineShortAccum): PipelineWork. 4 million ops, the work package pack
// takes for a whole job file: llama-3-8b --pp 8 --pp-interleave 4 --accum
// 184, at the limit, plans in 1.6 s of CPU and 1.45 GB here;
// llama-3-8b --pp 8 --pp-interleave 4 --accum 1024 was 22 million (20 s of
// CPU, 46 s on a busy host, 4.0 GB), and is refused. A 1F1B pipeline
// without interleaving plans the few micro-steps that show each stage's
// peak, and is not bounded by it.
const MaxPipelineWork = 4_000_000

// PipelineWork is about how many ops planning s (validated) builds: for
// each stage (engine.StageWork: planned on its own, priced when s.GPU is
// set), its micro-steps × the layers it is built from × 84 ops a layer
// and 30 per expert (package pack's measure: gpt2 to deepseek-v3 within a
// tenth). 0 for a job without a model.
func PipelineWork(s *Spec) int64 {
	if s.Model == nil {
		return 0
	}
	perLayer := 84 + 30*int64(s.Model.NumExperts)
	var work int64
	for stage := range max(s.PP, 1) {
		steps, layers := StageWork(s, stage, s.GPU != nil)
		work += int64(steps) * int64(layers) * perLayer // ≤ 2^11 · 2^15 · 2^20, over ≤ 2^15 stages: no wrap
	}
	return work
}

// validatePipelineWork refuses a pipeline whose schedule simulates every
// micro-step past MaxPipelineWork, naming the schedule, {pp} and {accum}.
func (s *Spec) validatePipelineWork() error {
	if s.PP < 2 || s.Mode != Train || s.Trace != nil || s.PPSchedule == strategy.OneFOneB && max(s.PPInterleave, 1) == 1 {
		return nil
	}
	w := PipelineWork(s)
	if w <= MaxPipelineWork {
		return nil
	}
	sched := "the gpipe schedule holds every micro-batch"
	if s.PPInterleave > 1 {
		sched = fmt.Sprintf("{pp-interleave} %d builds each stage from the whole model", s.PPInterleave)
	}
	per := max(w/int64(s.Accum), 1)
	fewer := max(MaxPipelineWork/per, 1)
	if s.PPInterleave > 1 {
		fewer = max(fewer/int64(s.PP)*int64(s.PP), int64(s.PP)) // a multiple of {pp} (validateInterleave)
	}
	return invalid(FieldAccum, "{pp} %d over {accum} %d micro-steps of %s simulates every micro-step (%s): about %.1f million ops to build, over the limit of %d million (about 2 s and 1.5 GB): give {accum} %d or less, or the 1f1b schedule without {pp-interleave}",
		s.PP, s.Accum, s.Model.Name, sched, float64(w)/1e6, MaxPipelineWork/1_000_000, fewer)
}

// withinChunks: pp × interleave chunks, at most MaxBlocks.
func withinChunks(pp, interleave int) bool {
	_, ok := mulChecked(int64(max(pp, 1)), int64(interleave), MaxBlocks)
	return ok
}
