package build

import (
	"github.com/memplan/memplan/ir"
	"github.com/memplan/memplan/models"
	"github.com/memplan/memplan/units"
)

// DeepSeek-V2/V3 as transformers runs them (src/transformers/models/
// deepseek_v3/modeling_deepseek_v3.py @00b676f8: DeepseekV3DecoderLayer,
// DeepseekV3Attention, DeepseekV3MoE, DeepseekV3MLP; DeepseekV2 has the same
// modules but for its rotary product, complex and cast back:
// ops.RopeComplex): the shared decoder path outside the layers
// (model.embed_tokens, model.layers.N, model.norm, lm_head) with rotary
// tables of qk_rope_head_dim.
//
// Not modelled: V3's rope_interleave (a view-transpose-reshape copy of the
// rotary slices, [B, heads, S, 64] and [B, 1, S, 64], per layer) and the
// routers' scoring (V3's sigmoid with group-limited top-k runs as the
// float32 softmax router of moe: the same [tokens, experts] float32 scores
// and top-k outputs). Routing is balanced as in moe.

// deepseekLayer is DeepseekV3DecoderLayer: pre-norm latent attention, then
// pre-norm MLP: dense for the first first_k_dense_replace layers, else the
// routed experts plus the shared experts' MLP.
func (m *builder) deepseekLayer(i int, x, cos, sin, mask ir.TensorID) ir.TensorID {
	a, b := m.a, m.b
	h := m.norm("input_layernorm", x, a.Hidden)
	att := func() ir.TensorID { defer b.Enter("self_attn")(); return m.mlaAttention(h, cos, sin, mask) }()
	x = b.Binary("add", "residual1", x, att)
	h = m.norm("post_attention_layernorm", x, a.Hidden)
	y := func() ir.TensorID {
		defer b.Enter("mlp")()
		if !a.MoELayer(i) {
			return m.gatedMLP(h, a.DenseIntermediate)
		}
		routed := m.moe(h)
		if a.SharedExperts == 0 {
			return routed
		}
		shared := func() ir.TensorID {
			defer b.Enter("shared_experts")()
			return m.gatedMLP(h, a.SharedExperts*a.Intermediate)
		}()
		return b.Binary("add", "plus_shared", routed, shared)
	}()
	return b.Binary("add", "residual2", x, y)
}

// gatedMLP is DeepseekV3MLP of width I: down_proj(act(gate_proj(h)) *
// up_proj(h)), column- and row-parallel under TP.
func (m *builder) gatedMLP(h ir.TensorID, I int) ir.TensorID {
	a, b := m.a, m.b
	h = m.colIn(h)
	gate := m.dense("gate_proj", h, a.Hidden, I, false, colPar)
	up := m.dense("up_proj", h, a.Hidden, I, false, colPar)
	var y ir.TensorID
	if m.o.FusedSwiGLU && a.Act == "silu" {
		y = b.FusedSwiGLU("gated", gate, up)
	} else {
		y = b.Binary("mul", "gated", m.act("act_fn", gate), up)
	}
	return m.dense("down_proj", y, I, a.Hidden, false, rowPar)
}

