// Package diagnose runs the observation table of a memory problem: it varies
// one input of a job at a time (micro-batch, sequence, accumulation,
// optimizer, checkpointing, precision; for inference, generated tokens
// instead of the training-only inputs), reports how the peak, its phase and
// each ledger category move, names the object that presses on the peak, and
// picks the cheapest next step among engine.Compare's strategies.
package diagnose

import (
	"cmp"
	"fmt"
	"slices"

	"github.com/memplan/memplan/allocator"
	"github.com/memplan/memplan/engine"
	"github.com/memplan/memplan/ir"
	"github.com/memplan/memplan/lower"
	"github.com/memplan/memplan/models"
	"github.com/memplan/memplan/ops"
	"github.com/memplan/memplan/units"
)

// Row is one observation: the job with one input changed.
type Row struct {
	Name   string
	Peak   units.Bytes
	Phase  string
	Op     string
	Ledger [ir.NumCategories]units.Bytes
	Err    error
}

// Object is a thing live at the peak that a user can act on.
type Object struct {
	Name  string
	Bytes units.Bytes
}

// Report is a diagnosis.
type Report struct {
	Base Row
	// Plan is the job as given, compacted (its numbers without its
	// programs): whether it fits is Plan.Fits, the GPU or budget and the
	// host memory together, as plan decides.
	Plan *engine.Result
	Rows []Row
	// Objects live at the base's peak, largest first; Pressure is the first.
	Objects  []Object
	Pressure Object
	// Next is the cheapest of compare's strategies that helps (Why says by
	// which rule it was picked); empty when none lowers the peak.
	Next, Why string
}

// variation is one input changed.
type variation struct {
	name  string
	apply func(*engine.Spec)
}

// variations are the inputs diagnose changes, one at a time: those that
// apply to the job. A ViT takes images of a fixed size (no sequence to
// double), and so does a trace that records no sequence dimension (a row
// "sequence ×2 (0)" changed nothing); a trace ran in the dtypes it recorded
// (no precision to switch); inference has no accumulation, optimizer or
// checkpointing, and varies the generated tokens instead.
func variations(s engine.Spec) []variation {
	type v = variation
	vs := []v{{fmt.Sprintf("micro-batch ×2 (%d)", 2*s.MicroBatch), func(s *engine.Spec) { s.MicroBatch *= 2 }}}
	if s.Model != nil && s.Model.Family != models.FamilyViT || s.Trace != nil && s.Trace.HasSeq() {
		vs = append(vs, v{fmt.Sprintf("sequence ×2 (%d)", 2*s.Seq), func(s *engine.Spec) { s.Seq *= 2 }})
	}
	if s.Mode != engine.Train {
		if s.GenTokens > 0 {
			vs = append(vs, v{fmt.Sprintf("generated tokens ×2 (%d)", 2*s.GenTokens), func(s *engine.Spec) { s.GenTokens *= 2 }})
		}
		return append(vs, precisionVariation(s)...)
	}
	vs = append(vs, v{fmt.Sprintf("accumulation ×2 (%d micro-steps)", 2*max(s.Accum, 1)), func(s *engine.Spec) { s.Accum = 2 * max(s.Accum, 1) }})
	// A trace replays its recorded step unless told to plan another
	// (TraceOptimizer): setting the optimizer alone changed nothing.
	sgd := s.Optimizer == lower.SGD
	if s.Trace != nil && !s.TraceOptimizer {
		sgd = s.Trace.Optimizer == "sgd"
	}
	if sgd {
		vs = append(vs, v{"optimizer adamw", func(s *engine.Spec) { s.Optimizer, s.TraceOptimizer = lower.AdamW, s.Trace != nil }})
	} else {
		vs = append(vs, v{"optimizer sgd (no state)", func(s *engine.Spec) { s.Optimizer, s.TraceOptimizer = lower.SGD, s.Trace != nil }})
	}
	if s.Checkpoint.Kind == engine.NoCheckpoint {
		vs = append(vs, v{"checkpoint every block", func(s *engine.Spec) { s.Checkpoint = engine.CheckpointPolicy{Kind: engine.CheckpointFull} }})
	} else {
		vs = append(vs, v{"no checkpointing", func(s *engine.Spec) { s.Checkpoint = engine.CheckpointPolicy{} }})
	}
	return append(vs, precisionVariation(s)...)
}

