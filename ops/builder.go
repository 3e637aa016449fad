package ops

import (
	"fmt"
	"slices"
	"strings"

	"github.com/memplan/memplan/internal/chunk"
	"github.com/memplan/memplan/ir"
	"github.com/memplan/memplan/units"
)

// Precision is the numeric recipe of a run: an index into the precisions
// table, whose rows say where parameters, gradients and optimizer state live
// and what autocast computes in. Adding a precision policy is one row.
type Precision uint8

const (
	// FP32: float32 parameters and activations.
	FP32 Precision = iota
	// AMPBF16 / AMPFP16: float32 parameters under torch.autocast.
	AMPBF16
	AMPFP16
	// BF16 / FP16: 16-bit parameters and activations with float32 master
	// weights kept by the optimizer (Megatron-LM / DeepSpeed style).
	BF16
	FP16
	// PureBF16 / PureFP16: parameters, gradients and optimizer state all in
	// 16 bits, no master copy (litgpt bf16-true, torchtune dtype: bf16).
	PureBF16
	PureFP16
	// AutocastBF16: bfloat16 parameters, gradients and optimizer state
	// under torch.autocast(bfloat16): a 16-bit checkpoint trained as loaded
	// with transformers' bf16=True (5.x loads the checkpoint's dtype); only
	// what is float32 (peft's adapters, their inputs) is cast per op.
	AutocastBF16
)

// precisionRow is one precision policy.
type precisionRow struct {
	name     string
	param    units.DType // parameters (and so gradients) are stored in
	autocast units.DType // torch.autocast's lower dtype, or Invalid
	master   bool        // the optimizer keeps float32 master weights (and state)
	doc      string
}

var precisions = []precisionRow{
	FP32:         {"fp32", units.F32, units.Invalid, false, "float32 parameters, activations, gradients and optimizer state"},
	AMPBF16:      {"amp-bf16", units.F32, units.BF16, false, "torch.autocast(bfloat16): float32 parameters and state, per-op casts"},
	AMPFP16:      {"amp-fp16", units.F32, units.F16, false, "torch.autocast(float16) + GradScaler: float32 parameters and state, per-op casts"},
	BF16:         {"bf16", units.BF16, units.Invalid, true, "bfloat16 parameters and activations, float32 master weights and optimizer state (Megatron-LM, DeepSpeed)"},
	FP16:         {"fp16", units.F16, units.Invalid, true, "float16 parameters and activations, float32 master weights and optimizer state"},
	PureBF16:     {"pure-bf16", units.BF16, units.Invalid, false, "bfloat16 parameters, gradients and optimizer state, no master copy (litgpt bf16-true, torchtune dtype: bf16)"},
	PureFP16:     {"pure-fp16", units.F16, units.Invalid, false, "float16 parameters, gradients and optimizer state, no master copy (litgpt 16-true)"},
	AutocastBF16: {"autocast-bf16", units.BF16, units.BF16, false, "bfloat16 parameters, gradients and optimizer state under torch.autocast(bfloat16): a bfloat16 checkpoint trained with transformers' bf16=True; float32 adapters cast per op"},
}

// precisionAliases are the frameworks' own names for rows above.
var precisionAliases = map[string]Precision{"bf16-true": PureBF16, "16-true": PureFP16, "fp16-true": PureFP16, "bf16-mixed": AMPBF16, "16-mixed": AMPFP16, "32-true": FP32, "32": FP32}

func (p Precision) row() precisionRow {
	if int(p) < len(precisions) {
		return precisions[p]
	}
	return precisionRow{name: fmt.Sprintf("precision(%d)", p), param: units.F32, autocast: units.Invalid}
}

func (p Precision) String() string { return p.row().name }

// Doc says what the precision keeps where.
func (p Precision) Doc() string { return p.row().doc }

// ParsePrecision reads a precision name (PrecisionNames) or a framework's
// alias for one (litgpt's bf16-true, bf16-mixed, 16-true, ...).
func ParsePrecision(s string) (Precision, error) {
	t := strings.ToLower(strings.TrimSpace(s))
	for i, r := range precisions {
		if t == r.name {
			return Precision(i), nil
		}
	}
	if p, ok := precisionAliases[t]; ok {
		return p, nil
	}
	return 0, fmt.Errorf("unknown precision %q (want one of %s)", s, strings.Join(PrecisionNames(), ", "))
}

// PrecisionNames lists the accepted precision names.
func PrecisionNames() []string {
	out := make([]string, len(precisions))
	for i, r := range precisions {
		out[i] = r.name
	}
	return out
}

// Precisions lists every precision policy.
func Precisions() []Precision {
	out := make([]Precision, len(precisions))
	for i := range precisions {
		out[i] = Precision(i)
	}
	return out
}

// ParamDType is the dtype parameters are stored in.
func (p Precision) ParamDType() units.DType { return p.row().param }

// AutocastDType is the lower-precision dtype of autocast, or Invalid when the
// precision does not autocast.
func (p Precision) AutocastDType() units.DType { return p.row().autocast }

// MasterWeights reports whether the optimizer keeps float32 master copies.
func (p Precision) MasterWeights() bool { return p.row().master }

// Device selects device-specific kernel behaviour.
type Device uint8

const (
	// CUDA kernels (the default): dropout keeps a bool mask.
	CUDA Device = iota
	// CPU kernels: dropout keeps its mask in the input dtype (REFERENCE.md,
	// checked on Debian's torch 1.13).
	CPU
)

// Config of a Builder. The zero value is fp32, CUDA, inference.
type Config struct {
	Precision Precision
	Device    Device
	// Training turns on autograd's saved tensors and dropout.
	Training bool
}

