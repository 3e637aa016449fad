package search

import (
	"cmp"
	"context"
	"fmt"
	"github.com/memplan/memplan/models/build"
	"math"
	"slices"
	"strings"

	"github.com/memplan/memplan/engine"
	"github.com/memplan/memplan/models"
	"github.com/memplan/memplan/units"
)

// Dim is a dimension of a job that Max solves for.
type Dim uint8

const (
	// DimMicroBatch is the micro-batch (sequences per micro-step; in
	// inference, sequences served together).
	DimMicroBatch Dim = iota
	// DimSeq is the sequence length (in inference, the prompt).
	DimSeq
	// DimGenTokens is the tokens generated after the prompt (inference:
	// the KV cache holds seq + gen-tokens per sequence).
	DimGenTokens
)

// dimFields are the job field each dimension sets.
var dimFields = [...]engine.Field{DimMicroBatch: engine.FieldMicroBatch, DimSeq: engine.FieldSeq, DimGenTokens: engine.FieldGenTokens}

// Field is the job field d sets.
func (d Dim) Field() engine.Field { return dimFields[d] }

func (d Dim) String() string { return d.Field().String() }

// Dims lists every dimension Max solves for.
func Dims() []Dim { return []Dim{DimMicroBatch, DimSeq, DimGenTokens} }

// MaxCap is the largest value Max tries when nothing else bounds the
// dimension (a micro-batch on a budget far above the job).
const MaxCap = 1 << 20

// MaxResult is the answer of Max.
type MaxResult struct {
	Dim Dim
	// Value is the largest value that fits (0 when none does: Max then
	// returns ErrNothingFits and Beyond is the plan at the smallest value).
	Value int
	// Step is the granule of the dimension (a sequence split over TP ranks
	// by sequence parallelism must divide by TP): values are multiples of it.
	Step int
	// At is the plan at Value (full timeline); Beyond the plan at Value+Step,
	// which does not fit (nil when Value is Cap).
	At, Beyond *engine.Result
	// Cap bounds the search; CapWhy says what sets it.
	Cap    int
	CapWhy string
	// Plans counts the plans simulated to find Value.
	Plans int
	// Cache is the cache the probes were planned through: the next step
	// of a job that nothing fits (engine.LargestLever of Beyond) reuses
	// its built and lowered programs instead of building the model again.
	Cache *engine.Cache `json:"-"`
}

// AtCap says the answer is the search's bound, not where memory runs out.
func (r *MaxResult) AtCap() bool { return r.Value == r.Cap }

// Max finds the largest value of dimension d at which base fits its GPU or
// budget, everything else as given; base's value of d is ignored.
//
// It relies on monotonicity: with everything else fixed, a job's program has
// the same ops and the same lifetimes at every micro-batch, sequence length
// and generated-token count, and every tensor's size is a non-decreasing
// function of them, so the peak (a maximum over ops of sums of live sizes)
// never falls as they grow, and "fits" holds on a prefix of the values.
// TestPropertyPeakMonotone checks it on generated jobs, and
// TestPropertyMaxMatchesScan that Max agrees with a scan of every value.
//
// The search gallops from the smallest value to one past the largest value
// the curves seen predict to fit (each phase's peak of each stage, and the
// host's, modelled apart by the quadratic through three values: the peak
// is affine in a micro-batch, a quadratic at worst in a sequence), then
// narrows the bracket the same way, beside the prediction on the side not
// probed last, bisecting when three probes in a row did not halve it: a
// poor prediction costs probes, never the answer, which is always the
// bracket [v, v+Step] both probed. Each probe is an exact plan without a
// timeline. TestMaxProbesFew counts them on catalog jobs.
func Max(base engine.Spec, d Dim) (*MaxResult, error) {
	return MaxContext(context.Background(), base, d)
}

