package build

import (
	"fmt"

	"github.com/memplan/memplan/ir"

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
	return 0, fmt.Errorf("build: unknown model code %q (want hf or litgpt)", s)
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