// precisionVariation switches between mixed and pure bf16 (none for a
// trace, which runs the dtypes it recorded).
func precisionVariation(s engine.Spec) []variation {
	switch {
	case s.Trace != nil:
		return nil
	case s.Precision == ops.PureBF16:
		return []variation{{"precision amp-bf16", func(s *engine.Spec) { s.Precision = ops.AMPBF16 }}}
	}
	return []variation{{"precision pure-bf16", func(s *engine.Spec) { s.Precision = ops.PureBF16 }}}
}

func rowOf(name string, r *engine.Result, err error) Row {
	row := Row{Name: name, Err: err}
	if err != nil {
		return row
	}
	sr := r.Sim
	if r.First != nil && r.First.Peak.Total > sr.Peak.Total {
		sr = r.First
	}
	row.Peak, row.Phase, row.Ledger, row.Op = sr.Peak.Total, sr.Peak.Phase.String(), sr.Peak.Cat, sr.PeakOp
	return row
}

// Diagnose plans s and its variations. With reserved, the caching allocator's
// fragmentation at the reserved peak counts as an object too.
func Diagnose(s engine.Spec, reserved bool) (*Report, error) {
	// Planned through the cache the next step's strategies plan from, as
	// plan does: the model is built and lowered once.
	// Unpriced: the report reads no step time of the base (priced, a
	// plan past three micro-steps built a program of two to extrapolate
	// it: 0.7 s of deepseek-v3 --accum 4's).
	// For its peak alone (PeakOnly): the report reads the peak, its
	// stage's objects and the verdict, never another stage's, so a
	// pipeline's stages are planned as the variations' are, each with the
	// micro-steps that show its own peak and like middle stages left out
	// (deepseek-v3 --pp 8 --accum 16: 11.8 → 7.9 s). With reserved the
	// caching allocator replays the peak stage's programs, whose
	// fragmentation may grow with their micro-steps: that stage is planned
	// again as in full (ReplayPeak).
	cache := engine.LeverCache(s)
	base, err := engine.PlanWith(s, engine.Options{Cache: cache, NoTimeline: true, NoTiming: true, PeakOnly: !reserved, ReplayPeak: reserved})
	if err != nil {
		return nil, err
	}
	rep := &Report{Base: rowOf("baseline", base, nil)}
	rep.Objects = objects(base)
	if reserved {
		rv, err := base.PredictReserved(allocator.Config{}, false, false)
		if err != nil {
			return nil, err
		}
		rep.Objects = append(rep.Objects, Object{"fragmentation (caching allocator)", rv.Fragmentation})
	}
	slices.SortStableFunc(rep.Objects, func(a, b Object) int { return cmp.Compare(b.Bytes, a.Bytes) })
	rep.Pressure = rep.Objects[0]
	// The base's programs are done with before the next step and the
	// variations are planned (deepseek-v3 --accum 4 held them through all
	// six: 3.1 GB of RSS), and the next step may take those it plans from
	// last (engine.Cache's take) where it copied them.
	base.Compact()
	if base.Spec.Mode == engine.Train {
		rep.Next, rep.Why = nextStep(base, cache)
	}
	// Each variation is read into its row and dropped: only its peak is
	// reported, so it is planned for its numbers alone, without a timeline
	// and unpriced (priced, a variation past three micro-steps built a
	// program of two more to extrapolate a step time nobody reads).
	// An accumulation that simulates as many micro-steps as the base's
	// builds the base's programs again (engine.SimulatedAccum): its row is
	// the base's (deepseek-v3 --accum 4 planned three micro-steps again,
	// 1.1 s).
	o := engine.Options{NoTimeline: true, NoTiming: true, NumbersOnly: true}
	for _, v := range variations(base.Spec) {
		vs := base.Spec
		v.apply(&vs)
		if sameAccum(base.Spec, vs, o) {
			rep.Rows = append(rep.Rows, rowOf(v.name, base, nil))
			continue
		}
		r, err := engine.PlanWith(vs, o)
		rep.Rows = append(rep.Rows, rowOf(v.name, r, err))
		r.Compact()
	}
	if base.Spec.Mode != engine.Train {
		rep.Next, rep.Why = inferenceStep(base, rep.Rows)
	}
	rep.Plan = base
	return rep, nil
}

