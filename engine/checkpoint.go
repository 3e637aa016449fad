package engine

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/memplan/memplan/ir"
	"github.com/memplan/memplan/search/ckpt"
	"github.com/memplan/memplan/sim"
	"github.com/memplan/memplan/strategy"
	"github.com/memplan/memplan/units"
)

// CheckpointKind is the kind of activation checkpointing.
type CheckpointKind uint8

const (
	// NoCheckpoint keeps every activation (the zero value).
	NoCheckpoint CheckpointKind = iota
	// CheckpointFull checkpoints every repeated block.
	CheckpointFull
	// CheckpointEvery checkpoints blocks 0, k, 2k, ... (CheckpointPolicy.Every).
	CheckpointEvery
	// CheckpointModules checkpoints the modules matching
	// CheckpointPolicy.Modules.
	CheckpointModules
	// CheckpointSelective recomputes the attention core (Korthikanti et al.).
	CheckpointSelective
	// CheckpointSelectiveOp is torchtitan's op-level selective
	// checkpointing (torchtitanSAC).
	CheckpointSelectiveOp
	// CheckpointAuto checkpoints the blocks the chain DP picks to fit.
	CheckpointAuto
)

var checkpointKinds = [...]string{NoCheckpoint: "none", CheckpointFull: "full", CheckpointEvery: "every",
	CheckpointModules: "modules", CheckpointSelective: "selective", CheckpointSelectiveOp: "selective-op", CheckpointAuto: "auto"}

func (k CheckpointKind) String() string {
	if int(k) < len(checkpointKinds) {
		return checkpointKinds[k]
	}
	return fmt.Sprintf("checkpoint(%d)", uint8(k))
}

// CheckpointPolicy is what --checkpoint asks for. It is comparable (a
// Spec's keys carry it whole).
type CheckpointPolicy struct {
	Kind CheckpointKind
	// Every is k for CheckpointEvery: checkpoint blocks 0, k, 2k, ...
	Every int
	// Modules are the comma-separated module globs of CheckpointModules.
	Modules string
}

// Patterns are the module globs of a CheckpointModules policy.
func (c CheckpointPolicy) Patterns() []string {
	if c.Modules == "" {
		return nil
	}
	return strings.Split(c.Modules, ",")
}

// ParseCheckpoint reads none, full, every=K, modules=GLOB[,GLOB...],
// selective, selective-op and auto.
func ParseCheckpoint(s string) (CheckpointPolicy, error) {
	s = strings.TrimSpace(s)
	switch {
	case s == "" || s == "none":
		return CheckpointPolicy{}, nil
	case s == "full":
		return CheckpointPolicy{Kind: CheckpointFull}, nil
	case s == "selective":
		return CheckpointPolicy{Kind: CheckpointSelective}, nil
	case s == "selective-op":
		return CheckpointPolicy{Kind: CheckpointSelectiveOp}, nil
	case s == "auto":
		return CheckpointPolicy{Kind: CheckpointAuto}, nil
	case strings.HasPrefix(s, "every="):
		k, err := strconv.Atoi(strings.TrimPrefix(s, "every="))
		if err != nil || k < 1 {
			return CheckpointPolicy{}, fieldErr(FieldCheckpoint, "{checkpoint} every=K needs a positive integer K, got %q", strings.TrimPrefix(s, "every="))
		}
		return CheckpointPolicy{Kind: CheckpointEvery, Every: k}, nil
	case strings.HasPrefix(s, "modules="):
		var pats []string
		for _, p := range strings.Split(strings.TrimPrefix(s, "modules="), ",") {
			if p = strings.TrimSpace(p); p != "" {
				pats = append(pats, p)
			}
		}
		if len(pats) == 0 {
			return CheckpointPolicy{}, fieldErr(FieldCheckpoint, "{checkpoint} modules= needs at least one module glob, e.g. modules=model.layers.*")
		}
		return CheckpointModulesOf(pats...), nil
	}
	return CheckpointPolicy{}, fieldErr(FieldCheckpoint, "{checkpoint} %q: want none, full, every=K, modules=GLOB, selective, selective-op or auto", s)
}

// CheckpointModulesOf checkpoints the modules matching globs (none may
// contain a comma).
func CheckpointModulesOf(globs ...string) CheckpointPolicy {
	return CheckpointPolicy{Kind: CheckpointModules, Modules: strings.Join(globs, ",")}
}

