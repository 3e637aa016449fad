package engine

import (
	"cmp"
	"context"
	"slices"

	"github.com/memplan/memplan/ir"
	"github.com/memplan/memplan/sim"
	"github.com/memplan/memplan/units"
)

// LargestLever plans Compare's strategies on the job of base (its result:
// the baseline, not planned again; its own training semantics kept) and
// returns the one that lowers the peak the most (the first in Compare's
// order of equal ones): the next step a job that does not fit is pointed
// to. nil when no strategy applies or none lowers the peak. A strategy that
// does not apply to the job is left out. c is the cache to plan through;
// plan passes the one its baseline was planned through.
//
// It is a branch and bound over the strategies: each has a floor its peak
// cannot go below (Variant.floor), and one whose floor is not below the
// best peak found so far is not planned. They are planned by increasing
// floor, so the strategies that can go lowest come first and bound the
// others sooner (deepseek-v3 --pp 4 --accum 8: offloading the optimizer
// reaches 2.28 TiB, under every checkpointing's and activation offload's
// floor, the optimizer step's peak, which were planned first at 46 s of
// the lever's 56 s). A pipeline's stages are planned one after another,
// and a strategy whose peak so far rises over another's floor with stages
// left is put off once (leverQueue): that one may prove lower first, and
// bound it (deepseek-v3 --pp 8 --accum 16: offloading the optimizer, of
// no floor, planned all eight stages to reach 1.94 TiB, over "checkpoint
// every block"'s floor and peak of 1.69 TiB; put off, it plans two). The
// pick does not depend on the order: a strategy is skipped only when its
// peak cannot beat the best one's, nor equal it ahead of it in Compare's
// order (TestPropertyLeverBoundPicksTheLowest; on real plans,
// TestLargestLeverMatchesCompare).
//
// Planned as Compare does (every result whole, no cache), deepseek-v3's
// lever held seven programs of about 470,000 ops each and built the model
// eight times.
func LargestLever(base *Result, c *Cache) *Row {
	r, _ := LargestLeverContext(context.Background(), base, c)
	return r
}

// LargestLeverContext is LargestLever stopped by ctx (Options.Context):
// once ctx is done it returns its cause, not a lever picked from the
// strategies planned before.
func LargestLeverContext(ctx context.Context, base *Result, c *Cache) (*Row, error) {
	all := Variants(base.Spec, Allow{})[1:] // the baseline is base
	floors := make([]units.Bytes, len(all))
	never := make([]bool, len(all))
	for i, v := range all {
		floors[i] = v.floor(base)
		s := base.Spec
		never[i] = v.apply(&s) != nil
	}
	auto := newAutoSettled(base, all)
	q := newLeverQueue(base.PeakBytes(), floors, never, auto.beaten)
	var best *Row
	o := leverOptions(c)
	o.Context = ctx
	// A strategy put off goes on from the stage after the last it planned
	// (Options.resume) when its turn comes again.
	off := map[int]*Result{}
	_, err := q.pick(func(pending []int, skip func(k int) bool, stop func(k int, peak units.Bytes, more bool) bool,
		seen func(k int, peak units.Bytes, planned bool) bool) error {
		vs := make([]Variant, len(pending))
		for k, i := range pending {
			vs[k] = all[i]
		}
		o.stopAt = stop
		o.resumeAt = func(k int) *Result { return off[pending[k]] }
		return eachVariant(base.Spec, vs, o, skip, func(k int, r Row) error {
			i := pending[k]
			delete(off, i)
			if r.Err != nil {
				seen(k, 0, false)
				return nil
			}
			defer r.Result.Compact()
			auto.seen(i, r.Result) // a plan put off has its first stage too
			if seen(k, r.Result.PeakBytes(), true) {
				best = &r
			}
			if !q.done[i] && r.Result.stopped != nil {
				off[i] = r.Result // put off
			}
			return nil
		})
	})
	if err == nil {
		err = o.stopped() // stopped during the last strategy: not a lever picked from the others
	}
	if err != nil {
		return nil, err
	}
	return best, nil
}

// leverQueue is LargestLever's order of planning: strategies by their
// index in Compare's order, each with the lowest peak it can have (its
// floor, or the peak of the stages planned when it was put off).
type leverQueue struct {
	b    *bound
	low  []units.Bytes
	done []bool         // planned, or never to be
	out  func(int) bool // a rule besides the bound that leaves one out (nil: none)
	// off are the strategies put off in the current round of plan;
	// once says which were ever put off.
	off  []int
	once []bool
}