// mlaAttention is DeepseekV3Attention.forward: the query through q_proj or
// q_a_proj, q_a_layernorm and q_b_proj, split (views) into its nope and
// rotary parts; kv_a_proj_with_mqa's output split into the latent and one
// rotary key; the latent through kv_a_layernorm and kv_b_proj to per-head
// keys and values (views); rotary on the query's and the shared key's
// rotary parts; the key's expanded over the heads (a view); torch.cat of
// the parts into the query and key states (copies, which attention keeps);
// attention; the heads merged (transpose().contiguous(): a copy) and
// o_proj. Under TP the down-projections are replicated and q_b_proj,
// kv_b_proj column-parallel, o_proj row-parallel. Inference caches the
// uncompressed key and value states, as transformers 4.x's DynamicCache
// does, or (Options.MLALatentCache, 5.x) the latent and the rotary key,
// expanded over the whole cache by kv_b_proj.
func (m *builder) mlaAttention(h, cos, sin, mask ir.TensorID) ir.TensorID {
	a, b := m.a, m.b
	B, S := m.bs()
	A, _, D := m.localHeads()
	R, V := int64(a.QKRopeDim), int64(a.VHeadDim)
	N := D - R
	h = m.colIn(h)
	var q ir.TensorID
	if a.QLoRARank > 0 {
		qa := m.dense("q_a_proj", h, a.Hidden, a.QLoRARank, a.QKVBias, replicated)
		qa = m.norm("q_a_layernorm", qa, a.QLoRARank)
		q = m.dense("q_b_proj", qa, a.QLoRARank, a.Heads*a.HeadDim, false, colPar)
	} else {
		q = m.dense("q_proj", h, a.Hidden, a.Heads*a.HeadDim, false, colPar)
	}
	q = b.View("q", q, B, A, S, D)
	qPass, qRot := b.View("q_pass", q, B, A, S, N), b.View("q_rot_in", q, B, A, S, R)
	ckv := m.dense("kv_a_proj_with_mqa", h, a.Hidden, a.KVLoRARank+a.QKRopeDim, a.QKVBias, replicated)
	latent := b.View("k_latent", ckv, B, S, int64(a.KVLoRARank))
	kRot := b.View("k_rot_in", ckv, B, 1, S, R)
	latent = m.norm("kv_a_layernorm", latent, a.KVLoRARank)
	inference := m.o.KVContext > 0 && !m.o.Training
	latentCache := inference && m.o.MLALatentCache
	// kv_b_proj's heads over n tokens: views of its output.
	heads := func(x ir.TensorID, n int64) (ir.TensorID, ir.TensorID) {
		kv := m.dense("kv_b_proj", x, a.KVLoRARank, a.Heads*(a.HeadDim-a.QKRopeDim+a.VHeadDim), false, colPar)
		return b.View("k_pass", kv, B, A, n, N), b.View("value_states", kv, B, A, n, V)
	}
	var kPass, v ir.TensorID
	if !latentCache {
		kPass, v = heads(latent, S)
	}
	qRot = b.Rotary("q_rot", qRot, cos, sin, m.rope())
	kRot = b.Rotary("k_rot", kRot, cos, sin, m.rope())
	T := S
	if latentCache {
		// transformers 5.x caches the latent and the rotary key, and
		// expands every head's keys and values from the whole cache.
		T = int64(m.o.KVContext)
		latent = b.CacheWrite(b.View("kv_nope", latent, B, 1, S, int64(a.KVLoRARank)), b.KVCache("kv_nope_cache", b.Tensor(latent).DType, B, 1, T, int64(a.KVLoRARank)))
		kRot = b.CacheWrite(kRot, b.KVCache("k_rot_cache", b.Tensor(kRot).DType, B, 1, T, R))
		kPass, v = heads(latent, T)
	}
	kRot = b.View("k_rot_expand", kRot, B, A, T, R)
	query := b.Cat("query_states", 3, qPass, qRot)
	key := b.Cat("key_states", 3, kPass, kRot)
	if inference && !latentCache {
		T = int64(m.o.KVContext)
		key = b.CacheWrite(key, b.KVCache("k_cache", b.Tensor(key).DType, B, A, T, D))
		v = b.CacheWrite(v, b.KVCache("v_cache", b.Tensor(v).DType, B, A, T, V))
	}
	var o ir.TensorID
	if m.o.Attention == Eager {
		o = m.mlaEager(query, key, v, mask, T)
	} else {
		o = b.SDPA("sdpa", query, key, v, true)
	}
	o = b.View("merged", b.Copy("merge_heads", o, B, S, A, V), B, S, A*V)
	return m.dense("o_proj", o, a.Heads*a.VHeadDim, a.Hidden, a.OutBias, rowPar)
}

// mlaEager is eager_attention_forward on MLA's states: the scores of the
// query and the transposed key (matmul copies it), scaled, masked, a
// float32 softmax cast back, dropout, and the context with the values.
//
// It is Megatron's CoreAttention region, as in the other families' eager
// attention (core_attention: from the key's copy through the context
// matmul), which --checkpoint selective recomputes.
func (m *builder) mlaEager(query, key, v, mask ir.TensorID, T int64) ir.TensorID {
	b := m.b
	defer b.Enter("core_attention")()
	B, _ := m.bs()
	A, _, D := m.localHeads()
	s := b.MatMul("scores", query, b.Copy("k_t_contig", key, B, A, D, T))
	s = b.Scale("scale", s)
	if mask != ir.NoTensor {
		s = b.Binary("add", "masked", s, mask)
	}
	p := b.To(b.Softmax("probs", b.To(s, units.F32), false), b.Tensor(s).DType)
	p = b.Dropout("attn_dropout", p, m.a.AttnDropout)
	return b.MatMul("context", p, b.Copy("v_contig", v, B, A, T, int64(m.a.VHeadDim)))
}

// expertLinear is the name of a routed expert's i-th linear (gate, up,
// down): Mixtral's w1, w3, w2, and the gate_proj, up_proj, down_proj of
// DeepSeek's experts (DeepseekV3MLP, so peft's targets=gate_proj adapts the
// routed experts with the dense and shared MLPs, as in the modeling code).
func (m *builder) expertLinear(i int) string {
	if m.a.Family == models.FamilyDeepSeekV2 || m.a.Family == models.FamilyDeepSeekV3 {
		return [...]string{"gate_proj", "up_proj", "down_proj"}[i]
	}
	return [...]string{"w1", "w3", "w2"}[i]
}
