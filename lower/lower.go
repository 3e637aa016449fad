// Package lower lowers a forward ir.Graph into the ir.Program of one training
// iteration (forward, loss, autograd's backward, the optimizer step, repeated
// over accumulated micro-steps) or of one inference pass. The lowering follows
// PyTorch's eager semantics: backward runs the forward nodes in reverse,
// each reading what its node saved and the gradients of its outputs;
// parameter gradients are created by the first micro-step and accumulated in
// place by the rest; zero_grad(set_to_none=True) frees them after the step.
package lower

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"

	"github.com/memplan/memplan/internal/chunk"
	"github.com/memplan/memplan/ir"
	"github.com/memplan/memplan/ops"
	"github.com/memplan/memplan/units"
)

// TrainConfig says how one training iteration runs. The zero value is one
// micro-step of SGD, foreach, fp32, steady state.
type TrainConfig struct {
	Optimizer Optimizer
	Impl      Impl
	Precision ops.Precision
	// Accum is the number of micro-steps per optimizer step (0 means 1).
	Accum int
	// FirstStep lowers the first iteration: optimizer state does not exist
	// yet and the step creates it lazily, as torch.optim does.
	FirstStep bool
	// WeightDecay < 0 takes the optimizer's default (AdamW 0.01, others 0).
	WeightDecay float64
	// PagedState keeps the optimizer state in CUDA unified memory
	// (bitsandbytes paged optimizers, cudaMallocManaged): outside PyTorch's
	// caching allocator, so it counts in the host ledger, not the device's.
	PagedState bool
	// Hold is how long the training loop keeps the model's outputs
	// (logits) in a variable.
	Hold Hold
	// ZeroGrad is when and how the loop clears gradients.
	ZeroGrad ZeroGrad
	// StateDType, when valid, is the dtype of the optimizer's state (for
	// the optimizers whose state follows the parameters'): float32 Adam
	// state over bfloat16 parameters without master weights, say.
	StateDType units.DType
	// InBackward runs each parameter's optimizer step inside backward, as
	// soon as its gradient is complete, and frees the gradient right after
	// (torchtune's optimizer_in_bwd: a per-parameter optimizer stepped from
	// register_post_accumulate_grad_hook, then zero_grad). It needs Accum 1.
	InBackward bool
	// Workspace is the library workspace each thread's first matmul
	// allocates through the caching allocator and keeps (cuBLAS: 8,519,680
	// bytes per handle and stream by default); a training step has two
	// threads, the caller's (forward) and autograd's (backward).
	Workspace units.Bytes
	// SeparateCopies lowers a parameter several nodes read (a tied input
	// embedding and LM head) as the pipeline stages holding them do: each
	// stage its own copy, whose gradient its AccumulateGrad takes alone
	// (Megatron all-reduces the copies' gradients over the embedding
	// group), so the later reader's gradient accumulates in place, as into
	// any gradient, and strategy.Pipeline cuts the two apart. Without it,
	// autograd sums the two gradients in the parameter's InputBuffer before
	// one AccumulateGrad (bufferGrad).
	SeparateCopies bool
	// OutOfPlaceSums sums every later gradient of a tensor several nodes
	// read out of place (old + new, a new buffer while both live), as
	// PyTorch 1.x's engine does; PyTorch 2.0 adds into the first when it
	// can steal it (pytorch/pytorch#88339).
	OutOfPlaceSums bool
	// InPlace reserves room for what the transforms after lowering insert
	// (the autocast cache's exits: a thirty-second more ops and tensors),
	// for a caller that transforms the program in place, and RecomputeRoom
	// room for a recompute of every forward op and output too (full
	// checkpointing).
	InPlace, RecomputeRoom bool
}

// Hold is how long a training loop keeps the model's outputs.
type Hold uint8

const (
	// HoldNone drops them once the loss exists (transformers' Trainer
	// returns only the loss from compute_loss; torchtune and torchtitan
	// del them before backward).
	HoldNone Hold = iota
	// HoldBackward keeps them until their micro-step's backward is done.
	HoldBackward
	// HoldNextForward keeps them in the variable until the next forward
	// returns and rebinds it: through backward, the optimizer step and the
	// next micro-step's forward (litgpt, hand-written loops).
	HoldNextForward
)

// ZeroGrad is how a training loop clears gradients.
type ZeroGrad uint8

const (
	// ZeroToNone: optimizer.zero_grad(set_to_none=True) after the step,
	// PyTorch 2's default: gradients exist from backward to the step.
	ZeroToNone ZeroGrad = iota
	// ZeroInPlace: zero_grad(set_to_none=False) (PyTorch < 2.0's default):
	// gradients stay allocated across iterations.
	ZeroInPlace
	// ZeroAfterForward: zero_grad(set_to_none=True) called between the
	// forward and backward: the previous step's gradients are alive during
	// the forward.
	ZeroAfterForward
)

// bwdMemFactor scales a node's forward memory traffic to its backward's: an
// elementwise backward reads the output gradient and the saved tensors and
// writes the input gradient, about twice what the forward moved.
const bwdMemFactor = 2

// ErrNoLoss is returned when a training graph has no loss.
var ErrNoLoss = errors.New("graph has no loss to differentiate")

