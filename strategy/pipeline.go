package strategy

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"

	"github.com/memplan/memplan/ir"
	"github.com/memplan/memplan/units"
)

// Pipeline is pipeline parallelism (Megatron-LM's, Narayanan et al. SC'21)
// seen from one rank: Apply turns the program of the whole model into the
// program that rank Stage of Stages runs.
//
// Stage extraction. The transformer blocks (ir.BlockOf of the forward ops'
// modules, in order of first execution: "model.layers.0", ...) are split
// into Stages×Interleave contiguous model chunks; chunk c gets blocks
// [c·L/C, (c+1)·L/C) (integer division, so sizes differ by at most one and
// the larger chunks come later). Ops outside any block go with the block
// before them, or with the first chunk when they come before every block:
// embeddings are on the first stage, the final norm, head and loss on the
// last, as Megatron places them. Rank s holds chunks s, s+Stages, ...
// (Megatron's virtual stages); without Interleave, chunk s.
//
// The rank keeps the forward, backward and recompute ops of its chunks,
// the optimizer-step ops of its parameters (multi-tensor foreach ops are
// cut to its tensors, and their temporaries and workspaces scaled by the
// share of bytes it keeps), and the parameters, gradients, optimizer state
// and buffers those ops touch; everything else disappears from the program
// and from Program.Params. Optimizer state is matched to its parameter by
// name (plan names it "<param>.<state>"). Ops that read nothing computed
// (batch loading, mask construction) run on every rank that reads what they
// write, keeping only those outputs: the first rank loads the token ids,
// the last the labels. Only the last stage has the loss and the backward
// seed; the others start their backward from the received output gradient.
//
// Boundaries become point-to-point ops (Comm SendRecv over group "pp",
// 2 ranks, Node -1): a tensor a chunk reads but another rank computes
// arrives by "pp.recv_forward" (in the forward) or "pp.recv_backward" (in
// the backward), an op that writes it fresh at the start of the reading
// micro-step's chunk; a tensor it computes that another rank reads leaves by
// "pp.send_forward" / "pp.send_backward", an op that reads it at the end of
// the chunk's micro-step, after which it is freed (Megatron's
// deallocate_output_tensor). These ops have no Module, so module patterns
// (checkpointing) never take a receive for part of a block. A received input that the backward reads stays
// as an activation until then. Parameters used on several ranks (tied input
// and output embeddings) are duplicated there, as in Megatron, and their
// gradients all-reduced over those ranks by a "pp.tied_grad_all_reduce" op
// before the optimizer step; per-stage parameters then add up to more than
// the model by the tied matrix.
//
// Schedule. The input lays micro-steps out as F0 B0 F1 B1 ...; Apply
// reorders them as Megatron's schedules do for this rank:
//
//   - "1f1b" (default, forward_backward_pipelining_without_interleaving):
//     min(Stages−Stage−1, m) warm-up forwards, then one forward and one
//     backward alternately, then the remaining backwards. The first stage
//     holds Stages micro-batches in flight, the last one.
//   - "gpipe": all forwards, then all backwards (m in flight everywhere).
//   - "1f1b" with Interleave v > 1 (forward_backward_pipelining_with_
//     interleaving): virtual micro-batch k runs chunk (k mod pv)/p of
//     micro-batch ⌊k/pv⌋·p + k mod p (backward: chunks in reverse); warm-up
//     (p−s−1)·2 + (v−1)·p virtual micro-batches (capped at m·v); m must be
//     a multiple of p, as Megatron requires.
//
// m < Stages is allowed; it just leaves a larger bubble (the cost model
// prices it, the memory does not change). Backwards run in micro-step order
// in every schedule, so micro-step 0's backward still creates each
// gradient; where a gradient's first toucher on this rank is an
// accumulating op (the input embedding of a tied matrix whose gradient the
// head created in the whole program), that op creates it instead.
//
// A program replayed from a PyTorch trace (no op has an autograd node)
// is placed by module path and position instead of by node, its
// optimizer state matched to parameters by the optimizer's op order
// rather than by name, and its recorded gradient pairing (GradOf) kept for
// the rank: pipeline_trace.go.
//
// Apply Pipeline before transforms that shard or offload model state
// (ZeRO, offload), which then see only this rank's state; checkpointing
// may come before or after.
type Pipeline struct {
	Stages int
	Stage  int
	// Schedule is 1F1B (the zero value) or GPipe.
	Schedule Schedule
	// Interleave is the number of model chunks (virtual stages) per rank;
	// 0 or 1 is the plain schedule.
	Interleave int
	// Layout, when set, is the number of blocks in each of the
	// Stages×Interleave chunks, in order, instead of the even split; chunks
	// may be empty. Ops after the last block always go to the last chunk
	// and ops before the first to the first. With a layout that gives
	// every block to this rank's chunk, a program holding only that
	// stage's blocks (build.Options.Layers) becomes the same stage program
	// as the whole model's would, at a fraction of the work.
	Layout []int
}

var _ Transform = (*Pipeline)(nil)

// Name implements Transform.
func (pp *Pipeline) Name() string { return "pipeline" }

// Op chunk markers besides chunk indices.
const (
	chunkSource = -2 // reads nothing computed: replicated where its outputs are read
	chunkOptim  = -3 // optimizer step: filtered to the rank's tensors
	chunkNone   = -4 // unassigned (should not happen)
)

// ppUnit is one chunk's forward or backward of one micro-step.
type ppUnit struct {
	phase ir.Phase
	micro int
	chunk int
}

// Apply implements Transform.
func (pp *Pipeline) Apply(p *ir.Program) (*ir.Program, error) { return pp.apply(p, false) }

