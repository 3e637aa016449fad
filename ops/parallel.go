package ops

import (
	"github.com/memplan/memplan/ir"
	"github.com/memplan/memplan/units"
)

// FrozenParam registers a parameter that takes no gradient (a LoRA base
// weight, a frozen norm or embedding): it is still a resident Parameter, in
// the parameter dtype, but RequiresGrad is false, so autograd gives it no
// gradient and the optimizer no state.
func (b *Builder) FrozenParam(name string, shape ...int64) ir.TensorID {
	return b.TypedFrozenParam(name, b.cfg.Precision.ParamDType(), shape...)
}

// TypedFrozenParam is FrozenParam in an explicit dtype (units.NF4 for a
// QLoRA base weight).
func (b *Builder) TypedFrozenParam(name string, dt units.DType, shape ...int64) ir.TensorID {
	id := b.newTensor(ir.Tensor{Name: b.qual(name), Shape: shape, DType: dt, Base: ir.NoTensor, Cat: ir.Parameter, Resident: true})
	b.g.Params = append(b.g.Params, id)
	b.isParam[id] = true
	return id
}

// TypedParam registers a trainable parameter in an explicit dtype (LoRA
// adapters that peft keeps in float32 over a 16-bit base model).
func (b *Builder) TypedParam(name string, dt units.DType, shape ...int64) ir.TensorID {
	id := b.newTensor(ir.Tensor{Name: b.qual(name), Shape: shape, DType: dt, Base: ir.NoTensor, Cat: ir.Parameter, Resident: true, RequiresGrad: b.cfg.Training})
	b.g.Params = append(b.g.Params, id)
	b.isParam[id] = true
	return id
}

// QuantState registers quantization constants (absmax blocks) of a
// quantized weight: resident, counted in the Parameter ledger line, but kept
// out of Graph.Params (they are not parameters of the checkpoint, so
// parameter counts stay exact) — they are listed with the buffers.
func (b *Builder) QuantState(name string, dt units.DType, shape ...int64) ir.TensorID {
	id := b.newTensor(ir.Tensor{Name: b.qual(name), Shape: shape, DType: dt, Base: ir.NoTensor, Cat: ir.Parameter, Resident: true})
	b.g.Buffers = append(b.g.Buffers, id)
	return id
}

// Collective appends a communication node of rule kind (tp_copy,
// tp_all_reduce, tp_all_gather, sp_all_gather, sp_reduce_scatter, sp_split,
// all_to_all). For view rules (tp_copy, tp_all_reduce) the output aliases x
// and shape is ignored; otherwise the output is a new storage of the given
// shape in x's dtype. comm runs in the forward, bwd in the backward (either
// may be nil).
func (b *Builder) Collective(kind, name string, x ir.TensorID, shape []int64, comm, bwd *ir.Comm) ir.TensorID {
	r := Table[kind]
	o := out{name: name, dt: b.g.Tensors[x].DType, view: ir.NoTensor}
	if r.View {
		o.view = x
		o.shape = b.Shape(x)
	} else {
		o.shape = append([]int64(nil), shape...)
	}
	y := b.node(kind, []ir.TensorID{x}, []out{o}, 0)[0]
	n := b.last()
	n.Comm, n.BwdComm = comm, bwd
	if !r.View {
		n.MemBytes = float64(b.g.Tensors[x].Bytes) + float64(b.g.Tensors[y].Bytes)
	}
	return y
}

// SaveShard rewrites the last node, a linear over an all-gathered input,
// the way Megatron's sequence-parallel linear runs
// (LinearWithGradAccumulationAndAsyncCommunication): it saves the sharded
// input instead of the gathered one and all-gathers it again in backward, so
// the backward holds a workspace of the full input and runs gather. Nothing
// changes when the linear saved no input (a frozen weight needs no weight
// gradient, so no re-gather).
func (b *Builder) SaveShard(shard ir.TensorID, gather *ir.Comm) {
	n := b.last()
	full := n.In[0]
	for i, s := range n.Saved {
		if s == full {
			n.Saved[i] = shard
			n.BwdWorkspace += b.g.Tensors[full].DType.Size(b.g.Tensors[full].Numel())
			n.BwdComm = gather
			return
		}
	}
}

