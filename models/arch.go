package models

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// PosEmbedding is how a model encodes token positions. Its values are the
// spellings the model's own documentation uses, so messages that print one
// read as before.
type PosEmbedding string

const (
	PosLearned PosEmbedding = "learned" // an absolute position table (gpt2, bert, vit)
	PosRotary  PosEmbedding = "rotary"  // rotary embeddings applied inside attention
)

// Norm is a model's normalisation layer.
type Norm string

const (
	LayerNorm Norm = "layernorm" // torch.nn.LayerNorm: mean and variance
	RMSNorm   Norm = "rmsnorm"   // root-mean-square norm (transformers LlamaRMSNorm)
)

// Family names, equal to the HuggingFace config.json "model_type" values.
// Each family's defaults and policies are its row of families (families.go).
//
// Per-family quirks that matter for parameter counts and op structure:
//
//   - gpt2: learned absolute position table (n_positions x n_embd); LayerNorm
//     with bias before attention and MLP (pre-LN) plus a final ln_f; fused
//     c_attn (Conv1D n_embd -> 3*n_embd, with bias); c_proj, c_fc, c_proj all
//     with bias; non-gated MLP of width n_inner (null -> 4*n_embd); lm_head is
//     tied to wte. The causal mask attn.bias is a buffer, not a parameter.
//   - llama: RMSNorm (weight only) pre-attention and pre-MLP plus a final norm;
//     rotary positions; separate q/k/v/o projections, bias only if
//     attention_bias; gated SiLU MLP (gate_proj, up_proj, down_proj), bias only
//     if mlp_bias; GQA via num_key_value_heads; optional head_dim (Llama 3.2
//     writes it, it equals hidden/heads there); untied unless
//     tie_word_embeddings (Llama 3.2 1B/3B tie).
//   - mistral: llama structure plus sliding-window attention on every layer.
//   - mixtral: mistral attention; every MLP is a sparse MoE block: a bias-free
//     router Linear(hidden, num_local_experts) and num_local_experts gated
//     experts (w1, w3: hidden->intermediate, w2: intermediate->hidden), top
//     num_experts_per_tok routing.
//   - qwen3_moe: qwen3 attention (q_norm/k_norm, explicit head_dim); every
//     MLP is a Qwen3MoeSparseMoeBlock: a bias-free router weight
//     [num_experts, hidden] and num_experts gated experts of width
//     moe_intermediate_size (experts.gate_up_proj [E, 2*I, H], down_proj
//     [E, H, I]); top num_experts_per_tok routing whose weights are
//     renormalised to sum to 1 when norm_topk_prob. Dense layers
//     (mlp_only_layers, decoder_sparse_step > 1) are refused.
//   - qwen2: llama structure, but q_proj, k_proj and v_proj always carry a
//     bias and o_proj never does; sliding window only when use_sliding_window.
//   - qwen3: llama structure with explicit head_dim (128 even where
//     hidden/heads differs), no qkv bias (attention_bias false), and q_norm /
//     k_norm: RMSNorm(head_dim) applied per head to queries and keys.
//   - gemma: llama-like, head_dim explicit (256), embeddings multiplied by
//     sqrt(hidden) (no parameter), RMSNorm computes x*(1+w) (same parameter
//     count), GeGLU MLP with tanh-approximated GELU (hidden_activation, or
//     gelu_pytorch_tanh when only the legacy hidden_act is given), embeddings
//     always tied to the LM head.
//   - gemma2: gemma plus four RMSNorms per layer (input, post-attention,
//     pre-feedforward, post-feedforward), attention and final-logit soft-capping,
//     query_pre_attn_scalar, and sliding-window attention on every other layer.
//   - gemma3_text: gemma2's four norms per layer, x*(1+w) RMSNorms and
//     scaled, tied embeddings, plus qwen3-style q_norm/k_norm over head_dim;
//     no soft-capping unless the config sets it; sliding-window attention on
//     every layer but each sliding_window_pattern-th (layer_types), whose
//     rotary tables use rope_local_base_freq while the full-attention layers
//     use rope_theta (two cos/sin pairs, Gemma3TextModel.forward @v5.24.0).
//   - phi3: llama-like RMSNorm/rotary/SwiGLU but with a fused qkv_proj
//     (hidden -> (heads + 2*kv_heads)*head_dim) and a fused gate_up_proj
//     (hidden -> 2*intermediate), no biases, untied LM head, resid/embd dropout.
//   - gpt_neox (Pythia): LayerNorm with bias, two per layer (input and
//     post-attention) plus final_layer_norm; fused query_key_value with bias;
//     dense, dense_h_to_4h and dense_4h_to_h with bias; non-gated GELU MLP;
//     partial rotary (rotary_pct of each head, no parameters); parallel residual
//     (attention and MLP read the same input) when use_parallel_residual;
//     separate embed_out (no bias) unless tie_word_embeddings.
//   - phi (phi-1, phi-1.5, phi-2): one LayerNorm with bias per layer
//     (input_layernorm) whose output feeds attention and MLP in parallel
//     (x + attn(ln(x)) + mlp(ln(x))), plus final_layernorm; separate
//     q_proj/k_proj/v_proj and a dense output projection, all with bias;
//     partial rotary (partial_rotary_factor of each head, no parameters);
//     non-gated gelu_new MLP fc1/fc2 with bias; lm_head untied unless
//     tie_word_embeddings, always with a bias of vocab_size (PhiForCausalLM
//     nn.Linear(hidden, vocab, bias=True)); resid_pdrop after attention and
//     after the MLP, embd_pdrop after the embeddings. qk_layernorm=true is
//     refused.
//   - falcon (falcon-7b: parallel_attn, multi_query, no alibi, no bias, the
//     old decoder architecture; others are refused by key): one LayerNorm with
//     bias per layer feeding attention and MLP in parallel, plus ln_f; a fused
//     query_key_value (hidden -> (heads + 2)*head_dim: one key and one value
//     head), no biases; full rotary; non-gated GELU MLP dense_h_to_4h /
//     dense_4h_to_h (ffn_hidden_size, default 4*hidden); lm_head tied to
//     word_embeddings unless tie_word_embeddings is false.
//   - deepseek_v2, deepseek_v3 (transformers DeepseekV2/V3ForCausalLM,
//     DeepSeek's modeling_deepseek.py): llama's RMSNorm, rotary and SwiGLU
//     with multi-head latent attention: q_proj (hidden -> heads*(nope+rope)),
//     or when q_lora_rank is set q_a_proj (hidden -> q_lora_rank),
//     q_a_layernorm and q_b_proj (q_lora_rank -> heads*(nope+rope));
//     kv_a_proj_with_mqa (hidden -> kv_lora_rank + rope: the latent and one
//     rotary key shared by every head), kv_a_layernorm over the latent,
//     kv_b_proj (kv_lora_rank -> heads*(nope+v_head_dim)); o_proj
//     (heads*v_head_dim -> hidden); biases on q_a/kv_a/o only with
//     attention_bias. The first first_k_dense_replace layers have a dense
//     MLP of intermediate_size; the others a MoE of n_routed_experts
//     experts of moe_intermediate_size (top num_experts_per_tok, a
//     bias-free router [n_routed_experts, hidden]) plus n_shared_experts
//     shared experts run as one MLP of n_shared*moe_intermediate_size that
//     every token passes. V3's router e_score_correction_bias is a buffer
//     in transformers, not a parameter. The multi-token-prediction layers
//     (num_nextn_predict_layers, model.layers.61 of V3) are not loaded by
//     transformers and not counted (MTPParamCount gives them). A layer
//     pattern other than moe_layer_freq 1 is refused.
//   - bert: bidirectional post-LN encoder; embeddings = word, learned position
//     and token_type tables summed, then a LayerNorm; q/k/v/o with bias; LayerNorm
//     after attention and after the MLP; counted as BertModel with its pooler
//     (dense hidden->hidden with bias, tanh), no MLM/NSP heads.
//   - vit: pre-LN bidirectional encoder over (image/patch)^2 patches plus a CLS
//     token; patch embedding is a Conv2d(channels, hidden, patch, stride=patch)
//     with bias; learned position table of num_patches+1 rows; q/k/v with
//     bias when qkv_bias; final LayerNorm. ViTForImageClassification checkpoints
//     (architectures says so) have no pooler and a Linear(hidden, num_labels)
//     classifier with bias; ViTModel checkpoints have a pooler and no classifier.
const (
	FamilyGPT2       = "gpt2"
	FamilyLlama      = "llama"
	FamilyMistral    = "mistral"
	FamilyMixtral    = "mixtral"
	FamilyQwen2      = "qwen2"
	FamilyQwen3      = "qwen3"
	FamilyQwen3MoE   = "qwen3_moe"
	FamilyGemma      = "gemma"
	FamilyGemma2     = "gemma2"
	FamilyGemma3     = "gemma3_text"
	FamilyPhi3       = "phi3"
	FamilyGPTNeoX    = "gpt_neox"
	FamilyPhi        = "phi"
	FamilyFalcon     = "falcon"
	FamilyDeepSeekV2 = "deepseek_v2"
	FamilyDeepSeekV3 = "deepseek_v3"
	FamilyBERT       = "bert"
	FamilyViT        = "vit"
)