func (c CheckpointPolicy) String() string {
	switch c.Kind {
	case CheckpointEvery:
		return "every=" + strconv.Itoa(c.Every)
	case CheckpointModules:
		return "modules=" + c.Modules
	}
	return c.Kind.String()
}

// Blocks lists the repeated blocks of p (module paths with a layer index,
// e.g. "model.layers.3"), in execution order.
func Blocks(p *ir.Program) []string {
	seen := map[string]bool{}
	var out []string
	for i := range p.Ops {
		op := &p.Ops[i]
		if op.Phase != ir.Forward || op.Micro != 0 {
			continue
		}
		b := ir.BlockOf(op.Module)
		if b == op.Module && !strings.ContainsAny(lastPart(b), "0123456789") {
			continue
		}
		if !seen[b] {
			seen[b] = true
			out = append(out, b)
		}
	}
	return out
}

func lastPart(p string) string {
	if i := strings.LastIndexByte(p, '.'); i >= 0 {
		return p[i+1:]
	}
	return p
}

// checkpointTransform turns a policy into the transform for program p; nil
// when the policy checkpoints nothing.
// The program's first block is block first of the model (a pipeline stage's
// slice), which "every" counts from.
func checkpointTransform(c CheckpointPolicy, p *ir.Program, blocksChosen []string, first int) (*strategy.Checkpoint, error) {
	switch c.Kind {
	case NoCheckpoint:
		return nil, nil
	case CheckpointModules:
		return &strategy.Checkpoint{Patterns: c.Patterns()}, nil
	case CheckpointSelective:
		return &strategy.Checkpoint{Patterns: []string{"*.core_attention"}}, nil
	case CheckpointAuto:
		if len(blocksChosen) == 0 {
			return nil, nil
		}
		return &strategy.Checkpoint{Patterns: blocksChosen}, nil
	}
	blocks := Blocks(p)
	if len(blocks) == 0 {
		return nil, fmt.Errorf("the model has no repeated blocks to checkpoint")
	}
	var pats []string
	for i, b := range blocks {
		if c.Kind == CheckpointFull || c.Kind == CheckpointSelectiveOp || (first+i)%c.Every == 0 {
			pats = append(pats, b)
		}
	}
	if len(pats) == 0 {
		return nil, nil // a stage's slice between two checkpointed blocks
	}
	sort.Strings(pats)
	if c.Kind == CheckpointSelectiveOp {
		return &strategy.Checkpoint{Patterns: pats, Save: &torchtitanSAC}, nil
	}
	return &strategy.Checkpoint{Patterns: pats}, nil
}

// torchtitanSAC is torchtitan's op-level selective activation
// checkpointing of every transformer block (selective_ac_option="op",
// pytorch/torchtitan torchtitan/models/llama/parallelize_llama.py
// _save_list @2024-10): the outputs of SDPA (flash and efficient) and of
// every other aten.mm are kept; the rest of the block is recomputed.
var torchtitanSAC = strategy.SavePolicy{Kinds: []string{"sdpa_flash"}, Alternate: "linear"}

// blockCosts measures the chain the DP plans over from program p: for each
// block, the activations its backward reads (its input included), the
// inputs a checkpoint would keep, and its forward FLOPs.
func blockCosts(p *ir.Program, blocks []string) []ckpt.Block {
	idx := map[string]int{}
	for i, b := range blocks {
		idx[b] = i
	}
	out := make([]ckpt.Block, len(blocks))
	for i, b := range blocks {
		out[i].Name = b
	}
	owner := func(t ir.TensorID) ir.TensorID { return ir.Storage(p.Tensors, t) }
	// A saved storage is held until the lowest block whose backward reads it.
	holder := map[ir.TensorID]int{}
	produced := map[ir.TensorID]int{} // storage → block whose forward wrote it (-1 outside)
	for i := range p.Ops {
		op := &p.Ops[i]
		if op.Micro != 0 {
			continue
		}
		bi, inBlock := idx[ir.BlockOf(op.Module)]
		switch {
		case op.Phase == ir.Forward && !op.Recompute:
			for _, t := range op.Out {
				if _, seen := produced[owner(t)]; !seen {
					produced[owner(t)] = -1
					if inBlock {
						produced[owner(t)] = bi
					}
				}
			}
			if inBlock {
				out[bi].Forward += op.FLOPs
			}
		case op.Phase == ir.Backward && inBlock:
			for _, t := range op.In {
				o := owner(t)
				if p.Tensors[o].Cat != ir.Activation || p.Tensors[o].Resident {
					continue
				}
				if h, ok := holder[o]; !ok || bi < h {
					holder[o] = bi
				}
			}
		}
	}
	for o, h := range holder {
		out[h].Saved += int64(p.Tensors[o].Bytes)
		if pb, ok := produced[o]; ok && pb != h {
			out[h].Input += int64(p.Tensors[o].Bytes)
		}
	}
	for i := range out {
		if out[i].Input > out[i].Saved {
			out[i].Input = out[i].Saved
		}
	}
	return out
}