type lowerer struct {
	g *ir.Graph
	p *ir.Program
	// shared maps a graph parameter or buffer to its one program tensor
	// (NoTensor: a per-micro-step tensor).
	shared []ir.TensorID
	saved  []bool // graph storages saved for backward
	// grad says which graph tensors require a gradient: read per node
	// input in every micro-step's backward, a byte each rather than the
	// tensor's 100 (0.3 s of cache misses in diagnose deepseek-v3 --accum
	// 4 --checkpoint full's lowerings).
	grad []bool

	// ids and names hold the ops' tensor lists and the tensors' names in a
	// few large arrays instead of one allocation each (a 470,000-op MoE
	// makes a million of them per lowering); in and out are backward's
	// lists being built, gradNames the gradient names of graph tensors.
	ids       chunk.Slices[ir.TensorID]
	shapes    chunk.Slices[int64]
	names     chunk.Strings
	in, out   []ir.TensorID
	gradNames []string
	// bwdNames interns "kind_backward" per node kind.
	bwdNames map[string]string

	// uses counts, per graph parameter, the gradients autograd sums into
	// its one AccumulateGrad (2 for a tied embedding and LM head); pending
	// holds, during a micro-step's backward, the InputBuffer slot of each
	// parameter read more than once whose sum is not complete, and post
	// the ops the backward op being built is followed by (micro: its
	// micro-step).
	uses    []int32
	pending map[ir.TensorID]*pendingGrad
	post    []ir.Op
	micro   int
	node    int32 // the node whose backward is being built
	// outOfPlace: TrainConfig.OutOfPlaceSums.
	outOfPlace bool
}

// pendingGrad is autograd's InputBuffer slot of a parameter that several
// nodes read: the sum of the gradients it has received so far.
type pendingGrad struct {
	buf ir.TensorID
	n   int32
	// steal: buf can be summed into in place (a fresh, dense tensor that
	// holds the last reference to its storage).
	steal bool
}

// cloneShape is a copy of shape cut from a chunk, its capacity its length
// (nil when empty, as append([]int64(nil), shape...) was).
func (l *lowerer) cloneShape(shape []int64) []int64 {
	if len(shape) == 0 {
		return nil
	}
	return l.shapes.Clone(shape)
}

// bwdName is node kind's backward op name, made once per kind.
func (l *lowerer) bwdName(kind string) string {
	name, ok := l.bwdNames[kind]
	if !ok {
		if l.bwdNames == nil {
			l.bwdNames = map[string]string{}
		}
		name = kind + "_backward"
		l.bwdNames[kind] = name
	}
	return name
}

// mapped is mapIDs cut from a chunk (non-nil even when empty).
func (l *lowerer) mapped(ids, idm []ir.TensorID) []ir.TensorID {
	out := l.ids.Make(len(ids))
	for i, t := range ids {
		out[i] = idm[t]
	}
	return out
}

// sharedOf is the program tensor of graph parameter or buffer x.
func (l *lowerer) sharedOf(x ir.TensorID) (ir.TensorID, bool) {
	s := l.shared[x]
	return s, s != ir.NoTensor
}

func newLowerer(g *ir.Graph) *lowerer {
	l := &lowerer{g: g, p: &ir.Program{}, shared: make([]ir.TensorID, len(g.Tensors)), saved: make([]bool, len(g.Tensors)), grad: make([]bool, len(g.Tensors))}
	for i := range l.shared {
		l.shared[i] = ir.NoTensor
		l.grad[i] = g.Tensors[i].RequiresGrad
	}
	for i := range g.Nodes {
		for _, t := range g.Nodes[i].Saved {
			l.saved[ir.Storage(g.Tensors, t)] = true
		}
	}
	for _, id := range append(append([]ir.TensorID(nil), g.Params...), g.Buffers...) {
		t := g.Tensors[id]
		t.Shape = l.cloneShape(t.Shape)
		l.shared[id] = l.add(t)
	}
	for _, id := range g.Params {
		l.p.Params = append(l.p.Params, l.shared[id])
	}
	return l
}

// countUses sets l.uses: for each graph tensor, the nodes that read it
// with a gradient.
func (l *lowerer) countUses() {
	g := l.g
	l.uses = make([]int32, len(g.Tensors))
	for i := range g.Nodes {
		n := &g.Nodes[i]
		for pos, x := range n.In {
			if l.grad[x] && !contains(n.NoGrad, pos) {
				l.uses[x]++
			}
		}
	}
}

func (l *lowerer) add(t ir.Tensor) ir.TensorID {
	l.p.Tensors = append(l.p.Tensors, t)
	return ir.TensorID(len(l.p.Tensors) - 1)
}

// instance maps the graph's per-iteration tensors to fresh program tensors
// for micro-step m.
func (l *lowerer) instance(m int) []ir.TensorID {
	idm := make([]ir.TensorID, len(l.g.Tensors))
	suffix := "@" + strconv.Itoa(m)
	for i := range l.g.Tensors {
		if s, ok := l.sharedOf(ir.TensorID(i)); ok {
			idm[i] = s
			continue
		}
		t := l.g.Tensors[i]
		if t.Base != ir.NoTensor {
			t.Base = idm[t.Base]
		} else if l.saved[i] && t.Cat == ir.Temporary {
			t.Cat = ir.Activation
		}
		if t.Resident { // batch inputs: loaded per micro-step
			t.Resident = false
		}
		if m > 0 {
			t.Name = l.names.Join(t.Name, suffix)
		}
		idm[i] = l.add(t)
	}
	return idm
}

