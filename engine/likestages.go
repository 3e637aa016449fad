package engine

import (
	"github.com/memplan/memplan/ir"
	"github.com/memplan/memplan/models/build"
	"github.com/memplan/memplan/strategy"
)

// likeStages says whether pl plans for numbers alone and unpriced
// (Options.NumbersOnly and NoTiming: the lever's strategies, diagnose's
// variations and next step, which read the peak, its stage's ledger, the
// fit and the host memory, never each stage's), naming no stages, a 1F1B
// pipeline whose stages are built from their own layers, whose
// checkpointing does not name modules and whose micro-steps outnumber its
// stages: its middle stages of like layers (likeEarlier) need not all be
// planned, as none peaks over the one it is like (the peak's stage is the
// first of equal ones). With no more micro-steps than stages, an early
// stage runs every forward before its first backward where a later one
// interleaves them: a forward of the later one runs beside gradients the
// earlier one holds only after its forwards (mixtral-8x7b, pp 5, accum 3:
// stage 3 peaked 0.76 GiB over stage 1).
func (pl *planner) likeStages() bool {
	s := pl.s
	return pl.o.forNumbers() && pl.o.NoTiming && pl.o.Stages == nil && s.PP > 2 && s.Accum > s.PP && s.PPSchedule == strategy.OneFOneB && pl.sliced() &&
		s.Checkpoint.Kind != CheckpointModules && s.Checkpoint.Kind != CheckpointAuto
}

// likeEarlier says whether middle stage stage (neither the first nor the
// last) of pl's pipeline (likeStages) is like a middle stage planned
// before it, whose graph pl.graphs keeps: its forward graph is that one's
// but for names (ir.SameButNames: layers of the same kinds), and under
// checkpointing every k-th block its first layer falls at the same place
// in the period. Such a stage runs the same ops with fewer micro-batches
// in flight (stage i of p holds p−i) over no more micro-steps, so it peaks
// no higher on the device or the host, and need not be planned
// (TestPropertyLikeStagesPeakNoHigher; deepseek-v3 --pp 16 --accum 32:
// the lever's checkpointing plans 4 of its 16 stages), or like the first
// layers of one with more (fewerThanEarlier). The graph built to compare
// is kept for the stage's plan when it is not like one.
func (pl *planner) likeEarlier(stage int) (bool, error) {
	s := pl.s
	if stage == 0 || stage == s.PP-1 {
		return false, nil
	}
	g, err := pl.stageGraph(stage)
	if err != nil {
		return false, err
	}
	if pl.likeOf(stage, g, func(int) bool { return true }) >= 0 {
		return true, nil
	}
	if fewer, err := pl.fewerThanEarlier(stage, g); fewer || err != nil {
		return fewer, err
	}
	if pl.graphs == nil {
		pl.graphs = map[int]*ir.Graph{}
	}
	pl.graphs[stage] = g
	return false, nil
}

// stageGraph is the forward graph of stage stage: the one pl.graphs
// keeps, or one built (and not kept).
func (pl *planner) stageGraph(stage int) (*ir.Graph, error) {
	if g := pl.graphs[stage]; g != nil {
		return g, nil
	}
	o, _ := pl.graphOptions(stage)
	g, err := build.Graph(pl.s.Model, o)
	if err != nil {
		return nil, optionError(err)
	}
	return g, nil
}

// likeOf is the first middle stage before stage stage, of those ok says,
// whose forward graph pl.graphs keeps and g (stage's) is but for names, at
// the same place in the checkpointing period (inPeriod); −1 for none.
func (pl *planner) likeOf(stage int, g *ir.Graph, ok func(i int) bool) int {
	for i := 1; i < stage; i++ {
		if pl.graphs[i] != nil && ok(i) && pl.inPeriod(i, stage) && ir.SameButNames(pl.graphs[i], g) {
			return i
		}
	}
	return -1
}

// inPeriod says whether stages i and j start at the same place in the
// period of checkpointing every k-th block (always, under any other
// checkpointing): only then are their blocks checkpointed alike.
func (pl *planner) inPeriod(i, j int) bool {
	s := pl.s
	k := s.Checkpoint.Every
	if s.Checkpoint.Kind != CheckpointEvery || k <= 0 {
		return true
	}
	lo, _ := stageLayers(s, i)
	lo2, _ := stageLayers(s, j)
	return lo%k == lo2%k
}

// fewerThanEarlier says whether middle stage stage of pl's pipeline, of
// graph g, holds fewer layers than a middle stage planned before it and
// is like that one's first layers: its graph is the graph of that stage's
// first layers but for names (built to compare), and under checkpointing
// every k-th block both start at the same place in the period. Such a
// stage runs that one's ops less those of its last layers, with fewer
// micro-batches in flight over no more micro-steps, so it peaks no higher
// on the device or the host (TestPropertyLikeStagesPeakNoHigher draws
// stages of unequal sizes). deepseek-v3's 61 layers over 8 stages are
// stages of 7 and 8 layers: the stages of 7 after one of 8 were planned.
func (pl *planner) fewerThanEarlier(stage int, g *ir.Graph) (bool, error) {
	s := pl.s
	lo, hi := stageLayers(s, stage)
	for i := 1; i < stage; i++ {
		lo2, hi2 := stageLayers(s, i)
		if pl.graphs[i] == nil || hi2-lo2 <= hi-lo || !pl.inPeriod(i, stage) {
			continue
		}
		o, _ := pl.graphOptions(i)
		o.Layers = [2]int{lo2, lo2 + hi - lo}
		first, err := build.Graph(s.Model, o)
		if err != nil {
			return false, optionError(err)
		}
		if ir.SameButNames(first, g) {
			return true, nil
		}
	}
	return false, nil
}

// slopeLike is, for stage stage of pl's 1F1B pipeline (each stage built
// from its own layers, checkpointing that names no modules), the index of
// an earlier middle stage's timing among priced (middle stage → its index)
// whose forward graph the stage's is but for names, with its first layer at
// the same place in the period of checkpointing every k-th block; −1 for
// none, the first stage or the last. Past their warm-ups the two run the
// same forward and backward ops on the same streams for every micro-step
// (planPipelineShortAccum's argument for extrapolating a stage's step from
// its own few), so the stage's step grows per micro-step as that one's, and
// need not be priced with one more micro-step to say by how much
// (TestPropertyStagewiseMatchesFull, TestPipelineShortAccumTiming):
// deepseek-v3 --pp 8 --accum 16 built and priced seven stages with one more
// micro-step, of which four are like stages 1 and 2. The graph built to
// compare is kept for the stage's program.
func (pl *planner) slopeLike(stage int, priced map[int]int) (int, error) {
	s := pl.s
	if stage == 0 || stage == s.PP-1 || !pl.sliced() || s.PPSchedule != strategy.OneFOneB || max(s.PPInterleave, 1) > 1 ||
		s.Checkpoint.Kind == CheckpointModules || s.Checkpoint.Kind == CheckpointAuto {
		return -1, nil
	}
	g, err := pl.stageGraph(stage)
	if err != nil {
		return -1, err
	}
	if pl.graphs == nil {
		pl.graphs = map[int]*ir.Graph{}
	}
	pl.graphs[stage] = g
	i := pl.likeOf(stage, g, func(i int) bool { _, ok := priced[i]; return ok })
	if i < 0 {
		return -1, nil
	}
	return priced[i], nil
}
