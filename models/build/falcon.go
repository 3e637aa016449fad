package build

import (
	"github.com/memplan/memplan/ir"
	"github.com/memplan/memplan/ops"
	"github.com/memplan/memplan/units"
)

// Falcon (falcon-7b) as transformers' modeling_falcon.py runs it
// (src/transformers/models/falcon/modeling_falcon.py @v5.24.0, FalconModel,
// FalconDecoderLayer, FalconAttention with sdpa, FalconMLP). Outside the
// layer it is the shared decoder path under FalconModel's names
// (transformer.word_embeddings, transformer.h.N, transformer.ln_f) with the
// rotary tables of FalconRotaryEmbedding and an lm_head tied to the
// embedding.

// falconLayer is FalconDecoderLayer with parallel_attn and the old decoder
// architecture: one input_layernorm feeds self_attention and mlp,
//
//	mlp_output += attention_output                  (in place)
//	output = dropout_add(mlp_output, residual, hidden_dropout)
//
// The in-place sum is modelled as an add (one [B, S, H] more while it runs).
func (m *builder) falconLayer(i int, x, cos, sin, mask ir.TensorID) ir.TensorID {
	a, b := m.a, m.b
	h := m.norm("input_layernorm", x, a.Hidden)
	att := func() ir.TensorID { defer b.Enter("self_attention")(); return m.falconAttention(h, cos, sin, mask) }()
	mlp := func() ir.TensorID { defer b.Enter("mlp")(); return m.mlp(h) }()
	y := b.Binary("add", "mlp_plus_attn", mlp, att)
	y = b.Dropout("hidden_dropout", y, a.HiddenDropout)
	return b.Binary("add", "residual", y, x)
}

// falconMask is FalconModel's causal mask: create_causal_mask with
// allow_is_causal_skip=False materialises a bool [B, 1, S, S] mask (an
// expanded [1, 1, S, S]) that every layer's attention receives. Under
// eager attention it is eager_mask's: that bool mask turned by torch.where
// into a float [B, 1, S, S] of 0 and the dtype's minimum, in
// inputs_embeds' dtype (masking_utils.py create_causal_mask, eager_mask
// @v5.24.0; float32 under autocast, whose embeddings stay float32).
func (m *builder) falconMask(root string) ir.TensorID {
	b := m.b
	defer b.Enter(root)()
	B, S := m.bs()
	T := m.falconKeys()
	mask := b.Zeros("causal_mask", units.Bool, 1, 1, S, T)
	if m.o.Attention != Eager {
		return mask
	}
	zero := b.View("zero_expanded", b.Zeros("zero", m.o.Precision.ParamDType()), B, 1, S, T)
	return b.Where("causal_mask_float", b.View("causal_mask_expanded", mask, B, 1, S, T), zero)
}

// falconKeys is the keys attention reads: the sequence's, or in inference
// with a KV cache the cache's length, which attention reads whole (a
// static cache, as attention's KV cache is modelled for every family).
func (m *builder) falconKeys() int64 {
	_, S := m.bs()
	if m.o.KVContext > 0 && !m.o.Training {
		return int64(m.o.KVContext)
	}
	return S
}

// falconAttention is FalconAttention.forward under sdpa with multi_query:
// fused_qkv viewed as [B, S, heads + 2, D]; the query is a slice (a view),
// the key and value are fused_qkv[..., [-2], :] and [..., [-1], :] (advanced
// indexing: copies of one head); rotary on both; then
// scaled_dot_product_attention(q, k, v, attn_mask=mask) with the single key
// and value head broadcast over the query heads. ATen turns the bool mask
// into a float one of the query's dtype per call (convert_boolean_attn_mask,
// where(mask, 0, -inf): [B, 1, S, S]), which the kernel saves.
//
// On CPU kernels the flash kernel runs (it takes a mask and broadcast heads;
// measured in the trace of torch 2.14.1). On CUDA the flash kernel refuses
// any explicit mask and the memory-efficient one unequal head counts
// (aten/src/ATen/native/transformers/cuda/sdp_utils.cpp: check_for_attn_mask,
// check_batch_size_and_num_heads_dense<false>), so the math path runs:
// scaled q and kᵀ, the broadcast kᵀ and v expanded by matmul into copies of
// every head, the scores plus the mask, softmax, and the context matmul.
func (m *builder) falconAttention(h, cos, sin, mask ir.TensorID) ir.TensorID {
	a, b := m.a, m.b
	B, S := m.bs()
	A, _, D := m.localHeads()
	y := m.dense("query_key_value", m.colIn(h), a.Hidden, (a.Heads+2)*a.HeadDim, a.QKVBias, colPar)
	q := b.View("q", y, B, A, S, D)
	k := b.Copy("k", b.View("k_head", y, B, 1, S, D), B, 1, S, D)
	v := b.Copy("v", b.View("v_head", y, B, 1, S, D), B, 1, S, D)
	q = b.Rotary("q_rot", q, cos, sin, m.rope())
	k = b.Rotary("k_rot", k, cos, sin, m.rope())
	T := m.falconKeys()
	if m.o.KVContext > 0 && !m.o.Training {
		// Inference: the one key and value head go into the cache of
		// --seq + --gen-tokens positions, which attention reads
		// (falcon-7b had none: --gen-tokens changed nothing, physical
		// sweep round 24).
		k = b.CacheWrite(k, b.KVCache("k_cache", b.Tensor(k).DType, B, 1, T, D))
		v = b.CacheWrite(v, b.KVCache("v_cache", b.Tensor(v).DType, B, 1, T, D))
	}
	if m.o.Attention == Eager {
		o := m.attentionOut(m.falconEager(q, k, v, mask), true)
		b.Release(y, q, k, v) // fused_qkv, query_layer, key_layer, value_layer: locals until forward returns
		return o
	}
	dt := b.Tensor(q).DType
	if ac := m.o.Precision.AutocastDType(); ac != units.Invalid {
		dt = ac
	}
	bias := b.Zeros("attn_mask_float", dt, B, 1, S, T)
	b.Release(mask)
	if m.o.Device == ops.CPU {
		return m.attentionOut(b.SDPAMasked("sdpa", q, k, v, bias), false)
	}
	return m.attentionOut(m.falconMathSDPA(q, k, v, bias), true)
}