// newLeverQueue is the queue of strategies of the given floors (the
// queue's own from then on) under a baseline of peak basePeak; never
// says which are never planned (they do not apply), out (nil: none)
// which a rule besides the bound leaves out.
func newLeverQueue(basePeak units.Bytes, floors []units.Bytes, never []bool, out func(int) bool) *leverQueue {
	return &leverQueue{b: newBound(basePeak, floors), low: floors, done: never, out: out, once: make([]bool, len(floors))}
}

// dead says whether strategy i is not to be planned: the bound or the
// other rule rules it out.
func (q *leverQueue) dead(i int) bool { return q.b.skip(i) || q.out != nil && q.out(i) }

// pick plans the strategies through plan and returns the index of the
// best (-1: none). plan plans the strategies pending names, in that order,
// one at a time: it leaves out those skip says (asked when their turn
// comes), ends each plan after the first stage stop says (given the peak
// so far and whether stages are left), and hands each planned strategy's
// peak to seen (planned false: it did not plan), which says whether it is
// the best so far. Once a strategy is put off, those after it that it may
// be lower than are left for plan's next call, which gets every strategy
// not planned and not ruled out, lowest first.
func (q *leverQueue) pick(plan func(pending []int, skip func(k int) bool, stop func(k int, peak units.Bytes, more bool) bool,
	seen func(k int, peak units.Bytes, planned bool) bool) error) (int, error) {
	for pending := q.next(); len(pending) > 0; pending = q.next() {
		last := -1 // the strategy the last stop put off
		err := plan(pending, func(k int) bool { return q.dead(pending[k]) || q.ahead(pending[k]) },
			func(k int, peak units.Bytes, more bool) bool {
				i := pending[k]
				if q.b.beaten(i, peak) {
					return true
				}
				if more && q.putOff(i, peak) {
					last = i
					return true
				}
				return false
			},
			func(k int, peak units.Bytes, planned bool) bool {
				i := pending[k]
				if last == i {
					last = -1
					return false
				}
				q.done[i] = true
				return planned && q.b.offer(i, peak)
			})
		if err != nil {
			return -1, err
		}
	}
	return q.b.at, nil
}

// next is the strategies not planned and not ruled out, by the lowest
// peak each can have (Compare's order among equal ones); none is put off
// any more.
func (q *leverQueue) next() []int {
	q.off = q.off[:0]
	var out []int
	for i := range q.low {
		if !q.done[i] && !q.dead(i) {
			out = append(out, i)
		}
	}
	slices.SortStableFunc(out, q.cmp)
	return out
}

// cmp orders strategies by the lowest peak each can have, then by index.
func (q *leverQueue) cmp(a, b int) int {
	return cmp.Or(cmp.Compare(q.low[a], q.low[b]), cmp.Compare(a, b))
}

// ahead says whether a strategy put off comes before strategy i now.
func (q *leverQueue) ahead(i int) bool {
	return slices.ContainsFunc(q.off, func(j int) bool { return q.cmp(j, i) < 0 })
}

// putOff says whether strategy i, its peak at least peak with stages left
// to plan, is put off: another strategy, not planned and not ruled out,
// may be lower (or as low and ahead of it in Compare's order). One is put
// off once: planned again, it is planned in full.
func (q *leverQueue) putOff(i int, peak units.Bytes) bool {
	if q.once[i] {
		return false
	}
	for j, low := range q.low {
		if j != i && (low < peak || low == peak && j < i) && !q.done[j] && !q.dead(j) {
			q.low[i] = max(q.low[i], peak)
			q.once[i] = true
			q.off = append(q.off, i)
			return true
		}
	}
	return false
}

// leverOptions are the options LargestLever plans its strategies with
// through c: judged by their peaks, without step times, timelines or
// programs, none cached for the strategies its bound may rule out.
func leverOptions(c *Cache) Options {
	return Options{Cache: c, NoTiming: true, NoTimeline: true, NumbersOnly: true, leverBound: true}
}

