package lower

import (
	"fmt"
	"slices"
	"strings"

	"github.com/memplan/memplan/ir"
	"github.com/memplan/memplan/units"
)

// Optimizer names a torch.optim (or bitsandbytes, transformers, lion-pytorch)
// optimizer: an index into the optimizers table. Adding an optimizer is one
// row there.
type Optimizer uint8

const (
	SGD Optimizer = iota
	SGDMomentum
	Adam
	AdamW
	Adafactor
	Adam8bit
	AdamWAMSGrad
	RMSprop
	Adagrad
	Lion
	AdamW8bitAO
	AdamW4bitAO
)

// optimizerRow describes one optimizer's memory: the state it keeps per
// parameter, the temporaries of its step in each implementation, and when
// its state is created.
type optimizerRow struct {
	name    string
	aliases []string
	doc     string
	// source is the implementation the row follows (file @ release).
	source string
	// decay is the default weight_decay.
	decay float64
	// fused is the fused kernel its fused step runs (the source it is
	// read from), "" when it has none. Its other implementations are its
	// emitters: foreach when it has a foreach emitter, single when it has
	// a per-parameter one (Impls).
	fused string
	// eager: the state is created by the constructor, so the first step
	// finds it allocated (torch.optim.Adagrad), not lazily by step().
	eager bool
	// states lists the state tensors of parameter p whose state dtype is dt
	// (the parameter's, or float32 with master weights).
	states func(p *ir.Tensor, dt units.DType) []state
	// foreach emits the multi-tensor step (impl Foreach).
	foreach func(s *step)
	// single is the scratch one per-parameter step holds (impl Single) on
	// top of the upcast gradient.
	single func(s *step, i int) units.Bytes
}