// apply may rewrite p when it owns it: after the copy, p is read only where
// nothing has been written yet (the analysis and the parameter lists).
//
// It is a driver over a pipeliner's phases, in order: check (the layout
// and the program), blocks and chunks (which chunk each block goes to),
// placeOps (the chunk of every op), keepOps and placeSources (the rank's
// ops, what crosses ranks, and the source ops it replicates), retag
// (categories of what crosses), emit (the units in schedule order
// with their receives and sends), tiedGrads, cutOptimizer, and finish
// (gradient creation, compaction).
func (pp *Pipeline) apply(p *ir.Program, own bool) (*ir.Program, error) {
	pl := &pipeliner{pp: pp, p: p}
	if err := pl.check(); err != nil {
		return nil, err
	}
	// The blocks and the analysis only read p: on a large program the
	// analysis runs beside (on a deepseek-v3 stage the two were a quarter
	// of the transform); on fit's shallow ones, whose workers keep both
	// cores busy, a goroutine each cost more than it saved (mixtral-8x7b's
	// search: 80-92 s → 88-99 s).
	analyse := func() { pl.a = newPPAnalysis(p, isTrace(p)) }
	var beside sync.WaitGroup
	if len(p.Ops) >= ir.ConcurrentOps {
		beside.Go(analyse)
		analyse = func() {}
	}
	pl.findBlocks()
	err := pl.chunks()
	var nodeChunk []int32
	if err == nil {
		nodeChunk = pl.nodeChunks()
	}
	analyse()
	beside.Wait()
	if err != nil {
		return nil, err
	}
	if pl.a.trace {
		pl.a.assocByDataflow(p.Params)
	}
	if err := pl.placeOps(nodeChunk); err != nil {
		return nil, err
	}
	pl.keepOps(own)
	pl.placeSources()
	pl.retag()
	if err := pl.emit(); err != nil {
		return nil, err
	}
	pl.tiedGrads()
	pl.cutOptimizer()
	if pl.a.trace {
		pl.bornAtStart()
	}
	// Resident storages no op touches: the first stage holds them; and
	// what the rank's ops touch, which ppFixGradCreation marks as it goes.
	keep := make([]bool, len(pl.q.Tensors))
	if pp.Stage == 0 {
		copy(keep, pl.a.untouched)
	}
	operands := ppFixGradCreation(pl.q, pl.out, keep)
	return ppCompact(pl.q, pl.out, keep, operands, p.GradOf), nil
}

// ppXfer is a tensor crossing ranks: received before, or sent after, a unit.
type ppXfer struct {
	t    ir.TensorID
	unit ppUnit
	at   int // original op index, for a stable order
}

// pipeliner is one Pipeline.apply.
type pipeliner struct {
	pp      *Pipeline
	p       *ir.Program // the input
	m, v    int         // micro-batches, chunks per rank
	nChunks int

	blocks       []string       // in order of first forward execution
	blockIdx     map[string]int // block → index in blocks
	opBlock      []int32        // each op's index in blocks, or -1 (findBlocks)
	chunkOfBlock []int

	a       *ppAnalysis
	opChunk []int // chunk of each op, or chunkSource, chunkOptim

	// traceFwd and traceModule place a trace's ops (pipeline_trace.go).
	traceFwd    []int
	traceModule map[string]int

	// q's tensors are written (categories, sizes); q.Ops is p's and is
	// never written (a source op's trimmed outputs go to srcOut).
	q      *ir.Program
	srcOut map[int][]ir.TensorID
	unitOf []ppUnit // original op index → unit, where isKept
	isKept []bool
	nKept  int
	used   []bool // tensors the rank's ops touch (with their bases)
	// minReader: the earliest chunk reading each tensor of a source op's
	// storage, or a view of it (keepOps).
	minReader []int32
	// paramRanks: the ranks reading each parameter (keepOps).
	paramRanks paramRanks
	keptIdx    []int // kept ops, in order

	recvs, sends []ppXfer
	isParam      tensorSet
	out          []ir.Op
}

// mine reports whether chunk c is on this rank.
func (pl *pipeliner) mine(c int) bool { return c >= 0 && c%pl.pp.Stages == pl.pp.Stage }

// markUsed marks t and its bases as touched by the rank.
func (pl *pipeliner) markUsed(t ir.TensorID) {
	for t != ir.NoTensor && !pl.used[t] {
		pl.used[t] = true
		t = pl.q.Tensors[t].Base
	}
}

// check validates the pipeline's settings against the program.
func (pl *pipeliner) check() error {
	pp, p := pl.pp, pl.p
	sched := pp.Schedule
	if sched != OneFOneB && sched != GPipe {
		return fmt.Errorf("unknown pipeline schedule %s (want 1f1b or gpipe)", pp.Schedule)
	}
	pl.v = pp.Interleave
	if pl.v == 0 {
		pl.v = 1
	}
	if pl.v < 0 {
		return fmt.Errorf("pipeline interleave must be positive, got %d", pp.Interleave)
	}
	if pp.Stages < 2 {
		return fmt.Errorf("pipeline needs at least 2 stages, got %d", pp.Stages)
	}
	if pp.Stage < 0 || pp.Stage >= pp.Stages {
		return fmt.Errorf("pipeline stage %d out of range [0, %d)", pp.Stage, pp.Stages)
	}
	if p.SummedGrads {
		return fmt.Errorf("pipeline needs a tied parameter's copies apart, one per stage (lower.TrainConfig.SeparateCopies); this program sums their gradients on one GPU")
	}
	pl.m = max(p.MicroBatches, 1)
	if pl.v > 1 && sched != OneFOneB {
		return fmt.Errorf("pipeline interleaving needs the 1f1b schedule, not %s", sched)
	}
	if pl.v > 1 && pl.m%pp.Stages != 0 {
		return fmt.Errorf("interleaved pipeline needs micro-batches (%d) to be a multiple of stages (%d)", pl.m, pp.Stages)
	}
	for i := range p.Ops {
		if p.Ops[i].Phase == ir.Backward {
			pl.nChunks = pp.Stages * pl.v
			return nil
		}
	}
	return fmt.Errorf("pipeline needs a training program (this one has no backward)")
}