// Activation names accepted in hidden_act / activation_function (the keys of
// transformers' ACT2FN that are plain elementwise functions).
var knownActs = map[string]bool{
	"gelu": true, "gelu_new": true, "gelu_fast": true, "gelu_pytorch_tanh": true,
	"gelu_accurate": true, "gelu_python": true, "gelu_10": true, "quick_gelu": true,
	"silu": true, "swish": true, "relu": true, "relu2": true, "relu6": true,
	"leaky_relu": true, "tanh": true, "sigmoid": true, "mish": true, "linear": true,
	"laplace": true,
}

// Arch is a normalized architecture description, independent of the HF field
// names of each family. Build one with ParseHFConfig, LoadFile, Lookup or
// Resolve; an Arch built by hand should pass Validate before use.
type Arch struct {
	Name         string // catalog name or file path it came from
	Family       string // HF model_type (see the Family* constants)
	Architecture string // config "architectures"[0], e.g. LlamaForCausalLM ("" if absent)
	// Quant is the config's quantization_config (nil: unquantized weights).
	Quant *Quantization

	Hidden       int // d_model
	Layers       int
	Heads        int
	KVHeads      int // == Heads without GQA
	HeadDim      int // Hidden/Heads unless config says head_dim (Gemma, Qwen3)
	Intermediate int // FFN inner size (per expert for MoE)
	Vocab        int // 0 for vit (no token embedding)
	MaxPositions int // learned table rows for gpt2/bert; context limit for rotary; num_patches+1 for vit

	PosEmbedding PosEmbedding // PosLearned (gpt2/bert/vit absolute position table) or PosRotary
	RotaryPct    float64      // fraction of each head that is rotated (gpt_neox rotary_pct, phi partial_rotary_factor); 1 for rotary families, 0 for learned
	RopeTheta    float64      // rotary base; 0 for learned positions

	Norm     Norm // LayerNorm or RMSNorm
	NormBias bool // LayerNorm has a bias
	NormEps  float64

	Act         string // hidden_act: gelu, gelu_new, gelu_pytorch_tanh, silu, relu ...
	GatedMLP    bool   // gate_proj+up_proj+down_proj (SwiGLU/GeGLU) vs fc1/fc2
	FusedQKV    bool   // gpt2 c_attn, gpt_neox and falcon query_key_value, phi3 qkv_proj (matters for op structure, not params)
	FusedGateUp bool   // phi3 gate_up_proj

	QKVBias bool // q/k/v projections carry a bias
	OutBias bool // attention output projection carries a bias
	MLPBias bool // MLP projections carry biases
	QKNorm  bool // Qwen3 q_norm/k_norm (RMSNorm over head_dim)

	TieEmbeddings    bool // LM head shares the token embedding matrix
	ParallelResidual bool // gpt_neox use_parallel_residual; phi always
	SharedNorm       bool // phi: one input_layernorm feeds attention and MLP (1 norm per layer; needs ParallelResidual)
	LMHeadBias       bool // phi: lm_head carries a bias of Vocab (also when the weight is tied)
	PostNorms        bool // gemma2: post_attention_layernorm + pre/post_feedforward_layernorm (4 norms per layer)
	EmbedScale       bool // gemma/gemma2 multiply embeddings by sqrt(Hidden)

	NumExperts      int  // MoE experts per layer; 0 = dense
	ExpertsPerToken int  // MoE top-k; router is a bias-free Linear(Hidden, NumExperts)
	NormTopK        bool // qwen3_moe norm_topk_prob: the top-k routing weights are divided by their sum
	// SharedExperts (deepseek n_shared_experts) run as one gated MLP of
	// SharedExperts*Intermediate beside the routed experts; DenseLayers
	// (first_k_dense_replace) first layers have a dense gated MLP of
	// DenseIntermediate instead of experts.
	SharedExperts     int
	DenseLayers       int
	DenseIntermediate int
	// MTPLayers is DeepSeek-V3's num_nextn_predict_layers: modules in the
	// checkpoint that transformers does not load (MTPParamCount).
	MTPLayers int

	// Multi-head latent attention (deepseek, KVLoRARank > 0): HeadDim is
	// qk_nope_head_dim + qk_rope_head_dim; QLoRARank is q_lora_rank (0: a
	// plain q_proj), KVLoRARank kv_lora_rank, QKRopeDim qk_rope_head_dim
	// (the rotary part of each query and key head, the key's shared by every
	// head), VHeadDim v_head_dim.
	QLoRARank, KVLoRARank, QKRopeDim, VHeadDim int

	SlidingWindow            int  // 0 = none
	SlidingWindowAlternating bool // gemma2: window only on every other layer (even layer indices)
	// SlidingWindowPattern n > 0 (gemma3_text): layer i has full attention
	// when (i+1)%n == 0 and the sliding window otherwise; RopeLocalTheta is
	// the sliding layers' rotary base.
	SlidingWindowPattern int
	RopeLocalTheta       float64

	AttnLogitSoftcap   float64 // gemma2 attn_logit_softcapping; 0 = none
	FinalLogitSoftcap  float64 // gemma2 final_logit_softcapping; 0 = none
	QueryPreAttnScalar float64 // gemma2 query_pre_attn_scalar (scale = 1/sqrt of it); 0 = head_dim

	Encoder   bool // bert/vit: bidirectional encoder, post-LN for bert
	TypeVocab int  // bert token_type embeddings
	Pooler    bool // bert/vit pooler dense layer (included when the real checkpoint has it)

	ImageSize, PatchSize, Channels int // vit
	NumLabels                      int // vit classification head rows (0 = no classifier)

	AttnDropout   float64 // attn_pdrop / attention_probs_dropout_prob / attention_dropout
	HiddenDropout float64 // resid_pdrop / hidden_dropout_prob / hidden_dropout
	EmbdDropout   float64 // embd_pdrop (bert/vit/gpt_neox: the hidden dropout applied after the embeddings)

	TorchDType string // config torch_dtype ("" if absent)
}

