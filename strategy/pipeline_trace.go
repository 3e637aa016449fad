package strategy

import (
	"slices"
	"strings"

	"github.com/memplan/memplan/ir"
	"github.com/memplan/memplan/units"
)

// Placement of ops replayed from a recorded PyTorch trace (importer/
// torchtrace), which carry no autograd node (Node -1): the catalog path
// places an op by its forward node, a trace's ops by module path and
// position instead (docs/trace-format.md: an event's module is the one
// whose forward ran it, in backward the one whose backward runs).
//
//   - A forward op in a block ("layers.3.self_attn" is in "layers.3") goes
//     with its block. Any other forward op goes by its position in its
//     micro-step: before the micro-step's first block op, to the first
//     chunk (input preparation, embeddings); after its last, to the last
//     chunk (final norm, head, loss); between, with the block before it.
//     This is where Megatron places them, and where nodeChunks places the
//     catalog's nodes.
//   - A backward op in a block goes with its block; one outside every block
//     goes with the chunk its module's forward ops went to ("embed" to the
//     first, "head" and "(loss)" to the last), when they all went to one;
//     otherwise (the root module, whose forward ops are both before and
//     after the blocks, or an op no forward module names) with the op that
//     wrote what it reads, as for any op.

// traceChunks is the chunk of each forward op of a trace by position (-1:
// not a forward op, or one with an autograd node), and the chunk of each
// module outside the blocks whose forward ops all went to one chunk.
func (pl *pipeliner) traceChunks() (fwd []int, module map[string]int) {
	p := pl.p
	first, last := pl.blockSpans()
	fwd = make([]int, len(p.Ops))
	module = map[string]int{}
	mixed := map[string]bool{}
	cur := 0
	for i := range p.Ops {
		fwd[i] = -1
		op := &p.Ops[i]
		if op.Phase != ir.Forward || op.Recompute || op.Node >= 0 {
			continue
		}
		b, inBlock := ppBlock(op.Module)
		lo, hasBlocks := first[op.Micro]
		switch {
		case inBlock:
			cur = pl.chunkOfBlock[pl.blockIdx[b]]
		case !hasBlocks || i < lo:
			cur = 0
		case i > last[op.Micro]:
			cur = pl.nChunks - 1
		}
		fwd[i] = cur
		if inBlock || op.Module == "" {
			continue
		}
		if c, seen := module[op.Module]; seen && c != cur {
			mixed[op.Module] = true
		}
		module[op.Module] = cur
	}
	for m := range mixed {
		delete(module, m)
	}
	return fwd, module
}

// blockSpans is the index of each micro-step's first and last forward op
// in a block.
func (pl *pipeliner) blockSpans() (first, last map[int]int) {
	first, last = map[int]int{}, map[int]int{}
	for i := range pl.p.Ops {
		op := &pl.p.Ops[i]
		if op.Phase != ir.Forward || op.Recompute || op.Node >= 0 {
			continue
		}
		if _, ok := ppBlock(op.Module); ok {
			if _, seen := first[op.Micro]; !seen {
				first[op.Micro] = i
			}
			last[op.Micro] = i
		}
	}
	return first, last
}

// traceChunkOf is the chunk of trace op i (Node -1) outside every block by
// its position or module, or chunkNone when neither tells.
func (pl *pipeliner) traceChunkOf(i int) int {
	op := &pl.p.Ops[i]
	if pl.traceFwd == nil || op.Node >= 0 {
		return chunkNone
	}
	if c := pl.traceFwd[i]; c >= 0 {
		return c
	}
	if c, ok := pl.traceModule[op.Module]; ok && op.Module != "" {
		return c
	}
	return chunkNone
}

// PipelineBlocks is the number of blocks Pipeline would split among its
// chunks in a program whose forward ops ran in these modules (in any order,
// repeats allowed): the distinct "<path>.<index>" prefixes. A trace can be
// cut into at most this many stages.
func PipelineBlocks(modules []string) int {
	seen := map[string]bool{}
	for _, m := range modules {
		if b, ok := ppBlock(m); ok {
			seen[b] = true
		}
	}
	return len(seen)
}

// PipelineBlock is the block Pipeline places an op of module in (the
// module's "<path>.<index>" prefix), and whether it is in one.
func PipelineBlock(module string) (string, bool) { return ppBlock(module) }

// isTrace reports whether p was replayed from a trace: no op has an
// autograd node.
func isTrace(p *ir.Program) bool {
	for i := range p.Ops {
		if p.Ops[i].Node >= 0 {
			return false
		}
	}
	return true
}