// MaxContext is Max cancelled by ctx: each probe checks it first, and each
// plan between its phases (engine.Options.Context), and the search returns
// its error (a service's request deadline or a client that went away).
func MaxContext(ctx context.Context, base engine.Spec, d Dim) (*MaxResult, error) {
	r := &MaxResult{Dim: d, Step: 1}
	if err := r.refuse(&base); err != nil {
		return nil, err
	}
	// The sequence's bound is the model's positions less the generated
	// tokens, known before the spec is validated at the smallest sequence;
	// the generated tokens' bound is the positions less the prompt, whose
	// default validation fills in (at 0 generated tokens).
	if d == DimSeq {
		if err := r.bounds(&base); err != nil {
			return nil, err
		}
	}
	smallest := 1
	if d == DimGenTokens {
		smallest = 0
	}
	base = (&maxSolver{base: base, r: r}).spec(smallest)
	if err := base.Validate(); err != nil {
		return nil, err
	}
	if d != DimSeq {
		if err := r.bounds(&base); err != nil {
			return nil, err
		}
	}
	if base.CapacityBytes() <= 0 {
		return nil, engine.FieldErrorf(engine.FieldGPU, "max needs a {gpu} or a {budget} to fit")
	}
	m := &maxSolver{base: base, r: r, ctx: ctx}
	// The cache keeps only what the next step of the smallest value plans
	// from (engine.LeverCache): the step is asked for when nothing fits,
	// and then of that value's plan (Beyond). Unfiltered, it held every
	// probe's programs, which no later probe plans from (each is another
	// value), and the next step planned beside them (max deepseek-v3
	// --pp 4 --accum 8: 2.31 GB of RSS, every stage's programs of eight
	// micro-steps).
	r.Cache = engine.LeverCache(m.spec(r.Step))
	lo, hi, err := m.solve()
	if err != nil {
		return nil, err
	}
	return r, m.finish(lo, hi)
}

// solve finds the bracket's ends in units of Step: lo the largest value
// that fits (0: none), hi = lo+1, which does not (cap+1 when the cap fits).
func (m *maxSolver) solve() (lo, hi int, err error) {
	lo, hi, err = m.bracket()
	if err != nil {
		return 0, 0, err
	}
	m.keep(lo, hi)
	for hi-lo > 1 {
		mid, err := m.next(lo, hi)
		if err != nil {
			return 0, 0, err
		}
		if m.fits(mid) {
			lo = mid
		} else {
			hi = mid
		}
		m.keep(lo, hi)
	}
	return lo, hi, nil
}

// keep drops the plans of every probe but the bracket's ends, the two the
// answer reports (finish): each held its program, and twelve probes of a
// 300,000-event trace held 2.4 GB (second adversarial sweep). Their peaks
// stay for the prediction.
func (m *maxSolver) keep(lo, hi int) {
	for u := range m.plans {
		if u != lo && u != hi {
			delete(m.plans, u)
		}
	}
}

// refuse says why r's dimension cannot be solved for base's job, if it
// cannot.
func (r *MaxResult) refuse(base *engine.Spec) error {
	a := base.Model
	switch r.Dim {
	case DimMicroBatch:
	case DimSeq:
		if a != nil && a.Family == models.FamilyViT {
			return engine.FieldErrorf(engine.FieldSeq, "%s takes images of a fixed size; it has no {seq} to solve for", a.Name)
		}
		if base.Trace != nil && !base.Trace.HasSeq() {
			return engine.FieldErrorf(engine.FieldSeq, "the trace has no sequence dimension; it has no {seq} to solve for")
		}
	case DimGenTokens:
		if base.Mode != engine.Infer {
			return engine.FieldErrorf(engine.FieldGenTokens, "{gen-tokens} applies to inference ({mode} infer)")
		}
		if a != nil && a.Encoder {
			return engine.FieldErrorf(engine.FieldGenTokens, "%s is an encoder; it generates no tokens", a.Name)
		}
	default:
		return fmt.Errorf("unknown dimension %d", r.Dim)
	}
	return nil
}