var optimizers = []optimizerRow{
	SGD: {name: "sgd", doc: "torch.optim.SGD without momentum: no state",
		source: "pytorch torch/optim/sgd.py @v2.1.0",
		fused:  fusedSGD,
		states: func(*ir.Tensor, units.DType) []state { return nil },
		foreach: func(s *step) {
			if s.wd > 0 {
				s.emit("_foreach_add(grads, params, alpha=weight_decay)", cat(s.g, s.weights), nil, s.gradBytes())
			}
			s.emit("_foreach_add_(params, grads, alpha=-lr)", cat(s.weights, s.g), nil, 0)
		},
		single: func(s *step, i int) units.Bytes {
			if s.wd > 0 {
				return s.l.p.Tensors[s.grads[i]].Bytes
			}
			return 0
		}},
	SGDMomentum: {name: "sgd-momentum", aliases: []string{"momentum"}, doc: "torch.optim.SGD with momentum: one momentum buffer",
		source: "pytorch torch/optim/sgd.py @v2.1.0", fused: fusedSGD,
		states: func(p *ir.Tensor, dt units.DType) []state { return []state{full(p, dt, "momentum_buffer")} },
		foreach: func(s *step) {
			s.emit("_foreach_mul_/_foreach_add_(momentum_buffers, grads)", cat(s.all, s.g), nil, 0)
			s.emit("_foreach_add_(params, momentum_buffers, alpha=-lr)", cat(s.weights, s.all), nil, 0)
		},
		single: func(*step, int) units.Bytes { return 0 }},
	Adam: {name: "adam", doc: "torch.optim.Adam: exp_avg and exp_avg_sq",
		source: "pytorch torch/optim/adam.py @v2.1.0", fused: "pytorch torch/optim/adam.py @v2.1.0 _fused_adam: torch._fused_adam_",
		states: adamStates, foreach: adamForeach, single: adamSingle},
	AdamW: {name: "adamw", aliases: []string{"adamw_torch", "adamw_hf", "torch.optim.adamw"}, doc: "torch.optim.AdamW: exp_avg and exp_avg_sq, decoupled weight decay (default 0.01)",
		source: "pytorch torch/optim/adamw.py @v2.1.0", decay: 0.01, fused: fusedAdamW,
		states: adamStates, foreach: adamForeach, single: adamSingle},
	Adafactor: {name: "adafactor", doc: "transformers.Adafactor (beta1=None): factored float32 second moment for matrices",
		source: "huggingface/transformers src/transformers/optimization.py @v4.35.0 Adafactor",
		states: func(p *ir.Tensor, _ units.DType) []state {
			n := p.Numel()
			if len(p.Shape) >= 2 {
				r := n / p.Shape[len(p.Shape)-1]
				c := n / p.Shape[len(p.Shape)-2]
				return []state{{"exp_avg_sq_row", units.F32, r, []int64{r}}, {"exp_avg_sq_col", units.F32, c, []int64{c}}}
			}
			return []state{{"exp_avg_sq", units.F32, n, []int64{n}}}
		},
		// update = grad**2 + eps, then _approx_sq_grad makes a new
		// full-size update before the old one is dropped.
		single: func(s *step, i int) units.Bytes { return 2 * units.F32.Size(s.l.p.Tensors[s.params[i]].Numel()) }},
	Adam8bit: {name: "adamw8bit", aliases: []string{"adam8bit", "8bit-adam", "adamw-8bit", "adamw_bnb_8bit"},
		doc:    "bitsandbytes AdamW8bit: block-wise 8-bit exp_avg and exp_avg_sq, a float32 absmax per 2048 values; tensors under 4096 values keep 32-bit state",
		source: "bitsandbytes bitsandbytes/optim/optimizer.py @0.41.1 Optimizer8bit (min_8bit_size=4096, blocksize 2048)", decay: 0.01,
		fused: "bitsandbytes bitsandbytes/optim/optimizer.py @0.41.1 Optimizer8bit.update_step: one optimizer_update_8bit_blockwise kernel per parameter, its only step",
		states: func(p *ir.Tensor, _ units.DType) []state {
			n := p.Numel()
			if n < bnbMin8bitNum {
				return []state{{"state1", units.F32, n, []int64{n}}, {"state2", units.F32, n, []int64{n}}}
			}
			blocks := (n + bnbBlock - 1) / bnbBlock
			return []state{{"state1", units.U8, n, []int64{n}}, {"state2", units.U8, n, []int64{n}},
				{"absmax1", units.F32, blocks, []int64{blocks}}, {"absmax2", units.F32, blocks, []int64{blocks}}}
		}},
	AdamWAMSGrad: {name: "adamw-amsgrad", aliases: []string{"adam-amsgrad"}, doc: "torch.optim.AdamW(amsgrad=True): exp_avg, exp_avg_sq and max_exp_avg_sq",
		source: "pytorch torch/optim/adamw.py @v2.1.0 (_multi_tensor_adamw: _foreach_maximum_, then _foreach_sqrt of the maxima)", decay: 0.01,
		fused: fusedAdamW + " (max_exp_avg_sqs with amsgrad=True)",
		states: func(p *ir.Tensor, dt units.DType) []state {
			return []state{full(p, dt, "exp_avg"), full(p, dt, "exp_avg_sq"), full(p, dt, "max_exp_avg_sq")}
		},
		foreach: func(s *step) {
			ms, vs, mx := s.slot(0), s.slot(1), s.slot(2)
			s.decoupledDecay()
			s.emit("_foreach_lerp_(exp_avgs, grads, 1-beta1)", cat(ms, s.g), nil, 0)
			s.emit("_foreach_mul_/_foreach_addcmul_(exp_avg_sqs, grads, grads)", cat(vs, s.g), nil, 0)
			s.emit("_foreach_maximum_(max_exp_avg_sqs, exp_avg_sqs)", cat(mx, vs), nil, 0)
			d := s.temp("max_exp_avg_sq_sqrt", mx)
			s.emit("_foreach_sqrt(max_exp_avg_sqs)", mx, []ir.TensorID{d}, 0)
			s.emit("_foreach_addcdiv_(params, exp_avgs, denom, step_size)", cat(s.weights, ms, []ir.TensorID{d}), nil, 0)
		},
		single: func(s *step, i int) units.Bytes { return 2 * s.stateBytes(i, 2) }},
	RMSprop: {name: "rmsprop", doc: "torch.optim.RMSprop (momentum=0, centered=False): square_avg",
		source: "pytorch torch/optim/rmsprop.py @v2.1.0 (_multi_tensor_rmsprop: avg = _foreach_sqrt(square_avgs))",
		// No fused: RMSprop.__init__ takes no fused argument (rmsprop.py
		// @v2.1.0, and the stable docs' signature: foreach, maximize,
		// differentiable, capturable).
		states: func(p *ir.Tensor, dt units.DType) []state { return []state{full(p, dt, "square_avg")} },
		foreach: func(s *step) {
			sq := s.slot(0)
			s.emit("_foreach_mul_/_foreach_addcmul_(square_avgs, grads, grads)", cat(sq, s.g), nil, 0)
			d := s.temp("square_avg_sqrt", sq)
			s.emit("_foreach_sqrt(square_avgs)", sq, []ir.TensorID{d}, 0)
			s.emit("_foreach_addcdiv_(params, grads, avg, -lr)", cat(s.weights, s.g, []ir.TensorID{d}), nil, 0)
		},
		single: func(s *step, i int) units.Bytes { return s.stateBytes(i, 0) }},
	Adagrad: {name: "adagrad", doc: "torch.optim.Adagrad: a sum of squared gradients, created by the constructor (so it exists before the first step)",
		source: "pytorch torch/optim/adagrad.py @v2.1.0 (state['sum'] in __init__; _multi_tensor_adagrad: std = _foreach_sqrt(state_sums))", eager: true,
		fused:  "pytorch torch/optim/adagrad.py (stable docs) fused=True: torch._fused_adagrad_",
		states: func(p *ir.Tensor, dt units.DType) []state { return []state{full(p, dt, "sum")} },
		foreach: func(s *step) {
			sum := s.slot(0)
			s.emit("_foreach_addcmul_(state_sums, grads, grads)", cat(sum, s.g), nil, 0)
			d := s.temp("state_sum_sqrt", sum)
			s.emit("_foreach_sqrt(state_sums)", sum, []ir.TensorID{d}, 0)
			s.emit("_foreach_addcdiv_(params, grads, std, -clr)", cat(s.weights, s.g, []ir.TensorID{d}), nil, 0)
		},
		single: func(s *step, i int) units.Bytes { return s.stateBytes(i, 0) }},
	Lion: {name: "lion", doc: "Lion (Chen et al. 2023, lion-pytorch): one momentum buffer; the update is a sign of an interpolation",
		source: "lucidrains/lion-pytorch lion_pytorch/lion_pytorch.py @0.1.2 update_fn: exp_avg.clone().mul_(beta1).add(grad, ...).sign_()", decay: 0,
		states: func(p *ir.Tensor, dt units.DType) []state { return []state{full(p, dt, "exp_avg")} },
		// the clone and the out-of-place add are alive together.
		single: func(s *step, i int) units.Bytes { return 2 * s.stateBytes(i, 0) }},
	AdamW8bitAO: {name: "adamw8bit-torchao", aliases: []string{"torchao.optim.adamw8bit", "torchao-adamw8bit"},
		doc:    "torchao AdamW8bit: block-wise 8-bit exp_avg and exp_avg_sq with a float32 scale per 256 values; tensors under 4096 values (or not a multiple of the block) keep plain state",
		source: "pytorch/ao torchao/prototype/low_bit_optim/adam.py @v0.5.0 _AdamBase._new_buffer (p.numel() >= 4096 and p.numel() % block_size == 0, else torch.zeros_like(p)); subclass_8bit.py OptimState8bit (uint8 codes, float32 scale per block of 256); the step is one compiled kernel per parameter",
		decay:  0.01, fused: torchaoStep,
		states: func(p *ir.Tensor, dt units.DType) []state { return lowBitStates(p, dt, 256, 1) }},
	AdamW4bitAO: {name: "adamw4bit-torchao", aliases: []string{"torchao.optim.adamw4bit", "adamw4bit"},
		doc:    "torchao AdamW4bit (Li et al. 2023): 4-bit exp_avg and exp_avg_sq packed two per byte with a float32 scale per 128 values; tensors under 4096 values keep plain state",
		source: "pytorch/ao torchao/prototype/low_bit_optim/adam.py @v0.5.0 _AdamBase._new_buffer; subclass_4bit.py OptimState4bit (codes packed two per uint8, float32 scale per block of 128)",
		decay:  0.01, fused: torchaoStep,
		states: func(p *ir.Tensor, dt units.DType) []state { return lowBitStates(p, dt, 128, 2) }},
}

