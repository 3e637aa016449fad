package build

import (
	"fmt"

	"github.com/memplan/memplan/ir"
	"github.com/memplan/memplan/models"
	"github.com/memplan/memplan/units"

	"github.com/memplan/memplan/ops"
)

// Code is whose modeling code runs a decoder: the same architecture is
// written differently by different frameworks, and the differences decide
// what autograd keeps.
type Code uint8

const (
	// CodeHF is transformers' modeling_<family>.py.
	CodeHF Code = iota
	// CodeLitGPT is lit-gpt's one GPT class (lit_gpt/model.py @8641822): q,
	// k and v come from one fused linear for every family (so the whole qkv
	// output stays alive while SDPA keeps v, a view of it), rotary
	// embeddings produce new q and k by torch.cat, and LoRA adapts parts of
	// the fused linear (LoRA.QKV) without peft's defensive clone under 4-bit.
	CodeLitGPT
)

func (c Code) String() string {
	if c == CodeLitGPT {
		return "litgpt"
	}
	return "hf"
}

// ParseCode reads hf or litgpt.
func ParseCode(s string) (Code, error) {
	switch s {
	case "hf", "transformers":
		return CodeHF, nil
	case "litgpt", "lit-gpt":
		return CodeLitGPT, nil
	}
	return 0, fmt.Errorf("unknown model code %q (want hf or litgpt)", s)
}

// Quant is how QLoRA's 4-bit base layers behave, where bitsandbytes versions
// and framework options differ.
type Quant struct {
	ops.NF4
	// NoDoubleQuant keeps one float32 absmax per 64-value block
	// (bnb.nf4, compress_statistics=False) instead of 8-bit absmax with
	// float32 constants per 256 blocks (bnb.nf4-dq).
	NoDoubleQuant bool
	// TargetsOnly quantises only the linears LoRA adapts (torchtune's
	// LoRALinear(quantize_base=True); the others stay in the model dtype),
	// instead of every linear of the body (transformers' load_in_4bit).
	TargetsOnly bool
	// FP32Rest keeps every parameter that is not 4-bit (embeddings, norms,
	// biases, an unquantised head) in float32, as peft's
	// prepare_model_for_kbit_training casts them (peft
	// src/peft/utils/other.py @v0.13.0).
	FP32Rest bool
	// Head quantises the LM head too (litgpt's bitsandbytes plugin swaps
	// every torch.nn.Linear, lm_head included; transformers' load_in_4bit
	// leaves it alone). A tied head stays as it is.
	Head bool
}

// litgptRMSNorm is lit_gpt/rmsnorm.py @8641822 L17-21, unfused and without
// an upcast:
//
//	norm_x = torch.mean(x * x, dim=-1, keepdim=True)
//	x_normed = x * torch.rsqrt(norm_x + eps)
//	return weight * x_normed
//
// It saves x, the rsqrt, x*x where mean.dim keeps its input, and x_normed
// when the weight is trained.
func (m *builder) litgptRMSNorm(x, w ir.TensorID) ir.TensorID {
	b := m.b
	sq := b.Binary("mul", "x_sq", x, x)
	ms := b.MeanLast("norm_x", sq, m.o.MeanSavesInput)
	r := b.Unary("rsqrt", "rsqrt", ms)
	xn := b.Binary("mul", "x_normed", x, r)
	return b.Binary("mul", "out", w, xn)
}

// hfRMSNorm is transformers' eager RMSNorm (LlamaRMSNorm, copied by
// mistral, mixtral, qwen2/3, phi3; modeling_llama.py @v4.46.0):
//
//	hidden_states = hidden_states.to(torch.float32)
//	variance = hidden_states.pow(2).mean(-1, keepdim=True)
//	hidden_states = hidden_states * torch.rsqrt(variance + eps)
//	return self.weight * hidden_states.to(input_dtype)
//
// It saves the float32 input (pow and the product keep it), the rsqrt, the
// pow's output where mean.dim keeps its input, and the normalised states in
// the input dtype when the weight is trained. Gemma's (modeling_gemma.py)
// multiplies by (1 + weight) in float32 before casting back, so it keeps the
// float32 normalised states instead, as torchtune's RMSNorm does from 0.5
// on when RMSNormFP32Weight is set (torchtune/modules/rms_norm.py @v0.6.1:
// F.rms_norm(x.float(), weight=self.scale).to(x.dtype): a float32 input
// with a 16-bit weight is refused by the fused kernel, "Cannot dispatch to
// fused implementation", aten/src/ATen/native/layer_norm.cpp @v2.14.1, and
// runs as _to_copy, pow, mean, add_, rsqrt, mul, mul, _to_copy, as the
// framework suite's trace of it on CPU shows).
func (m *builder) hfRMSNorm(x, w ir.TensorID) ir.TensorID {
	b := m.b
	dt := b.Tensor(x).DType
	xf := b.To(x, units.F32)
	sq := b.Unary("pow2", "pow", xf)
	ms := b.MeanLast("variance", sq, m.o.MeanSavesInput)
	r := b.Unary("rsqrt", "rsqrt", ms)
	h := b.Binary("mul", "normed", xf, r)
	if m.a.Family == models.FamilyGemma || m.a.Family == models.FamilyGemma2 || m.a.Family == models.FamilyGemma3 || m.o.RMSNormFP32Weight {
		return b.To(b.Binary("mul", "scaled", h, b.To(w, units.F32)), dt)
	}
	return b.Binary("mul", "out", w, b.To(h, dt))
}

// rope is how the model's code applies rotary embeddings: lit-gpt casts
// back to the input's dtype; transformers promotes (apply_rotary_pos_emb),
// except DeepSeek-V2's complex product, which casts back (type_as).
func (m *builder) rope() ops.Rope {
	switch {
	case m.o.Code != CodeHF:
		return ops.RopeCastBack
	case m.a.Family == models.FamilyDeepSeekV2:
		return ops.RopeComplex
	}
	return ops.RopePromote
}