func mapIDs(ids []ir.TensorID, idm []ir.TensorID) []ir.TensorID {
	out := make([]ir.TensorID, len(ids))
	for i, t := range ids {
		out[i] = idm[t]
	}
	return out
}

func (l *lowerer) forward(idm []ir.TensorID, m int) {
	if len(l.g.Inputs) > 0 {
		l.p.Ops = append(l.p.Ops, ir.Op{Name: "load_batch", Phase: ir.Forward, Micro: m, Out: l.mapped(l.g.Inputs, idm), Node: -1})
	}
	for ni := range l.g.Nodes {
		n := &l.g.Nodes[ni]
		l.p.Ops = append(l.p.Ops, ir.Op{Name: n.Kind, Module: n.Module, Phase: ir.Forward, Micro: m,
			In: l.mapped(n.In, idm), Out: l.mapped(n.Out, idm), Workspace: n.Workspace, FLOPs: n.FLOPs, MemBytes: n.MemBytes, Node: int32(ni), Comm: n.Comm})
	}
}

func contains(xs []int, v int) bool {
	for _, x := range xs {
		if x == v {
			return true
		}
	}
	return false
}

// backward appends autograd's backward of micro-step m. pgrad holds the
// parameter gradients across micro-steps. Bounded: its FLOPs and bytes
// moved are float64 (no wrap), its tensors' bytes the forward's (≤ 2^62 in
// all, engine.checkProgramBytes).
func (l *lowerer) backward(idm []ir.TensorID, m int, pgrad map[ir.TensorID]ir.TensorID) {
	g := l.g
	// gradOf[x] is the gradient of graph tensor x, or NoTensor: a slice
	// indexed by id, as dense as the graph (a map was 3% of a 300,000-op
	// MoE's plan).
	gradOf := make([]ir.TensorID, len(g.Tensors))
	for i := range gradOf {
		gradOf[i] = ir.NoTensor
	}
	loss := g.Tensors[g.Loss]
	l.pending, l.micro = map[ir.TensorID]*pendingGrad{}, m
	seed := l.add(ir.Tensor{Name: l.gradName(g.Loss), Shape: []int64{}, DType: loss.DType, Bytes: loss.DType.Size(1), Base: ir.NoTensor, Cat: ir.Temporary})
	gradOf[g.Loss] = seed
	l.p.Ops = append(l.p.Ops, ir.Op{Name: "loss.backward", Phase: ir.Backward, Micro: m, In: []ir.TensorID{idm[g.Loss]}, Out: []ir.TensorID{seed}, Node: -1})
	for ni := len(g.Nodes) - 1; ni >= 0; ni-- {
		n := &g.Nodes[ni]
		l.in, l.out = l.in[:0], l.out[:0]
		for _, t := range n.Saved {
			l.in = append(l.in, idm[t])
		}
		for _, o := range n.Out {
			if gt := gradOf[o]; gt != ir.NoTensor {
				l.in = append(l.in, gt)
			}
		}
		l.node = int32(ni)
		nGout := len(l.in) - len(n.Saved)
		if nGout == 0 {
			continue
		}
		op := ir.Op{Name: l.bwdName(n.Kind), Module: n.Module, Phase: ir.Backward, Micro: m,
			Workspace: n.BwdWorkspace, FLOPs: n.BwdFLOPs, MemBytes: bwdMemFactor * n.MemBytes, Node: int32(ni), Comm: n.BwdComm}
		gout0 := l.in[len(n.Saved)]
		for pos, x := range n.In {
			if l.grad[x] && !contains(n.NoGrad, pos) {
				op.Workspace += l.inputGrad(n, pos, gout0, idm, pgrad, gradOf)
			}
		}
		// The lists live in the lowering's shared arrays (their capacity
		// is their length: whoever appends to one copies it first).
		op.In = l.ids.Clone(l.in)
		if len(l.out) > 0 {
			op.Out = l.ids.Clone(l.out)
		}
		l.p.Ops = append(l.p.Ops, op)
		l.p.Ops = append(l.p.Ops, l.post...)
		l.post = l.post[:0]
	}
	// A parameter some of whose readers got no gradient: what was summed
	// goes to AccumulateGrad when backward ends.
	for _, px := range slices.Sorted(maps.Keys(l.pending)) {
		l.flushGrad(px, "", pgrad)
	}
	l.p.Ops = append(l.p.Ops, l.post...)
	l.post = l.post[:0]
}