// sameAccum says whether v, base with another accumulation and nothing
// else changed, plans base's programs: valid (a row names why not) and
// simulated with as many micro-steps.
func sameAccum(base, v engine.Spec, o engine.Options) bool {
	c := v
	if c.Accum = base.Accum; c != base {
		return false
	}
	c = v
	return c.Validate() == nil && engine.SimulatedAccum(v, o) == engine.SimulatedAccum(base, o)
}

// objects splits the memory live at the base's peak into what a user can act
// on: the loss's logits (every storage the loss or the output head made,
// whatever its category), activations, optimizer state, parameters,
// gradients, KV cache and temporaries.
func objects(r *engine.Result) []Object {
	p, pk := r.Program, r.Sim.Peak
	if r.First != nil && r.First.Peak.Total > pk.Total {
		p, pk = r.FirstProgram, r.First.Peak
	}
	loss := lossBytes(p, pk.Op)
	cat := pk.Cat
	out := []Object{
		{"loss logits", loss.total},
		{"activations", cat[ir.Activation] - loss.byCat[ir.Activation]},
		{"optimizer state", cat[ir.OptimizerState]},
		{"parameters", cat[ir.Parameter]},
		{"gradients", cat[ir.Gradient]},
		{"KV cache", cat[ir.KVCache]},
		{"temporaries", cat[ir.Temporary] - loss.byCat[ir.Temporary]},
	}
	return out
}

type lossLive struct {
	total units.Bytes
	byCat [ir.NumCategories]units.Bytes
}

// isLoss: the modules of the loss and the output head (their outputs are the
// logits and what the loss makes of them).
func isLoss(module string) bool {
	b := ir.BlockOf(module)
	return b == "loss" || b == "lm_head" || b == "model.lm_head"
}

// lossBytes sums the device storages live at op at that ops of the loss or
// the output head wrote first (the simulator's lifetimes: from the first
// write to the last use), plus op's workspace when op is one of them.
func lossBytes(p *ir.Program, at int) lossLive {
	n := len(p.Tensors)
	owner := make([]ir.TensorID, n)
	for i := range p.Tensors {
		if b := p.Tensors[i].Base; b != ir.NoTensor {
			owner[i] = owner[b]
		} else {
			owner[i] = ir.TensorID(i)
		}
	}
	first, last := make([]int, n), make([]int, n)
	for i := range first {
		first[i], last[i] = -1, -1
	}
	for oi := range p.Ops {
		for _, t := range p.Ops[oi].Out {
			if o := owner[t]; first[o] < 0 {
				first[o] = oi
			}
		}
		for _, ts := range [2][]ir.TensorID{p.Ops[oi].In, p.Ops[oi].Out} {
			for _, t := range ts {
				last[owner[t]] = oi
			}
		}
	}
	var l lossLive
	for i := range p.Tensors {
		t := &p.Tensors[i]
		if t.Base != ir.NoTensor || t.Resident || t.Host || first[i] < 0 || first[i] > at {
			continue
		}
		if !t.Keep && last[i] < at {
			continue
		}
		if isLoss(p.Ops[first[i]].Module) {
			l.total += t.Bytes
			l.byCat[t.Cat] += t.Bytes
		}
	}
	if op := &p.Ops[at]; isLoss(op.Module) {
		l.total += op.Workspace
		l.byCat[ir.Temporary] += op.Workspace
	}
	return l
}