// Builder writes a forward ir.Graph. It is not safe for concurrent use.
type Builder struct {
	cfg Config
	g   *ir.Graph
	// module is the current module path ("model.layers.3.mlp"): built
	// once per Enter, not per node (every node and tensor name carries it;
	// deepseek-v3 builds 470,000 nodes in a few thousand modules).
	module   string
	castMemo map[ir.TensorID]ir.TensorID
	isParam  map[ir.TensorID]bool
	// autocasting is set while autocast's policy (not model code) casts.
	autocasting bool
	// Operand lists, shapes and names cut from shared chunks: deepseek-v3's
	// graph is 2.2 million small allocations one by one.
	ids    chunk.Slices[ir.TensorID]
	shapes chunk.Slices[int64]
	ints   chunk.Slices[int]
	names  chunk.Strings
}

// NewBuilder starts an empty graph.
func NewBuilder(cfg Config) *Builder {
	return &Builder{cfg: cfg, g: &ir.Graph{Loss: ir.NoTensor}, castMemo: map[ir.TensorID]ir.TensorID{}, isParam: map[ir.TensorID]bool{}}
}

// Reserve makes room for about nodes more nodes and tensors more tensors,
// so a builder that knows its model's size does not grow its lists by
// doubling.
func (b *Builder) Reserve(nodes, tensors int) {
	b.g.Nodes = slices.Grow(b.g.Nodes, nodes)
	b.g.Tensors = slices.Grow(b.g.Tensors, tensors)
}

// Config returns the builder's configuration.
func (b *Builder) Config() Config { return b.cfg }

// Graph returns the graph written so far.
func (b *Builder) Graph() *ir.Graph { return b.g }

// Tensor returns a tensor of the graph.
func (b *Builder) Tensor(t ir.TensorID) *ir.Tensor { return &b.g.Tensors[t] }

// Shape returns a copy of t's shape.
func (b *Builder) Shape(t ir.TensorID) []int64 {
	return append([]int64(nil), b.g.Tensors[t].Shape...)
}

// Enter pushes a module scope ("layers", "3", ...) and returns its pop.
func (b *Builder) Enter(name string) func() {
	outer := b.module
	if outer == "" {
		b.module = name
	} else {
		b.module = b.names.Join(outer, ".", name)
	}
	return func() { b.module = outer }
}

// Module is the current module path.
func (b *Builder) Module() string { return b.module }

func (b *Builder) qual(name string) string {
	if m := b.Module(); m != "" {
		return b.names.Join(m, ".", name)
	}
	return name
}

// ActDType is the dtype of activations outside autocast casts.
func (b *Builder) ActDType() units.DType { return b.cfg.Precision.ParamDType() }

func (b *Builder) newTensor(t ir.Tensor) ir.TensorID {
	if t.Base == 0 && t.Bytes == 0 {
		t.Base = ir.NoTensor
	}
	if t.Base == ir.NoTensor {
		t.Bytes = t.DType.Size(t.Numel())
	}
	b.g.Tensors = append(b.g.Tensors, t)
	return ir.TensorID(len(b.g.Tensors) - 1)
}

// Param registers a trainable parameter of the current module.
func (b *Builder) Param(name string, shape ...int64) ir.TensorID {
	id := b.newTensor(ir.Tensor{Name: b.qual(name), Shape: shape, DType: b.cfg.Precision.ParamDType(), Base: ir.NoTensor,
		Cat: ir.Parameter, Resident: true, RequiresGrad: b.cfg.Training})
	b.g.Params = append(b.g.Params, id)
	b.isParam[id] = true
	return id
}

// Input registers a batch input. batch marks that its first dimension is
// the micro-batch.
func (b *Builder) Input(name string, dt units.DType, shape ...int64) ir.TensorID {
	id := b.newTensor(ir.Tensor{Name: name, Shape: shape, DType: dt, Base: ir.NoTensor, Cat: ir.Other, Resident: true, Batch: true})
	b.g.Inputs = append(b.g.Inputs, id)
	return id
}

// Buffer registers a resident non-trainable tensor (masks, tables).
func (b *Builder) Buffer(name string, dt units.DType, shape ...int64) ir.TensorID {
	id := b.newTensor(ir.Tensor{Name: b.qual(name), Shape: shape, DType: dt, Base: ir.NoTensor, Cat: ir.Other, Resident: true})
	b.g.Buffers = append(b.g.Buffers, id)
	return id
}

// out describes one output of a node.
type out struct {
	name   string
	dt     units.DType
	shape  []int64
	view   ir.TensorID // NoTensor: owns storage
	noGrad bool
}

func numel(shape []int64) int64 {
	n := int64(1)
	for _, d := range shape {
		n *= d
	}
	return n
}

func (b *Builder) requiresGrad(in []ir.TensorID) bool {
	if !b.cfg.Training {
		return false
	}
	for _, t := range in {
		if b.g.Tensors[t].RequiresGrad {
			return true
		}
	}
	return false
}