// Clone returns a deep copy (Arch has no reference fields, so a value copy).
func (a *Arch) Clone() *Arch {
	if a == nil {
		return nil
	}
	c := *a
	return &c
}

// NumPatches is the number of image patches for vit (0 otherwise).
func (a *Arch) NumPatches() int {
	if a.Family != FamilyViT || a.PatchSize <= 0 {
		return 0
	}
	n := a.ImageSize / a.PatchSize
	return n * n
}

// QDim is the width of the query projection output (Heads*HeadDim).
func (a *Arch) QDim() int { return a.Heads * a.HeadDim }

// KVDim is the width of the key (and of the value) projection output.
func (a *Arch) KVDim() int { return a.KVHeads * a.HeadDim }

// IsMoE reports whether the MLP is a sparse mixture of experts.
func (a *Arch) IsMoE() bool { return a.NumExperts > 0 }

// MLA reports whether attention is multi-head latent attention (DeepSeek).
func (a *Arch) MLA() bool { return a.KVLoRARank > 0 }

// VDim is the width of one value head: v_head_dim under MLA, else HeadDim.
func (a *Arch) VDim() int {
	if a.MLA() {
		return a.VHeadDim
	}
	return a.HeadDim
}

// MoELayer reports whether decoder layer i has experts (false for the
// first DenseLayers layers and for dense models).
func (a *Arch) MoELayer(i int) bool { return a.NumExperts > 0 && i >= a.DenseLayers }

