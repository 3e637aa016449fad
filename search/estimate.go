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
	var peak units.Bytes
	var step time.Duration
	for _, st := range []struct{ stage, inFlight int }{{0, s.PP}, {s.PP - 1, 2}} {
		q := s
		q.PPStages = []int{st.stage}
		r, t, err := e.runWith(q, layers, min(s.Accum, st.inFlight))
		if err != nil {
			return 0, 0, err
		}
		peak, step = max(peak, r.PeakBytes()), max(step, t)
	}
	return peak, step, nil
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