// inputGrad makes or accumulates the gradient of input pos of node n, whose
// backward op is being built in l.in and l.out (gout0: its first output
// gradient), and returns the workspace that adds.
func (l *lowerer) inputGrad(n *ir.Node, pos int, gout0 ir.TensorID, idm []ir.TensorID, pgrad map[ir.TensorID]ir.TensorID, gradOf []ir.TensorID) units.Bytes {
	x := n.In[pos]
	xt := &l.g.Tensors[x]
	size := xt.DType.Size(xt.Numel())
	// accumulate adds into an existing gradient; one written by this
	// same op (an input used twice, as in x + x) is not read first.
	accumulate := func(gt ir.TensorID) units.Bytes {
		if !slices.Contains(l.out, gt) {
			l.in = append(l.in, gt)
		}
		return size
	}
	// A gradient the forward already computed and saved is returned as
	// it is (a view of the saved storage).
	savedGrad := ir.NoTensor
	if k, ok := n.GradSaved[pos]; ok {
		savedGrad = idm[n.Saved[k]]
	}
	if px, isShared := l.sharedOf(x); isShared {
		if l.uses != nil && l.uses[x] > 1 {
			return l.bufferGrad(n, pos, px, savedGrad, pgrad)
		}
		if gt, ok := pgrad[px]; ok {
			return accumulate(gt)
		}
		gt := l.add(ir.Tensor{Name: l.names.Join(xt.Name, ".grad"), Shape: l.cloneShape(xt.Shape), DType: xt.DType, Bytes: size, Base: ir.NoTensor, Cat: ir.Gradient})
		if savedGrad != ir.NoTensor {
			l.p.Tensors[gt].Base, l.p.Tensors[gt].Bytes = savedGrad, 0
		}
		pgrad[px] = gt
		l.out = append(l.out, gt)
		return 0
	}
	if gt := gradOf[x]; gt != ir.NoTensor {
		if l.outOfPlace {
			gradOf[x] = l.sumOutOfPlace(n, xt, gt, l.gradName(x), ir.Temporary, xt.Shape)
			return 0
		}
		return accumulate(gt)
	}
	gt := ir.Tensor{Name: l.gradName(x), Shape: xt.Shape, DType: xt.DType, Base: ir.NoTensor, Cat: ir.Temporary, Batch: xt.Batch}
	if savedGrad != ir.NoTensor {
		gt.Base = savedGrad
	} else if n.GradAliases && pos == 0 {
		gt.Base = gout0
	} else {
		gt.Bytes = size
	}
	id := l.add(gt)
	gradOf[x] = id
	l.out = append(l.out, id)
	return 0
}

// bufferGrad adds the gradient of parameter input pos of node n to the
// parameter's InputBuffer slot, as autograd's engine does before the
// parameter's AccumulateGrad runs (torch/csrc/autograd/input_buffer.cpp,
// pytorch/pytorch@4537ef6c, accumulate): the first gradient is kept as it
// is; a later one is added in place into the slot when the slot can be
// stolen (can_accumulate_inplace: dense, the last reference to it and to
// its storage), out of place (old_var + var, a third buffer while both
// operands live) when it cannot, as when it is a view that keeps its base
// (linear's weight gradient, ops.Rule.ViewGradIn). It returns the
// workspace that adds. The in-place path for dense tensors is PyTorch 2.0's
// (pytorch/pytorch#88339, November 2022); PyTorch 1.x sums every dense
// gradient out of place (measured on 1.13): TrainConfig.OutOfPlaceSums.
func (l *lowerer) bufferGrad(n *ir.Node, pos int, px, savedGrad ir.TensorID, pgrad map[ir.TensorID]ir.TensorID) units.Bytes {
	x := n.In[pos]
	xt := &l.g.Tensors[x]
	size := xt.DType.Size(xt.Numel())
	_, accumulating := pgrad[px] // a later micro-step: AccumulateGrad adds in place
	cat := ir.Gradient
	if accumulating {
		cat = ir.Temporary
	}
	var ws units.Bytes
	p := l.pending[px]
	switch {
	case p == nil:
		l.p.SummedGrads = true
		steal := !l.outOfPlace && (savedGrad != ir.NoTensor || !viewGrad(n.Kind, pos))
		if !steal {
			cat = ir.Temporary // replaced by the out-of-place sum
		}
		buf := l.add(ir.Tensor{Name: l.names.Join(xt.Name, ".grad"), Shape: l.cloneShape(xt.Shape), DType: xt.DType, Bytes: size, Base: ir.NoTensor, Cat: cat})
		if savedGrad != ir.NoTensor {
			l.p.Tensors[buf].Base, l.p.Tensors[buf].Bytes = savedGrad, 0
		}
		l.out = append(l.out, buf)
		p = &pendingGrad{buf: buf, steal: steal}
		l.pending[px] = p
	case p.steal: // old_var.add_(var): var lives only in this op
		if !slices.Contains(l.out, p.buf) {
			l.in = append(l.in, p.buf)
		}
		ws = size
	default: // old_var + var
		p.buf = l.sumOutOfPlace(n, xt, p.buf, l.names.Join(xt.Name, ".grad"), cat, l.cloneShape(xt.Shape))
		p.steal = !l.outOfPlace
	}
	p.n++
	if p.n == l.uses[x] {
		l.flushGrad(px, n.Module, pgrad)
	}
	return ws
}

// flushGrad hands parameter px's summed gradient to AccumulateGrad: the
// first micro-step's becomes the gradient (stolen, as
// torch/csrc/autograd/functions/accumulate_grad.h does with a gradient
// nothing else references), a later one's is added into it in place.
func (l *lowerer) flushGrad(px ir.TensorID, module string, pgrad map[ir.TensorID]ir.TensorID) {
	p := l.pending[px]
	delete(l.pending, px)
	if gt, ok := pgrad[px]; ok {
		l.post = append(l.post, ir.Op{Name: "accumulate_grad", Module: module, Phase: ir.Backward, Micro: l.micro,
			In: []ir.TensorID{gt, p.buf}, Node: -1})
		return
	}
	l.p.Tensors[p.buf].Cat = ir.Gradient
	pgrad[px] = p.buf
}

