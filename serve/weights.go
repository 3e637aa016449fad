package serve

import (
	"fmt"
	"strings"

	"github.com/memplan/memplan/models"
	"github.com/memplan/memplan/units"
)

// Quant is a weight quantization scheme vLLM loads. Each stores the
// linear layers of the transformer body; embeddings, norms and the LM head
// stay in the serving dtype (vLLM's quantized linear methods replace
// LinearBase layers only; ParallelLMHead is unquantized for these schemes).
type Quant uint8

const (
	NoQuant Quant = iota
	// Int8 is W8A8 int8 with a float32 scale per output channel
	// (compressed-tensors CompressedTensorsW8A8Int8, channel strategy).
	Int8
	// FP8 is float8_e4m3fn weights with a float32 scale per tensor
	// (vllm/model_executor/layers/quantization/fp8.py Fp8LinearMethod).
	FP8
	// AWQ is 4-bit weights in groups of 128: qweight int32 [in, out/8],
	// qzeros int32 [in/g, out/8], scales float16 [in/g, out]
	// (quantization/awq.py AWQLinearMethod.create_weights).
	AWQ
	// GPTQ is 4-bit weights in groups of 128: qweight int32 [in/8, out],
	// qzeros int32 [in/g, out/8], scales float16 [in/g, out], g_idx int32
	// [in] (quantization/gptq.py GPTQLinearMethod.create_weights).
	GPTQ
	// NF4 is bitsandbytes 4-bit NormalFloat, blocks of 64 with a float32
	// absmax each (quantization/bitsandbytes.py, bnb_4bit_quant_type nf4,
	// no double quantization).
	NF4
)

// GroupSize is AWQ's and GPTQ's default group (q_group_size /
// group_size 128).
const GroupSize = 128

var quantNames = [...]string{NoQuant: "none", Int8: "int8", FP8: "fp8", AWQ: "awq", GPTQ: "gptq", NF4: "nf4"}

func (q Quant) String() string {
	if int(q) < len(quantNames) {
		return quantNames[q]
	}
	return fmt.Sprintf("quant(%d)", int(q))
}

// ParseQuant reads a quantization name as vLLM's --quantization spells it
// (and the quant_method of a config's quantization_config).
func ParseQuant(s string) (Quant, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "", "none":
		return NoQuant, nil
	case "int8", "w8a8", "w8a8-int8":
		return Int8, nil
	case "fp8", "w8a8-fp8":
		return FP8, nil
	case "awq", "awq_marlin":
		return AWQ, nil
	case "gptq", "gptq_marlin":
		return GPTQ, nil
	case "nf4", "bitsandbytes", "bnb-nf4":
		return NF4, nil
	}
	return 0, bad(FieldQuant, "{quantization} %q: want none, int8, fp8, awq, gptq or nf4", s)
}

// QuantNames lists the schemes for flag help.
func QuantNames() []string { return quantNames[:] }

// linearBytes is the storage of one [out, in] linear weight under q (dt for
// unquantized weights).
func linearBytes(q Quant, out, in int64, dt units.DType) units.Bytes {
	return groupLinearBytes(q, GroupSize, out, in, dt)
}

// groupLinearBytes is linearBytes with AWQ's and GPTQ's group of g inputs.
// Bounded: out × in is one weight of a model the parser holds to 10^15
// parameters, and groups ≤ in.
func groupLinearBytes(q Quant, g, out, in int64, dt units.DType) units.Bytes {
	switch q {
	case Int8:
		return units.Bytes(out*in + 4*out)
	case FP8:
		return units.Bytes(out*in + 4)
	case AWQ:
		groups := ceilDiv(in, g)
		return units.Bytes(in*out/2 + groups*out/2 + groups*out*2)
	case GPTQ:
		groups := ceilDiv(in, g)
		return units.Bytes(in*out/2 + groups*out/2 + groups*out*2 + 4*in)
	case NF4:
		n := out * in
		return units.Bytes(n/2 + 4*ceilDiv(n, 64))
	}
	return dt.Size(out * in)
}

func ceilDiv(a, b int64) int64 { return (a + b - 1) / b }