// assocByDataflow matches a trace's optimizer state to its parameter where
// names cannot (a trace names a storage by the op that made it,
// "zeros_like#57", not "<param>.exp_avg"): a state tensor belongs to the
// parameter that the first optimizer op touching it touches, or else the
// next optimizer op touching a parameter does. PyTorch's single-tensor
// optimizers (foreach=False) step one parameter after another, each
// parameter's ops together (torch/optim/adamw.py _single_tensor_adamw and
// sgd.py _single_tensor_sgd @v2.5.1: the step counter and moments are
// updated, then the parameter is written; the first step's _init_group
// makes each parameter's state with zeros_like(param)), so that parameter
// is the state's own. Dataflow alone cannot tell: a trace's op also reads
// the storages that die at it (frees become last uses), which joins one
// parameter's temporaries to the next's. An op touching several parameters
// (a multi-tensor foreach op) matches nothing: its state stays unmatched,
// on every stage, as before.
func (a *ppAnalysis) assocByDataflow(params []ir.TensorID) {
	p := a.p
	isParam := map[ir.TensorID]bool{}
	for _, id := range params {
		isParam[id] = true
	}
	a.assocByPosition(isParam)
	// next[i]: the parameter of the first optimizer op at or after i that
	// touches one (NoTensor: several, or none).
	next := make([]ir.TensorID, len(p.Ops)+1)
	next[len(p.Ops)] = ir.NoTensor
	for i := len(p.Ops) - 1; i >= 0; i-- {
		next[i] = next[i+1]
		if op := &p.Ops[i]; op.Phase == ir.Optimizer {
			if own, touches := opParam(op, isParam); touches {
				next[i] = own
			}
		}
	}
	done := make([]bool, len(p.Tensors))
	for i := range p.Ops {
		op := &p.Ops[i]
		if op.Phase != ir.Optimizer {
			continue
		}
		for _, ts := range [][]ir.TensorID{op.In, op.Out} {
			for _, t := range ts {
				tt := &p.Tensors[t]
				if done[t] || isParam[t] || (tt.Cat != ir.OptimizerState && !tt.Keep) {
					continue
				}
				done[t] = true
				if a.assoc[t] == ir.NoTensor {
					a.assoc[t] = next[i]
				}
			}
		}
	}
}

// assocByPosition matches the optimizer state a multi-tensor (foreach)
// op steps to its parameters by position: torch._foreach_* ops take lists
// aligned index by index (torch/optim/adamw.py _multi_tensor_adamw @v2.5.1:
// torch._foreach_lerp_(device_exp_avgs, device_grads, 1 - beta1),
// torch._foreach_addcdiv_(device_params, device_exp_avgs, denom, ...)),
// so the k-th of a run of n state tensors belongs to the k-th of a run of n
// parameters, or of gradients (Program.GradOf names theirs), in the same
// op. A run of state k·n long is k lists (exp_avgs then exp_avg_sqs). With
// assocByDataflow's matching alone, every stage of a pipeline cut from a
// foreach trace held every parameter's state.
func (a *ppAnalysis) assocByPosition(isParam map[ir.TensorID]bool) {
	p := a.p
	ownerOf := func(t ir.TensorID) ir.TensorID {
		if isParam[t] {
			return t
		}
		if par, ok := p.GradOf[t]; ok {
			return par
		}
		return ir.NoTensor
	}
	isState := func(t ir.TensorID) bool {
		tt := &p.Tensors[t]
		return !isParam[t] && (tt.Cat == ir.OptimizerState || tt.Keep) && tt.Base == ir.NoTensor
	}
	for i := range p.Ops {
		op := &p.Ops[i]
		if op.Phase != ir.Optimizer || len(op.In) < 4 {
			continue
		}
		owners := ownerRun(op.In, ownerOf)
		n := len(owners)
		if n < 2 {
			continue
		}
		for j := 0; j < len(op.In); {
			k := j
			for k < len(op.In) && isState(op.In[k]) {
				k++
			}
			if k == j {
				j++
				continue
			}
			if (k-j)%n == 0 {
				for x := j; x < k; x++ {
					if t := op.In[x]; a.assoc[t] == ir.NoTensor {
						a.assoc[t] = owners[(x-j)%n]
					}
				}
			}
			j = k
		}
	}
}

// ownerRun is the first run of at least two operands of ins that each
// belong to a parameter (ownerOf), as those parameters, cut to one list
// when it is several of the same; nil when there is none.
func ownerRun(ins []ir.TensorID, ownerOf func(ir.TensorID) ir.TensorID) []ir.TensorID {
	for j := 0; j < len(ins); j++ {
		k := j
		for k < len(ins) && ownerOf(ins[k]) != ir.NoTensor {
			k++
		}
		if k-j >= 2 {
			run := make([]ir.TensorID, 0, k-j)
			for _, t := range ins[j:k] {
				// Side by side, two of one parameter are one entry
				// (a tied parameter's gradients, UntieTraceGrads).
				if o := ownerOf(t); len(run) == 0 || run[len(run)-1] != o {
					run = append(run, o)
				}
			}
			return run[:period(run)]
		}
		j = k
	}
	return nil
}