// The fused kernels the torch.optim rows share, and torchao's step.
const (
	fusedSGD    = "pytorch torch/optim/sgd.py @v2.3.0 fused=True: torch._fused_sgd_"
	fusedAdamW  = "pytorch torch/optim/adamw.py @v2.1.0 _fused_adamw: torch._fused_adamw_"
	torchaoStep = "pytorch/ao torchao/prototype/low_bit_optim/adam.py @v0.5.0 _AdamBase.step: one compiled single_param_adam per parameter, its only step"
)

// lowBitStates are torchao's block-wise quantised Adam states: per moment,
// numel/perByte bytes of codes and a float32 scale per block; small tensors
// keep zeros_like(p).
func lowBitStates(p *ir.Tensor, dt units.DType, block, perByte int64) []state {
	n := p.Numel()
	if n < 4096 || n%block != 0 {
		return []state{full(p, dt, "exp_avg"), full(p, dt, "exp_avg_sq")}
	}
	codes, scales := n/perByte, n/block
	return []state{{"exp_avg.codes", units.U8, codes, []int64{codes}}, {"exp_avg_sq.codes", units.U8, codes, []int64{codes}},
		{"exp_avg.scale", units.F32, scales, []int64{scales}}, {"exp_avg_sq.scale", units.F32, scales, []int64{scales}}}
}