// nextStep is the cheapest strategy of engine.Compare that helps: with a GPU
// or budget, the fastest variant that fits (step time when the GPU prices
// it, else the least extra FLOPs); without one, the cheapest that lowers the
// peak by at least 10%.
// inferenceStep is the next step of an inference job: compare's strategies
// are training's, so it is the change of the table that lowers the peak
// most (with a capacity, only one that fits).
func inferenceStep(base *engine.Result, rows []Row) (string, string) {
	var best *Row
	for i := range rows {
		r := &rows[i]
		if r.Err != nil || r.Peak >= base.PeakBytes() || (base.Capacity > 0 && r.Peak > base.Capacity) {
			continue
		}
		if best == nil || r.Peak < best.Peak {
			best = r
		}
	}
	if best == nil {
		if base.Capacity > 0 {
			return "", "inference: no change above fits (compare's strategies are for training); try --tp or a smaller --micro-batch"
		}
		return "", "inference: no change above lowers the peak (compare's strategies are for training)"
	}
	return fmt.Sprintf("%s: peak %s", best.Name, best.Peak), "inference: the change above that lowers the peak most"
}

func nextStep(base *engine.Result, c *engine.Cache) (string, string) {
	if len(engine.Variants(base.Spec, engine.Allow{})) < 2 {
		return "", ""
	}
	basePeak := base.PeakBytes()
	// A strategy that cannot lower a peak in the optimizer step cannot
	// lower it by 10%, nor make a job that does not fit fit; one whose
	// floor is over the capacity cannot fit, so cannot help (deepseek-v3
	// --accum 4 --checkpoint full planned the fused optimizer step, whose
	// forward and backward alone peak over the GPU: its next step 2.2 →
	// 1.0 s).
	skip := func(v engine.Variant) bool {
		return v.CannotLower(base) && (base.Capacity == 0 || !base.Fits) || v.CannotFit(base)
	}
	type pick struct {
		row  engine.Row
		cost float64
	}
	helps := func(r *engine.Result) bool {
		if base.Capacity > 0 {
			return r.Fits
		}
		return r.PeakBytes() <= basePeak*9/10
	}
	// Whether a strategy helps is its peak's, which pricing does not
	// change: the strategies are planned unpriced first, and only those
	// that help are priced to pick the cheapest. Priced, every strategy of
	// deepseek-v3 --accum 4 built programs of two and three micro-steps
	// (18 s of CPU and 1.3 GB more), and none fit.
	helped := map[string]bool{}
	// A strategy stops at the first stage that shows it does not help.
	o := engine.Options{NoTiming: true, NumbersOnly: true, Cache: c, StopUnfit: base.Capacity > 0}
	if base.Capacity == 0 {
		o.StopOver = basePeak * 9 / 10
	}
	engine.EachStrategy(base, o, skip, func(row engine.Row) {
		if helps(row.Result) {
			helped[row.Name] = true
		}
	})
	var best *pick
	priced := func(v engine.Variant) bool { return !helped[v.Name] } // those that help were not skipped
	if len(helped) > 0 {
		engine.EachStrategy(base, engine.Options{Cache: c}, priced, func(row engine.Row) {
			r := row.Result
			if !helps(r) {
				return
			}
			cost := engine.TotalFLOPs(r.Program)
			if r.Timing != nil {
				cost = r.Timing.Step.Seconds()
			}
			if best == nil || cost < best.cost || cost == best.cost && r.PeakBytes() < best.row.Result.PeakBytes() {
				best = &pick{row, cost}
			}
		})
	}
	if best == nil {
		if base.Capacity > 0 {
			return "", "no single strategy of compare fits; search the combinations with memplan fit"
		}
		return "", "no single strategy of compare lowers the peak by 10%"
	}
	why := "the cheapest strategy that lowers the peak by at least 10%"
	if base.Capacity > 0 {
		why = "the fastest strategy that fits"
	}
	return fmt.Sprintf("%s: peak %s (%s)", best.row.Name, best.row.Result.PeakBytes(), best.row.Changes), why
}