// KVCacheElems is what a paged KV cache stores per token and per layer, in
// elements, summed over every KV head: keys and values (2·KVHeads·HeadDim),
// or under MLA the compressed latent and the shared rotary key,
// kv_lora_rank + qk_rope_head_dim (vLLM's MLA backends cache only those,
// one "head" of 576 for DeepSeek-V2/V3: DeepSeek-V2 paper, arXiv 2405.04434,
// Table 1, (d_c + d_h^R)·l with d_c = 4·d_h = 512 and d_h^R = d_h/2 = 64).
func (a *Arch) KVCacheElems() int {
	if a.MLA() {
		return a.KVLoRARank + a.QKRopeDim
	}
	return 2 * a.KVHeads * a.HeadDim
}

// Limits keep every parameter-count product far inside int64.
const (
	maxDim        = 1 << 20 // hidden, intermediate, head_dim, image_size
	maxLayers     = 1 << 12
	maxHeads      = 1 << 14
	maxVocab      = 1 << 24
	maxPositions  = 1 << 26
	maxExperts    = 1 << 12
	maxParamCount = 1e15 // a float64 estimate above this is rejected
)

// Validate checks that the description is internally consistent: positive
// sizes, heads dividing hidden (unless the family has an explicit head_dim),
// KV heads dividing heads, top-k experts within the expert count, sane
// dropouts, and a parameter count that fits comfortably in an int64.
func (a *Arch) Validate() error {
	if a == nil {
		return fmt.Errorf("nil architecture")
	}
	if !knownFamily(a.Family) {
		return a.fail("unsupported family %q (supported: %s)", a.Family, strings.Join(Families(), ", "))
	}
	for _, check := range []func() error{a.checkSizes, a.checkHeads, a.checkPositions, a.checkNorm,
		a.checkDropouts, a.checkExperts, a.checkDeepSeek, a.checkOptions, a.checkFamilyFields} {
		if err := check(); err != nil {
			return err
		}
	}
	if est := a.paramEstimate(); est > maxParamCount {
		return a.fail("parameter count ~%.3g exceeds the supported maximum %.0g", est, float64(maxParamCount))
	}
	return nil
}

// fail is a Validate error naming the architecture.
func (a *Arch) fail(format string, args ...any) error {
	name := a.Name
	if name == "" {
		name = "arch"
	}
	return fmt.Errorf("%s: %s", name, fmt.Sprintf(format, args...))
}

// archBound is a size and its supported maximum.
type archBound struct {
	name string
	v    int
	max  int
}

// checkSizes checks that every size is positive and within its supported maximum (vit has no vocabulary).
func (a *Arch) checkSizes() error {
	bounds := []archBound{
		{"Hidden", a.Hidden, maxDim},
		{"Layers", a.Layers, maxLayers},
		{"Heads", a.Heads, maxHeads},
		{"KVHeads", a.KVHeads, maxHeads},
		{"HeadDim", a.HeadDim, maxDim},
		{"Intermediate", a.Intermediate, maxDim},
		{"MaxPositions", a.MaxPositions, maxPositions},
	}
	if a.Family != FamilyViT {
		bounds = append(bounds, archBound{"Vocab", a.Vocab, maxVocab})
	}
	for _, b := range bounds {
		if b.v <= 0 {
			return a.fail("%s must be positive, got %d", b.name, b.v)
		}
		if b.v > b.max {
			return a.fail("%s %d exceeds the supported maximum %d", b.name, b.v, b.max)
		}
	}
	if a.Family == FamilyViT && a.Vocab != 0 {
		return a.fail("Vocab must be 0 for vit, got %d", a.Vocab)
	}
	return nil
}