// ErrNoCapacity is returned by --checkpoint auto without a GPU or budget.
var ErrNoCapacity error = fieldErr(FieldCheckpoint, "{checkpoint} auto needs a {gpu} or a {budget} to plan against")

// peaksOnly simulates for the peaks alone: auto's choice reads no
// timeline (one point per op: 133 MB for a deepseek-v3 candidate).
var peaksOnly = sim.Options{NoTimeline: true}

// autoChoice is what --checkpoint auto chose: the blocks to checkpoint and
// whether no choice fits (then every block, the lowest peak auto reaches).
type autoChoice struct {
	blocks   []string
	noneFits bool
}

// autoCheckpoint chooses the blocks to checkpoint with the exact chain DP
// (search/ckpt) so that the simulated peak fits the capacity with the least
// recompute. The DP works on measured block costs; the simulator is the
// judge: the chain budget is tightened by any excess until the simulated
// program fits. When no choice fits, it chooses every block: a job too big
// for the GPU is an answer that does not fit (plan reports it, max bisects
// over it), not bad input.
//
// It also returns the program build made for the choice when that was the
// last one it built (nil otherwise), for the caller to plan rather than
// build it again.
func autoCheckpoint(s *Spec, base *ir.Program, build func([]string) (*ir.Program, error)) (autoChoice, *ir.Program, error) {
	return autoCheckpointFrom(s, base, build, autoOrder(s, base))
}

// autoOrder is autoCheckpoint's order, stepFirst (tests try both).
var autoOrder = stepFirst

// autoReuse says whether a plan takes the program autoCheckpoint built for
// its choice (tests compare with one built again).
var autoReuse = true

// stepFirst says whether autoCheckpoint looks at the optimizer step with
// every block checkpointed before the program without checkpointing: when
// the resident state the program starts with is over the capacity before
// any sharding or offload. Either order gives the same choice (checkpointing
// changes no op of the step: TestPropertyFwdBwdVariantsKeepOptimizerPeak);
// the order only decides which is built once. A job whose step alone is
// over the GPU ends on the first program, the every-block one it plans
// (deepseek-v3 --accum 4 built its 1.4 million ops without checkpointing,
// which autocast's cache copied, before it built every block once more for
// the plan); one that fits without checkpointing ends on the
// program without it. Not when the step runs inside backward, where the
// property does not hold.
func stepFirst(s *Spec, base *ir.Program) bool {
	if s.Sem.OptimizerInBackward {
		return false
	}
	var resident units.Bytes
	for i := range base.Tensors {
		t := &base.Tensors[i]
		if t.Base == ir.NoTensor && t.Resident && !t.Host {
			resident += t.Bytes
		}
	}
	return resident > s.CapacityBytes()
}

// autoRun is one autoCheckpoint's programs: it builds and simulates
// them, and keeps the last it built (last, for blocks lastNames) while no
// other is being built: held past a build, it would double the heap.
type autoRun struct {
	build     func([]string) (*ir.Program, error)
	capacity  units.Bytes
	last      *ir.Program
	lastNames []string
}

// run builds the program checkpointing names and simulates it for its peaks.
func (a *autoRun) run(names []string) (*sim.Result, error) {
	a.last = nil
	p, err := a.build(names)
	if err != nil {
		return nil, err
	}
	r, err := sim.RunWith(p, peaksOnly)
	if err != nil {
		return nil, err
	}
	a.last, a.lastNames = p, names
	return r, nil
}

// peaks is the simulated peak of the program checkpointing names and the
// peak of its forward and backward (the part the chain can change; the
// optimizer step's is fixed).
func (a *autoRun) peaks(names []string) (all, fb units.Bytes, err error) {
	r, err := a.run(names)
	if err != nil {
		return 0, 0, err
	}
	return r.Peak.Total, fwdBwdPeak(r), nil
}

