package search

import (
	"context"
	"fmt"
	"strings"

	"github.com/memplan/memplan/engine"
	"github.com/memplan/memplan/models"
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
// The search gallops from the smallest value, guided by the secant through
// the last two peaks (the peak is close to affine in a micro-batch, to a
// quadratic at worst in a sequence), then bisects the bracket; each probe
// is an exact plan without a timeline.
func Max(base engine.Spec, d Dim) (*MaxResult, error) {
	return MaxContext(context.Background(), base, d)
}

// MaxContext is Max cancelled by ctx: each probe checks it first, and each
// plan between its phases (engine.Options.Context), and the search returns
// its error (a service's request deadline or a client that went away).
func MaxContext(ctx context.Context, base engine.Spec, d Dim) (*MaxResult, error) {
	r := &MaxResult{Dim: d, Step: 1, Cache: &engine.Cache{}}
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
	lo, hi, err := m.bracket()
	if err != nil {
		return nil, err
	}
	m.keep(lo, hi)
	for hi-lo > 1 {
		mid, err := m.next(lo, hi)
		if err != nil {
			return nil, err
		}
		if m.fits(mid) {
			lo = mid
		} else {
			hi = mid
		}
		m.keep(lo, hi)
	}
	return r, m.finish(lo, hi)
}

// keep drops the plans of every probe but the bracket's ends, the two the
// answer reports (finish): each held its program, and twelve probes of a
// 300,000-event trace held 2.4 GB (second adversarial sweep). Their peaks
// stay for the secant.
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
	r.Cap -= r.Cap % r.Step
	if r.Cap < r.Step {
		return engine.FieldErrorf(r.Dim.Field(), "no {%s} fits in %s", r.Dim.Field().Key(), r.CapWhy)
	}
	return nil
}

// maxSolver holds what Max's phases share: the job, the answer being built
// and the peaks seen (units of Step → peak), which guide the next probe.
type maxSolver struct {
	ctx   context.Context
	base  engine.Spec
	r     *MaxResult
	peaks map[int]float64
	// plans are the probes' results, kept for the answer and the value
	// beyond it.
	plans map[int]*engine.Result
	last  [2]int
	// stalls counts the probes in a row that did not halve the bracket;
	// width is the bracket's width before the last probe.
	stalls, width int
	// err is the first error of a probe inside the bracket.
	err error
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
	return engine.PlanWith(m.spec(v), engine.Options{NoTimeline: true, Cache: m.r.Cache, Context: m.ctx})
}

// probe plans value u·Step and records its peak.
func (m *maxSolver) probe(u int) (bool, error) {
	res, err := m.plan(u * m.r.Step)
	if err != nil {
		return false, err
	}
	if m.peaks == nil {
		m.peaks, m.plans = map[int]float64{}, map[int]*engine.Result{}
	}
	m.peaks[u], m.plans[u] = float64(res.PeakBytes()), res
	m.last = [2]int{m.last[1], u}
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
// cap+1 when the cap fits): from 1, each probe goes to the secant's guess
// or, when that is closer, 2^k past the last fitting value after k fitting
// probes in a row (a gallop), so a poor guess costs O(log) probes.
func (m *maxSolver) bracket() (lo, hi int, err error) {
	capU := m.r.Cap / m.r.Step
	ok, err := m.probe(1)
	if err != nil || !ok {
		return 0, 1, err
	}
	lo = 1
	for gap := 1; lo < capU; gap *= 2 {
		// One past the guess: if the peak is affine the guess fits and
		// this is the first value that does not.
		u := min(max(m.secant(lo)+1, lo+gap), capU)
		ok, err := m.probe(u)
		if err != nil {
			return 0, 0, err
		}
		if !ok {
			return lo, u, nil
		}
		lo = u
	}
	return lo, capU + 1, nil
}

// secant is where the line through the last two peaks meets the capacity
// (0 when it does not rise), at least lo+1.
func (m *maxSolver) secant(lo int) int {
	a, b := m.last[0], m.last[1]
	pa, oka := m.peaks[a]
	pb, okb := m.peaks[b]
	if !oka || !okb || a == b || pb <= pa {
		return 0
	}
	c := float64(m.base.CapacityBytes())
	slope := (pb - pa) / float64(b-a)
	guess := float64(b) + (c-pb)/slope
	if guess > float64(MaxCap) {
		return MaxCap
	}
	return max(int(guess), lo+1)
}

// next is the next probe inside (lo, hi): the secant's guess, or the
// midpoint when two probes in a row failed to halve the bracket.
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
	if m.stalls < 2 {
		if g := m.secant(lo); g > lo && g < hi {
			return g, nil
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