// period is the length of the shortest list run repeats (several lists of
// the same parameters side by side: _foreach_addcmul_(exp_avg_sqs, grads,
// grads)).
func period(run []ir.TensorID) int {
	for n := 1; n < len(run); n++ {
		if len(run)%n != 0 {
			continue
		}
		rep := true
		for x := n; x < len(run) && rep; x++ {
			rep = run[x] == run[x%n]
		}
		if rep {
			return n
		}
	}
	return len(run)
}

// opParam is the one parameter op touches (NoTensor for several), and
// whether it touches any.
func opParam(op *ir.Op, isParam map[ir.TensorID]bool) (ir.TensorID, bool) {
	own, touches := ir.NoTensor, false
	for _, ts := range [][]ir.TensorID{op.In, op.Out} {
		for _, t := range ts {
			switch {
			case !isParam[t] || t == own:
			case touches:
				return ir.NoTensor, true
			default:
				own, touches = t, true
			}
		}
	}
	return own, touches
}

// bornAtStart has this rank's first op write the storages a trace's first
// op writes for every rank (importer/torchtrace's bornAtStart: initial
// storages the step frees, such as the old state of an optimizer that
// replaces it, live from the start) when ops kept here read them and that
// first op runs on another rank.
func (pl *pipeliner) bornAtStart() {
	q := pl.q
	if len(pl.out) == 0 || len(q.Ops) == 0 || pl.isKept[0] {
		return
	}
	written, read := map[ir.TensorID]bool{}, map[ir.TensorID]bool{}
	for i := range pl.out {
		for _, t := range pl.out[i].Out {
			written[t] = true
		}
		for _, t := range pl.out[i].In {
			read[t] = true
		}
	}
	var born []ir.TensorID
	for _, t := range q.Ops[0].Out {
		if pl.used[t] && read[t] && !written[t] && q.Tensors[t].Base == ir.NoTensor && !q.Tensors[t].Resident {
			born = append(born, t)
			written[t] = true
		}
	}
	if len(born) > 0 {
		pl.out[0].Out = append(born, pl.out[0].Out...)
	}
}

// ppGradOf is a trace's gradient → parameter pairing (Program.GradOf, which
// ZeRO and DDP after the pipeline shard by) for the rank's tensors,
// renumbered by remap. A v1 trace's pairing is by dtype and size
// (importer/torchtrace gradsBySize), which may pair a gradient with an
// equal-size parameter of another stage; such a gradient is paired again
// with an unpaired parameter of this rank of the same dtype and size, in id
// order (the same memory and traffic, as there).
func ppGradOf(q *ir.Program, gradOf map[ir.TensorID]ir.TensorID, used []bool, remap []ir.TensorID) map[ir.TensorID]ir.TensorID {
	if gradOf == nil {
		return nil
	}
	out := make(map[ir.TensorID]ir.TensorID, len(gradOf))
	paired := map[ir.TensorID]bool{}
	var orphans []ir.TensorID
	for g, p := range gradOf {
		switch {
		case !used[g]:
		case used[p]:
			out[remap[g]] = remap[p]
			paired[p] = true
		default:
			orphans = append(orphans, g)
		}
	}
	if len(orphans) == 0 {
		return out
	}
	type key struct {
		dt units.DType
		b  units.Bytes
	}
	free := map[key][]ir.TensorID{}
	for _, p := range q.Params {
		if t := &q.Tensors[p]; used[p] && !paired[p] && t.RequiresGrad {
			free[key{t.DType, t.Bytes}] = append(free[key{t.DType, t.Bytes}], p)
		}
	}
	slices.Sort(orphans)
	for _, g := range orphans {
		k := key{q.Tensors[g].DType, q.Tensors[g].Bytes}
		if ps := free[k]; len(ps) > 0 {
			out[remap[g]] = remap[ps[0]]
			free[k] = ps[1:]
		}
	}
	return out
}

// namedIndexEnd is the length of the prefix of path that ends with its first
// component of the form <name>_<digits> ("encoder_layer_0"), or 0.
func namedIndexEnd(path string) int {
	start := 0
	for start < len(path) {
		end := strings.IndexByte(path[start:], '.')
		if end < 0 {
			end = len(path)
		} else {
			end += start
		}
		c := path[start:end]
		if u := strings.LastIndexByte(c, '_'); u > 0 && ir.IsIndex(c[u+1:]) {
			return end
		}
		start = end + 1
	}
	return 0
}

// xferBytes is the bytes of tensor t sent between ranks: its elements, or,
// for a trace's tensor whose size scales with the batch (the importer keeps
// no shape for it), its storage's bytes.
func (pl *pipeliner) xferBytes(t ir.TensorID) units.Bytes {
	q := pl.q
	tt := &q.Tensors[t]
	if pl.a.trace && len(tt.Shape) == 0 {
		return q.Tensors[ir.Storage(q.Tensors, t)].Bytes
	}
	return tt.DType.Size(tt.Numel())
}