// LeverCache is a cache to plan base through and then hand to
// LargestLever: it keeps only the programs the lever's strategies plan
// from. A priced 1F1B pipeline of p+2 to 2p+3 micro-steps holds all of
// them, where the lever, judging peaks, plans the p+1 that show them
// (pipelineShortAccum): kept, every stage's lowered and scheduled programs
// of deepseek-v3 --pp 4 --accum 8 were never looked up again (3.85 GB of
// peak RSS, 2.99 GB without them). The filter ends with the lever
// (eachVariant). It holds a program the plan made with autocast's cache
// alone in place of the one that cache was applied to, and makes that one
// again for the strategies that plan from it (Cache.finish): deepseek-v3
// --accum 8 held its steady and first-step programs twice, before and
// after the cache's few exits (2.16-2.22 GiB of peak RSS, 1.87-1.88 GiB
// with one copy). A spec that does not validate gets a plain cache
// (PlanWith reports why).
func LeverCache(base Spec) *Cache {
	c := &Cache{derive: true}
	if base.Validate() != nil {
		return c
	}
	vs := Variants(base, Allow{})[1:]
	c.lever = &leverBase{base: base}
	for _, v := range vs {
		if !v.fwdBwd {
			c.lever.rest = append(c.lever.rest, v)
		}
	}
	c.putOnlyFor(specsOf(base, vs), leverOptions(c), true)
	return c
}

// leverBase is what a LeverCache knows of the baseline it was made for
// until it is settled: its spec and the strategies that do not change only
// forward and backward (Variant.fwdBwd).
type leverBase struct {
	base Spec
	rest []Variant
}

// settle drops from a LeverCache the programs only the checkpointing and
// activation-offload strategies plan from, once res, the baseline's steady
// step (every stage), shows that neither the lever nor diagnose plans
// them: it peaks in its optimizer step, which each of those strategies
// keeps (Variant.floor: its peak cannot go below the baseline's), and
// over its capacity or without one (diagnose plans every strategy of a job
// that fits). Planned anyway (a first step that peaks higher in forward),
// such a strategy lowers the model again: a cache decision, never an
// answer. deepseek-v3 --accum 4 --checkpoint full held its lowered steady
// and first-step programs through the next step, which offloads the
// optimizer. s is the spec res was planned for.
func (c *Cache) settle(s *Spec, res *Result) {
	if c == nil || c.lever == nil {
		return
	}
	k, b := s.preShardKey(), c.lever.base.preShardKey()
	if k.Accum = b.Accum; k != b {
		return // another job planned through the cache (max's probes)
	}
	peak := res.PeakBytes()
	var opt units.Bytes
	for _, st := range res.StagePhasePeaks {
		opt = max(opt, st[ir.Optimizer])
	}
	if opt < peak || res.Capacity > 0 && peak <= res.Capacity {
		return
	}
	o := leverOptions(c)
	rest := specsOf(c.lever.base, c.lever.rest)
	c.putOnlyFor(rest, o, true)
	c.keepFor(rest, o)
	c.lever = nil
}

// specsOf is s with each of vs that applies applied.
func specsOf(s Spec, vs []Variant) []Spec {
	var out []Spec
	for _, v := range vs {
		vs := s
		if v.apply(&vs) == nil {
			out = append(out, vs)
		}
	}
	return out
}

// bestFirst orders the indices of floors by increasing floor, equal ones
// in their order.
func bestFirst(floors []units.Bytes) []int {
	order := make([]int, len(floors))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(floors[a], floors[b]) })
	return order
}

// bound is LargestLever's branch and bound over strategies given by their
// index in Compare's order, each with its floor: the best is the lowest
// peak under the baseline's, the first in that order of equal ones,
// whatever the order they are offered in.
type bound struct {
	floors []units.Bytes
	peak   units.Bytes // the best peak so far (at first the baseline's)
	at     int         // the best's index (-1: none yet)
}

func newBound(basePeak units.Bytes, floors []units.Bytes) *bound {
	return &bound{floors: floors, peak: basePeak, at: -1}
}

// skip says whether strategy i cannot be the best: its floor is over the
// best peak, or equal to it (the baseline's, or a best one's ahead of i).
func (b *bound) skip(i int) bool { return b.beaten(i, b.floors[i]) }