func adamStates(p *ir.Tensor, dt units.DType) []state {
	return []state{full(p, dt, "exp_avg"), full(p, dt, "exp_avg_sq")}
}

func adamForeach(s *step) {
	ms, vs := s.slot(0), s.slot(1)
	if s.row.decay > 0 {
		s.decoupledDecay()
	} else if s.wd > 0 {
		s.emit("_foreach_add(grads, params, alpha=weight_decay)", cat(s.g, s.weights), nil, s.gradBytes())
	}
	s.emit("_foreach_lerp_(exp_avgs, grads, 1-beta1)", cat(ms, s.g), nil, 0)
	s.emit("_foreach_mul_/_foreach_addcmul_(exp_avg_sqs, grads, grads)", cat(vs, s.g), nil, 0)
	d := s.temp("exp_avg_sq_sqrt", vs)
	s.emit("_foreach_sqrt(exp_avg_sqs)", vs, []ir.TensorID{d}, 0)
	s.emit("_foreach_addcdiv_(params, exp_avgs, denom, step_size)", cat(s.weights, ms, []ir.TensorID{d}), nil, 0)
}

// adamSingle: denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps):
// the sqrt and the quotient are both alive for a moment. Bounded: twice one
// parameter's state (a model holds ≤ 10^15 parameters, models' parser).
func adamSingle(s *step, i int) units.Bytes { return 2 * s.stateBytes(i, 1) }

// full is a state shaped like p: its shape is p's own, which addState
// copies into the tensor it makes.
func full(p *ir.Tensor, dt units.DType, name string) state {
	return state{name, dt, p.Numel(), p.Shape}
}

func (o Optimizer) row() *optimizerRow {
	if int(o) < len(optimizers) {
		return &optimizers[o]
	}
	return &optimizerRow{name: fmt.Sprintf("optimizer(%d)", o), states: func(*ir.Tensor, units.DType) []state { return nil }}
}