// findBlocks lists the blocks in order of first forward execution, and
// gives every op its block's index (opBlock): -1 outside a block, or in one
// no forward op runs in. Consecutive ops mostly share their module (the
// same string), so a module is parsed and looked up once per run of ops,
// not once per op and per use (a stage of deepseek-v2 has 590k ops).
func (pl *pipeliner) findBlocks() {
	ops := pl.p.Ops
	pl.blockIdx = map[string]int{}
	pl.opBlock = make([]int32, len(ops))
	// One pass: an op's block is registered by then whenever the block's
	// first forward op comes before every other op of it (a lowered
	// program's forward comes first); an op of a block not registered yet
	// leaves the second pass to do (a trace's, or a block no forward op
	// runs in, which stays -1).
	var blk blockOfModule
	last, lastIdx, lastB, lastOK := "", int32(-1), "", false
	pending := false
	for i := range ops {
		op := &ops[i]
		if m := op.Module; i == 0 || m != last {
			last = m
			// Another module of the same block keeps its index (an
			// expert's projections, one after another).
			if b, ok := blk.of(m); i == 0 || b != lastB || ok != lastOK {
				lastB, lastOK = b, ok
				lastIdx = -1
				if bi, ok := pl.blockIdx[lastB]; ok && lastOK {
					lastIdx = int32(bi)
				}
			}
		}
		if lastOK && lastIdx < 0 && op.Phase == ir.Forward && !op.Recompute {
			lastIdx = int32(len(pl.blocks))
			pl.blockIdx[lastB] = len(pl.blocks)
			pl.blocks = append(pl.blocks, lastB)
		}
		pl.opBlock[i] = lastIdx
		pending = pending || (lastOK && lastIdx < 0)
	}
	if !pending {
		return
	}
	last, lastIdx = "", -1
	for i := range ops {
		if m := ops[i].Module; i == 0 || m != last {
			last, lastIdx = m, -1
			if b, ok := blk.of(m); ok {
				if bi, ok := pl.blockIdx[b]; ok {
					lastIdx = int32(bi)
				}
			}
		}
		pl.opBlock[i] = lastIdx
	}
}

// blockOfModule is ppBlock of the module last asked for, kept, and of
// every module under the same indexed block: ppBlock reads only
// ir.BlockOf's prefix, which ends at the path's first index, so
// "model.layers.3.mlp.experts.17.up_proj" has the block of
// "model.layers.3.mlp.experts.17.gate_proj" without parsing it (a
// deepseek-v3 stage changes module every few ops: 0.4 s of a pipelined
// diagnose parsed them).
type blockOfModule struct {
	module, block string
	ok, valid     bool
	prefix        string // ir.BlockOf(module), when it ends at an index ("" if not)
}

func (c *blockOfModule) of(module string) (string, bool) {
	if c.valid && module == c.module {
		return c.block, c.ok
	}
	if p := c.prefix; c.valid && p != "" && len(module) > len(p) && module[len(p)] == '.' && module[:len(p)] == p {
		c.module = module
		return c.block, c.ok
	}
	b := ir.BlockOf(module)
	c.module, c.valid = module, true
	c.block, c.ok = ppBlockOf(b)
	c.prefix = ""
	if endsInIndex(b) {
		c.prefix = b
	}
	return c.block, c.ok
}

// chunks gives each block its chunk: by Layout, or the even split.
//
// Bounded: c·blocks < chunks·blocks ≤ blocks² (more chunks than blocks
// are refused below), blocks ≤ 2^15 for a model (engine.MaxBlocks), ≤ the ops of
// a trace.
func (pl *pipeliner) chunks() error {
	pp, blocks, nChunks, v := pl.pp, pl.blocks, pl.nChunks, pl.v
	pl.chunkOfBlock = make([]int, len(blocks))
	if pp.Layout == nil {
		if len(blocks) < nChunks {
			if v > 1 {
				return fmt.Errorf("%d pipeline stages × %d chunks exceed the model's %d blocks", pp.Stages, v, len(blocks))
			}
			return fmt.Errorf("%d pipeline stages exceed the model's %d blocks", pp.Stages, len(blocks))
		}
		for c := 0; c < nChunks; c++ {
			for b := c * len(blocks) / nChunks; b < (c+1)*len(blocks)/nChunks; b++ {
				pl.chunkOfBlock[b] = c
			}
		}
		return nil
	}
	if len(pp.Layout) != nChunks {
		return fmt.Errorf("pipeline layout has %d chunks, want %d stages × %d", len(pp.Layout), pp.Stages, v)
	}
	b := 0
	for c, n := range pp.Layout {
		if n < 0 || b+n > len(blocks) {
			return fmt.Errorf("pipeline layout %v does not split the program's %d blocks", pp.Layout, len(blocks))
		}
		for ; n > 0; n-- {
			pl.chunkOfBlock[b] = c
			b++
		}
	}
	if b != len(blocks) {
		return fmt.Errorf("pipeline layout %v does not split the program's %d blocks", pp.Layout, len(blocks))
	}
	return nil
}

// nodeChunks is the chunk of each forward node (indexed by node, -1 for a
// node no forward op computes): its block's, or the preceding block's. Ops
// after the last block's in their micro-step go to the last chunk. Every
// forward op in a block has its block in opBlock (findBlocks lists them).
func (pl *pipeliner) nodeChunks() []int32 {
	p := pl.p
	// lastBlockOp[micro]: the last forward op of a block in the micro-step
	// (-1: none), for micro-steps in [0, MicroBatches), where it was a map
	// written once per forward op; a map only for any other micro-step.
	lastBlockOp := make([]int, max(p.MicroBatches, 1))
	for i := range lastBlockOp {
		lastBlockOp[i] = -1
	}
	other := map[int]int{}
	lastOf := func(micro int) (int, bool) {
		if micro >= 0 && micro < len(lastBlockOp) {
			return lastBlockOp[micro], lastBlockOp[micro] >= 0
		}
		i, ok := other[micro]
		return i, ok
	}
	maxNode := int32(-1)
	for i := range p.Ops {
		op := &p.Ops[i]
		maxNode = max(maxNode, op.Node)
		if op.Phase == ir.Forward && !op.Recompute && pl.opBlock[i] >= 0 {
			if op.Micro >= 0 && op.Micro < len(lastBlockOp) {
				lastBlockOp[op.Micro] = i
			} else {
				other[op.Micro] = i
			}
		}
	}
	nodeChunk := make([]int32, maxNode+1)
	for i := range nodeChunk {
		nodeChunk[i] = -1
	}
	cur := 0
	for i := range p.Ops {
		op := &p.Ops[i]
		if op.Phase != ir.Forward || op.Recompute {
			continue
		}
		if bi := pl.opBlock[i]; bi >= 0 {
			cur = pl.chunkOfBlock[bi]
		} else if last, ok := lastOf(op.Micro); ok && i > last {
			cur = pl.nChunks - 1
		}
		if op.Node >= 0 && nodeChunk[op.Node] < 0 {
			nodeChunk[op.Node] = int32(cur)
		}
	}
	return nodeChunk
}