// node appends a node of rule kind and returns its outputs.
func (b *Builder) node(kind string, in []ir.TensorID, outs []out, flops float64) []ir.TensorID {
	r, ok := Table[kind]
	if !ok {
		panic("no rule for " + kind) // programmer error: builders use table names
	}
	rg := b.requiresGrad(in)
	batch := false
	for _, t := range in {
		batch = batch || b.g.Tensors[t].Batch
	}
	// One backing array for the node's inputs, outputs and saved tensors
	// (each a full slice expression: an append past it copies), not three.
	ni, no := len(in), len(outs)
	ids := b.ids.Make(ni + no + len(r.SaveIn) + len(r.SaveOut))
	copy(ids, in)
	n := ir.Node{Kind: kind, Module: b.module, FLOPs: flops}
	if ni > 0 {
		n.In = ids[:ni:ni]
	}
	n.Out = ids[ni : ni : ni+no]
	var mem float64
	for _, t := range in {
		mem += float64(b.g.Tensors[t].DType.Size(b.g.Tensors[t].Numel()))
	}
	for i, o := range outs {
		t := ir.Tensor{Name: b.qual(o.name), Shape: o.shape, DType: o.dt, Base: o.view, Cat: ir.Temporary,
			RequiresGrad: rg && !o.noGrad && (i == 0 || !r.View), Batch: batch && len(o.shape) > 0}
		if o.view != ir.NoTensor {
			t.Cat = b.g.Tensors[o.view].Cat
		}
		id := b.newTensor(t)
		n.Out = append(n.Out, id)
		mem += float64(o.dt.Size(numel(o.shape)))
	}
	if r.View {
		mem = 0 // a view launches no kernel
	}
	n.MemBytes = mem
	n.BwdFLOPs = flops * r.BwdFactor
	if r.SaveInIfOtherGrad && r.BwdFactor == 2 && len(in) >= 2 {
		// A matmul's backward computes one product per operand that needs a
		// gradient: dX = dY·Wᵀ and dW = dYᵀ·X. A frozen weight (LoRA base)
		// halves it.
		k := 0
		for _, t := range in[:2] {
			if b.g.Tensors[t].RequiresGrad {
				k++
			}
		}
		n.BwdFLOPs = flops * float64(k)
	}
	n.GradAliases = r.View
	if b.cfg.Training && rg {
		for _, i := range r.SaveIn {
			if i >= len(in) {
				continue
			}
			if r.SaveInIfOtherGrad && i < 2 && len(in) >= 2 && !(b.cfg.Training && b.g.Tensors[in[1-i]].RequiresGrad) {
				continue
			}
			n.Saved = appendSaved(n.Saved, ids[ni+no:ni+no], in[i])
		}
		for _, i := range r.SaveOut {
			if i < len(n.Out) {
				n.Saved = appendSaved(n.Saved, ids[ni+no:ni+no], n.Out[i])
			}
		}
	}
	if len(n.Out) == 0 {
		n.Out = nil
	}
	b.g.Nodes = append(b.g.Nodes, n)
	return n.Out
}

// appendSaved appends t to saved, starting it in room (the node's shared
// backing array) when it is still empty.
func appendSaved(saved, room []ir.TensorID, t ir.TensorID) []ir.TensorID {
	if saved == nil {
		saved = room
	}
	return append(saved, t)
}

func (b *Builder) last() *ir.Node { return &b.g.Nodes[len(b.g.Nodes)-1] }

func isFloat(dt units.DType) bool { return dt == units.F32 || dt == units.F16 || dt == units.BF16 }

// cast returns x in dtype dt, adding an autocast copy when needed. Casts of
// parameters are reused within the forward pass.
func (b *Builder) cast(x ir.TensorID, dt units.DType) ir.TensorID {
	t := &b.g.Tensors[x]
	if t.DType == dt || !isFloat(t.DType) {
		return x
	}
	if c, ok := b.castMemo[x]; ok && b.g.Tensors[c].DType == dt {
		return c
	}
	shape := b.shapes.Clone(t.Shape)
	name := t.Name
	if m := b.module; len(name) > len(m) && name[len(m)] == '.' && strings.HasPrefix(name, m) {
		name = name[len(m)+1:]
	}
	cached := b.autocastCaches(x, dt)
	y := b.node("to_copy", b.ids.One(x), []out{{name: name + "." + dt.String(), dt: dt, shape: shape, view: ir.NoTensor}}, 0)[0]
	b.last().MemBytes = float64(t.DType.Size(t.Numel()) + dt.Size(t.Numel()))
	b.g.Tensors[y].AutocastCached = cached
	if b.isParam[x] {
		b.castMemo[x] = y
	}
	return y
}

// autocastCaches reports whether autocast's weight cache keeps the cast of
// x to dt until the outermost autocast region exits: a cast to the
// region's lower dtype of a float32 leaf that requires grad and is no view
// (pytorch/pytorch@008ec6b1 aten/src/ATen/autocast_mode.cpp, cached_cast:
// can_try_cache = to_type == lower_precision_fp && arg is kFloat &&
// arg.requires_grad() && arg.is_leaf() && !arg.is_view() && cache_enabled).
// Frozen parameters (LoRA and QLoRA bases) and casts written in model code
// (To) are not cached. Inference graphs, whose parameters the builder does
// not mark as requiring grad, get none.
func (b *Builder) autocastCaches(x ir.TensorID, dt units.DType) bool {
	t := &b.g.Tensors[x]
	return b.autocasting && b.isParam[x] && t.RequiresGrad && t.Base == ir.NoTensor && t.DType == units.F32 &&
		dt == b.cfg.Precision.AutocastDType()
}