// falconMathSDPA is ATen's _scaled_dot_product_attention_math
// (aten/src/ATen/native/transformers/attention.cpp @v2.14.1) on a query of
// A heads and a key and value of one head: 16-bit inputs computed in
// float32, q and kᵀ each scaled by sqrt(scale), matmul's broadcast of kᵀ
// and v over the heads copied out (and saved), the mask added, softmax
// saved, the output cast back.
func (m *builder) falconMathSDPA(q, k, v, bias ir.TensorID) ir.TensorID {
	b := m.b
	B, S := m.bs()
	A, _, D := m.localHeads()
	dt := b.Tensor(q).DType
	if ac := m.o.Precision.AutocastDType(); ac != units.Invalid {
		dt = ac
		q, k, v = b.To(q, dt), b.To(k, dt), b.To(v, dt)
	}
	q, k, v = b.To(q, units.F32), b.To(k, units.F32), b.To(v, units.F32)
	T := m.falconKeys()
	qs := b.Copy("q_contig", b.Scale("q_scaled", q), B, A, S, D)
	ks := b.Copy("k_t_expand", b.Scale("k_t_scaled", b.View("k_t", k, B, 1, D, T)), B, A, D, T)
	s := b.MatMul("scores", qs, ks)
	s = b.Binary("add", "masked", s, b.To(bias, units.F32))
	p := b.Softmax("probs", s, false)
	o := b.MatMul("context", p, b.Copy("v_expand", v, B, A, T, D))
	return b.To(o, dt)
}

// falconEager is FalconAttention.forward's eager path (rotary, no alibi;
// modeling_falcon.py @v5.24.0):
//
//	attention_scores = query_layer @ key_layer.transpose(-1, -2)
//	attention_scores /= math.sqrt(self.head_dim)
//	attention_scores = F.softmax(attention_scores + attention_mask, dim=-1, dtype=hidden_states.dtype)
//	attn_output = attention_scores @ value_layer
//
// Under autocast matmul casts its operands first, then copies them into
// contiguous batches (the query is a transposed view of the fused
// projection, rotary keeps the layout; the one key and value head is
// expanded over the query heads), and saves the copies. The in-place
// division is modelled as a scale (its output replaces the scores, which
// nothing saves: the two live together for that op only, fewer than at
// the softmax). The scores stay alive through the softmax, beside their sum
// with the mask and the probabilities, as the variable attention_scores
// holds them until the softmax is assigned to it (measured in export-hf's
// trace: three score matrices at the softmax). The sum takes the mask's
// dtype (float32 under autocast), which the softmax keeps. It is Megatron's
// CoreAttention region (core_attention), which --checkpoint selective
// recomputes.
func (m *builder) falconEager(q, k, v, mask ir.TensorID) ir.TensorID {
	b := m.b
	defer b.Enter("core_attention")()
	B, S := m.bs()
	A, _, D := m.localHeads()
	if ac := m.o.Precision.AutocastDType(); ac != units.Invalid {
		q, k, v = b.To(q, ac), b.To(k, ac), b.To(v, ac)
	}
	T := m.falconKeys()
	qc := b.Copy("q_contig", q, B, A, S, D)
	kt := b.Copy("k_t_expand", b.View("k_t", k, B, 1, D, T), B, A, D, T)
	s := b.Scale("scale", b.MatMul("scores", qc, kt))
	p := b.Softmax("probs", b.Binary("add", "masked", s, mask), false)
	b.Release(s) // attention_scores holds the scores until the softmax is assigned to it
	return b.MatMul("context", p, b.Copy("v_expand", v, B, A, T, D))
}