// placeOps gives every op its chunk: the optimizer step and source ops are
// marked; other ops take their node's chunk (nodeChunk, nodeChunks), their
// block's, or that of the op that wrote what they read (loss.backward reads
// the loss).
func (pl *pipeliner) placeOps(nodeChunk []int32) error {
	p, a := pl.p, pl.a
	if pl.a.trace {
		pl.traceFwd, pl.traceModule = pl.traceChunks()
	}
	opChunk := make([]int, len(p.Ops))
	pl.opChunk = opChunk
	// The ops of the rank's chunks are kept, in their units.
	pl.unitOf = make([]ppUnit, len(p.Ops))
	pl.isKept = make([]bool, len(p.Ops))
	for i := range p.Ops {
		op := &p.Ops[i]
		switch {
		case op.Phase == ir.Optimizer:
			opChunk[i] = chunkOptim
		case a.isSource(op):
			opChunk[i] = chunkSource
		default:
			opChunk[i] = pl.chunkOf(i, nodeChunk)
			if opChunk[i] == chunkNone && pl.readsCarried(op, ir.Gradient) {
				// lower carries the previous step's gradients as one tensor
				// of the whole model, not one per stage.
				return fmt.Errorf("pipeline parallelism does not model zero_grad between forward and backward (%s): the previous step's gradients are carried whole, not per stage", op.Name)
			}
			if opChunk[i] == chunkNone {
				return fmt.Errorf("pipeline cannot place op %d (%s) on a stage", i, op.Name)
			}
			if pl.mine(opChunk[i]) {
				pl.unitOf[i], pl.isKept[i] = ppUnit{op.Phase, op.Micro, opChunk[i]}, true
				pl.nKept++
			}
		}
	}
	return nil
}

// chunkOf is the chunk of op i, neither a source nor in the optimizer step.
func (pl *pipeliner) chunkOf(i int, nodeChunk []int32) int {
	op := &pl.p.Ops[i]
	if op.Node >= 0 && nodeChunk[op.Node] >= 0 { // nodeChunks covers every op's node
		return int(nodeChunk[op.Node])
	}
	if bi := pl.opBlock[i]; bi >= 0 {
		return pl.chunkOfBlock[bi]
	}
	if c := pl.traceChunkOf(i); c != chunkNone {
		return c
	}
	for _, t := range op.In {
		if w := pl.a.writer[t]; w >= 0 && w < int32(i) && pl.opChunk[w] >= 0 {
			return pl.opChunk[w]
		}
	}
	// The loop rebinding the outputs it held from the previous iteration
	// ("logits = model(...) (rebinds)", lower's HoldNextForward) reads only
	// that carried state: it runs where the op it follows, the last write
	// of the outputs, does (the last stage). It had no stage: plan --pp 2
	// --recipe litgpt (or pytorch) was refused (issue 15's sweep).
	if i > 0 && pl.readsCarried(op, ir.Temporary) && pl.opChunk[i-1] >= 0 {
		return pl.opChunk[i-1]
	}
	return chunkNone
}

// readsCarried reports whether op reads state of category cat the previous
// iteration left alive (ir.Tensor.Carried).
func (pl *pipeliner) readsCarried(op *ir.Op, cat ir.Category) bool {
	return slices.ContainsFunc(op.In, func(t ir.TensorID) bool {
		st := &pl.p.Tensors[ir.Storage(pl.p.Tensors, t)]
		return st.Carried && st.Cat == cat
	})
}

// keepOps keeps the forward and backward ops of the rank's chunks
// (placeOps marks them). The ops are rebuilt into out, so only the tensors
// are copied. One pass over the kept ops' operands gathers what the later
// phases ask of them, each once a pass of its own over a stage's million
// ops (BenchmarkPipelineStageDeepSeekV3, with the rest of round 19's
// changes: 492 -> 299 ms): the tensors they touch (used, with their
// bases), the earliest chunk reading a source op's output (minReader), the
// tensors received and sent (recvs, sends) and the ranks reading each
// parameter (paramRanks).
func (pl *pipeliner) keepOps(own bool) {
	p := pl.p
	pl.q = p
	if !own {
		pl.q = &ir.Program{MicroBatches: p.MicroBatches, Ops: p.Ops, Params: p.Params,
			Tensors: append(make([]ir.Tensor, 0, len(p.Tensors)+len(p.Tensors)/4+16), p.Tensors...)}
	}
	q := pl.q
	pl.srcOut = map[int][]ir.TensorID{}
	pl.isParam = paramSet(p)
	pl.paramRanks = paramRanks{first: make([]int32, len(q.Tensors)), more: map[ir.TensorID]map[int]bool{}}
	// One pass over the placement, touching only the ops of other ranks
	// and the source ops (few on a stage's own slice): what another rank's
	// forward and backward ops read (in place of a whole program's reader
	// lists), and the storages holding a source op's
	// output (srcTree). A read's minReader walk below runs only for those,
	// and stops at the first tensor already read from a chunk no later (a
	// storage's value is never above any of its views', as each walk lowers
	// the whole chain).
	readElsewhere := make([]bool, len(q.Tensors))
	srcTree := make([]bool, len(q.Tensors))
	for r, c := range pl.opChunk {
		switch {
		case c == chunkSource:
			for _, t := range q.Ops[r].Out {
				srcTree[pl.a.owner[t]] = true
			}
		case c >= 0 && !pl.mine(c):
			for _, t := range q.Ops[r].In {
				readElsewhere[t] = true
				if pl.isParam.has(t) {
					pl.paramRanks.add(t, c%pl.pp.Stages)
				}
			}
		}
	}
	pl.minReader = make([]int32, len(q.Tensors))
	for i := range pl.minReader {
		pl.minReader[i] = -1
	}
	pl.used = make([]bool, len(q.Tensors))
	recvSeen := make([]bool, len(q.Tensors))
	for i := range pl.unitOf {
		if !pl.isKept[i] {
			continue
		}
		u := pl.unitOf[i]
		c := int32(u.chunk)
		for _, t := range q.Ops[i].In {
			pl.markUsed(t)
			if pl.isParam.has(t) {
				pl.paramRanks.add(t, u.chunk%pl.pp.Stages)
			}
			if !pl.a.local(t) && !recvSeen[t] && !pl.keptWriter(t) {
				recvSeen[t] = true
				pl.recvs = append(pl.recvs, ppXfer{t, u, i})
			}
			if !srcTree[pl.a.owner[t]] {
				continue
			}
			for s := t; s != ir.NoTensor; s = q.Tensors[s].Base {
				if r := pl.minReader[s]; r >= 0 && r <= c {
					break
				}
				pl.minReader[s] = c
			}
		}
		for _, t := range q.Ops[i].Out {
			pl.markUsed(t)
			if !pl.a.local(t) && pl.a.writer[t] == int32(i) && readElsewhere[t] {
				pl.sends = append(pl.sends, ppXfer{t, u, i})
			}
		}
	}
}