// autocast applies the cast policy of kind to the floating inputs and returns
// the inputs to use and the op's compute dtype.
func (b *Builder) autocast(kind string, in ...ir.TensorID) ([]ir.TensorID, units.DType) {
	r := Table[kind]
	low := b.cfg.Precision.AutocastDType()
	res := b.ids.Clone(in)
	dt := b.g.Tensors[in[0]].DType
	b.autocasting = true
	defer func() { b.autocasting = false }()
	switch {
	case low != units.Invalid && r.Cast == Lower:
		for i, x := range res {
			res[i] = b.cast(x, low)
		}
		dt = low
	case low != units.Invalid && r.Cast == CastFP32:
		for i, x := range res {
			res[i] = b.cast(x, units.F32)
		}
		dt = units.F32
	case r.Cast == Promote:
		for _, x := range in {
			if xd := b.g.Tensors[x].DType; isFloat(xd) && xd.Bits() > dt.Bits() || !isFloat(dt) {
				dt = xd
			}
		}
	}
	return res, dt
}

func lastDim(shape []int64) int64 { return shape[len(shape)-1] }

// withLast is a copy of shape with its last dimension d.
func (b *Builder) withLast(shape []int64, d int64) []int64 {
	s := b.shapes.Clone(shape)
	s[len(s)-1] = d
	return s
}

// Linear is torch.nn.functional.linear(x, w, bias); bias may be NoTensor.
func (b *Builder) Linear(name string, x, w, bias ir.TensorID) ir.TensorID {
	ins := []ir.TensorID{x, w}
	if bias != ir.NoTensor {
		ins = append(ins, bias)
	}
	ins, dt := b.autocast("linear", ins...)
	xs, ws := b.g.Tensors[ins[0]].Shape, b.g.Tensors[ins[1]].Shape
	rows := numel(xs) / lastDim(xs)
	flops := 2 * float64(rows) * float64(ws[0]) * float64(ws[1])
	return b.node("linear", ins, []out{{name: name, dt: dt, shape: b.withLast(xs, ws[0]), view: ir.NoTensor}}, flops)[0]
}

// MatMul is a batched matmul a[..., m, k] @ c[..., k, n]. Inputs must be
// contiguous; permuted inputs need Copy first, as PyTorch's matmul makes them.
func (b *Builder) MatMul(name string, a, c ir.TensorID) ir.TensorID {
	ins, dt := b.autocast("matmul", a, c)
	as, cs := b.g.Tensors[ins[0]].Shape, b.g.Tensors[ins[1]].Shape
	m, k, n := as[len(as)-2], as[len(as)-1], cs[len(cs)-1]
	batch := numel(as) / (m * k)
	shape := append(append([]int64(nil), as[:len(as)-2]...), m, n)
	return b.node("matmul", ins, []out{{name: name, dt: dt, shape: shape, view: ir.NoTensor}}, 2*float64(batch)*float64(m)*float64(k)*float64(n))[0]
}

// Conv2d with a square kernel, stride and no padding (patch embeddings).
func (b *Builder) Conv2d(name string, x, w, bias ir.TensorID, stride int64) ir.TensorID {
	ins := []ir.TensorID{x, w}
	if bias != ir.NoTensor {
		ins = append(ins, bias)
	}
	ins, dt := b.autocast("conv2d", ins...)
	xs, ws := b.g.Tensors[ins[0]].Shape, b.g.Tensors[ins[1]].Shape
	oh := (xs[2]-ws[2])/stride + 1
	ow := (xs[3]-ws[3])/stride + 1
	shape := []int64{xs[0], ws[0], oh, ow}
	flops := 2 * float64(numel(shape)) * float64(ws[1]) * float64(ws[2]) * float64(ws[3])
	return b.node("conv2d", ins, []out{{name: name, dt: dt, shape: shape, view: ir.NoTensor}}, flops)[0]
}

// LayerNorm over the last dimension; bias may be NoTensor.
func (b *Builder) LayerNorm(name string, x, w, bias ir.TensorID) ir.TensorID {
	ins := []ir.TensorID{x, w}
	if bias != ir.NoTensor {
		ins = append(ins, bias)
	}
	ins, dt := b.autocast("layer_norm", ins...)
	xs := b.g.Tensors[ins[0]].Shape
	stat := b.withLast(xs, 1)
	outs := b.node("layer_norm", ins, []out{
		{name: name, dt: dt, shape: append([]int64(nil), xs...), view: ir.NoTensor},
		{name: name + ".mean", dt: units.F32, shape: stat, view: ir.NoTensor, noGrad: true},
		{name: name + ".rstd", dt: units.F32, shape: append([]int64(nil), stat...), view: ir.NoTensor, noGrad: true},
	}, 8*float64(numel(xs)))
	return outs[0]
}

// RMSNorm over the last dimension (fused kernel semantics).
func (b *Builder) RMSNorm(name string, x, w ir.TensorID) ir.TensorID {
	ins, dt := b.autocast("rms_norm", x, w)
	xs := b.g.Tensors[ins[0]].Shape
	outs := b.node("rms_norm", ins, []out{
		{name: name, dt: dt, shape: append([]int64(nil), xs...), view: ir.NoTensor},
		{name: name + ".rstd", dt: units.F32, shape: b.withLast(xs, 1), view: ir.NoTensor, noGrad: true},
	}, 6*float64(numel(xs)))
	return outs[0]
}

// Unary applies an elementwise rule (gelu, silu, relu, tanh).
func (b *Builder) Unary(kind, name string, x ir.TensorID) ir.TensorID {
	ins, dt := b.autocast(kind, x)
	xs := b.g.Tensors[ins[0]].Shape
	return b.node(kind, ins, []out{{name: name, dt: dt, shape: append([]int64(nil), xs...), view: ir.NoTensor}}, 8*float64(numel(xs)))[0]
}

// Softmax over the last dimension (log=true for log_softmax).
func (b *Builder) Softmax(name string, x ir.TensorID, log bool) ir.TensorID {
	kind := "softmax"
	if log {
		kind = "log_softmax"
	}
	return b.Unary(kind, name, x)
}