func (o Optimizer) String() string { return o.row().name }

// Doc says what state the optimizer keeps.
func (o Optimizer) Doc() string { return o.row().doc }

// Source is the implementation memplan follows for it.
func (o Optimizer) Source() string { return o.row().source }

// DefaultWeightDecay is the optimizer's default weight_decay.
func (o Optimizer) DefaultWeightDecay() float64 { return o.row().decay }

// Impls are the implementations the optimizer has, in Impl order: foreach
// and single where the row has their emitters, fused where it names a fused
// kernel. torch.optim.RMSprop has no fused=True, lion-pytorch and
// transformers' Adafactor only a per-parameter loop, bitsandbytes and
// torchao only their own kernels.
func (o Optimizer) Impls() []Impl {
	r := o.row()
	var out []Impl
	if r.foreach != nil {
		out = append(out, Foreach)
	}
	if r.single != nil {
		out = append(out, Single)
	}
	if r.fused != "" {
		out = append(out, Fused)
	}
	return out
}

// Has reports whether the optimizer has implementation i.
func (o Optimizer) Has(i Impl) bool { return slices.Contains(o.Impls(), i) }

// OnlyImpl is the one implementation the optimizer has, if it has one.
func (o Optimizer) OnlyImpl() (Impl, bool) {
	if is := o.Impls(); len(is) == 1 {
		return is[0], true
	}
	return 0, false
}

// Planned is the implementation the step is lowered in when i is asked
// for: i when the optimizer has it, else its first (foreach where it has
// one: what torch.optim runs on CUDA when fused is not asked for,
// optimizer.py _default_to_fused_or_foreach). It is the one rule that maps
// a request to a plan: lowering applies it, and engine.Spec.Validate, so
// the spec a plan reports names the step it planned.
func (o Optimizer) Planned(i Impl) Impl {
	is := o.Impls()
	if len(is) == 0 || slices.Contains(is, i) {
		return i
	}
	return is[0]
}

// CheckImpl says, in words, why implementation i cannot run the optimizer
// (nil when it can): for a request a user made explicitly, which Planned
// would otherwise replace.
func (o Optimizer) CheckImpl(i Impl) error {
	is := o.Impls()
	if len(is) == 0 || slices.Contains(is, i) {
		return nil
	}
	names := make([]string, len(is))
	for k, x := range is {
		names[k] = x.String()
	}
	return fmt.Errorf("%s has only %s", o, strings.Join(names, " and "))
}

// ParseOptimizer reads an optimizer name or alias (OptimizerNames).
func ParseOptimizer(s string) (Optimizer, error) {
	t := strings.ToLower(strings.TrimSpace(s))
	for i := range optimizers {
		r := &optimizers[i]
		if t == r.name {
			return Optimizer(i), nil
		}
		for _, a := range r.aliases {
			if t == a {
				return Optimizer(i), nil
			}
		}
	}
	return 0, fmt.Errorf("unknown optimizer %q (want one of %s)", s, strings.Join(OptimizerNames(), ", "))
}

// OptimizerNames lists the accepted names.
func OptimizerNames() []string {
	out := make([]string, len(optimizers))
	for i := range optimizers {
		out[i] = optimizers[i].name
	}
	return out
}

// Optimizers lists every optimizer.
func Optimizers() []Optimizer {
	out := make([]Optimizer, len(optimizers))
	for i := range optimizers {
		out[i] = Optimizer(i)
	}
	return out
}

// Impl is how the optimizer step is implemented (torch.optim's foreach,
// for-loop or fused kernels).
type Impl int8

const (
	// Foreach is PyTorch 2's default on CUDA: _foreach_* kernels over all
	// parameters of one dtype at once; intermediate lists are as large as the
	// whole state they are computed from.
	Foreach Impl = iota
	// Single is the per-parameter for-loop (foreach=False).
	Single
	// Fused is the fused CUDA kernel (fused=True): no intermediates.
	Fused
)