// bounds sets the granule and the cap of r's dimension for base.
func (r *MaxResult) bounds(base *engine.Spec) error {
	a := base.Model
	positions := 0
	if a != nil && a.MaxPositions > 0 {
		positions = a.MaxPositions
	}
	r.Cap, r.CapWhy = MaxCap, fmt.Sprintf("the search's bound of %d", MaxCap)
	switch r.Dim {
	case DimSeq:
		if base.SP && base.TP > 1 {
			r.Step = base.TP
		}
		if positions > 0 {
			r.Cap, r.CapWhy = positions-base.GenTokens, fmt.Sprintf("%s's %d positions", a.Name, positions)
			if base.GenTokens > 0 {
				r.CapWhy += fmt.Sprintf(" less %d generated tokens", base.GenTokens)
			}
		}
	case DimGenTokens:
		if positions > 0 {
			r.Cap, r.CapWhy = positions-base.Seq, fmt.Sprintf("%s's %d positions less the %d-token prompt", a.Name, positions, base.Seq)
		}
	}
	r.tokenCap(base)
	r.Cap -= r.Cap % r.Step
	if r.Cap < r.Step {
		return engine.FieldErrorf(r.Dim.Field(), "no {%s} fits in %s", r.Dim.Field().Key(), r.CapWhy)
	}
	return nil
}

// tokenCap lowers r's cap to the tokens a model's graph is built for
// (build.MaxTokens, 2^31 a micro-step: micro-batch × (seq + generated
// tokens)), which engine refuses past: the search answers the largest
// value that fits under it rather than the refusal of a probe past it, a
// value nobody gave (sweep H, round 25: max --micro-batch '?' on a 1 PiB
// budget at 8,192 tokens was refused at its own cap of 2^20).
func (r *MaxResult) tokenCap(base *engine.Spec) {
	if base.Model == nil || base.Trace != nil {
		return
	}
	mb, seq, gen := int64(max(base.MicroBatch, 1)), int64(base.Seq), int64(base.GenTokens)
	var c int64
	switch r.Dim {
	case DimMicroBatch:
		c = build.MaxTokens / max(seq+gen, 1)
	case DimSeq:
		c = build.MaxTokens/mb - gen
	case DimGenTokens:
		c = build.MaxTokens/mb - seq
	default:
		return
	}
	if c < int64(r.Cap) {
		r.Cap, r.CapWhy = int(max(c, 0)), "the 2^31 tokens a micro-step of a model's graph is built for"
	}
}

// maxSolver holds what Max's phases share: the job, the answer being built
// and the margins seen, which guide the next probe.
type maxSolver struct {
	ctx  context.Context
	base engine.Spec
	r    *MaxResult
	// margins are each probe's curves less their limits, by value in
	// units of Step.
	margins map[int]curves
	// plans are the probes' results, kept for the answer and the value
	// beyond it.
	plans map[int]*engine.Result
	// lastU is the last value probed, lastFit whether it fitted.
	lastU   int
	lastFit bool
	// stalls counts the probes in a row that did not halve the bracket;
	// width is the bracket's width before the last probe.
	stalls, width int
	// err is the first error of a probe inside the bracket.
	err error
	// planFn, when set, plans a value instead of the engine (tests of
	// the search on curves of their own).
	planFn func(v int) (*engine.Result, error)
}

// curves are what decides whether a plan fits, each less its limit (a
// plan fits when none is above 0): the device peak of each phase of every
// stage and of the first iteration against the capacity, and the host
// memory per node against --host-memory (NaN without one). Each is a
// maximum over ops of sums of live sizes, so each is non-decreasing in the
// dimension, as the peak is; they are modelled apart because the peak is
// their maximum, which bends where another takes over (a short sequence
// peaks in the optimizer step, flat in the sequence, a long one in
// backward).
type curves []float64

// curvesOf are res's curves.
func curvesOf(res *engine.Result) curves {
	capacity := float64(res.Capacity)
	var c curves
	add := func(b units.Bytes) {
		if b > 0 {
			c = append(c, float64(b)-capacity)
		} else {
			c = append(c, math.NaN()) // no op of that phase
		}
	}
	for _, st := range res.StagePhasePeaks {
		for _, b := range st {
			add(b)
		}
	}
	if res.First != nil {
		for _, pt := range res.First.PhasePeak {
			add(max(pt.Total, 0))
		}
	}
	c = append(c, math.NaN())
	if hm := res.Spec.HostMemory; hm > 0 {
		c[len(c)-1] = float64(res.HostPerNode) - float64(hm)
	}
	return c
}