// checkHeads checks that heads divide hidden (unless the family has an explicit head_dim) and KV heads divide
// heads.
func (a *Arch) checkHeads() error {
	if a.Heads*a.HeadDim != a.Hidden && !explicitHeadDimFamily(a.Family) {
		if a.Hidden%a.Heads != 0 {
			return a.fail("Heads (%d) must divide Hidden (%d)", a.Heads, a.Hidden)
		}
		return a.fail("HeadDim must be Hidden/Heads = %d for %s, got %d", a.Hidden/a.Heads, a.Family, a.HeadDim)
	}
	if a.Heads%a.KVHeads != 0 {
		return a.fail("KVHeads (%d) must divide Heads (%d)", a.KVHeads, a.Heads)
	}
	return nil
}

// checkPositions checks the position embedding and its rotary parameters.
func (a *Arch) checkPositions() error {
	switch a.PosEmbedding {
	case PosLearned:
		if a.RotaryPct != 0 {
			return a.fail("RotaryPct must be 0 with learned positions, got %g", a.RotaryPct)
		}
	case PosRotary:
		if !(a.RotaryPct > 0 && a.RotaryPct <= 1) {
			return a.fail("RotaryPct must be in (0, 1], got %g", a.RotaryPct)
		}
		if !(a.RopeTheta > 0) || math.IsInf(a.RopeTheta, 0) {
			return a.fail("RopeTheta must be positive, got %g", a.RopeTheta)
		}
	default:
		return a.fail("PosEmbedding must be \"learned\" or \"rotary\", got %q", a.PosEmbedding)
	}
	return nil
}

// checkNorm checks the normalisation, its epsilon and the activation.
func (a *Arch) checkNorm() error {
	switch a.Norm {
	case LayerNorm:
	case RMSNorm:
		if a.NormBias {
			return a.fail("RMSNorm has no bias")
		}
	default:
		return a.fail("Norm must be \"layernorm\" or \"rmsnorm\", got %q", a.Norm)
	}
	if !(a.NormEps >= 0 && a.NormEps < 1) {
		return a.fail("NormEps must be in [0, 1), got %g", a.NormEps)
	}
	if !knownActs[a.Act] {
		return a.fail("unsupported activation %q", a.Act)
	}
	return nil
}

// checkDropouts checks that every dropout is a probability.
func (a *Arch) checkDropouts() error {
	for _, d := range []struct {
		name string
		v    float64
	}{{"AttnDropout", a.AttnDropout}, {"HiddenDropout", a.HiddenDropout}, {"EmbdDropout", a.EmbdDropout}} {
		if !(d.v >= 0 && d.v <= 1) {
			return a.fail("%s must be in [0, 1], got %g", d.name, d.v)
		}
	}
	return nil
}

// checkExperts checks the expert count and top-k.
func (a *Arch) checkExperts() error {
	if a.NumExperts < 0 || a.NumExperts > maxExperts {
		return a.fail("NumExperts must be in [0, %d], got %d", maxExperts, a.NumExperts)
	}
	if a.NumExperts > 0 {
		if a.ExpertsPerToken <= 0 || a.ExpertsPerToken > a.NumExperts {
			return a.fail("ExpertsPerToken must be in [1, NumExperts=%d], got %d", a.NumExperts, a.ExpertsPerToken)
		}
	} else if a.ExpertsPerToken != 0 {
		return a.fail("ExpertsPerToken is %d but the model has no experts", a.ExpertsPerToken)
	}
	if (a.Family == FamilyMixtral || a.Family == FamilyQwen3MoE) && a.NumExperts == 0 {
		return a.fail("%s needs NumExperts > 0", a.Family)
	}
	return nil
}

// isDeepSeek reports whether f is a DeepSeek family.
func isDeepSeek(f string) bool { return f == FamilyDeepSeekV2 || f == FamilyDeepSeekV3 }

// checkDeepSeek checks multi-head latent attention, the shared experts and
// the dense first layers: DeepSeek's fields, zero elsewhere.
func (a *Arch) checkDeepSeek() error {
	if !isDeepSeek(a.Family) {
		if a.MLA() || a.QLoRARank|a.QKRopeDim|a.VHeadDim|a.SharedExperts|a.DenseLayers|a.DenseIntermediate|a.MTPLayers != 0 {
			return a.fail("latent attention, shared experts and dense first layers are DeepSeek's (%s has none)", a.Family)
		}
		return nil
	}
	for _, b := range []archBound{{"KVLoRARank", a.KVLoRARank, maxDim}, {"VHeadDim", a.VHeadDim, maxDim}, {"QKRopeDim", a.QKRopeDim, a.HeadDim - 1}} {
		if b.v <= 0 || b.v > b.max {
			return a.fail("%s must be in [1, %d], got %d", b.name, b.max, b.v)
		}
	}
	switch {
	case a.QKRopeDim%2 != 0:
		return a.fail("QKRopeDim must be even (rotary pairs), got %d", a.QKRopeDim)
	case a.QLoRARank < 0 || a.QLoRARank > maxDim:
		return a.fail("QLoRARank must be in [0, %d], got %d", maxDim, a.QLoRARank)
	case a.KVHeads != a.Heads:
		return a.fail("KVHeads must equal Heads under latent attention, got %d and %d", a.KVHeads, a.Heads)
	case a.NumExperts == 0:
		return a.fail("%s needs NumExperts > 0", a.Family)
	case a.SharedExperts < 0 || a.SharedExperts > maxExperts:
		return a.fail("SharedExperts must be in [0, %d], got %d", maxExperts, a.SharedExperts)
	case a.DenseLayers < 0 || a.DenseLayers > a.Layers:
		return a.fail("DenseLayers must be in [0, Layers=%d], got %d", a.Layers, a.DenseLayers)
	case a.DenseLayers > 0 && (a.DenseIntermediate <= 0 || a.DenseIntermediate > maxDim):
		return a.fail("DenseIntermediate must be in [1, %d], got %d", maxDim, a.DenseIntermediate)
	case a.MTPLayers < 0 || a.MTPLayers > maxLayers:
		return a.fail("MTPLayers must be in [0, %d], got %d", maxLayers, a.MTPLayers)
	}
	return nil
}