// fwdBwdPeak is the peak of r's forward and backward.
func fwdBwdPeak(r *sim.Result) units.Bytes {
	return max(r.PhasePeak[ir.Forward].Total, r.PhasePeak[ir.Backward].Total)
}

// stepOver says whether r's optimizer step is over the capacity.
// Checkpointing changes no op of the step
// (TestPropertyFwdBwdVariantsKeepOptimizerPeak): it stays over whatever
// blocks are chosen, so every block is chosen.
func (a *autoRun) stepOver(r *sim.Result) bool {
	st := r.PhasePeak[ir.Optimizer]
	return st.Op >= 0 && st.Total > a.capacity
}

// chosen is choice c with its program when it was the last built.
func (a *autoRun) chosen(c autoChoice) (autoChoice, *ir.Program, error) {
	if a.last != nil && slices.Equal(a.lastNames, c.blocks) {
		return c, a.last, nil
	}
	return c, nil, nil
}

// autoCheckpointFrom is autoCheckpoint looking at the step with every
// block checkpointed first when step says so.
func autoCheckpointFrom(s *Spec, base *ir.Program, build func([]string) (*ir.Program, error), step bool) (autoChoice, *ir.Program, error) {
	capacity := s.CapacityBytes()
	if capacity <= 0 {
		return autoChoice{}, nil, ErrNoCapacity
	}
	blocks := Blocks(base)
	if len(blocks) == 0 {
		return autoChoice{}, nil, fmt.Errorf("the model has no repeated blocks to checkpoint")
	}
	none := autoChoice{blocks: blocks, noneFits: true}
	a := &autoRun{build: build, capacity: capacity}
	var allPeak, allFB units.Bytes
	var allErr error
	if step {
		// An error here is returned where the every-block plan is
		// needed: not when the job fits without checkpointing.
		var r *sim.Result
		if r, allErr = a.run(blocks); allErr == nil {
			if a.stepOver(r) {
				return a.chosen(none)
			}
			allPeak, allFB = r.Peak.Total, fwdBwdPeak(r)
		}
	}
	if r, err := a.run(nil); err == nil {
		if r.Peak.Total <= capacity {
			return a.chosen(autoChoice{}) // fits without checkpointing
		}
		if a.stepOver(r) {
			return a.chosen(none)
		}
	}
	costs := blockCosts(base, blocks) // for the DP: not before the early answers above need it
	if !step {
		allPeak, allFB, allErr = a.peaks(blocks)
	}
	if allErr != nil {
		return autoChoice{}, nil, allErr
	}
	if allPeak > capacity {
		return a.chosen(none)
	}
	best, err := a.tighten(blocks, costs, allFB)
	if err != nil {
		return autoChoice{}, nil, err
	}
	return a.chosen(autoChoice{blocks: best})
}

// tighten runs the chain DP over blocks (costs) until the simulated
// program fits, from the chain budget the capacity leaves beside what is
// outside the chain at the forward/backward peak with every block
// checkpointed (allFB), and returns the fitting choice of least recompute
// (every block when none fits).
func (a *autoRun) tighten(blocks []string, costs []ckpt.Block, allFB units.Bytes) ([]string, error) {
	capacity := a.capacity
	outside := int64(allFB) - ckpt.MinPeak(costs)
	chain := int64(capacity) - outside
	best, bestRe := blocks, math.Inf(1)
	var over []string // the last choice over the capacity
	stall := 0        // iterations the DP returned the same policy while over
	for iter := 0; iter < 10 && chain > 0; iter++ {
		pol, err := ckpt.Optimal(costs, chain)
		if err != nil {
			break
		}
		_, re := ckpt.Evaluate(costs, pol)
		var names []string
		for i, c := range pol {
			if c {
				names = append(names, blocks[i])
			}
		}
		peak, fb, err := a.peaks(names)
		if err != nil {
			return nil, err
		}
		if peak > capacity {
			// The model under-counted: tighten. The DP works in whole
			// slots, so an excess smaller than a slot can leave its choice
			// unchanged; tighten twice as hard each time it does.
			if slices.Equal(names, over) {
				stall++
			} else {
				stall = 0
			}
			over = names
			chain -= int64(peak-capacity) << stall
			continue
		}
		if re < bestRe {
			best, bestRe = names, re
		}
		slack := int64(capacity - max(fb, 0))
		if capacity > peak && fb < capacity && slack > 0 && iter < 9 {
			chain += slack // room left: let the DP keep more blocks
			continue
		}
		break
	}
	return best, nil
}