// sumOutOfPlace is autograd's old + new for graph tensor xt, whose
// gradient old holds: the gradient node n's backward op writes gets a
// buffer of its own (name, with n's module), and the sum, appended after
// the op, is a new tensor called name of category cat, which it returns
// (a parameter's slot, bufferGrad; an activation's under
// TrainConfig.OutOfPlaceSums).
func (l *lowerer) sumOutOfPlace(n *ir.Node, xt *ir.Tensor, old ir.TensorID, name string, cat ir.Category, shape []int64) ir.TensorID {
	size := xt.DType.Size(xt.Numel())
	part := l.add(ir.Tensor{Name: l.names.Join(name, " (", n.Module, ")"), Shape: shape, DType: xt.DType, Bytes: size, Base: ir.NoTensor, Cat: ir.Temporary, Batch: xt.Batch})
	l.out = append(l.out, part)
	sum := l.add(ir.Tensor{Name: name, Shape: shape, DType: xt.DType, Bytes: size, Base: ir.NoTensor, Cat: cat, Batch: xt.Batch})
	l.post = append(l.post, ir.Op{Name: "add (autograd sums gradients)", Module: n.Module, Phase: ir.Backward, Micro: l.micro,
		In: []ir.TensorID{old, part}, Out: []ir.TensorID{sum}, FLOPs: float64(xt.Numel()), MemBytes: 3 * float64(size), Node: l.node})
	return sum
}

// viewGrad says whether a node of kind returns the gradient of input pos
// as a view that keeps its base alive (ops.Rule.ViewGradIn).
func viewGrad(kind string, pos int) bool {
	r := ops.Table[kind]
	return r != nil && slices.Contains(r.ViewGradIn, pos)
}

// gradName is "grad(name)" of graph tensor x, made once for all
// micro-steps.
func (l *lowerer) gradName(x ir.TensorID) string {
	if l.gradNames == nil {
		l.gradNames = make([]string, len(l.g.Tensors))
	}
	if l.gradNames[x] == "" {
		l.gradNames[x] = l.names.Join("grad(", l.g.Tensors[x].Name, ")")
	}
	return l.gradNames[x]
}

// Train lowers g into one training iteration. Bounded: c.Accum is the
// micro-steps simulated, not --accum (engine.shortAccum: 3 or 4; at most
// engine.MaxPipelineAccum = 1024 under a pipeline), so the capacity
// hints' 2·Accum·nodes and 7·Accum·tensors/5 are a few times the graph.
func Train(g *ir.Graph, c TrainConfig) (*ir.Program, error) {
	if g.Loss == ir.NoTensor {
		return nil, ErrNoLoss
	}
	c.defaults()
	if c.InBackward && c.Accum > 1 {
		return nil, ErrInBackwardAccum
	}
	l := newLowerer(g)
	if !c.SeparateCopies {
		l.countUses()
	}
	l.outOfPlace = c.OutOfPlaceSums
	l.p.MicroBatches = c.Accum
	l.reserve(c)
	pgrad := map[ir.TensorID]ir.TensorID{}
	// Steady state of a loop that holds its outputs into the next forward,
	// or zeroes gradients after it: last iteration's outputs (gradients)
	// are alive when this one starts.
	var prevOut, prevGrads []ir.TensorID
	if !c.FirstStep && c.Hold == HoldNextForward && len(g.Outputs) > 0 {
		prevOut = []ir.TensorID{l.carried("previous outputs", g.Outputs, ir.Temporary)}
	}
	if !c.FirstStep && c.ZeroGrad == ZeroAfterForward {
		prevGrads = []ir.TensorID{l.carried("previous gradients", l.trainable(), ir.Gradient)}
	}
	for m := 0; m < c.Accum; m++ {
		idm := l.instance(m)
		if m == 0 {
			l.workspace(c.Workspace, ir.Forward, "main thread", c.FirstStep)
		}
		fwd := len(l.p.Ops)
		l.forward(idm, m)
		if len(prevOut) > 0 {
			// The variable is rebound when the model returns.
			l.insertAfterLastWrite(fwd, mapIDs(g.Outputs, idm), ir.Op{Name: "logits = model(...) (rebinds)", Phase: ir.Forward, Micro: m, In: prevOut, Node: -1})
			prevOut = nil
		}
		if m == 0 && len(prevGrads) > 0 {
			l.p.Ops = append(l.p.Ops, ir.Op{Name: "zero_grad(set_to_none=True)", Phase: ir.Forward, In: prevGrads, Node: -1})
		}
		if m == 0 {
			l.workspace(c.Workspace, ir.Backward, "autograd thread", c.FirstStep)
		}
		start := len(l.p.Ops)
		l.backward(idm, m, pgrad)
		if c.InBackward {
			l.stepsInBackward(c, start, pgrad)
		}
		switch {
		case len(g.Outputs) == 0:
		case c.Hold == HoldBackward:
			l.p.Ops = append(l.p.Ops, ir.Op{Name: "del outputs", Phase: ir.Backward, Micro: m, In: mapIDs(g.Outputs, idm), Node: -1})
		case c.Hold == HoldNextForward:
			prevOut = mapIDs(g.Outputs, idm)
		}
	}
	if !c.InBackward {
		l.optimizer(c, pgrad)
	}
	if len(prevOut) > 0 {
		// Still bound when the iteration ends.
		l.p.Ops = append(l.p.Ops, ir.Op{Name: "outputs still bound", Phase: ir.Optimizer, In: prevOut, Node: -1})
	}
	if c.ZeroGrad != ZeroToNone {
		// Gradients outlive the iteration: kept and zeroed in place, or
		// cleared only after the next forward.
		for _, gt := range pgrad {
			t := &l.p.Tensors[gt]
			if c.ZeroGrad == ZeroInPlace && !c.FirstStep {
				t.Resident = true
			} else {
				t.Keep = true
			}
		}
	}
	return l.p, nil
}