// spec is base at value v of the dimension.
func (m *maxSolver) spec(v int) engine.Spec {
	s := m.base
	switch m.r.Dim {
	case DimMicroBatch:
		s.MicroBatch = v
	case DimSeq:
		s.Seq = v
	case DimGenTokens:
		s.GenTokens = v
	}
	return s
}

// plan simulates base at value v (without the per-op timeline: Max
// reports peaks).
func (m *maxSolver) plan(v int) (*engine.Result, error) {
	if m.ctx != nil {
		if err := context.Cause(m.ctx); err != nil {
			return nil, err
		}
	}
	m.r.Plans++
	if m.planFn != nil {
		return m.planFn(v)
	}
	return engine.PlanWith(m.spec(v), engine.Options{NoTimeline: true, Cache: m.r.Cache, Context: m.ctx})
}

// probe plans value u·Step and records its curves.
func (m *maxSolver) probe(u int) (bool, error) {
	res, err := m.plan(u * m.r.Step)
	if err != nil {
		return false, err
	}
	if m.margins == nil {
		m.margins, m.plans = map[int]curves{}, map[int]*engine.Result{}
	}
	m.margins[u], m.plans[u] = curvesOf(res), res
	m.lastFit, m.lastU = res.Fits, u
	return res.Fits, nil
}

// fits probes u; an error is kept for next and finish to return.
func (m *maxSolver) fits(u int) bool {
	ok, err := m.probe(u)
	if err != nil && m.err == nil {
		m.err = err
	}
	return ok && err == nil
}

// bracket finds lo (in units of Step) that fits and hi that does not (hi =
// cap+1 when the cap fits): from 1, each probe goes one past the largest
// value the curves predict to fit or, when that is closer, 2^k past the
// last fitting value after k fitting probes in a row (a gallop), so a poor
// prediction costs O(log) probes.
func (m *maxSolver) bracket() (lo, hi int, err error) {
	capU := m.r.Cap / m.r.Step
	ok, err := m.probe(1)
	if err != nil || !ok {
		return 0, 1, err
	}
	lo = 1
	for gap := 1; lo < capU; gap *= 2 {
		// One past the prediction: if it is right this is the first
		// value that does not fit, and the prediction the answer.
		u, predicted := lo+gap, false
		switch r := m.predict(lo, 0); {
		case r >= float64(capU) && !math.IsInf(r, 1):
			u, predicted = capU, true
		case r < float64(capU) && int(r)+1 > u:
			u, predicted = int(r)+1, true
		}
		u = min(u, capU)
		ok, err := m.probe(u)
		if err != nil {
			return 0, 0, err
		}
		if !ok {
			return lo, u, nil
		}
		if predicted {
			// Predicted not to fit, it fits: the curves changed
			// course (--checkpoint auto chose to checkpoint), and
			// the gallop goes on at their scale, doubling u.
			gap = max(gap, u/2)
		}
		lo = u
	}
	return lo, capU + 1, nil
}

// predict is where the first curve is predicted to cross its limit past
// lo (below hi when hi > 0), as a real value in units of Step: its largest
// fitting value is the floor. +Inf when no curve is predicted to cross.
// Each curve is modelled by the quadratic through its three values nearest
// the bracket (a peak is affine in a micro-batch, a quadratic at worst in a
// sequence), or by the line through two when the quadratic does not rise
// there.
func (m *maxSolver) predict(lo, hi int) float64 {
	us := make([]int, 0, len(m.margins))
	for u := range m.margins {
		us = append(us, u)
	}
	dist := func(u int) int { return max(u-m.lastU, m.lastU-u) }
	slices.SortFunc(us, func(a, b int) int { return cmp.Or(cmp.Compare(dist(a), dist(b)), cmp.Compare(a, b)) })
	best := math.Inf(1)
	var xs, ys []float64
	for k := range len(m.margins[m.lastU]) {
		if hi > 0 {
			if c := m.margins[hi]; c != nil && k < len(c) && !(c[k] > 0) {
				continue // under its limit over the whole bracket
			}
		}
		xs, ys = xs[:0], ys[:0]
		for _, u := range us {
			if c := m.margins[u]; k < len(c) && !math.IsNaN(c[k]) && len(xs) < 3 {
				xs, ys = append(xs, float64(u)), append(ys, c[k])
			}
		}
		if r, ok := crossing(xs, ys, float64(lo)); ok {
			best = min(best, r)
		}
	}
	return best
}

