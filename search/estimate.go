package search

import (
	"fmt"
	"sync"
	"time"

	"github.com/memplan/memplan/engine"
	"github.com/memplan/memplan/ir"
	"github.com/memplan/memplan/models"
	"github.com/memplan/memplan/strategy"
	"github.com/memplan/memplan/units"
)

// estimator evaluates plans on shallow copies of the model. Plans share
// one engine.Cache, so those that differ only in sharding or offload build,
// lower and schedule each shallow program once; the copies of each depth
// are made once, as the cache keys on the model.
type estimator struct {
	model *models.Arch
	cache *engine.Cache

	mu     sync.Mutex
	copies map[int]*models.Arch
}

func newEstimator(a *models.Arch) *estimator {
	return &estimator{model: a, cache: &engine.Cache{}, copies: map[int]*models.Arch{}}
}

// depth is the model cut to layers (0: the model).
func (e *estimator) depth(layers int) *models.Arch {
	if layers <= 0 || layers == e.model.Layers {
		return e.model
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	a := e.copies[layers]
	if a == nil {
		a = e.model.Clone()
		a.Layers = layers
		e.copies[layers] = a
	}
	return a
}

// unit is the smallest layer count that keeps the plan's structure: every
// pipeline stage (and virtual stage) gets the same whole number of periods
// of the checkpoint pattern (every k-th block).
func unit(s *engine.Spec) int {
	u := max(s.PP, 1) * max(s.PPInterleave, 1)
	if s.Checkpoint.Kind == "every" {
		u *= s.Checkpoint.Every
	}
	return u
}

// simAccum is the number of micro-steps to simulate for a plan of accum
// micro-steps: the same peak with fewer ops. Micro-steps after the first
// hold the same memory (every gradient already exists), so two show the
// peak of any k ≥ 2; a pipeline stage holds at most p micro-batches in
// flight under 1F1B, so p show the peak of any k ≥ p (p is also a multiple
// of p, as the interleaved schedule needs).
func simAccum(s *engine.Spec) int {
	return min(s.Accum, max(2, s.PP))
}

// stepAt extrapolates a step time simulated with sim micro-steps to accum
// micro-steps: the optimizer step runs once, forward and backward once per
// micro-step, and a pipeline rank idles (p−1)/v micro-steps' worth in the
// bubble (Narayanan et al., SC'21).
func stepAt(r *engine.Result, sim, accum int) time.Duration {
	t := r.Timing
	if t == nil {
		return 0
	}
	s := &r.Spec
	micro := float64(t.Phases[ir.Forward].Wall+t.Phases[ir.Backward].Wall) / float64(sim)
	bubble := 0.0
	if s.PP > 1 {
		bubble = micro * float64(s.PP-1) / float64(max(s.PPInterleave, 1))
	}
	return t.Phases[ir.Optimizer].Wall + time.Duration(micro*float64(accum)+bubble)
}

// run plans s with its model cut to layers (0: full depth) and its
// micro-steps cut to simAccum; it returns the result and the step time
// extrapolated to s's micro-steps.
func (e *estimator) run(s engine.Spec, layers int) (*engine.Result, time.Duration, error) {
	return e.runWith(s, layers, simAccum(&s))
}

// runWith is run simulating sim micro-steps.
func (e *estimator) runWith(s engine.Spec, layers, sim int) (*engine.Result, time.Duration, error) {
	s.Model, s.Cache = e.depth(layers), e.cache
	accum := s.Accum
	s.Accum = sim
	r, err := engine.Plan(s)
	if err != nil {
		return nil, 0, err
	}
	r.Spec.Cache = nil // a kept result must not keep the cache alive
	return r, stepAt(r, s.Accum, accum), nil
}

// shallow plans s on a copy of its model with the given number of layers.
// Under a 1F1B pipeline it plans only the first and the last stage, which
// bound the others (engine.Spec.PPStages), each with the fewest micro-steps
// that show its peak: the first holds p micro-batches in flight, the last
// one, so two micro-steps show the last stage's peak of any k ≥ 2.
func (e *estimator) shallow(s engine.Spec, layers int) (units.Bytes, time.Duration, error) {
	if s.PP < 2 || max(s.PPInterleave, 1) > 1 || (s.PPSchedule != "" && s.PPSchedule != "1f1b") {
		r, t, err := e.run(s, layers)
		if err != nil {
			return 0, 0, err
		}
		return r.PeakBytes(), t, nil
	}
	first := s
	first.PPStages = []int{0}
	peak, step, err := e.firstStage(first, layers, min(s.Accum, s.PP))
	if err != nil {
		return 0, 0, err
	}
	last := s
	last.PPStages = []int{s.PP - 1}
	r, t, err := e.runWith(last, layers, min(s.Accum, 2))
	if err != nil {
		return 0, 0, err
	}
	return max(peak, r.PeakBytes()), max(step, t), nil
}

// firstStage is the peak and step time of pipeline stage 0 (s.PPStages
// [0]) holding m micro-batches in flight. For m > 3 it simulates three
// micro-steps and adds the m−3 micro-batches the real schedule holds
// besides them (inFlight); TestPropertyInFlightIsExact checks the result
// equals the simulation of all m.
func (e *estimator) firstStage(s engine.Spec, layers, m int) (units.Bytes, time.Duration, error) {
	if m <= 3 {
		r, t, err := e.runWith(s, layers, m)
		if err != nil {
			return 0, 0, err
		}
		return r.PeakBytes(), t, nil
	}
	r, t, err := e.runWith(s, layers, 3)
	if err != nil {
		return 0, 0, err
	}
	peak, ok := inFlight(r, m-3)
	if !ok {
		r, t, err = e.runWith(s, layers, m)
		if err != nil {
			return 0, 0, err
		}
		peak = r.PeakBytes()
	}
	return peak, t, nil
}

// inFlight is the peak of the first pipeline stage's three-micro-step
// program r with extra more micro-batches in flight. Under 1F1B with m ≥ 4
// micro-steps (m ≤ stages) the first stage runs m forwards, then m
// backwards; three micro-steps run F0 F1 F2 B0 B1 B2. From F2 (the last
// forward, real F(m−1)) to the end of B1 (a backward before the last) the
// real stage holds m−3 more micro-batches than the three-step program,
// each retaining what one micro-batch's forward leaves live (S: the rise
// between the first ops of F1 and F2); before, it runs the same first two
// forwards (later ones hold less than F(m−1)), and after, B2 plays the last
// backward, holding one micro-batch. So the peak is the three-step
// timeline with extra·S added over that window. ok is false when the
// program does not have that shape.
func inFlight(r *engine.Result, extra int) (units.Bytes, bool) {
	p, tl := r.Program, r.Sim.Timeline
	if len(tl) != len(p.Ops) {
		return 0, false
	}
	first := func(ph ir.Phase, micro int) int {
		for i := range p.Ops {
			if p.Ops[i].Phase == ph && p.Ops[i].Micro == micro {
				return i
			}
		}
		return -1
	}
	f1, f2, b0, b2 := first(ir.Forward, 1), first(ir.Forward, 2), first(ir.Backward, 0), first(ir.Backward, 2)
	if f1 < 0 || f2 <= f1 || b0 <= f2 || b2 <= b0 || p.Ops[f1].Name != p.Ops[f2].Name {
		return 0, false
	}
	per := tl[f2].Total - tl[f1].Total
	if per < 0 {
		return 0, false
	}
	var peak units.Bytes
	for i := range tl {
		v := tl[i].Total
		if i >= f2 && i < b2 {
			v += units.Bytes(extra) * per
		}
		peak = max(peak, v)
	}
	return peak, true
}

// bucketSlack is how far a plan's peak can stray from the affine-in-depth
// pattern: ZeRO-2 reduces gradients in buckets of reduce_bucket_size
// elements, and where the bucket boundaries fall depends on the depth, so up
// to one bucket of full gradients may be live or not at the peak.
func bucketSlack(s *engine.Spec) units.Bytes {
	if s.ZeRO != 2 {
		return 0
	}
	return units.Bytes(strategy.DefaultReduceBucketElems) * units.Bytes(s.Precision.ParamDType().Size(1))
}

// estimate sets c.EstPeak to a lower bound on the full model's peak and
// c.EstStep to an estimate of its step time, from shallow models of 2u and 3u
// layers: the peak is the maximum of functions affine in the layer count
// (convex in it), so the line through two shallow points extended to the
// full depth lies below it; the step time is a sum over layers, affine in it.
// Models too shallow to shrink are planned in full.
func (e *estimator) estimate(c *Plan) {
	u := unit(&c.Spec)
	L := e.model.Layers
	// Two and three units: with a single unit the first and the last layer
	// are the same one, and boundary effects (a ZeRO-3 prefetch reaching
	// the head, a pipeline stage holding only its ends) break the affine
	// pattern the extrapolation relies on.
	if 3*u >= L {
		r, t, err := e.run(c.Spec, 0)
		if err != nil {
			c.Dropped = err.Error()
			return
		}
		c.Result, c.EstPeak, c.EstStep, c.VerifiedStep = r, r.PeakBytes(), t, t
		return
	}
	p1, t1, err := e.shallow(c.Spec, 2*u)
	if err != nil {
		c.Dropped = err.Error()
		return
	}
	p2, t2, err := e.shallow(c.Spec, 3*u)
	if err != nil {
		c.Dropped = err.Error()
		return
	}
	// Integer arithmetic rounds the extrapolation down, keeping it a bound.
	c.EstPeak = p2 + (p2-p1)*units.Bytes(L-3*u)/units.Bytes(u) - bucketSlack(&c.Spec)
	if c.EstPeak < 1 {
		c.EstPeak = 1
	}
	scale := float64(L-3*u) / float64(u)
	if c.EstPeak < p2 {
		c.EstPeak = p2
	}
	c.EstStep = t2 + time.Duration(scale*float64(t2-t1))
	if c.EstPeak <= 0 {
		c.Dropped = fmt.Sprintf("no estimate (shallow peaks %s, %s)", p1, p2)
	}
}
