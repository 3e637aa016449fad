// Package ops holds the op rule table — what PyTorch autograd saves for each
// op's backward, how autocast casts its inputs, its FLOPs — and a Builder that
// model front ends use to write a forward ir.Graph op by op.
//
// The saved sets follow tools/autograd/derivatives.yaml of PyTorch 2.x and the
// CUDA kernels' own saved outputs: linear/matmul save each operand only when
// the other one requires grad (mm: self is saved for mat2's gradient and mat2
// for self's, so a frozen linear saves no input), convolution saves both,
// GELU and SiLU their input, ReLU/softmax/log_softmax their output, LayerNorm
// and RMSNorm their input plus per-row statistics, dropout a mask (bool, 1
// byte, on CUDA; in the input dtype on CPU), flash/memory-efficient SDPA q, k,
// v, the output and the log-sum-exp, embedding its indices, bitsandbytes'
// 4-bit linear its packed weight. Collectives (tensor/sequence/expert
// parallel) save nothing; their nodes carry ir.Comm for forward and backward.
package ops

import (
	"fmt"
	"sort"
)

// CastPolicy is how torch.autocast treats an op (aten/src/ATen/autocast_mode.cpp).
type CastPolicy uint8

const (
	// NoCast: the op runs in its inputs' dtype (embedding, views, dropout).
	NoCast CastPolicy = iota
	// Lower: cast floating inputs to the autocast dtype (linear, matmul,
	// bmm, conv, scaled_dot_product_attention).
	Lower
	// CastFP32: cast inputs to float32 (layer_norm, softmax, log_softmax,
	// nll_loss, cross_entropy, group_norm, ...).
	CastFP32
	// Promote: run in the widest input dtype (add, mul, cat, where).
	Promote
)

// Rule is one row of the op table.
type Rule struct {
	Name string
	// SaveIn / SaveOut are the input and output positions autograd keeps.
	SaveIn, SaveOut []int
	// SaveInIfOtherGrad: inputs 0 and 1 are each saved only when the other
	// one requires grad (derivatives.yaml: mul's "self: grad * other" saves
	// other; mm's "self: mm_mat1_backward(grad, mat2, ...)" saves mat2 and
	// "mat2: mm_mat2_backward(grad, self, ...)" saves self; autograd's
	// codegen guards a saved variable used by one input's formula with
	// should_compute_output of that input). Other positions are unaffected.
	SaveInIfOtherGrad bool
	Cast              CastPolicy
	// View: output 0 aliases input 0; its gradient is a view too.
	View bool
	// ViewGradIn are the input positions whose gradient autograd returns
	// as a view that keeps a larger temporary as its base (linear's
	// weight: TBackward's t() of mm_mat2_backward's result), so autograd's
	// InputBuffer cannot steal it to sum a second gradient into in place
	// (torch/csrc/autograd/input_buffer.cpp, can_accumulate_inplace asks
	// for storage().use_count() == 1).
	ViewGradIn []int
	// BwdFactor is backward FLOPs as a multiple of forward FLOPs.
	BwdFactor float64
	// Source says where the saved set comes from.
	Source string
}

// Table is the op rule table, keyed by rule name. It is checked at init.
var Table = map[string]*Rule{}

func add(r Rule) {
	if _, dup := Table[r.Name]; dup {
		panic("duplicate rule " + r.Name)
	}
	rr := r
	Table[r.Name] = &rr
}

const dy = "derivatives.yaml"