// crossing is where the curve through the points (xs, ys) (two or three,
// nearest first) rises through 0 past from: the quadratic through three,
// else the line through the two nearest; ok is false when neither rises
// through 0 past from.
func crossing(xs, ys []float64, from float64) (float64, bool) {
	if len(xs) < 2 {
		return 0, false
	}
	if len(xs) == 3 {
		// Newton's form about from: q(from + t) = a t² + b t + c.
		f01 := (ys[1] - ys[0]) / (xs[1] - xs[0])
		f12 := (ys[2] - ys[1]) / (xs[2] - xs[1])
		a := (f12 - f01) / (xs[2] - xs[0])
		d0, d1 := from-xs[0], from-xs[1]
		b := f01 + a*(d0+d1)
		c := ys[0] + f01*d0 + a*d0*d1
		if t, ok := risingRoot(a, b, c); ok {
			return from + t, true
		}
	}
	slope := (ys[1] - ys[0]) / (xs[1] - xs[0])
	if !(slope > 0) {
		return 0, false
	}
	r := xs[0] - ys[0]/slope
	return r, r >= from
}

// risingRoot is the smallest t ≥ 0 where a t² + b t + c rises through 0.
func risingRoot(a, b, c float64) (float64, bool) {
	if math.Abs(a) < 1e-300 || math.Abs(a*c) < 1e-12*b*b {
		if b > 0 && -c/b >= 0 {
			return -c / b, true
		}
		return 0, false
	}
	disc := b*b - 4*a*c
	if disc < 0 {
		return 0, false
	}
	q := -(b + math.Copysign(math.Sqrt(disc), b)) / 2
	best, ok := 0.0, false
	for _, t := range []float64{q / a, c / q} {
		if t >= 0 && 2*a*t+b > 0 && !math.IsInf(t, 0) && (!ok || t < best) {
			best, ok = t, true
		}
	}
	return best, ok
}

// next is the next probe inside (lo, hi): beside the largest value the
// curves predict to fit, on the side not probed last (a value predicted to
// fit after one that did not, and the one past it after one that did), or
// the midpoint when three probes in a row failed to halve the bracket.
func (m *maxSolver) next(lo, hi int) (int, error) {
	if m.err != nil {
		return 0, m.err
	}
	w := hi - lo
	if m.width > 0 && 2*w > m.width {
		m.stalls++
	} else {
		m.stalls = 0
	}
	m.width = w
	if m.stalls < 3 {
		if r := m.predict(lo, hi); r < float64(hi) {
			g := int(r)
			if m.lastFit {
				g++
			}
			return min(max(g, lo+1), hi-1), nil
		}
	}
	return lo + w/2, nil
}

// finish takes the plans of the answer and of the value one step beyond
// from the probes (the bracket's ends were both probed).
func (m *maxSolver) finish(lo, hi int) error {
	if m.err != nil {
		return m.err
	}
	r, step := m.r, m.r.Step
	r.Value, r.At, r.Beyond = lo*step, m.plans[lo], m.plans[hi]
	if lo == 0 {
		return fmt.Errorf("%w: %w", ErrNothingFits, engine.FieldErrorf(r.Dim.Field(), "even {%s} %d does not fit: %s", r.Dim.Field().Key(), step, shortOf(r.Beyond)))
	}
	return nil
}

// shortOf says what res, a plan that does not fit, runs out of: how much
// more device memory it needs, how far over the host limit it is, or both
// (a job over --host-memory alone needs 0 B more of its GPU).
func shortOf(res *engine.Result) string {
	var parts []string
	if res.Shortfall > 0 {
		parts = append(parts, fmt.Sprintf("needs %s more", res.Shortfall))
	}
	if res.HostShortfall > 0 {
		parts = append(parts, fmt.Sprintf("is %s over {host-memory} %s", res.HostShortfall, res.Spec.HostMemory))
	}
	return strings.Join(parts, " and ")
}