// checkOptions checks the switches that need one another, the sliding window and the soft caps.
func (a *Arch) checkOptions() error {
	switch {
	case a.FusedGateUp && !a.GatedMLP:
		return a.fail("FusedGateUp requires GatedMLP")
	case a.SharedNorm && (!a.ParallelResidual || a.PostNorms):
		return a.fail("SharedNorm requires ParallelResidual and no PostNorms")
	case a.LMHeadBias && a.Encoder:
		return a.fail("LMHeadBias is for causal LM heads, not encoders")
	case a.Family == FamilyPhi && a.QKNorm:
		return a.fail("phi qk_layernorm is not modelled")
	case a.SlidingWindow < 0:
		return a.fail("SlidingWindow must be >= 0, got %d", a.SlidingWindow)
	}
	for _, s := range []struct {
		name string
		v    float64
	}{{"AttnLogitSoftcap", a.AttnLogitSoftcap}, {"FinalLogitSoftcap", a.FinalLogitSoftcap}, {"QueryPreAttnScalar", a.QueryPreAttnScalar}} {
		if !(s.v >= 0) || math.IsInf(s.v, 0) {
			return a.fail("%s must be a finite value >= 0, got %g", s.name, s.v)
		}
	}
	return nil
}

// checkFamilyFields checks the fields only some families have: token types (bert), the image (vit), labels.
func (a *Arch) checkFamilyFields() error {
	switch a.Family {
	case FamilyBERT:
		if a.TypeVocab < 0 || a.TypeVocab > maxVocab {
			return a.fail("TypeVocab must be in [0, %d], got %d", maxVocab, a.TypeVocab)
		}
	case FamilyViT:
		for _, b := range []archBound{{"ImageSize", a.ImageSize, maxDim}, {"PatchSize", a.PatchSize, maxDim}, {"Channels", a.Channels, maxDim}} {
			if b.v <= 0 || b.v > b.max {
				return a.fail("%s must be in [1, %d], got %d", b.name, b.max, b.v)
			}
		}
		if a.PatchSize > a.ImageSize {
			return a.fail("PatchSize (%d) must not exceed ImageSize (%d)", a.PatchSize, a.ImageSize)
		}
		if a.MaxPositions != a.NumPatches()+1 {
			return a.fail("MaxPositions must be num_patches+1 = %d for vit, got %d", a.NumPatches()+1, a.MaxPositions)
		}
	}
	if a.NumLabels < 0 || a.NumLabels > maxVocab {
		return a.fail("NumLabels must be in [0, %d], got %d", maxVocab, a.NumLabels)
	}
	if a.Family != FamilyBERT && a.TypeVocab != 0 {
		return a.fail("TypeVocab is only meaningful for bert, got %d", a.TypeVocab)
	}
	return nil
}

// paramEstimate mirrors ParamCount in float64 so Validate can reject sizes
// whose exact int64 count could overflow.
func (a *Arch) paramEstimate() float64 {
	var sum float64
	for _, g := range breakdown[float64](a) {
		sum += g.total
	}
	return sum
}

// ParamGroup is one named slice of the parameter count.
type ParamGroup struct {
	Name     string // embeddings, attention, mlp, norms, lm_head, pooler, classifier
	PerLayer int64  // share of one transformer layer (0 for groups outside the layers)
	Total    int64  // whole-model count of the group
}

type group[T int64 | float64] struct {
	name            string
	perLayer, total T
}

// breakdown holds the parameter formulas once, evaluated exactly in int64 or
// as an overflow-free estimate in float64: one function per group.
func breakdown[T int64 | float64](a *Arch) []group[T] {
	L, H := T(a.Layers), T(a.Hidden)
	attn, mlp := attentionParams[T](a), mlpParams[T](a)
	perNorms, norms := normParams[T](a)
	gs := []group[T]{
		{"embeddings", 0, embeddingParams[T](a)},
		{"attention", attn, L * attn},
		{"mlp", mlp, mlpTotal[T](a)},
		{"norms", perNorms, norms},
		{"lm_head", 0, lmHeadParams[T](a)},
	}
	if a.Pooler {
		gs = append(gs, group[T]{"pooler", 0, H*H + H})
	}
	if a.NumLabels > 0 {
		n := T(a.NumLabels)
		gs = append(gs, group[T]{"classifier", 0, H*n + n})
	}
	return gs
}

