package engine

import (
	"github.com/memplan/memplan/ir"
	"github.com/memplan/memplan/sim"
	"github.com/memplan/memplan/units"
)

// LargestLever plans Compare's strategies on the job of base (its result:
// the baseline, not planned again; its own training semantics kept) and
// returns the one that lowers the peak the most: the next step a job that
// does not fit is pointed to. nil when no strategy applies or none lowers
// the peak. A strategy that does not apply to the job is left out, and so
// is one that cannot lower base's peak (CannotLower). c is the cache to
// plan through (EachStrategy); plan passes the one its baseline was
// planned through.
//
// Planned as Compare does (every result whole, no cache), deepseek-v3's
// lever held seven programs of about 470,000 ops each and built the model
// eight times.
func LargestLever(base *Result, c *Cache) *Row {
	basePeak := base.PeakBytes()
	var best *Row
	// A strategy whose peak cannot go below the best one's is not planned
	// (deepseek-v3: the fused step cannot go below backward's 9.76 TiB, and
	// offloading the optimizer already reached 3.77 TiB).
	skip := func(v Variant) bool {
		below := basePeak
		if best != nil {
			below = best.Result.PeakBytes()
		}
		return v.floor(base) >= below
	}
	EachStrategy(base, Options{Cache: c, NoTiming: true}, skip, func(r Row) {
		if p := r.Result.PeakBytes(); p < basePeak && (best == nil || p < best.Result.PeakBytes()) {
			best = &r
		}
	})
	return best
}

// EachStrategy plans Compare's strategies on the job of base, one at a time
// and not the baseline (base is its result), as o says (through o.Cache,
// nil: a cache of its own; always without timelines; the lever, judging
// peaks, without step times, Options.NoTiming: under accumulation, pricing
// built a four-micro-step program for every strategy), leaving out the
// strategies skip names (nil: none), those that do not apply and those
// that do not plan; each gets every row planned, and the row's result is
// compacted (Result.Compact) once each returns, so at most one strategy's
// program is live. Through one cache, the strategies that change only
// sharding or offload build and lower the model once, the checkpointing
// ones lower it once.
func EachStrategy(base *Result, o Options, skip func(Variant) bool, each func(Row)) {
	if o.Cache == nil {
		o.Cache = &Cache{}
	}
	o.NoTimeline = true
	vs := Variants(base.Spec, Allow{})[1:] // the baseline is base
	_ = eachVariant(base.Spec, vs, o, skip, func(r Row) error {
		if r.Err == nil {
			each(r)
			r.Result.Compact()
		}
		return nil
	})
}

// eachVariant plans each of vs on base, one at a time, as o says (compare
// and the lever: through one cache and without timelines, which neither
// reads), and hands each its row: the result, or why the variant does not apply
// or does not plan. skip (nil: none) leaves a variant out unplanned, asked
// when its turn comes. An error each returns ends it and is returned. After
// each row the cache keeps only base's programs (Cache.keepBase): compare on
// deepseek-v2 held every checkpointed program until evicted, 1.78 GB of
// peak RSS where 1.32 GB do, for the same lookups
// (TestPropertyCompareKeepsBaseProgramsOnly).
func eachVariant(base Spec, vs []Variant, o Options, skip func(Variant) bool, each func(Row) error) error {
	for _, v := range vs {
		if skip != nil && skip(v) {
			continue
		}
		s := base
		row := Row{Variant: v}
		if row.Err = v.apply(&s); row.Err == nil {
			row.Result, row.Err = PlanWith(s, o)
		}
		if err := each(row); err != nil {
			return err
		}
		if o.Cache != nil {
			o.Cache.keepBase(&base)
		}
	}
	return nil
}

// CannotLower says the strategy cannot lower base's peak (floor).
func (v Variant) CannotLower(base *Result) bool {
	return v.floor(base) >= base.PeakBytes()
}

// floor is a lower bound on the strategy's peak from base's phases (0: none
// known). A strategy that changes only what forward and backward hold
// (checkpointing, activation offload) leaves every op of the optimizer step
// as it was, so its peak is at least base's optimizer-step peaks
// (TestPropertyFwdBwdVariantsKeepOptimizerPeak); one that changes only the
// step leaves forward and backward, so its peak is at least their peaks
// (TestPropertyStepOnlyVariantsKeepForwardBackward), unless the step runs
// inside backward.
func (v Variant) floor(base *Result) units.Bytes {
	var phases []ir.Phase
	switch {
	case v.fwdBwd:
		phases = []ir.Phase{ir.Optimizer}
	case v.stepOnly && !base.Spec.Sem.OptimizerInBackward:
		phases = []ir.Phase{ir.Forward, ir.Backward}
	}
	var f units.Bytes
	for _, r := range []*sim.Result{base.Sim, base.First} {
		if r == nil {
			continue
		}
		for _, ph := range phases {
			if pp := r.PhasePeak[ph]; pp.Op >= 0 {
				f = max(f, pp.Total)
			}
		}
	}
	return f
}