// weightBytes is one GPU's weights: every linear of the body split over the
// TP ranks (column-parallel q/k/v and gate/up by output, row-parallel o and
// down by input; MoE experts by intermediate size), the vocabulary-parallel
// embedding and LM head (padded to 64 rows, then split), replicated norms,
// and the rotary cos/sin cache vLLM keeps in the serving dtype
// ([max_position, rotary_dim], rotary_embedding.py
// _compute_cos_sin_cache).
//
// Bounded: the sum of every weight of a model the parser holds to 10^15
// parameters, at ≤ 4 bytes each, plus max_position (≤ 2^26) × rotary_dim.
func weightBytes(s *Spec) (units.Bytes, error) {
	a, t, dt := s.Model, int64(s.TP), s.DType
	if a.Family == models.FamilyViT || a.Encoder {
		return 0, bad(FieldModel, "%s is not a decoder", a.Name)
	}
	H, I, L := int64(a.Hidden), int64(a.Intermediate), int64(a.Layers)
	q := int64(a.QDim())
	kvRank := int64(kvHeadsPerRank(s)) * int64(a.HeadDim)
	g := int64(s.GroupSize)
	if g == 0 {
		g = GroupSize
	}
	lin := func(out, in int64) units.Bytes { return groupLinearBytes(s.Quant, g, out, in, dt) }
	// Attention: one fused qkv (column-parallel) and o (row-parallel).
	attn := lin(q/t+2*kvRank, H) + lin(H, q/t)
	if a.QKVBias {
		attn += dt.Size(q/t + 2*kvRank)
	}
	if a.OutBias {
		attn += dt.Size(H)
	}
	var mlp units.Bytes
	up := int64(1)
	if a.GatedMLP {
		up = 2
	}
	mlp = lin(up*I/t, H) + lin(H, I/t)
	if a.MLPBias {
		mlp += dt.Size(up*I/t + H)
	}
	if a.NumExperts > 0 {
		// FusedMoE: every expert's w13 and w2, split by intermediate size;
		// the router (gate) is replicated and unquantized.
		mlp = units.Bytes(a.NumExperts)*mlp + dt.Size(H*int64(a.NumExperts))
	}
	var norms int64
	for _, g := range a.ParamBreakdown() {
		if g.Name == "norms" {
			norms = g.Total
		}
	}
	vpad := ceilDiv(int64(a.Vocab), vocabPadding) * vocabPadding
	emb := dt.Size(vpad / t * H)
	var other int64
	for _, g := range a.ParamBreakdown() {
		if g.Name == "embeddings" {
			other = g.Total - int64(a.Vocab)*H // learned positions, replicated
		}
	}
	head := units.Bytes(0)
	if !a.TieEmbeddings {
		head = dt.Size(vpad / t * H)
	}
	if a.LMHeadBias {
		head += dt.Size(vpad / t)
	}
	layers := units.Bytes(L) * (attn + mlp)
	if a.MLA() {
		layers = deepseekBytes(s, lin, mlp)
	}
	total := layers + emb + head + dt.Size(norms+other)
	if a.PosEmbedding == models.PosRotary {
		rot := int64(float64(a.HeadDim) * a.RotaryPct)
		total += dt.Size(int64(a.MaxPositions) * rot)
	}
	return total, nil
}

// deepseekBytes is DeepSeek-V2/V3's layers as vLLM's deepseek_v2.py holds
// them on one GPU: DeepseekV2MLAAttention's q_a_proj and kv_a_proj_with_mqa
// replicated, q_b_proj (or q_proj) and kv_b_proj column-parallel, o_proj
// row-parallel; the routed experts (experts, as weightBytes sizes them),
// plus DeepseekV2MoE's shared_experts, one MLP of n_shared widths split
// over the ranks; a dense MLP in the first first_k_dense_replace layers.
// Norms (q_a_layernorm and kv_a_layernorm included) are counted with the
// others.
// Bounded as weightBytes.
func deepseekBytes(s *Spec, lin func(out, in int64) units.Bytes, experts units.Bytes) units.Bytes {
	a, t := s.Model, int64(s.TP)
	H, A, D := int64(a.Hidden), int64(a.Heads), int64(a.HeadDim)
	ql, kvl, R, V := int64(a.QLoRARank), int64(a.KVLoRARank), int64(a.QKRopeDim), int64(a.VHeadDim)
	q := lin(A*D/t, H)
	if ql > 0 {
		q = lin(ql, H) + lin(A*D/t, ql)
	}
	attn := q + lin(kvl+R, H) + lin(A*(D-R+V)/t, kvl) + lin(H, A*V/t)
	gated := func(I int64) units.Bytes { return lin(2*I/t, H) + lin(H, I/t) }
	moe := experts + gated(int64(a.SharedExperts)*int64(a.Intermediate))
	L, dense := int64(a.Layers), int64(a.DenseLayers)
	return units.Bytes(L)*attn + units.Bytes(L-dense)*moe + units.Bytes(dense)*gated(int64(a.DenseIntermediate))
}