// reserve sizes the program's lists once, to bounds that hold for every
// config, so that no append copies the whole program (a 470,000-op MoE's
// Ops and Tensors are 60-70 MB each). Per micro-step: the forward's nodes
// and load_batch, the backward's seed and at most one op per node, and up to
// four loop ops (del outputs, rebinds, zero_grad, a workspace); its
// tensors: the graph's per-iteration ones, the loss gradient and at most one
// gradient per per-iteration tensor that requires one. Once: the shared
// tensors, their gradients, two workspaces, two carried tensors, and the
// optimizer's (optimizerBound).
func (l *lowerer) reserve(c TrainConfig) {
	g := l.g
	nShared := len(g.Params) + len(g.Buffers)
	perIter, perIterGrad := 0, 0
	for i := range g.Tensors {
		if l.shared[i] == ir.NoTensor {
			perIter++
			if g.Tensors[i].RequiresGrad {
				perIterGrad++
			}
		}
	}
	ops, tensors := l.optimizerBound(c)
	nOps, nTensors := c.Accum*(2*len(g.Nodes)+6)+4+ops, c.Accum*(perIter+perIterGrad+1)+nShared+4+tensors
	if c.InPlace {
		nOps += nOps/32 + 16
		nTensors += nTensors/32 + 16
	}
	if c.RecomputeRoom {
		nOps += c.Accum * len(g.Nodes)
		nTensors += c.Accum * perIter
	}
	l.p.Ops = make([]ir.Op, 0, nOps)
	l.p.Tensors = slices.Grow(l.p.Tensors, nTensors)
}

// optimizerBound bounds the ops and tensors the optimizer step adds over
// the graph's parameters: a multi-tensor step is at most ten ops (init,
// upcast, decay, the update's five, copy back, zero_grad), a single-tensor
// step one more per parameter, a step inside backward the multi-tensor
// step's ten per parameter; each parameter has at most a master and
// maxStates states, and each multi-tensor step at most two temporaries
// (the upcast gradients and a foreach result: once, or per parameter inside
// backward).
func (l *lowerer) optimizerBound(c TrainConfig) (ops, tensors int) {
	row, n := c.Optimizer.row(), len(l.g.Params)
	ops, tensors = 16, n*(1+row.maxStates())+2
	switch {
	case c.InBackward:
		ops += 10 * n
		tensors += 2 * n
	case c.Impl == Single || c.Impl == Foreach && row.foreach == nil:
		ops += n
	}
	return ops, tensors
}

// maxStates is the most state tensors the optimizer keeps for one
// parameter: its states for a large matrix (16M values: past every row's
// small-tensor threshold, factored for Adafactor) or a single value.
func (r *optimizerRow) maxStates() int {
	big := ir.Tensor{Shape: []int64{4096, 4096}}
	one := ir.Tensor{Shape: []int64{1}}
	return max(len(r.states(&big, units.F32)), len(r.states(&one, units.F32)))
}

// carried adds a tensor as large as the graph tensors like that the
// previous iteration left alive; an op at the start of the program makes
// it.
func (l *lowerer) carried(name string, like []ir.TensorID, cat ir.Category) ir.TensorID {
	var b units.Bytes
	for _, t := range like {
		b += l.g.Tensors[t].Bytes
	}
	id := l.add(ir.Tensor{Name: name, Shape: []int64{int64(b)}, DType: units.U8, Bytes: b, Base: ir.NoTensor, Cat: cat, Carried: true})
	l.p.Ops = append(l.p.Ops, ir.Op{Name: name, Phase: ir.Forward, Out: []ir.TensorID{id}, Node: -1})
	return id
}

// trainable lists the graph's parameters that take a gradient.
func (l *lowerer) trainable() []ir.TensorID {
	var out []ir.TensorID
	for _, p := range l.g.Params {
		if l.g.Tensors[p].RequiresGrad {
			out = append(out, p)
		}
	}
	return out
}

// insertAfterLastWrite inserts op after the last op from start on that
// writes any of ts (at the end when none does).
func (l *lowerer) insertAfterLastWrite(start int, ts []ir.TensorID, op ir.Op) {
	at := len(l.p.Ops)
	for i := len(l.p.Ops) - 1; i >= start; i-- {
		if slices.ContainsFunc(l.p.Ops[i].Out, func(t ir.TensorID) bool { return slices.Contains(ts, t) }) {
			at = i + 1
			break
		}
	}
	l.p.Ops = slices.Insert(l.p.Ops, at, op)
}

// ErrInBackwardAccum refuses an optimizer step inside backward with
// gradient accumulation (torchtune raises the same: the step would run
// before the accumulated gradient exists).
var ErrInBackwardAccum = errors.New("an optimizer step inside backward cannot accumulate gradients (accumulation must be 1)")