// onlyIf is n when on holds, else 0.
func onlyIf[T int64 | float64](on bool, n T) T {
	if on {
		return n
	}
	return 0
}

// normSize is one norm over n features: LayerNorm weight+bias, RMSNorm weight only.
func normSize[T int64 | float64](a *Arch, n T) T {
	if a.Norm == LayerNorm && a.NormBias {
		return 2 * n
	}
	return n
}

// embeddingParams counts the input tables: tokens (with learned positions and BERT's token types), or ViT's
// patch embedding.
func embeddingParams[T int64 | float64](a *Arch) T {
	H := T(a.Hidden)
	if a.Family == FamilyViT {
		// cls_token (H) + position_embeddings ((patches+1) x H) +
		// patch Conv2d weight (H x C x p x p) and bias (H).
		p := T(a.PatchSize)
		return H + T(a.MaxPositions)*H + H*T(a.Channels)*p*p + H
	}
	emb := T(a.Vocab) * H
	if a.PosEmbedding == PosLearned {
		emb += T(a.MaxPositions) * H
	}
	if a.Family == FamilyBERT {
		emb += T(a.TypeVocab) * H
	}
	return emb
}

// attentionParams is one layer's attention: Q, K, V (fused or separate: same count) and the output projection.
func attentionParams[T int64 | float64](a *Arch) T {
	if a.MLA() {
		return mlaParams[T](a)
	}
	H := T(a.Hidden)
	q, kv := T(a.QDim()), T(a.KVDim())
	return H*q + 2*H*kv + q*H + onlyIf(a.QKVBias, q+2*kv) + onlyIf(a.OutBias, H)
}

// mlaParams is one layer's latent attention without its two norms (counted
// under norms): q_proj or q_a_proj and q_b_proj, kv_a_proj_with_mqa,
// kv_b_proj and o_proj (DeepseekV3Attention.__init__).
func mlaParams[T int64 | float64](a *Arch) T {
	H, A, D := T(a.Hidden), T(a.Heads), T(a.HeadDim)
	ql, kvl, rope, v := T(a.QLoRARank), T(a.KVLoRARank), T(a.QKRopeDim), T(a.VHeadDim)
	q := H * A * D
	if a.QLoRARank > 0 {
		q = H*ql + onlyIf(a.QKVBias, ql) + ql*A*D
	}
	kv := H*(kvl+rope) + onlyIf(a.QKVBias, kvl+rope) + kvl*A*(D-rope+v)
	return q + kv + A*v*H + onlyIf(a.OutBias, H)
}

// mlpTotal is every layer's MLP: the dense first layers' and the expert
// layers'.
func mlpTotal[T int64 | float64](a *Arch) T {
	dense := T(a.DenseLayers)
	total := (T(a.Layers) - dense) * mlpParams[T](a)
	if a.DenseLayers > 0 {
		H, I := T(a.Hidden), T(a.DenseIntermediate)
		total += dense * 3 * H * I
	}
	return total
}

// mlpParams is one layer's MLP: gated (gate, up, down) or plain (fc1, fc2); MoE = experts + bias-free router.
func mlpParams[T int64 | float64](a *Arch) T {
	H, I := T(a.Hidden), T(a.Intermediate)
	var mlp T
	if a.GatedMLP {
		mlp = 3*H*I + onlyIf(a.MLPBias, 2*I+H)
	} else {
		mlp = 2*H*I + onlyIf(a.MLPBias, I+H)
	}
	if a.NumExperts > 0 {
		mlp = T(a.NumExperts)*mlp + H*T(a.NumExperts)
		// DeepSeek's shared experts: one gated MLP of n_shared widths.
		mlp += 3 * H * T(a.SharedExperts) * I
	}
	return mlp
}

// normParams is one layer's norms and the whole model's. Norms: 2 per layer (4 with gemma2 post-norms, 1 with
// phi's shared input_layernorm), Qwen3 q/k norms over head_dim, plus one more: the final norm, or BERT's embedding
// LayerNorm (BERT is post-LN and has no final norm).
func normParams[T int64 | float64](a *Arch) (perLayer, total T) {
	H := T(a.Hidden)
	perNorms := 2 * normSize(a, H)
	switch {
	case a.PostNorms:
		perNorms = 4 * normSize(a, H)
	case a.SharedNorm:
		perNorms = normSize(a, H)
	}
	if a.QKNorm {
		perNorms += 2 * T(a.HeadDim)
	}
	if a.MLA() {
		perNorms += T(a.QLoRARank) + T(a.KVLoRARank) // q_a_layernorm, kv_a_layernorm
	}
	return perNorms, T(a.Layers)*perNorms + normSize(a, H)
}