// Binary is add or mul with broadcasting (either operand may be the one
// broadcast: weight * hidden in HF's RMSNorm).
func (b *Builder) Binary(kind, name string, a, c ir.TensorID) ir.TensorID {
	ins, dt := b.autocast(kind, a, c)
	as, cs := b.g.Tensors[ins[0]].Shape, b.g.Tensors[ins[1]].Shape
	shape := broadcast(as, cs)
	if shape == nil { // not broadcastable: the larger operand's
		shape = append([]int64(nil), as...)
		if numel(cs) > numel(as) {
			shape = append([]int64(nil), cs...)
		}
	}
	return b.node(kind, ins, []out{{name: name, dt: dt, shape: shape, view: ir.NoTensor}}, float64(numel(shape)))[0]
}

// broadcast is the shape of an elementwise op on shapes a and c as PyTorch
// broadcasts them (aligned on the right, a dimension of 1 stretched), nil
// when they do not broadcast. Taking the operand with more elements was
// wrong when both have as many: HF's RMSNorm multiplies weight [H] by the
// normalized [B, S, H], which at one token (micro-batch 1, a sequence of 1,
// or of TP ranks under sequence parallelism) has H elements too, and the
// result was [H]; sequence parallelism's gather then indexed its sequence
// dimension and panicked (plan --model llama-3.2-1b --tp 2 --sp --seq 2).
func broadcast(a, c []int64) []int64 {
	if len(c) > len(a) {
		a, c = c, a
	}
	out := append([]int64(nil), a...)
	off := len(a) - len(c)
	for i, d := range c {
		switch o := out[off+i]; {
		case o == d || d == 1:
		case o == 1:
			out[off+i] = d
		default:
			return nil
		}
	}
	return out
}

// Scale multiplies by a Python scalar (saves nothing).
func (b *Builder) Scale(name string, x ir.TensorID) ir.TensorID {
	xs := b.g.Tensors[x].Shape
	return b.node("mul_scalar", []ir.TensorID{x}, []out{{name: name, dt: b.g.Tensors[x].DType, shape: append([]int64(nil), xs...), view: ir.NoTensor}}, float64(numel(xs)))[0]
}

// Where is torch.where(cond, x, scalar) — masking attention scores.
func (b *Builder) Where(name string, cond, x ir.TensorID) ir.TensorID {
	xs := b.g.Tensors[x].Shape
	return b.node("where", []ir.TensorID{cond, x}, []out{{name: name, dt: b.g.Tensors[x].DType, shape: append([]int64(nil), xs...), view: ir.NoTensor}}, float64(numel(xs)))[0]
}

// Dropout with probability p. Without training or with p == 0 it is the
// identity, as nn.Dropout is in eval mode.
func (b *Builder) Dropout(name string, x ir.TensorID, p float64) ir.TensorID {
	if !b.cfg.Training || p <= 0 {
		return x
	}
	xs := b.g.Tensors[x].Shape
	mdt := units.Bool
	if b.cfg.Device == CPU {
		mdt = b.g.Tensors[x].DType
	}
	return b.node("dropout", []ir.TensorID{x}, []out{
		{name: name, dt: b.g.Tensors[x].DType, shape: append([]int64(nil), xs...), view: ir.NoTensor},
		{name: name + ".mask", dt: mdt, shape: append([]int64(nil), xs...), view: ir.NoTensor, noGrad: true},
	}, 2*float64(numel(xs)))[0]
}

// View is a view/reshape/transpose/slice of x with a new shape; it owns no
// storage.
func (b *Builder) View(name string, x ir.TensorID, shape ...int64) ir.TensorID {
	return b.node("view", []ir.TensorID{x}, []out{{name: name, dt: b.g.Tensors[x].DType, shape: shape, view: x}}, 0)[0]
}

// Copy materialises x (contiguous(), clone(), the copy matmul makes of a
// permuted operand) with the given shape (x's when nil).
func (b *Builder) Copy(name string, x ir.TensorID, shape ...int64) ir.TensorID {
	if shape == nil {
		shape = b.Shape(x)
	}
	n := b.node("copy", []ir.TensorID{x}, []out{{name: name, dt: b.g.Tensors[x].DType, shape: shape, view: ir.NoTensor}}, 0)
	b.last().MemBytes = 2 * float64(b.g.Tensors[x].Bytes)
	return n[0]
}

// Cat concatenates along dimension dim.
func (b *Builder) Cat(name string, dim int, xs ...ir.TensorID) ir.TensorID {
	ins, dt := b.autocast("cat", xs...)
	shape := b.Shape(ins[0])
	shape[dim] = 0
	for _, x := range ins {
		shape[dim] += b.g.Tensors[x].Shape[dim]
	}
	return b.node("cat", ins, []out{{name: name, dt: dt, shape: shape, view: ir.NoTensor}}, 0)[0]
}

// Embedding looks rows of w up by integer ids.
func (b *Builder) Embedding(name string, w, ids ir.TensorID) ir.TensorID {
	shape := append(b.Shape(ids), b.g.Tensors[w].Shape[1])
	return b.node("embedding", []ir.TensorID{w, ids}, []out{{name: name, dt: b.g.Tensors[w].DType, shape: shape, view: ir.NoTensor}}, 0)[0]
}

// Rope is how a model's code applies rotary position embeddings, which
// sets the dtype of the rotated tensor and the temporaries it holds.
type Rope uint8