// stepsInBackward moves each parameter's optimizer step (and the zero_grad
// that frees its gradient) to right after the last backward op, from start
// on, that writes or accumulates its gradient: the post-accumulate-grad hook
// fires once autograd has summed every contribution to the leaf.
func (l *lowerer) stepsInBackward(c TrainConfig, start int, pgrad map[ir.TensorID]ir.TensorID) {
	bwd := slices.Clone(l.p.Ops[start:])
	l.p.Ops = l.p.Ops[:start]
	last := map[ir.TensorID]int{} // gradient → index in bwd of its last writer or reader
	for i := range bwd {
		for _, t := range append(slices.Clone(bwd[i].In), bwd[i].Out...) {
			last[t] = i
		}
	}
	after := map[int][]ir.TensorID{} // bwd index → parameters stepped after it
	for _, pid := range l.p.Params {
		if g, ok := pgrad[pid]; ok {
			if i, seen := last[g]; seen {
				after[i] = append(after[i], pid)
			}
		}
	}
	for i := range bwd {
		l.p.Ops = append(l.p.Ops, bwd[i])
		for _, pid := range after[i] {
			n := len(l.p.Ops)
			l.optimizer(c, map[ir.TensorID]ir.TensorID{pid: pgrad[pid]})
			for j := n; j < len(l.p.Ops); j++ {
				l.p.Ops[j].Phase = ir.Backward
				l.p.Ops[j].Micro = bwd[i].Micro
			}
		}
	}
}

// workspace adds a thread's library workspace: resident in steady state,
// allocated where the thread first runs a matmul in the first iteration.
func (l *lowerer) workspace(size units.Bytes, phase ir.Phase, thread string, first bool) {
	if size <= 0 {
		return
	}
	t := ir.Tensor{Name: "cublas_workspace(" + thread + ")", Shape: []int64{int64(size)}, DType: units.U8, Bytes: size, Base: ir.NoTensor, Cat: ir.Other}
	if !first {
		t.Resident = true
		l.add(t)
		return
	}
	t.Keep = true
	l.p.Ops = append(l.p.Ops, ir.Op{Name: "cublas_workspace", Phase: phase, Out: []ir.TensorID{l.add(t)}, Node: -1})
}

// Infer lowers g into one forward pass without autograd.
func Infer(g *ir.Graph) (*ir.Program, error) { return InferWith(g, 0) }

// InferWith is Infer with the main thread's library workspace (resident).
func InferWith(g *ir.Graph, workspace units.Bytes) (*ir.Program, error) {
	for i := range g.Nodes {
		if len(g.Nodes[i].Saved) > 0 {
			return nil, fmt.Errorf("inference graph node %d (%s) saves tensors; build it with Training=false", i, g.Nodes[i].Kind)
		}
	}
	l := newLowerer(g)
	l.p.MicroBatches = 1
	l.workspace(workspace, ir.Forward, "main thread", false)
	l.forward(l.instance(0), 0)
	return l.p, nil
}

// state is one optimizer-state tensor to create for a parameter.
type state struct {
	name  string
	dt    units.DType
	numel int64
	shape []int64
}

// OptimizerStep appends the optimizer step and zero_grad of c to p, for the
// parameters in p.Params whose gradient is in grads (parameter → gradient
// tensor). Importers of recorded traces use it to swap the optimizer.
func OptimizerStep(p *ir.Program, grads map[ir.TensorID]ir.TensorID, c TrainConfig) {
	c.defaults()
	l := &lowerer{p: p}
	l.optimizer(c, grads)
}

func (c *TrainConfig) defaults() {
	if c.Accum <= 0 {
		c.Accum = 1
	}
	if c.WeightDecay < 0 {
		c.WeightDecay = c.Optimizer.DefaultWeightDecay()
	}
	c.Impl = c.Optimizer.Planned(c.Impl)
}

// optimizer appends the optimizer step and zero_grad. Its phases: register every trained parameter with its
// float32 master and its state tensors (addMaster, addState), write the update in the configured implementation
// (multiTensorUpdate for foreach and fused, perParamUpdate for the single-tensor loop), then copy the masters back
// into the parameters and drop the gradients.
func (l *lowerer) optimizer(c TrainConfig, pgrad map[ir.TensorID]ir.TensorID) {
	row := c.Optimizer.row()
	s := &step{l: l, row: row, wd: c.WeightDecay}
	m := &masterSet{}
	init := ir.Op{Name: "optimizer.init_state", Phase: ir.Optimizer, Node: -1}
	lazy := c.FirstStep && !row.eager
	for _, pid := range l.p.Params {
		gid, ok := pgrad[pid]
		if !ok {
			continue // frozen or unused
		}
		s.params = append(s.params, pid)
		s.grads = append(s.grads, gid)
		dt := l.addMaster(c, s, m, pid, gid)
		l.addState(c, s, pid, dt, lazy, &init)
		s.stateEnd = append(s.stateEnd, int32(len(s.all)))
	}
	if len(s.params) == 0 {
		return
	}
	if len(init.Out) > 0 {
		l.p.Ops = append(l.p.Ops, init)
	}
	l.update(c, s, m)
	if len(m.lowPrec) > 0 {
		s.emit("_foreach_copy_(params, master_params)", cat(m.lowPrec, m.master32), nil, 0)
	}
	if c.ZeroGrad == ZeroToNone {
		s.emit("zero_grad(set_to_none=True)", s.grads, nil, 0)
	}
}