// LinearNF4 is bitsandbytes' Linear4bit forward (MatMul4Bit): x is cast to
// the compute dtype cdt, the NF4 weight w [out, in] is dequantised with its
// absmax constants into a temporary of the full weight in cdt (the node's
// workspace, freed after the matmul) and multiplied. Backward dequantises the
// weight again (a backward workspace of the same size) to form the input
// gradient; the frozen weight takes no gradient. bias may be NoTensor.
// nested may be NoTensor (no double quantisation). o says how the installed
// bitsandbytes behaves.
func (b *Builder) LinearNF4(name string, x, w, absmax, nested, bias ir.TensorID, cdt units.DType, o NF4) ir.TensorID {
	x = b.To(x, cdt)
	ins := []ir.TensorID{x, w, absmax}
	if nested != ir.NoTensor {
		ins = append(ins, nested)
	}
	if bias != ir.NoTensor {
		ins = append(ins, b.cast(bias, cdt))
	}
	kind := "linear_4bit"
	if o.SavesInput {
		kind = "linear_4bit_saves_input"
	}
	xs, ws := b.g.Tensors[x].Shape, b.g.Tensors[w].Shape
	rows := numel(xs) / lastDim(xs)
	flops := 2 * float64(rows) * float64(ws[0]) * float64(ws[1])
	y := b.node(kind, ins, []out{{name: name, dt: cdt, shape: b.withLast(xs, ws[0]), view: ir.NoTensor}}, flops)[0]
	n := b.last()
	deq := cdt.Size(numel(ws))
	if o.DequantCopy {
		deq *= 2
	}
	n.Workspace = deq
	n.BwdWorkspace = deq
	n.NoGrad = []int{1, 2}
	if nested != ir.NoTensor {
		n.NoGrad = append(n.NoGrad, 3)
	}
	n.MemBytes += float64(deq)
	return y
}

// NF4 is how a bitsandbytes 4-bit linear behaves.
type NF4 struct {
	// SavesInput: bitsandbytes <= 0.43.2 saved every 4-bit linear's input
	// for backward (MatMul4Bit ctx.tensors = (A, B) whenever an input needs
	// grad; fixed by bitsandbytes #1270 in 0.43.3).
	SavesInput bool
	// DequantCopy: the weight was quantised from a float16 copy, so
	// dequantize_4bit returns float16 and .to(A.dtype) makes a second full
	// copy in the compute dtype (Lightning's BitsandbytesPrecision: weight
	// .to(torch.half) before quantize_4bit; MatMul4Bit.forward
	// dequantize_4bit(B, state).to(A.dtype)).
	DequantCopy bool
}

// VocabParallelCrossEntropy is Megatron's vocab_parallel_cross_entropy over
// float32 logits [..., V/t] sharded by vocabulary: the max, the predicted
// logit and the sum of exponentials are all-reduced over the tensor-parallel
// group (comm, [tokens] floats each), the softmax is computed in place in the
// logits' storage and saved with the target mask (bool) and the masked
// targets (int64). It returns the scalar loss and marks it as the graph's
// loss.
func (b *Builder) VocabParallelCrossEntropy(name string, logits, labels ir.TensorID, comm *ir.Comm) ir.TensorID {
	ls := b.Shape(logits)
	tokens := numel(ls) / lastDim(ls)
	outs := b.node("vocab_parallel_cross_entropy", []ir.TensorID{logits, labels}, []out{
		{name: name, dt: units.F32, shape: []int64{}, view: ir.NoTensor},
		{name: name + ".softmax", dt: b.g.Tensors[logits].DType, shape: ls, view: logits, noGrad: true},
		{name: name + ".target_mask", dt: units.Bool, shape: []int64{tokens}, view: ir.NoTensor, noGrad: true},
		{name: name + ".masked_target", dt: units.I64, shape: []int64{tokens}, view: ir.NoTensor, noGrad: true},
	}, 4*float64(numel(ls)))
	n := b.last()
	n.NoGrad = []int{1}
	n.Comm = comm
	b.g.Loss = outs[0]
	return outs[0]
}

// ToAs is To with an explicit output name (a cast in model code, such as
// peft's x.to(lora_A.weight.dtype)).
func (b *Builder) ToAs(name string, x ir.TensorID, dt units.DType) ir.TensorID {
	if b.g.Tensors[x].DType == dt {
		return x
	}
	shape := b.Shape(x)
	y := b.node("to_copy", []ir.TensorID{x}, []out{{name: name, dt: dt, shape: shape, view: ir.NoTensor}}, 0)[0]
	b.last().MemBytes = float64(b.g.Tensors[x].DType.Size(numel(shape)) + dt.Size(numel(shape)))
	return y
}