var implNames = []string{"foreach", "single", "fused"}

func (i Impl) String() string {
	if i >= 0 && int(i) < len(implNames) {
		return implNames[i]
	}
	return fmt.Sprintf("impl(%d)", i)
}

// ParseImpl reads foreach, single (or for-loop), fused.
func ParseImpl(s string) (Impl, error) {
	t := strings.ToLower(strings.TrimSpace(s))
	if t == "for-loop" || t == "forloop" {
		return Single, nil
	}
	for i, n := range implNames {
		if t == n {
			return Impl(i), nil
		}
	}
	return 0, fmt.Errorf("unknown optimizer implementation %q (want foreach, single or fused)", s)
}

// Bitsandbytes 8-bit optimizer constants: block-wise quantization with one
// float32 absmax per block of 2048 values (Dettmers et al., "8-bit
// Optimizers via Block-wise Quantization", ICLR 2022, §2), and tensors under
// min_8bit_size = 4096 elements keep 32-bit state (bnb.optim.Optimizer8bit).
const (
	bnbBlock      = 2048
	bnbMin8bitNum = 4096
)

// step is the optimizer step being lowered: what the rows' emitters see.
type step struct {
	l   *lowerer
	row *optimizerRow
	wd  float64
	// params with a gradient, their gradients, the tensors the update
	// writes (float32 masters or the parameters themselves), the gradients
	// the update reads (upcast or not), and every state tensor.
	params, grads, weights, g, all []ir.TensorID
	// stateEnd[i] ends params[i]'s state in all (it starts where
	// params[i-1]'s ends): one list, not a map of lists.
	stateEnd []int32
}

// stateOf is the state of params[i], in the row's order.
func (s *step) stateOf(i int) []ir.TensorID {
	start := int32(0)
	if i > 0 {
		start = s.stateEnd[i-1]
	}
	return s.all[start:s.stateEnd[i]:s.stateEnd[i]]
}

func (s *step) emit(name string, in, out []ir.TensorID, ws units.Bytes) {
	s.l.p.Ops = append(s.l.p.Ops, ir.Op{Name: name, Phase: ir.Optimizer, In: in, Out: out, Workspace: ws, Node: -1})
}

// slot is state k of every parameter.
func (s *step) slot(k int) []ir.TensorID {
	out := make([]ir.TensorID, 0, len(s.params))
	for i := range s.params {
		if st := s.stateOf(i); k < len(st) {
			out = append(out, st[k])
		}
	}
	return out
}

// temp is a foreach result list as large as the tensors of like, in their
// dtype.
func (s *step) temp(name string, like []ir.TensorID) ir.TensorID {
	var bytes units.Bytes
	dt := units.F32
	for _, t := range like {
		bytes += s.l.p.Tensors[t].Bytes
		dt = s.l.p.Tensors[t].DType
	}
	return s.l.add(ir.Tensor{Name: name, Shape: []int64{int64(bytes) / int64(max(dt.Size(1), 1))}, DType: dt, Bytes: bytes, Base: ir.NoTensor, Cat: ir.Temporary})
}

// gradBytes is the size of the gradients the update reads.
func (s *step) gradBytes() units.Bytes {
	var b units.Bytes
	for _, t := range s.g {
		b += s.l.p.Tensors[t].Bytes
	}
	return b
}

// stateBytes is the size of state k of parameter i.
func (s *step) stateBytes(i, k int) units.Bytes {
	st := s.stateOf(i)
	if k < len(st) {
		return s.l.p.Tensors[st[k]].Bytes
	}
	return 0
}

func (s *step) decoupledDecay() {
	if s.wd > 0 {
		s.emit("_foreach_mul_(params, 1-lr*weight_decay)", s.weights, nil, 0)
	}
}

func cat(xs ...[]ir.TensorID) []ir.TensorID {
	n := 0
	for _, x := range xs {
		n += len(x)
	}
	o := make([]ir.TensorID, 0, n)
	for _, x := range xs {
		o = append(o, x...)
	}
	return o
}