// keptWriter reports whether the op that first writes t, which a kept op
// reads, is on this rank: kept already, or a source op, which placeSources
// keeps for the output it writes here.
func (pl *pipeliner) keptWriter(t ir.TensorID) bool {
	w := pl.a.writer[t]
	return w >= 0 && (pl.isKept[w] || pl.opChunk[w] == chunkSource)
}

// paramRanks are the ranks reading each parameter: first is the rank+1 of
// its first reader, and a set is made only for a parameter read on a
// second rank, so that the reads of a parameter on one rank (all but a
// few) touch no map.
type paramRanks struct {
	first []int32
	more  map[ir.TensorID]map[int]bool
}

func (pr *paramRanks) add(t ir.TensorID, rank int) {
	switch f := pr.first[t]; {
	case f == int32(rank)+1:
	case f == 0:
		pr.first[t] = int32(rank) + 1
	default:
		if pr.more[t] == nil {
			pr.more[t] = map[int]bool{int(f - 1): true}
		}
		pr.more[t][rank] = true
	}
}

// count is how many ranks read t.
func (pr *paramRanks) count(t ir.TensorID) int {
	if m := pr.more[t]; m != nil {
		return len(m)
	}
	if pr.first[t] > 0 {
		return 1
	}
	return 0
}

// placeSources keeps the outputs of source ops that kept ops use; a source
// op runs in the unit of the earliest chunk reading them (same phase and
// micro-step).
func (pl *pipeliner) placeSources() {
	q, minReader := pl.q, pl.minReader
	for i := range q.Ops {
		if pl.opChunk[i] != chunkSource {
			continue
		}
		op := &q.Ops[i]
		var outs []ir.TensorID
		chunk := -1
		for _, t := range op.Out {
			if pl.used[t] {
				outs = append(outs, t)
				if c := int(minReader[t]); c >= 0 && (chunk < 0 || c < chunk) {
					chunk = c
				}
			}
		}
		if len(outs) == 0 {
			continue
		}
		if chunk < 0 {
			chunk = pl.pp.Stage // written as a view's base only
		}
		pl.srcOut[i] = outs
		for _, t := range op.In {
			pl.markUsed(t)
		}
		pl.unitOf[i], pl.isKept[i] = ppUnit{op.Phase, op.Micro, chunk}, true
		pl.nKept++
	}
	pl.keptIdx = make([]int, 0, pl.nKept)
	for i := range pl.unitOf {
		if pl.isKept[i] {
			pl.keptIdx = append(pl.keptIdx, i)
		}
	}
}

// retag writes received tensors fresh here, and sets what is saved for
// backward here: received inputs the backward reads become activations,
// and activations only another rank's backward reads (the output sent on)
// become temporaries.
func (pl *pipeliner) retag() {
	q := pl.q
	for _, x := range pl.recvs {
		t := &q.Tensors[x.t]
		t.Bytes = pl.xferBytes(x.t)
		t.Base = ir.NoTensor
		t.Resident = false
		t.Cat = ir.Temporary
		pl.markUsed(x.t)
	}
	// A read's storage is the analysis's (an array of ids, where walking the
	// chain read 80-byte tensors in no order) unless a received tensor
	// was in its chain: then its storage is where the walk now stops.
	owner := pl.a.owner
	moved := make([]bool, len(q.Tensors))
	for _, x := range pl.recvs {
		moved[owner[x.t]] = true
	}
	savedHere := make([]bool, len(q.Tensors))
	for i, u := range pl.unitOf {
		if pl.isKept[i] && u.phase == ir.Backward {
			for _, t := range q.Ops[i].In {
				o := owner[t]
				if moved[o] {
					o = ir.Storage(q.Tensors, t)
				}
				savedHere[o] = true
			}
		}
	}
	for _, x := range pl.recvs {
		if x.unit.phase == ir.Forward && savedHere[x.t] {
			q.Tensors[x.t].Cat = ir.Activation
		}
	}
	for i, u := range pl.unitOf {
		if !pl.isKept[i] || u.phase != ir.Forward {
			continue
		}
		for _, t := range q.Ops[i].Out {
			if tt := &q.Tensors[t]; tt.Base == ir.NoTensor && tt.Cat == ir.Activation && !savedHere[t] {
				tt.Cat = ir.Temporary
			}
		}
	}
}

// p2p is a point-to-point op for x. Point-to-point ops belong to no module
// (as load_batch), so module patterns (checkpointing) never take them for
// part of a block.
func (pl *pipeliner) p2p(name string, x ppXfer, in, outT []ir.TensorID) ir.Op {
	return ir.Op{Name: name, Phase: x.unit.phase, Micro: x.unit.micro, In: in, Out: outT, Node: -1,
		Comm: &ir.Comm{Kind: ir.SendRecv, Bytes: pl.xferBytes(x.t), Group: ir.PipelineGroup, Ranks: 2}}
}

// ppDir names a phase's direction in point-to-point op names.
func ppDir(ph ir.Phase) string {
	if ph == ir.Forward {
		return "forward"
	}
	return "backward"
}