// lmHeadParams is the output projection when it is not tied to the embeddings, and phi's bias.
func lmHeadParams[T int64 | float64](a *Arch) T {
	var lmHead T
	if !a.Encoder && !a.TieEmbeddings {
		lmHead = T(a.Vocab) * T(a.Hidden)
	}
	if a.LMHeadBias {
		lmHead += T(a.Vocab) // phi: nn.Linear(hidden, vocab, bias=True), not tied
	}
	return lmHead
}

// ParamBreakdown splits ParamCount into named groups: embeddings (token,
// position, token-type, patch and CLS tables), attention and mlp (all layers;
// PerLayer gives one layer's share, an expert layer's where DeepSeek's first
// layers are dense; MoE routers and shared experts count under mlp), norms (every
// norm including Qwen3 q/k norms, BERT's embedding LayerNorm and the final
// norm), lm_head (0 when tied, plus phi's bias), and pooler / classifier
// when present. The totals sum to ParamCount. Call Validate first; the
// result of an invalid Arch is unspecified.
func (a *Arch) ParamBreakdown() []ParamGroup {
	gs := breakdown[int64](a)
	out := make([]ParamGroup, len(gs))
	for i, g := range gs {
		out[i] = ParamGroup{Name: g.name, PerLayer: g.perLayer, Total: g.total}
	}
	return out
}

// MTPParamCount is the parameters of DeepSeek-V3's multi-token-prediction
// modules (num_nextn_predict_layers), which the checkpoint holds after the
// main layers and transformers does not load: per module enorm and hnorm,
// eh_proj (2·hidden -> hidden, no bias), one expert decoder layer and
// shared_head.norm; its embed_tokens and shared_head.head share the main
// model's (deepseek-ai/DeepSeek-V3 README_WEIGHTS.md). 0 for other models.
func (a *Arch) MTPParamCount() int64 {
	if a.MTPLayers == 0 {
		return 0
	}
	H := int64(a.Hidden)
	perNorms, _ := normParams[int64](a)
	layer := attentionParams[int64](a) + mlpParams[int64](a) + perNorms
	return int64(a.MTPLayers) * (3*H + 2*H*H + layer)
}

// ParamCount is the exact number of parameters of the real checkpoint's
// module (tied weights counted once): GPT2LMHeadModel, LlamaForCausalLM and
// the other *ForCausalLM classes, BertModel with pooler, and
// ViTForImageClassification or ViTModel as the config's architectures says.
// Call Validate first; the result of an invalid Arch is unspecified.
func (a *Arch) ParamCount() int64 {
	var n int64
	for _, g := range breakdown[int64](a) {
		n += g.total
	}
	return n
}

// Describe is a one-line human summary, e.g.
// "llama, 6.74B params, 32 layers, d=4096, 32 heads (32 kv), ffn 11008, vocab 32000".
func (a *Arch) Describe() string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "%s, %s params, %d layers, d=%d, %d heads", a.Family, HumanCount(a.ParamCount()), a.Layers, a.Hidden, a.Heads)
	if a.KVHeads != a.Heads {
		fmt.Fprintf(&sb, " (%d kv)", a.KVHeads)
	}
	if a.NumExperts > 0 {
		fmt.Fprintf(&sb, ", %d experts top-%d x ffn %d", a.NumExperts, a.ExpertsPerToken, a.Intermediate)
		if a.SharedExperts > 0 {
			fmt.Fprintf(&sb, " + %d shared", a.SharedExperts)
		}
	} else {
		fmt.Fprintf(&sb, ", ffn %d", a.Intermediate)
	}
	if a.Family == FamilyViT {
		fmt.Fprintf(&sb, ", %dpx/%d patches", a.ImageSize, a.PatchSize)
	} else {
		fmt.Fprintf(&sb, ", vocab %d", a.Vocab)
	}
	return sb.String()
}

// HumanCount formats a parameter count with three significant digits:
// 124M, 6.74B, 13.0B, 46.7B, 1.56B ...
func HumanCount(n int64) string {
	f := float64(n)
	unit := ""
	for _, u := range []struct {
		s string
		v float64
	}{{"T", 1e12}, {"B", 1e9}, {"M", 1e6}, {"K", 1e3}} {
		// 999,885,952 is 1.00B, not 1000M: a count that rounds up to 1000
		// of the next smaller unit takes this unit.
		if f >= u.v*0.9995 {
			f /= u.v
			unit = u.s
			break
		}
	}
	if unit == "" {
		return strconv.FormatInt(n, 10)
	}
	prec := 0
	switch {
	case f < 10:
		prec = 2
	case f < 100:
		prec = 1
	}
	return strconv.FormatFloat(f, 'f', prec, 64) + unit
}

// SlidingLayer says whether layer i attends within SlidingWindow
// (transformers' layer_types "sliding_attention"): every layer of a model
// with a window (DynamicCache's default without layer_types), but Gemma 2's
// odd layers and each n-th layer of Gemma 3's pattern, which attend in
// full.
func (a *Arch) SlidingLayer(i int) bool {
	switch {
	case a.SlidingWindow <= 0:
		return false
	case a.SlidingWindowAlternating:
		return i%2 == 0
	case a.SlidingWindowPattern > 0:
		return (i+1)%a.SlidingWindowPattern != 0
	}
	return true
}