const (
	// RopeCastBack is lit-gpt's apply_rope: the product cast back to the
	// input's dtype (roped.to(x.dtype)), about two input-sized temporaries
	// (rotate_half's cat and one product) while it runs.
	RopeCastBack Rope = iota
	// RopePromote is transformers' apply_rotary_pos_emb, q*cos +
	// rotate_half(q)*sin: mul and add follow type promotion under
	// autocast, so with float32 tables (LlamaRotaryEmbedding.forward casts
	// them to the hidden states' dtype, float32 with float32 parameters)
	// and a bfloat16 linear's q and k the rotated q and k, and the keys an
	// inference cache keeps, are float32 (sweep E, round 25: measured with
	// transformers 5.24.0 on CPU, 393,216 B of cache where bfloat16 keys
	// gave 262,144). Two output-sized temporaries.
	RopePromote
	// RopeComplex is transformers' DeepSeek-V2 apply_rotary_emb (4.57.1
	// and 5.24.0 modeling_deepseek_v2.py): x.float() viewed as complex,
	// times the complex table, view_as_real(...).type_as(x). The output
	// keeps x's dtype (measured on CPU with 5.24.0 under bfloat16 autocast:
	// the cached rotary key is bfloat16, where DeepSeek-V3's
	// apply_rotary_pos_emb caches it float32). A non-float32 x holds its
	// float32 copy and the complex product, two float32 temporaries;
	// a float32 x is its own copy and the product becomes the output.
	RopeComplex
)

// Rotary applies rotary position embeddings with shared cos/sin tables as
// code rope does (Rope).
func (b *Builder) Rotary(name string, x, cos, sin ir.TensorID, rope Rope) ir.TensorID {
	xs := b.Shape(x)
	dt := b.g.Tensors[x].DType
	if rope == RopePromote {
		_, dt = b.autocast("rotary", x, cos, sin)
	}
	work := 2 * dt.Size(numel(xs))
	if rope == RopeComplex {
		work = 0
		if dt != units.F32 {
			work = 2 * units.F32.Size(numel(xs))
		}
	}
	y := b.node("rotary", []ir.TensorID{x, cos, sin}, []out{{name: name, dt: dt, shape: xs, view: ir.NoTensor}}, 3*float64(numel(xs)))[0]
	b.last().Workspace = work
	b.last().BwdWorkspace = work
	return y
}

// SDPA is scaled_dot_product_attention on the flash/memory-efficient path:
// q [B,A,S,D], k and v [B,KV,S,D] (grouped-query attention without repeating
// k and v). Backward holds a float32 dq accumulator and softmax_d
// (flash-attention mha_bwd).
func (b *Builder) SDPA(name string, q, k, v ir.TensorID, causal bool) ir.TensorID {
	ins, dt := b.autocast("sdpa_flash", q, k, v)
	qs := b.Shape(ins[0])
	B, A, S, D := qs[0], qs[1], qs[2], qs[3]
	ks := b.g.Tensors[ins[1]].Shape
	flops := 4 * float64(B) * float64(A) * float64(S) * float64(ks[2]) * float64(D)
	if causal {
		flops /= 2
	}
	// The output has v's head width (DeepSeek's MLA: queries and keys of
	// 192, values of 128; the memory-efficient kernel takes unequal widths).
	os := append([]int64(nil), qs...)
	os[3] = b.g.Tensors[ins[2]].Shape[3]
	outs := b.node("sdpa_flash", ins, []out{
		{name: name, dt: dt, shape: os, view: ir.NoTensor},
		{name: name + ".logsumexp", dt: units.F32, shape: []int64{B, A, S}, view: ir.NoTensor, noGrad: true},
	}, flops)
	b.last().BwdWorkspace = units.F32.Size(B*A*S*D) + units.F32.Size(B*A*S)
	return outs[0]
}

// SDPAMasked is scaled_dot_product_attention with an explicit float mask
// [B, 1, S, T] on the flash kernel for CPU
// (_scaled_dot_product_flash_attention_for_cpu takes attn_mask and saves it
// with q, k, v, the output and logsumexp); k and v may have fewer heads than
// q (broadcast).
func (b *Builder) SDPAMasked(name string, q, k, v, mask ir.TensorID) ir.TensorID {
	ins, dt := b.autocast("sdpa_flash_masked", q, k, v, mask)
	qs := b.Shape(ins[0])
	B, A, S, D := qs[0], qs[1], qs[2], qs[3]
	ks := b.g.Tensors[ins[1]].Shape
	flops := 4 * float64(B) * float64(A) * float64(S) * float64(ks[2]) * float64(D)
	outs := b.node("sdpa_flash_masked", ins, []out{
		{name: name, dt: dt, shape: qs, view: ir.NoTensor},
		{name: name + ".logsumexp", dt: units.F32, shape: []int64{B, A, S}, view: ir.NoTensor, noGrad: true},
	}, flops)
	b.last().NoGrad = []int{3}
	b.last().BwdWorkspace = units.F32.Size(B*A*S*D) + units.F32.Size(B*A*S)
	return outs[0]
}

// CrossEntropy is F.cross_entropy(logits [N, V], labels [N]): log_softmax
// then nll_loss. It returns the scalar loss and marks it as the graph's loss.
func (b *Builder) CrossEntropy(name string, logits, labels ir.TensorID) ir.TensorID {
	lp := b.Softmax(name+".log_softmax", logits, true)
	ins, dt := b.autocast("nll_loss", lp, labels)
	outs := b.node("nll_loss", ins, []out{
		{name: name, dt: dt, shape: []int64{}, view: ir.NoTensor},
		{name: name + ".total_weight", dt: dt, shape: []int64{}, view: ir.NoTensor, noGrad: true},
	}, float64(b.g.Tensors[labels].Numel()))
	b.last().NoGrad = []int{1}
	b.g.Loss = outs[0]
	return outs[0]
}