// update writes the step in the configured implementation, one the optimizer has (defaults: Planned).
func (l *lowerer) update(c TrainConfig, s *step, m *masterSet) {
	switch c.Impl {
	case Foreach, Fused:
		l.multiTensorUpdate(s, m, c.Impl == Fused, c.Optimizer.String())
	case Single:
		l.perParamUpdate(s, c.Optimizer.String())
	}
}

// masterSet is what the optimizer keeps for parameters with a float32 master: the parameters, their gradients,
// the masters, and the bytes of those gradients upcast to float32.
type masterSet struct {
	lowPrec, lowGrads, master32 []ir.TensorID
	gradBytes32                 units.Bytes
}

// addMaster records the tensor the update writes for parameter pid: a float32 master when the precision keeps
// master weights and the parameter is not float32 already, else the parameter itself. It returns the dtype the
// parameter's state is sized in before any StateDType override.
func (l *lowerer) addMaster(c TrainConfig, s *step, m *masterSet, pid, gid ir.TensorID) units.DType {
	pt := l.p.Tensors[pid]
	if !c.Precision.MasterWeights() || pt.DType == units.F32 {
		// Parameters already in float32 (LoRA adapters) are their own
		// master and need no upcast gradient.
		s.weights = append(s.weights, pid)
		return pt.DType
	}
	// Master weights exist from the optimizer's construction.
	m.gradBytes32 += units.F32.Size(pt.Numel())
	mid := l.add(ir.Tensor{Name: l.names.Join(pt.Name, ".master"), Shape: l.cloneShape(pt.Shape), DType: units.F32,
		Bytes: units.F32.Size(pt.Numel()), Base: ir.NoTensor, Cat: ir.OptimizerState, Resident: true})
	s.weights = append(s.weights, mid)
	m.lowPrec = append(m.lowPrec, pid)
	m.lowGrads = append(m.lowGrads, gid)
	m.master32 = append(m.master32, mid)
	return units.F32
}

// addState adds parameter pid's optimizer state: resident from before the iteration, or, on a lazy optimizer's
// first step, kept from the init_state op that creates it.
func (l *lowerer) addState(c TrainConfig, s *step, pid ir.TensorID, dt units.DType, lazy bool, init *ir.Op) {
	// A pointer, not a copy that would escape to the heap through states:
	// the adds below never move Tensors (reserve), and an array they
	// moved would still hold the parameter.
	pt := &l.p.Tensors[pid]
	if c.StateDType != units.Invalid {
		dt = c.StateDType
	}
	for _, st := range s.row.states(pt, dt) {
		// bitsandbytes pages only tensors of at least 1e5 values
		// (optim/optimizer.py @0.41.1 get_state_buffer); smaller
		// state is an ordinary torch allocation.
		paged := c.PagedState && pt.Numel() >= 100000
		t := ir.Tensor{Name: l.names.Join(pt.Name, ".", st.name), Shape: l.cloneShape(st.shape), DType: st.dt, Bytes: st.dt.Size(st.numel), Base: ir.NoTensor, Cat: ir.OptimizerState, Host: paged}
		if lazy {
			t.Keep = true
		} else {
			t.Resident = true
		}
		id := l.add(t)
		s.all = append(s.all, id)
		if lazy {
			init.Out = append(init.Out, id)
		}
	}
}

// multiTensorUpdate writes a foreach or fused step over every parameter at once; the gradients of parameters with
// a float32 master are first upcast into one float32 buffer.
func (l *lowerer) multiTensorUpdate(s *step, m *masterSet, fused bool, name string) {
	s.g = s.grads
	if m.gradBytes32 > 0 {
		// Gradients are upcast to float32 for the update of the
		// master weights, all at once for a multi-tensor step.
		g32 := l.add(ir.Tensor{Name: "grads.float32", Shape: []int64{int64(m.gradBytes32 / 4)}, DType: units.F32, Bytes: m.gradBytes32, Base: ir.NoTensor, Cat: ir.Temporary})
		s.emit("_foreach_copy_(grads_fp32, grads)", m.lowGrads, []ir.TensorID{g32}, 0)
		s.g = []ir.TensorID{g32}
		for i, pid := range s.params {
			if s.weights[i] == pid {
				s.g = append(s.g, s.grads[i])
			}
		}
	}
	if fused {
		s.emit("_fused_"+name+"_", cat(s.weights, s.g, s.all), nil, 0)
		return
	}
	s.row.foreach(s)
}

// perParamUpdate writes one step op per parameter, each with the workspace of its own upcast gradient and of what
// the optimizer's single-tensor step allocates.
func (l *lowerer) perParamUpdate(s *step, name string) {
	for i, pid := range s.params {
		pt := &l.p.Tensors[pid]
		w := s.weights[i]
		in := cat([]ir.TensorID{w, s.grads[i]}, s.stateOf(i))
		var ws units.Bytes
		if w != pid {
			ws += units.F32.Size(pt.Numel()) // grad.float()
		}
		if s.row.single != nil {
			ws += s.row.single(s, i)
		}
		l.p.Ops = append(l.p.Ops, ir.Op{Name: name + ".step", Module: pt.Name, Phase: ir.Optimizer, In: in, Workspace: ws, Node: -1})
	}
}