// emit writes the units in schedule order: each unit's receives, its ops,
// its sends.
func (pl *pipeliner) emit() error {
	q := pl.q
	order, err := pl.pp.schedule(pl.pp.Schedule, pl.m, pl.v)
	if err != nil {
		return err
	}
	// The kept ops by unit, in their order: a counting sort on each
	// unit's place in the schedule (ops of a unit it does not list are
	// not placed, and reported below).
	at := make(map[ppUnit]int, len(order))
	for k, u := range order {
		at[u] = k
	}
	start := make([]int, len(order)+1)
	slot := make([]int32, len(pl.keptIdx)) // each kept op's place in order, or -1
	var lastU ppUnit
	lastK, lastOK := 0, false
	for j, i := range pl.keptIdx {
		if u := pl.unitOf[i]; j == 0 || u != lastU {
			lastU = u
			lastK, lastOK = at[u]
		}
		slot[j] = -1
		if lastOK {
			slot[j] = int32(lastK)
			start[lastK+1]++
		}
	}
	for k := range order {
		start[k+1] += start[k]
	}
	byUnit := make([]int, start[len(order)])
	next := append([]int(nil), start[:len(order)]...)
	for j, i := range pl.keptIdx {
		if k := slot[j]; k >= 0 {
			byUnit[next[k]] = i
			next[k]++
		}
	}
	recvBy := map[ppUnit][]ppXfer{}
	for _, x := range pl.recvs {
		recvBy[x.unit] = append(recvBy[x.unit], x)
	}
	sendBy := map[ppUnit][]ppXfer{}
	for _, x := range pl.sends {
		sendBy[x.unit] = append(sendBy[x.unit], x)
	}
	placed, nOptim := 0, 0
	for i := range q.Ops {
		if pl.opChunk[i] == chunkOptim {
			nOptim++
		}
	}
	out := opPool.get(0, len(pl.keptIdx)+len(pl.recvs)+len(pl.sends)+nOptim+8)
	for k, u := range order {
		for _, x := range recvBy[u] {
			out = append(out, pl.p2p("pp.recv_"+ppDir(u.phase), x, nil, []ir.TensorID{x.t}))
		}
		for _, i := range byUnit[start[k]:start[k+1]] {
			op := q.Ops[i]
			// Capped, so ppFixGradCreation's appends never write into
			// p's spare capacity.
			op.In, op.Out = op.In[:len(op.In):len(op.In)], op.Out[:len(op.Out):len(op.Out)]
			if pl.opChunk[i] == chunkSource {
				op.Out = pl.srcOut[i] // kept: it has outputs here
			}
			out = append(out, op)
			placed++
		}
		for _, x := range sendBy[u] {
			out = append(out, pl.p2p("pp.send_"+ppDir(u.phase), x, []ir.TensorID{x.t}, nil))
		}
	}
	pl.out = out
	if placed != len(pl.keptIdx) {
		return fmt.Errorf("pipeline schedule placed %d of %d ops (micro-steps or phases the schedule does not know)", placed, len(pl.keptIdx))
	}
	return nil
}

// tiedGrads all-reduces the gradients of parameters used on several ranks
// (tied embeddings) over the ranks holding them: a gradient is a
// parameter's by name, or in a trace by its pairing (Program.GradOf, one
// per part once UntieTraceGrads untied them).
func (pl *pipeliner) tiedGrads() {
	p, q := pl.p, pl.q
	for _, id := range p.Params {
		n := pl.paramRanks.count(id)
		if !pl.used[id] || n < 2 {
			continue
		}
		for g := range q.Tensors {
			gt := &q.Tensors[g]
			if gt.Cat == ir.Gradient && pl.used[g] && (pl.a.assoc[g] == id || p.GradOf != nil && p.GradOf[ir.TensorID(g)] == id) {
				pl.out = append(pl.out, ir.Op{Name: "pp.tied_grad_all_reduce", Module: q.Tensors[id].Name, Phase: ir.Optimizer, In: []ir.TensorID{ir.TensorID(g)}, Node: -1,
					Comm: &ir.Comm{Kind: ir.AllReduce, Bytes: gt.Bytes, Group: ir.PipelineGroup, Ranks: n}})
			}
		}
	}
}

// cutOptimizer keeps the optimizer ops that touch this rank's model state,
// cut to its tensors.
func (pl *pipeliner) cutOptimizer() {
	for i := range pl.q.Ops {
		if pl.opChunk[i] != chunkOptim {
			continue
		}
		op := pl.q.Ops[i]
		if !pl.cutOptimizerOp(&op) {
			continue
		}
		for _, t := range op.In {
			pl.markUsed(t)
		}
		for _, t := range op.Out {
			pl.markUsed(t)
		}
		pl.out = append(pl.out, op)
	}
}

// cutOptimizerOp cuts op to this rank's model-state tensors (a parameter,
// its gradient or its optimizer state; unassociated state every rank has)
// and scales its workspaces, work and temporaries by the share of bytes it
// keeps; false drops it (none of its model state is here, or it reads a
// temporary that is not and has no model state of its own here).
//
// A temporary that is not here was written by an optimizer op this rank
// dropped, one that touched only other ranks' state: it is cut from the
// reader like their state, and the reader stays when it holds this rank's.
// Megatron's optimizer copies to float32 only the gradients of parameters
// with main weights (a LoRA model's head, on the last stage), and its one
// fused Adam reads those copies beside every adapter: dropping the reader
// for that left the first stages of a LoRA pipeline without their
// optimizer step and state in the steady step, while the first step,
// which creates the state, kept it (bert-base --pp 3: 3x the host memory
// under --offload optimizer).
func (pl *pipeliner) cutOptimizerOp(op *ir.Op) bool {
	q, a, isParam := pl.q, pl.a, pl.isParam
	var keptB, allB float64
	foreign := false // reads a temporary another rank wrote
	filter := func(ts []ir.TensorID, isOut bool) []ir.TensorID {
		var r []ir.TensorID
		for _, t := range ts {
			tt := &q.Tensors[t]
			owner := a.assoc[t]
			switch {
			case isParam.has(t) || owner != ir.NoTensor || tt.Cat == ir.Gradient:
				allB += float64(tt.Bytes)
				keep := pl.used[t]
				if !keep && owner != ir.NoTensor && !isParam.has(t) && tt.Cat != ir.Gradient {
					keep = pl.used[owner]
				}
				if keep {
					keptB += float64(tt.Bytes)
					r = append(r, t)
				}
			case tt.Resident || tt.Keep:
				r = append(r, t) // unassociated state: every rank has it
			default:
				if !isOut && !pl.used[t] {
					foreign = true // cut, as another rank's state is
					continue
				}
				r = append(r, t)
			}
		}
		return r
	}
	op.In = filter(op.In, false)
	op.Out = filter(op.Out, true)
	if keptB == 0 && (foreign || allB > 0) {
		return false
	}
	if allB > 0 && keptB < allB {
		pl.scaleOptimizerOp(op, keptB/allB)
	}
	return true
}