// TopK routes tokens: it returns routing weights and expert indices (MoE).
func (b *Builder) TopK(name string, probs ir.TensorID, k int64) (weights, idx ir.TensorID) {
	ps := b.Shape(probs)
	outs := b.node("router_topk", []ir.TensorID{probs}, []out{
		{name: name + ".weights", dt: b.g.Tensors[probs].DType, shape: b.withLast(ps, k), view: ir.NoTensor},
		{name: name + ".indices", dt: units.I64, shape: b.withLast(ps, k), view: ir.NoTensor, noGrad: true},
	}, float64(numel(ps)))
	return outs[0], outs[1]
}

// IndexSelect gathers rows rows of x by an index of that many entries.
func (b *Builder) IndexSelect(name string, x, index ir.TensorID, rows int64) ir.TensorID {
	shape := []int64{rows, lastDim(b.g.Tensors[x].Shape)}
	n := b.node("index_select", []ir.TensorID{x, index}, []out{{name: name, dt: b.g.Tensors[x].DType, shape: shape, view: ir.NoTensor}}, 0)
	b.last().NoGrad = []int{1}
	return n[0]
}

// GroupedMM is torch._grouped_mm(x, w.transpose(-2, -1), offs): the rows
// of x [rows, k], grouped by expert at the offsets offs (int32 [experts]),
// each times its expert's weight, w [experts, n, k] as a linear stores it.
// It returns [rows, n] in x's dtype (the caller casts x to the weight's, as
// transformers' _grouped_mm does: the op has no autocast rule). Routing
// is balanced, so the FLOPs are every row's product with one expert.
func (b *Builder) GroupedMM(name string, x, w, offs ir.TensorID) ir.TensorID {
	xs, ws := b.g.Tensors[x].Shape, b.g.Tensors[w].Shape
	rows, k, n := numel(xs)/lastDim(xs), ws[2], ws[1]
	o := b.node("grouped_mm", []ir.TensorID{x, w, offs}, []out{{name: name, dt: b.g.Tensors[x].DType, shape: []int64{rows, n}, view: ir.NoTensor}}, 2*float64(rows)*float64(k)*float64(n))
	b.last().NoGrad = []int{2}
	return o[0]
}

// SumDim is x.sum(dim) (without keepdim): autograd keeps only sizes.
func (b *Builder) SumDim(name string, x ir.TensorID, dim int) ir.TensorID {
	ins, dt := b.autocast("sum", x)
	xs := b.g.Tensors[ins[0]].Shape
	shape := append(append([]int64(nil), xs[:dim]...), xs[dim+1:]...)
	return b.node("sum", ins, []out{{name: name, dt: dt, shape: shape, view: ir.NoTensor}}, float64(numel(xs)))[0]
}

// IndexAdd is acc.index_add_(0, index, src): in place, so the result aliases
// acc and the gradient of acc passes through.
func (b *Builder) IndexAdd(name string, acc, index, src ir.TensorID) ir.TensorID {
	n := b.node("index_add", []ir.TensorID{acc, index, src}, []out{{name: name, dt: b.g.Tensors[acc].DType, shape: b.Shape(acc), view: acc}}, float64(b.g.Tensors[src].Numel()))
	b.last().NoGrad = []int{1}
	b.last().GradAliases = true
	return n[0]
}

// IndexCopy is zeros.index_copy(dim, index, src) out of place: a new tensor
// of shape with src's columns scattered in. Autograd saves src.
func (b *Builder) IndexCopy(name string, src ir.TensorID, shape ...int64) ir.TensorID {
	z := b.Zeros(name+".zeros", b.g.Tensors[src].DType, shape...)
	n := b.node("index_copy", []ir.TensorID{z, src}, []out{{name: name, dt: b.g.Tensors[src].DType, shape: shape, view: ir.NoTensor}}, float64(b.g.Tensors[src].Numel()))
	return n[0]
}

// FusedLinearCrossEntropy is Liger's fused linear cross-entropy over x
// [N, H] and the head weight w [V, H]: the logits exist one chunk at a time
// (chunk = next_pow2(ceil(N / ceil(V/H))) rows, so about N·H values, in x's
// dtype; the node's workspace), and the forward computes the gradients of x
// and w (when w is trained) into grad_input [N, H] and grad_weight [V, H],
// which it saves and backward returns as they are. Liger-Kernel
// src/liger_kernel/ops/fused_linear_cross_entropy.py
// fused_linear_cross_entropy_forward (grad_input = zeros_like(_input),
// grad_weight = zeros_like(weight), loss_1d float32 [N]).
func (b *Builder) FusedLinearCrossEntropy(name string, x, w, labels ir.TensorID) ir.TensorID {
	xs, ws := b.g.Tensors[x].Shape, b.g.Tensors[w].Shape
	N, H, V := xs[0], xs[1], ws[0]
	xt, wt := b.g.Tensors[x].DType, b.g.Tensors[w].DType
	outs := []out{
		{name: name, dt: units.F32, shape: []int64{}, view: ir.NoTensor},
		{name: name + ".grad_input", dt: xt, shape: []int64{N, H}, view: ir.NoTensor, noGrad: true},
	}
	if b.g.Tensors[w].RequiresGrad {
		outs = append(outs, out{name: name + ".grad_weight", dt: wt, shape: []int64{V, H}, view: ir.NoTensor, noGrad: true})
	}
	inc := (V + H - 1) / H
	chunk := int64(1)
	for chunk < (N+inc-1)/inc {
		chunk *= 2
	}
	chunk = min(chunk, N)
	o := b.node("fused_linear_cross_entropy", []ir.TensorID{x, w, labels}, outs, 4*float64(N)*float64(H)*float64(V))
	n := b.last()
	n.Workspace = xt.Size(chunk*V) + units.F32.Size(N)
	n.NoGrad = []int{2}
	n.GradSaved = map[int]int{0: 0}
	if len(outs) == 3 {
		n.GradSaved[1] = 1
	}
	b.g.Loss = o[0]
	return o[0]
}

