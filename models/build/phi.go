package build

import (
	"github.com/memplan/memplan/ir"
	"github.com/memplan/memplan/models"
)

// Phi (phi-1, phi-1.5, phi-2) as transformers' modeling_phi.py runs it.
// Everything outside the decoder layer is the shared decoder path:
// model.embed_tokens, model.embed_dropout (embd_pdrop), the partial rotary
// cos/sin (partial_rotary_factor of each head, as gpt_neox's rotary_pct),
// model.final_layernorm and an lm_head that carries a bias (headBias).
// Attention is the shared one with separate q_proj/k_proj/v_proj and a
// "dense" output projection, all with bias; the MLP is the shared plain
// fc1 -> act (gelu_new) -> fc2 with biases.

// phiLayer is PhiDecoderLayer: one input_layernorm whose output feeds both
// self_attn and mlp (gpt_neox's parallel residual, but with a single norm),
// and one resid_dropout module applied to each branch (two masks, the
// tensors named resid_dropout_attn and resid_dropout_mlp):
//
//	h = input_layernorm(x)
//	x = resid_dropout(self_attn(h)) + resid_dropout(mlp(h)) + x
func (m *builder) phiLayer(i int, x, cos, sin, mask ir.TensorID) ir.TensorID {
	a, b := m.a, m.b
	h := m.norm("input_layernorm", x, a.Hidden)
	att := func() ir.TensorID { defer b.Enter("self_attn")(); return m.attention(i, h, cos, sin, mask) }()
	att = b.Dropout("resid_dropout_attn", att, a.HiddenDropout)
	mlp := func() ir.TensorID { defer b.Enter("mlp")(); return m.mlp(h) }()
	mlp = b.Dropout("resid_dropout_mlp", mlp, a.HiddenDropout)
	y := b.Binary("add", "attn_plus_mlp", att, mlp)
	return b.Binary("add", "residual", y, x)
}

// embedDropoutName is the module of the dropout after the token embedding
// (PhiModel.embed_dropout; "drop" for the other decoder families).
func (m *builder) embedDropoutName() string {
	if m.a.Family == models.FamilyPhi {
		return "embed_dropout"
	}
	return "drop"
}

// headBias registers the LM head's bias under the current scope (phi's
// lm_head = nn.Linear(hidden, vocab, bias=True); vocab-parallel under TP,
// like the weight), or returns ir.NoTensor when the head has none.
func (m *builder) headBias() ir.TensorID {
	if !m.a.LMHeadBias {
		return ir.NoTensor
	}
	return m.param("bias", int64(m.vocab/m.tp))
}