// scaleOptimizerOp scales a cut optimizer op by frac, the share of its
// model-state bytes the rank keeps: workspaces, FLOPs, bytes moved, its
// collective or copy, and the temporaries it writes.
// Bounded: frac ≤ 1 scales sizes down.
func (pl *pipeliner) scaleOptimizerOp(op *ir.Op, frac float64) {
	q, a := pl.q, pl.a
	op.Workspace = ppScale(op.Workspace, frac)
	op.WorkspaceHost = ppScale(op.WorkspaceHost, frac)
	op.FLOPs *= frac
	op.MemBytes *= frac
	// Comm and Transfer may be shared with the input (Clone).
	if op.Comm != nil {
		c := *op.Comm
		c.Bytes = ppScale(c.Bytes, frac)
		op.Comm = &c
	}
	if op.Transfer != nil {
		tr := *op.Transfer
		tr.Bytes = ppScale(tr.Bytes, frac)
		op.Transfer = &tr
	}
	for _, t := range op.Out {
		tt := &q.Tensors[t]
		if pl.used[t] || tt.Resident || tt.Keep || tt.Base != ir.NoTensor || pl.isParam.has(t) || a.assoc[t] != ir.NoTensor || tt.Cat == ir.Gradient {
			continue
		}
		if len(tt.Shape) == 1 {
			tt.Shape = []int64{int64(math.Round(float64(tt.Shape[0]) * frac))}
			tt.Bytes = tt.DType.Size(tt.Shape[0])
		} else {
			tt.Bytes = ppScale(tt.Bytes, frac)
		}
	}
}

// ppScale returns b·f rounded.
func ppScale(b units.Bytes, f float64) units.Bytes {
	return units.Bytes(math.Round(float64(b) * f))
}

// ppBlock returns the block of module when the module is inside an
// indexed block: the path up to its first list index ("model.layers.3",
// ir.BlockOf), or up to its first component named <name>_<index> when that
// comes first (torchvision's VisionTransformer names its encoder's blocks
// "encoder.layers.encoder_layer_0", torchvision/models/
// vision_transformer.py @v0.20.0, Encoder: layers[f"encoder_layer_{i}"]).
func ppBlock(module string) (string, bool) { return ppBlockOf(ir.BlockOf(module)) }

// ppBlockOf is ppBlock of a module whose ir.BlockOf is b.
func ppBlockOf(b string) (string, bool) {
	if n := namedIndexEnd(b); n > 0 {
		return b[:n], true
	}
	if !endsInIndex(b) {
		return "", false
	}
	return b, true
}

// endsInIndex says whether path's last component is a list index.
func endsInIndex(path string) bool { return ir.IsIndex(path[strings.LastIndexByte(path, '.')+1:]) }

// ppAnalysis is what Apply needs to know about the whole program.
type ppAnalysis struct {
	p      *ir.Program
	writer []int32 // first op writing each tensor id, or -1
	// assoc maps a model-state tensor (optimizer state, master weight,
	// gradient) to the parameter whose name prefixes its own; NoTensor
	// otherwise (and for the parameters themselves). Only gradients and the
	// optimizer step's operands are asked about (tiedGrads, cutOptimizer),
	// so only theirs are matched: the names of every activation of a
	// deepseek-v3 stage were a third of the analysis.
	assoc     []ir.TensorID
	untouched []bool // resident storages no op reads or writes
	trace     bool   // p was replayed from a trace (pipeline_trace.go)
	// isLocal and sourceIn are local's and isSource's questions about each
	// tensor's storage, answered once from ir.Storages where each answer
	// walked the view to its storage: 6 of the 74 s of deepseek-v3 --pp 4
	// --accum 8 were that walk's cache misses. Both are asked before retag
	// writes a category, of p's tensors as they were.
	isLocal  []bool
	sourceIn []bool
	// owner is each tensor's storage (ir.Storages), of p's tensors as
	// they were (retag clears the base of what is received).
	owner []ir.TensorID
}

func newPPAnalysis(p *ir.Program, trace bool) *ppAnalysis {
	n := len(p.Tensors)
	a := &ppAnalysis{p: p, writer: make([]int32, n), assoc: make([]ir.TensorID, n), untouched: make([]bool, n),
		trace: trace, isLocal: make([]bool, n), sourceIn: make([]bool, n)}
	owner := ir.Storages(p.Tensors)
	a.owner = owner
	for i, o := range owner {
		t := &p.Tensors[o]
		a.isLocal[i] = t.Resident || t.Keep || t.Cat == ir.Gradient
		// a trace's outputs do not say they require grad: one that reads a parameter does
		a.sourceIn[i] = t.Resident && !(trace && t.RequiresGrad)
	}
	for i := range a.writer {
		a.writer[i] = -1
	}
	touched := make([]bool, n)
	asked := make([]bool, n) // tensors assoc is asked about
	for i := range p.Ops {
		op := &p.Ops[i]
		opt := op.Phase == ir.Optimizer
		for _, t := range op.Out {
			if a.writer[t] < 0 {
				a.writer[t] = int32(i)
			}
			touched[owner[t]] = true
			asked[t] = asked[t] || opt
		}
		for _, t := range op.In {
			touched[owner[t]] = true
			asked[t] = asked[t] || opt
		}
	}
	for i := range p.Tensors {
		a.untouched[i] = p.Tensors[i].Resident && p.Tensors[i].Base == ir.NoTensor && !touched[i]
	}
	byName := map[string]ir.TensorID{}
	var isLen []bool // isLen[k]: some parameter's name has length k
	for _, id := range p.Params {
		name := p.Tensors[id].Name
		byName[name] = id
		if len(name) >= len(isLen) {
			isLen = append(isLen, make([]bool, len(name)+1-len(isLen))...)
		}
		isLen[len(name)] = true
	}
	for i := range p.Tensors {
		a.assoc[i] = ir.NoTensor
		if !asked[i] && p.Tensors[i].Cat != ir.Gradient {
			continue
		}
		name := p.Tensors[i].Name
		for j := min(len(name), len(isLen)) - 1; j > 0; j-- {
			if name[j] != '.' || !isLen[j] {
				continue
			}
			if id, ok := byName[name[:j]]; ok && id != ir.TensorID(i) {
				a.assoc[i] = id
				break
			}
		}
	}
	return a
}

// isSource reports whether op reads nothing computed in the iteration and
// writes nothing autograd differentiates nor any resident storage (batch
// loading, masks, views of buffers): every rank that needs its outputs runs
// it.
func (a *ppAnalysis) isSource(op *ir.Op) bool {
	if op.Phase == ir.Optimizer {
		return false
	}
	for _, t := range op.In {
		if !a.sourceIn[t] {
			return false
		}
	}
	for _, t := range op.Out {
		tt := &a.p.Tensors[t]
		if tt.RequiresGrad || (tt.Base == ir.NoTensor && tt.Resident) {
			return false
		}
	}
	return len(op.Out) > 0
}