// FusedSwiGLU is silu(gate) * up in one kernel that saves only its two
// inputs and recomputes silu in backward (Liger's LigerSiLUMulFunction).
func (b *Builder) FusedSwiGLU(name string, gate, up ir.TensorID) ir.TensorID {
	ins, dt := b.autocast("swiglu_fused", gate, up)
	xs := b.g.Tensors[ins[0]].Shape
	return b.node("swiglu_fused", ins, []out{{name: name, dt: dt, shape: append([]int64(nil), xs...), view: ir.NoTensor}}, 5*float64(numel(xs)))[0]
}

// MeanLast is x.mean(-1, keepdim=True); savesInput follows PyTorch versions
// whose autograd keeps mean.dim's input.
func (b *Builder) MeanLast(name string, x ir.TensorID, savesInput bool) ir.TensorID {
	kind := "mean"
	if savesInput {
		kind = "mean_saves_input"
	}
	xs := b.g.Tensors[x].Shape
	return b.node(kind, []ir.TensorID{x}, []out{{name: name, dt: b.g.Tensors[x].DType, shape: b.withLast(xs, 1), view: ir.NoTensor}}, float64(numel(xs)))[0]
}

// ReduceLast is a reduction over the last dimension with keepdim (rule
// sum): one value per row, in the dtype autocast runs the rule in.
func (b *Builder) ReduceLast(kind, name string, x ir.TensorID) ir.TensorID {
	ins, dt := b.autocast(kind, x)
	xs := b.g.Tensors[ins[0]].Shape
	return b.node(kind, ins, []out{{name: name, dt: dt, shape: b.withLast(xs, 1), view: ir.NoTensor}}, float64(numel(xs)))[0]
}

// MaxLast is torch.max(x, dim=-1, keepdim=True): the values, and the int64
// indices max.dim keeps for backward.
func (b *Builder) MaxLast(name string, x ir.TensorID) ir.TensorID {
	xs := b.g.Tensors[x].Shape
	outs := b.node("max_dim", []ir.TensorID{x}, []out{
		{name: name, dt: b.g.Tensors[x].DType, shape: b.withLast(xs, 1), view: ir.NoTensor},
		{name: name + ".indices", dt: units.I64, shape: b.withLast(xs, 1), view: ir.NoTensor, noGrad: true},
	}, float64(numel(xs)))
	return outs[0]
}

// Zeros is torch.zeros of the given shape in the activation dtype.
func (b *Builder) Zeros(name string, dt units.DType, shape ...int64) ir.TensorID {
	return b.node("zeros", nil, []out{{name: name, dt: dt, shape: shape, view: ir.NoTensor}}, 0)[0]
}

// Release marks where Python code drops its last reference to xs (a
// function that held them in local variables returns, a loop deletes its
// variable): they live at least until here. It computes and saves nothing.
func (b *Builder) Release(xs ...ir.TensorID) {
	b.node("release", xs, nil, 0)
	b.last().MemBytes = 0
}

// To is an explicit x.float() (or .to(dtype)) in model code, outside
// autocast's policy; it returns x when it already has that dtype.
func (b *Builder) To(x ir.TensorID, dt units.DType) ir.TensorID {
	if b.g.Tensors[x].DType == dt {
		return x
	}
	saved := b.castMemo
	b.castMemo = map[ir.TensorID]ir.TensorID{}
	y := b.cast(x, dt)
	b.castMemo = saved
	return y
}

// KVCache allocates a resident key or value cache [B, KV, ctx, D].
func (b *Builder) KVCache(name string, dt units.DType, shape ...int64) ir.TensorID {
	id := b.newTensor(ir.Tensor{Name: b.qual(name), Shape: shape, DType: dt, Base: ir.NoTensor, Cat: ir.KVCache, Resident: true, Batch: true})
	b.g.Buffers = append(b.g.Buffers, id)
	return id
}

// CacheWrite copies x into cache and returns the cache (a static cache's
// index_copy_); later attention reads the cache.
func (b *Builder) CacheWrite(x, cache ir.TensorID) ir.TensorID {
	b.node("kv_cache_update", []ir.TensorID{x, cache}, nil, 0)
	b.last().MemBytes = 2 * float64(b.g.Tensors[x].Bytes)
	return cache
}

// Index makes an integer index tensor produced inside the graph (router
// bookkeeping); it never requires grad.
func (b *Builder) Index(name string, from ir.TensorID, n int64) ir.TensorID {
	return b.IndexOf(name, from, units.I64, n)
}

// IndexOf is Index with elements of dtype dt (an int32 cast, histc's
// counts, cumsum's offsets).
func (b *Builder) IndexOf(name string, from ir.TensorID, dt units.DType, n int64) ir.TensorID {
	o := b.node("copy", b.ids.One(from), []out{{name: name, dt: dt, shape: b.shapes.One(n), view: ir.NoTensor, noGrad: true}}, 0)
	b.last().NoGrad = b.ints.One(0)
	b.g.Tensors[o[0]].RequiresGrad = false
	return o[0]
}