func init() {
	for _, r := range []Rule{
		{Name: "embedding", SaveIn: []int{1}, BwdFactor: 1, Source: dy + ": embedding: weight: embedding_backward(grad, indices, ...) saves indices"},
		{Name: "linear", SaveIn: []int{0, 1}, SaveInIfOtherGrad: true, ViewGradIn: []int{1}, Cast: Lower, BwdFactor: 2, Source: dy + ": mm/addmm: mat1 (the input) if mat2 (the weight) requires grad, mat2 if mat1 does; a frozen linear saves no input"},
		{Name: "matmul", SaveIn: []int{0, 1}, SaveInIfOtherGrad: true, Cast: Lower, BwdFactor: 2, Source: dy + ": bmm: self if mat2 requires grad, mat2 if self does"},
		{Name: "conv2d", SaveIn: []int{0, 1}, Cast: Lower, BwdFactor: 2, Source: dy + ": convolution: one formula for input, weight, bias, so both are saved whenever any needs grad"},
		{Name: "linear_4bit", SaveIn: []int{1}, BwdFactor: 1, Source: "bitsandbytes MatMul4Bit: ctx.tensors = (None, B) saves the packed 4-bit weight only (never the input); backward dequantises B again for grad_A"},
		{Name: "linear_4bit_saves_input", SaveIn: []int{0, 1}, BwdFactor: 1, Source: "bitsandbytes <= 0.43.2 MatMul4Bit: ctx.tensors = (A, B) whenever an input needs grad; bitsandbytes #1270 (0.43.3) stopped saving A for a frozen weight"},
		{Name: "layer_norm", SaveIn: []int{0, 1}, SaveOut: []int{1, 2}, Cast: CastFP32, BwdFactor: 2, Source: dy + ": native_layer_norm: input, weight, mean, rstd"},
		{Name: "rms_norm", SaveIn: []int{0, 1}, SaveOut: []int{1}, Cast: CastFP32, BwdFactor: 2, Source: "fused RMSNorm (torch.nn.RMSNorm / apex): input, weight, rstd"},
		{Name: "gelu", SaveIn: []int{0}, BwdFactor: 2, Source: dy + ": gelu: self"},
		{Name: "silu", SaveIn: []int{0}, BwdFactor: 2, Source: dy + ": silu: self"},
		{Name: "tanh", SaveOut: []int{0}, BwdFactor: 1, Source: dy + ": tanh: result"},
		{Name: "relu", SaveOut: []int{0}, BwdFactor: 1, Source: dy + ": relu: result"},
		{Name: "softmax", SaveOut: []int{0}, Cast: CastFP32, BwdFactor: 2, Source: dy + ": _softmax: result"},
		{Name: "log_softmax", SaveOut: []int{0}, Cast: CastFP32, BwdFactor: 2, Source: dy + ": _log_softmax: result"},
		{Name: "nll_loss", SaveIn: []int{1}, SaveOut: []int{1}, Cast: CastFP32, BwdFactor: 1, Source: dy + ": nll_loss_forward: target, total_weight"},
		{Name: "dropout", SaveOut: []int{1}, BwdFactor: 1, Source: dy + ": native_dropout: mask (bool on CUDA)"},
		{Name: "mul", SaveIn: []int{0, 1}, SaveInIfOtherGrad: true, Cast: Promote, BwdFactor: 2, Source: dy + ": mul.Tensor: self: grad*other, other: grad*self"},
		{Name: "mul_scalar", Cast: NoCast, BwdFactor: 1, Source: dy + ": mul.Scalar saves nothing"},
		{Name: "add", Cast: Promote, BwdFactor: 0, Source: dy + ": add.Tensor saves nothing"},
		{Name: "where", SaveIn: []int{0}, Cast: Promote, BwdFactor: 1, Source: dy + ": where.self: condition"},
		{Name: "rotary", SaveIn: []int{1, 2}, Cast: Promote, BwdFactor: 1, Source: "HF apply_rotary_pos_emb: q*cos + rotate_half(q)*sin saves cos and sin (shared); mul and add promote; DeepSeek-V2's complex product and lit-gpt's apply_rope cast back (Builder.Rotary, Rope)"},
		{Name: "cat", Cast: Promote, BwdFactor: 0, Source: dy + ": cat saves sizes only"},
		{Name: "copy", BwdFactor: 0, Source: dy + ": clone/contiguous/_to_copy save nothing"},
		{Name: "to_copy", BwdFactor: 0, Source: dy + ": _to_copy saves nothing (autocast cast)"},
		{Name: "view", View: true, Source: dy + ": view/reshape/transpose/select/slice save sizes only"},
		{Name: "sdpa_flash", SaveIn: []int{0, 1, 2}, SaveOut: []int{0, 1}, Cast: Lower, BwdFactor: 2.5, Source: dy + ": _scaled_dot_product_flash_attention: query, key, value, output, logsumexp (+ philox seed/offset)"},
		{Name: "sdpa_flash_masked", SaveIn: []int{0, 1, 2, 3}, SaveOut: []int{0, 1}, Cast: Lower, BwdFactor: 2.5, Source: dy + ": _scaled_dot_product_flash_attention_for_cpu with attn_mask: query, key, value, attn_mask, output, logsumexp"},
		{Name: "router_topk", SaveOut: []int{1}, BwdFactor: 1, Source: dy + ": topk: indices"},
		{Name: "grouped_mm", SaveIn: []int{0, 1, 2}, SaveInIfOtherGrad: true, BwdFactor: 2, Source: dy + ": _grouped_mm: self: _grouped_mm(grad, mat2^T, offs) saves mat2, mat2: _grouped_mm(self^T, grad, offs) saves self (each only when the other needs grad), and offs always; no autocast rule (aten/src/ATen/autocast_mode.cpp @v2.14.1 lists none), so it runs in its inputs' dtype"},
		{Name: "index_select", SaveIn: []int{1}, BwdFactor: 0, Source: dy + ": index_select/index: index"},
		{Name: "index_add", SaveIn: []int{1}, BwdFactor: 0, Source: dy + ": index_add: index"},
		{Name: "index_copy", SaveIn: []int{1}, BwdFactor: 0, Source: dy + ": index_copy: source: grad.index_select(dim, index).expand_as(source) saves the source (IndexCopyBackward0 source_)"},
		{Name: "zeros", Source: "torch.zeros: no inputs, saves nothing"},
		{Name: "release", Source: "no kernel: the last Python reference to its inputs ends here (a function returns, a variable is deleted); no outputs, saves nothing"},
		{Name: "kv_cache_update", Source: "inference only: copy k/v into a static cache"},
		{Name: "mean", BwdFactor: 1, Source: dy + ": mean saves sizes"},
		{Name: "fused_linear_cross_entropy", SaveOut: []int{1, 2}, BwdFactor: 0, Source: "Liger-Kernel src/liger_kernel/ops/fused_linear_cross_entropy.py (LigerFusedLinearCrossEntropyFunction): the forward computes grad_input and grad_weight chunk by chunk and saves them; backward returns them"},
		{Name: "mean_saves_input", SaveIn: []int{0}, BwdFactor: 1, Source: dy + ": mean.dim: mean_backward(grad, self.sym_sizes(), dim, self.sym_numel(), keepdim); PyTorch 2.1.0's generated MeanBackward1 holds SavedVariable self_ (torch/include/torch/csrc/autograd/generated/Functions.h in the 2.1.0 wheel)"},
		{Name: "swiglu_fused", SaveIn: []int{0, 1}, BwdFactor: 2, Source: "Liger-Kernel src/liger_kernel/ops/swiglu.py LigerSiLUMulFunction: ctx.save_for_backward(a, b); backward recomputes silu(a)"},
		{Name: "pow2", SaveIn: []int{0}, Cast: CastFP32, BwdFactor: 2, Source: dy + ": pow.Tensor_Scalar: self: pow_backward(grad, self, exponent) saves self; autocast runs pow in float32"},
		{Name: "rsqrt", SaveOut: []int{0}, BwdFactor: 1, Source: dy + ": rsqrt: -0.5 * grad * result.pow(3) saves the result"},
		// Hand-written activations (x * torch.sigmoid(x), exp(x - max) / sum),
		// as the CS336 course models write them. Autocast runs exp and sum in
		// float32 (its fp32 list), sigmoid in the input's dtype.
		{Name: "sigmoid", SaveOut: []int{0}, BwdFactor: 1, Source: dy + ": sigmoid: sigmoid_backward(grad, result) saves the result"},
		{Name: "exp", SaveOut: []int{0}, Cast: CastFP32, BwdFactor: 1, Source: dy + ": exp: grad * result.conj() saves the result"},
		{Name: "sub", Cast: Promote, BwdFactor: 0, Source: dy + ": sub.Tensor saves nothing (other: -grad * alpha)"},
		{Name: "div", SaveIn: []int{0, 1}, Cast: Promote, BwdFactor: 2, Source: dy + ": div.Tensor: self: div_tensor_self_backward(grad, other, ...), other: div_tensor_other_backward(grad, self, other) save both"},
		{Name: "sum", Cast: CastFP32, BwdFactor: 0, Source: dy + ": sum.dim_IntList: sum_backward(grad, self.sym_sizes(), dim, keepdim) saves sizes"},
		{Name: "max_dim", SaveOut: []int{1}, BwdFactor: 0, Source: dy + ": max.dim: value_selecting_reduction_backward_symint(grad, dim, indices, self.sym_sizes(), keepdim) saves the indices"},
		// Collectives (Megatron-LM megatron/core/tensor_parallel/mappings.py,
		// token dispatchers): they save nothing; Node.Comm / BwdComm say
		// which collective runs in forward and backward.
		{Name: "tp_copy", View: true, Source: "Megatron _CopyToModelParallelRegion (f): identity forward, all-reduce of the input gradient in backward; saves nothing"},
		{Name: "tp_all_reduce", View: true, Source: "Megatron _ReduceFromModelParallelRegion (g): all-reduce forward (in place), identity backward; saves nothing"},
		{Name: "tp_all_gather", Source: "Megatron _GatherFromModelParallelRegion: all-gather forward, split backward; saves nothing"},
		{Name: "sp_all_gather", Source: "Megatron _GatherFromSequenceParallelRegion: all-gather along the sequence forward, reduce-scatter of the gradient backward; saves nothing"},
		{Name: "sp_reduce_scatter", Source: "Megatron _ReduceScatterToSequenceParallelRegion: reduce-scatter forward, all-gather backward; saves nothing"},
		{Name: "sp_split", Source: "Megatron _ScatterToSequenceParallelRegion: split (a contiguous copy of this rank's slice) forward, all-gather backward; saves nothing"},
		{Name: "all_to_all", Source: "Megatron _AllToAll (MoE token dispatch/combine): all-to-all both ways; saves nothing"},
		{Name: "vocab_parallel_cross_entropy", SaveIn: []int{}, SaveOut: []int{1, 2, 3}, BwdFactor: 1, Source: "Megatron _VocabParallelCrossEntropy: float32 softmax computed in place over the [s,b,V/t] logits, target_mask, masked_target_1d"},
	} {
		add(r)
	}
	// Checked at init: saved positions must be sane.
	for _, r := range Table {
		for _, i := range append(append([]int{}, r.SaveIn...), r.SaveOut...) {
			if i < 0 || i > 3 {
				panic(fmt.Sprintf("rule %s saves position %d", r.Name, i))
			}
		}
	}
}

// Names lists the rule names, sorted.
func Names() []string {
	out := make([]string, 0, len(Table))
	for n := range Table {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}