// local reports whether t never crosses ranks by point-to-point: resident
// storages and parameter gradients (tied ones are all-reduced instead).
func (a *ppAnalysis) local(t ir.TensorID) bool { return a.isLocal[t] }

// ppFixGradCreation makes the first op on this rank that touches each
// parameter gradient create it (write it, without the accumulation
// workspace) and later ones accumulate into it. It marks in used what
// each op touches once fixed (with their bases), for ppCompact.
//
// It returns how many operands the ops have once fixed (ppCompact's).
func ppFixGradCreation(q *ir.Program, ops []ir.Op, used []bool) int {
	// fixable: a gradient storage the iteration creates, asked of every
	// operand (a byte each, not its 80-byte tensor).
	fixable := make([]bool, len(q.Tensors))
	for t := range q.Tensors {
		tt := &q.Tensors[t]
		fixable[t] = tt.Cat == ir.Gradient && tt.Base == ir.NoTensor && !tt.Resident && !tt.Keep
	}
	written := make([]bool, len(q.Tensors))
	operands := 0
	mark := func(ts []ir.TensorID) {
		for _, t := range ts {
			for s := t; s != ir.NoTensor && !used[s]; s = q.Tensors[s].Base {
				used[s] = true
			}
		}
	}
	for oi := range ops {
		op := &ops[oi]
		var fixIn, fixOut []ir.TensorID
		for _, t := range op.In {
			if fixable[t] && !written[t] && !ppContains(fixIn, t) {
				fixIn = append(fixIn, t)
			}
		}
		for _, t := range op.Out {
			if fixable[t] && written[t] {
				fixOut = append(fixOut, t)
			}
		}
		for _, t := range fixIn {
			op.In = ppRemove(op.In, t)
			if !ppContains(op.Out, t) {
				op.Out = append(op.Out, t)
				op.Workspace = max(op.Workspace-q.Tensors[t].Bytes, 0)
			}
		}
		for _, t := range fixOut {
			op.Out = ppRemove(op.Out, t)
			if !ppContains(op.In, t) {
				op.In = append(op.In, t)
				op.Workspace += q.Tensors[t].Bytes
			}
		}
		for _, t := range op.Out {
			written[t] = true
		}
		mark(op.In)
		mark(op.Out)
		operands += len(op.In) + len(op.Out)
	}
	return operands
}

func ppRemove(ts []ir.TensorID, x ir.TensorID) []ir.TensorID {
	r := ts[:0:0]
	for _, t := range ts {
		if t != x {
			r = append(r, t)
		}
	}
	return r
}

func ppContains(ts []ir.TensorID, x ir.TensorID) bool {
	for _, t := range ts {
		if t == x {
			return true
		}
	}
	return false
}

// ppCompact keeps the tensors marked in used (every one ops touch, with
// their bases: ppFixGradCreation marks them, and counts the ids operands
// ops have), renumbered in their original order, and rewrites ops (the
// caller's own, which the result keeps), Params and GradOf (gradOf
// renumbered).
func ppCompact(q *ir.Program, ops []ir.Op, used []bool, ids int, gradOf map[ir.TensorID]ir.TensorID) *ir.Program {
	remap := make([]ir.TensorID, len(q.Tensors))
	r := &ir.Program{MicroBatches: q.MicroBatches}
	kept := 0
	for i := range q.Tensors {
		if used[i] {
			kept++
		}
	}
	r.Tensors = tensorPool.get(0, kept)
	for i := range q.Tensors {
		remap[i] = ir.NoTensor
		if !used[i] {
			continue
		}
		t := q.Tensors[i]
		if t.Base != ir.NoTensor {
			t.Base = remap[t.Base]
		}
		remap[i] = ir.TensorID(len(r.Tensors))
		r.Tensors = append(r.Tensors, t)
	}
	// ops is the caller's own: its operand lists are replaced by ones
	// carved from a single array of ids operands (each capped, as in
	// Clone).
	operands := make([]ir.TensorID, ids)
	re := func(ts []ir.TensorID) []ir.TensorID {
		if ts == nil {
			return nil
		}
		o := operands[:len(ts):len(ts)]
		operands = operands[len(ts):]
		for k, t := range ts {
			o[k] = remap[t]
		}
		return o
	}
	for oi := range ops {
		op := &ops[oi]
		op.In, op.Out = re(op.In), re(op.Out)
	}
	r.Ops = ops
	for _, id := range q.Params {
		if used[id] {
			r.Params = append(r.Params, remap[id])
		}
	}
	r.GradOf = ppGradOf(q, gradOf, used, remap)
	return r
}

// schedule lists this rank's units in execution order.
// Bounded: m ≤ 1024 micro-batches (engine.MaxPipelineAccum) and p·v ≤
// 2^15 chunks (engine's validateInterleave).
func (pp *Pipeline) schedule(sched Schedule, m, v int) ([]ppUnit, error) {
	p, s := pp.Stages, pp.Stage
	F := func(micro, local int) ppUnit { return ppUnit{ir.Forward, micro, local*p + s} }
	B := func(micro, local int) ppUnit { return ppUnit{ir.Backward, micro, local*p + s} }
	var order []ppUnit
	if v == 1 {
		warm := m
		if sched == OneFOneB {
			warm = min(p-s-1, m)
		}
		for i := 0; i < warm; i++ {
			order = append(order, F(i, 0))
		}
		for i := 0; i < m-warm; i++ {
			order = append(order, F(warm+i, 0), B(i, 0))
		}
		for i := m - warm; i < m; i++ {
			order = append(order, B(i, 0))
		}
		return order, nil
	}
	// Interleaved: virtual micro-batch k → (micro-batch, local chunk).
	total := m * v
	virt := func(k int, fwd bool) (int, int) {
		inGroup := k % (p * v)
		chunk := inGroup / p
		if !fwd {
			chunk = v - 1 - chunk
		}
		return (k/(p*v))*p + k%p, chunk
	}
	warm := min((p-s-1)*2+(v-1)*p, total)
	for k := 0; k < warm; k++ {
		mb, c := virt(k, true)
		order = append(order, F(mb, c))
	}
	for k := 0; k < total-warm; k++ {
		mb, c := virt(warm+k, true)
		order = append(order, F(mb, c))
		mb, c = virt(k, false)
		order = append(order, B(mb, c))
	}
	for k := total - warm; k < total; k++ {
		mb, c := virt(k, false)
		order = append(order, B(mb, c))
	}
	return order, nil
}