// beaten says whether strategy i, its peak at least peak, cannot be the
// best: peak is over the best peak, or equal to it (the baseline's, or a
// best one's ahead of i). A plan stops at the first stage so beaten
// (Options.stopAbove): the rest could only raise its peak.
func (b *bound) beaten(i int, peak units.Bytes) bool {
	return peak > b.peak || peak == b.peak && (b.at < 0 || i > b.at)
}

// offer records strategy i's peak and says whether it is now the best.
func (b *bound) offer(i int, peak units.Bytes) bool {
	if peak < b.peak || peak == b.peak && b.at >= 0 && i < b.at {
		b.peak, b.at = peak, i
		return true
	}
	return false
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
// ones lower it once. --checkpoint auto's strategy is left out when it is
// settled as "checkpoint every block" (autoSettled), whose row it would
// repeat after it: under a pipeline it builds every stage from the whole
// model, and diagnose deepseek-v3 --pp 8 --accum 16 spent 103 of its 165 s
// (and most of its 4.4 GB) in it.
func EachStrategy(base *Result, o Options, skip func(Variant) bool, each func(Row)) {
	vs := Variants(base.Spec, Allow{})[1:] // the baseline is base
	auto := newAutoSettled(base, vs)
	eachStrategy(base, vs, o, func(i int) bool { return skip != nil && skip(vs[i]) || auto.asFull(i) }, func(i int, r Row) {
		auto.seen(i, r.Result)
		each(r)
	})
}

// eachStrategy is EachStrategy over the strategies vs, with skip and each
// given their index in vs.
func eachStrategy(base *Result, vs []Variant, o Options, skip func(int) bool, each func(int, Row)) {
	if o.Cache == nil {
		o.Cache = &Cache{}
	}
	o.NoTimeline = true
	_ = eachVariant(base.Spec, vs, o, skip, func(i int, r Row) error {
		if r.Err == nil {
			each(i, r)
			r.Result.Compact()
		}
		return nil
	})
}

// eachVariant plans each of vs on base, one at a time, as o says (compare
// and the lever: through one cache and without timelines, which neither
// reads), and hands each its index in vs and its row: the result, or why
// the variant does not apply or does not plan. skip (nil: none) leaves the
// variant of an index out unplanned, asked when its turn comes. An error
// each returns ends it and is returned. Each
// variant caches, and after it the cache keeps, only the programs the
// variants after it plan from (Cache.putOnlyFor, Cache.keepFor): compare on
// deepseek-v2 held every checkpointed program until evicted, 1.78 GB of
// peak RSS where 1.32 GB do, for the same lookups
// (TestPropertyCompareKeepsBaseProgramsOnly). Under the lever's bound
// (Options.leverBound) a variant's own programs are not kept for those
// after it, which the bound mostly rules out once it is planned: kept,
// they took deepseek-v3 --pp 4 --accum 8 from 2.34 to 3.06 GB of peak RSS.
func eachVariant(base Spec, vs []Variant, o Options, skip func(int) bool, each func(int, Row) error) error {
	specs := make([]Spec, len(vs))
	errs := make([]error, len(vs))
	for i, v := range vs {
		specs[i] = base
		errs[i] = v.apply(&specs[i])
	}
	if o.Cache != nil {
		defer o.Cache.putOnlyFor(nil, o, false)
		defer o.Cache.markLast(specs, o) // no mark outlives the loop
		// What none of them plans from goes before the first: a cache
		// that was not filtered while base was planned (max's probes)
		// held it through the first strategy (max deepseek-v3 --pp 4
		// --accum 8: every stage's programs of eight micro-steps beside
		// the first strategy's, 2.31 GB of RSS).
		o.Cache.keepFor(planned(specs, errs, skip, 0), o)
	}
	for i, v := range vs {
		later := planned(specs, errs, skip, i+1)
		if skip == nil || !skip(i) {
			if o.Cache != nil {
				var next []Spec
				if !o.leverBound {
					next = later
				}
				o.Cache.putOnlyFor(next, o, true)
				o.Cache.markLast(later, o)
			}
			row := Row{Variant: v, Err: errs[i]}
			if row.Err == nil {
				oi := o
				if o.stopAt != nil {
					oi.stopAbove = func(peak units.Bytes, more bool) bool { return o.stopAt(i, peak, more) }
				}
				if o.resumeAt != nil {
					oi.resume = o.resumeAt(i)
				}
				row.Result, row.Err = PlanWith(specs[i], oi)
			}
			if err := o.stopped(); err != nil {
				return err // not a row: the variant was not planned
			}
			if err := each(i, row); err != nil {
				return err
			}
		}
		if o.Cache != nil {
			o.Cache.keepFor(later, o)
		}
	}
	return nil
}

// planned is the specs from the one at index from on whose variant
// applies (its error nil) and that skip (nil: none) does not already leave
// out: a skip stays once it is said (the lever's bound only tightens), so
// the cache keeps nothing for a strategy that will not be planned, and the
// plan before the last that will be may take the program it plans from
// (Cache.markLast): the lever's offload of deepseek-v3's optimizer under
// --checkpoint full copied the steady and first-step programs that only
// activation offload, which the bound leaves out, planned from after it.
func planned(specs []Spec, errs []error, skip func(int) bool, from int) []Spec {
	var ok []Spec
	for i := from; i < len(specs); i++ {
		if errs[i] == nil && (skip == nil || !skip(i)) {
			ok = append(ok, specs[i])
		}
	}
	return ok
}

// CannotLower says the strategy cannot lower base's peak (floor).
func (v Variant) CannotLower(base *Result) bool {
	return v.floor(base) >= base.PeakBytes()
}

// CannotFit says the strategy cannot make base fit its capacity: its peak
// is at least its floor, over the capacity (false without a capacity).
func (v Variant) CannotFit(base *Result) bool {
	return base.Capacity > 0 && v.floor(base) > base.Capacity
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
	// Every pipeline stage keeps those ops too: a stage's step may be
	// higher than the peak stage's (deepseek-v3 --pp 8: the stages of
	// eight layers, 1.69 TiB, over stage 1's 1.67, where activation offload
	// and every-2nd-block checkpointing ended, planned in full).
	for _, st := range base.StagePhasePeaks {
		for _, ph := range phases {
			f = max(f, st[ph])
		}
	}
	return f
}

// autoSettled tells the lever when --checkpoint auto's strategy cannot be
// the best without planning it. Auto decides on the first stage alone
// (autoCheckpoint): it checkpoints nothing when that stage fits the
// capacity without checkpointing (from a baseline without it: auto is the
// baseline again, whose peak no strategy that is picked equals), and every
// block when the stage is over the capacity with every block checkpointed
// (or its optimizer step is): the plan of "checkpoint every block", which
// comes before it in Compare's order, so auto's peak, that one's, cannot
// beat it. Under a pipeline auto builds every stage from the whole model:
// deepseek-v3 --pp 8 --accum 16's lever took 94 s in it, to reach "checkpoint
// every block"'s peak. TestLargestLeverMatchesCompare checks the pick.
type autoSettled struct {
	base       *Result
	full, auto int         // their indices among the strategies given (-1: none)
	fullFirst  units.Bytes // the first stage's peak under "checkpoint every block" (-1: not planned)
}

func newAutoSettled(base *Result, vs []Variant) *autoSettled {
	a := &autoSettled{base: base, full: -1, auto: -1, fullFirst: -1}
	for k, v := range vs {
		s := base.Spec
		if v.apply(&s) != nil || s.Checkpoint.Kind == base.Spec.Checkpoint.Kind {
			continue
		}
		switch s.Checkpoint.Kind {
		case CheckpointFull:
			a.full = k
		case CheckpointAuto:
			a.auto = k
		}
	}
	return a
}

// seen records strategy k's result (its first stage planned first).
func (a *autoSettled) seen(k int, r *Result) {
	if k == a.full && len(r.StagePeaks) > 0 {
		a.fullFirst = r.StagePeaks[0]
	}
}

// beaten says whether strategy k is auto's and settled as the baseline or
// as "checkpoint every block".
func (a *autoSettled) beaten(k int) bool {
	if k != a.auto || len(a.base.StagePeaks) == 0 || a.base.Capacity <= 0 {
		return false
	}
	if a.base.Spec.Checkpoint.Kind == NoCheckpoint && a.base.StagePeaks[0] <= a.base.Capacity {
		return true
	}
	return a.asFull(k)
}

// asFull says whether strategy k is auto's and settled as "checkpoint
// every block", which comes before it: its plan is that one's.
func (a *autoSettled) asFull(k int) bool {
	return k == a.auto && a.base.Capacity > 0 && a.fullFirst > a.base.Capacity
}
