package models

import "sort"

// families is the table of supported model families: one row per HF
// config.json "model_type". Families, the parse dispatch of ParseHFConfig,
// the head_dim policy of Validate and DefaultLoRATargets all read it.
//
// To add a family, add one row: its model_type, the transformers
// configuration file its defaults come from (Source, with the version), peft's
// default LoRA targets, and either the llama-like decoder's defaults and
// policies as data (parse: (*parser).decoder) or, for a family whose config
// has a different structure, a parse function of its own. Every default in a
// row is the class default of the cited configuration file; a new Family*
// constant and a line in the family notes of arch.go describe its quirks.
// TestFamilyTable checks the table's consistency.
var families = []family{
	{
		ModelType:   FamilyGPT2,
		Source:      "transformers src/transformers/models/gpt2/configuration_gpt2.py @v4.51.0",
		LoRATargets: []string{"c_attn"},
		parse:       (*parser).gpt2,
	},
	{
		ModelType:    FamilyLlama,
		Source:       "transformers src/transformers/models/llama/configuration_llama.py @v4.51.0",
		LoRATargets:  []string{"q_proj", "v_proj"},
		parse:        (*parser).decoder,
		HeadDimKey:   true,
		MaxPositions: 2048,
		RopeTheta:    1e4,
		ActKey:       "hidden_act",
		Act:          "silu",
		Bias:         attentionBiasKey,
		MLPBiasKey:   true,
	},
	{
		ModelType:     FamilyMistral,
		Source:        "transformers src/transformers/models/mistral/configuration_mistral.py @v4.51.0",
		LoRATargets:   []string{"q_proj", "v_proj"},
		parse:         (*parser).decoder,
		HeadDimKey:    true,
		MaxPositions:  4096 * 32,
		RopeTheta:     1e4,
		ActKey:        "hidden_act",
		Act:           "silu",
		Window:        windowKey,
		SlidingWindow: 4096,
	},
	{
		ModelType:       FamilyMixtral,
		Source:          "transformers src/transformers/models/mixtral/configuration_mixtral.py @v4.51.0",
		LoRATargets:     []string{"q_proj", "v_proj"},
		parse:           (*parser).decoder,
		HeadDimKey:      true,
		MaxPositions:    4096 * 32,
		RopeTheta:       1e6,
		ActKey:          "hidden_act",
		Act:             "silu",
		Window:          windowKey,
		SlidingWindow:   0, // sliding_window=None
		MoE:             true,
		ExpertsPerToken: 2,
	},
	{
		ModelType:     FamilyQwen2,
		Source:        "transformers src/transformers/models/qwen2/configuration_qwen2.py @v4.51.0",
		LoRATargets:   []string{"q_proj", "v_proj"},
		parse:         (*parser).decoder,
		HeadDimKey:    true,
		MaxPositions:  32768,
		RopeTheta:     1e4,
		ActKey:        "hidden_act",
		Act:           "silu",
		Bias:          qkvBiasOnly,
		Window:        windowIfUsed,
		SlidingWindow: 4096,
	},
	{
		ModelType:     FamilyQwen3,
		Source:        "transformers src/transformers/models/qwen3/configuration_qwen3.py @v4.51.0",
		LoRATargets:   []string{"q_proj", "v_proj"},
		parse:         (*parser).decoder,
		HeadDimKey:    true,
		HeadDim:       128,
		MaxPositions:  32768,
		RopeTheta:     1e4,
		ActKey:        "hidden_act",
		Act:           "silu",
		Bias:          attentionBiasKey,
		QKNorm:        true,
		Window:        windowIfUsed,
		SlidingWindow: 4096,
	},
	{
		// Qwen3-MoE: the qwen3 row's attention with every MLP a sparse MoE
		// block (modeling_qwen3_moe.py @v5.24.0 Qwen3MoeSparseMoeBlock).
		ModelType:       FamilyQwen3MoE,
		Source:          "transformers src/transformers/models/qwen3_moe/configuration_qwen3_moe.py @v5.24.0",
		LoRATargets:     []string{"q_proj", "v_proj"},
		parse:           (*parser).decoder,
		HeadDimKey:      true,
		HeadDim:         128,
		MaxPositions:    32768,
		RopeTheta:       1e4,
		ActKey:          "hidden_act",
		Act:             "silu",
		Bias:            attentionBiasKey,
		QKNorm:          true,
		Window:          windowIfUsed,
		SlidingWindow:   4096,
		MoE:             true,
		ExpertsKey:      "num_experts",
		Experts:         128,
		ExpertsPerToken: 8,
		ExpertWidthKey:  "moe_intermediate_size",
		ExpertWidth:     768,
		NormTopKKey:     true,
	},
	{
		ModelType:    FamilyGemma,
		Source:       "transformers src/transformers/models/gemma/configuration_gemma.py @v4.51.0",
		LoRATargets:  []string{"q_proj", "v_proj"},
		parse:        (*parser).decoder,
		HeadDimKey:   true,
		HeadDim:      256,
		MaxPositions: 8192,
		RopeTheta:    1e4,
		// The legacy hidden_act ("gelu") is overridden to the tanh
		// approximation by transformers: only hidden_activation is read.
		ActKey:        "hidden_activation",
		Act:           "gelu_pytorch_tanh",
		EmbedScale:    true,
		Bias:          attentionBiasKey,
		TieEmbeddings: true,
	},
	{
		ModelType:          FamilyGemma2,
		Source:             "transformers src/transformers/models/gemma2/configuration_gemma2.py @v4.51.0",
		LoRATargets:        []string{"q_proj", "v_proj"},
		parse:              (*parser).decoder,
		HeadDimKey:         true,
		HeadDim:            256,
		MaxPositions:       8192,
		RopeTheta:          1e4,
		ActKey:             "hidden_activation",
		Act:                "gelu_pytorch_tanh",
		EmbedScale:         true,
		Bias:               attentionBiasKey,
		PostNorms:          true,
		TieEmbeddings:      true,
		Window:             windowKey,
		SlidingWindow:      4096,
		WindowAlternating:  true,
		AttnLogitSoftcap:   50,
		FinalLogitSoftcap:  30,
		QueryPreAttnScalar: 256,
	},
	{
		// Gemma 3 text decoder (Gemma3ForCausalLM): gemma2's layer with
		// q_norm/k_norm and a sliding window on five of every six layers.
		ModelType:          FamilyGemma3,
		Source:             "transformers src/transformers/models/gemma3/configuration_gemma3.py @v5.24.0 (Gemma3TextConfig)",
		LoRATargets:        []string{"q_proj", "v_proj"},
		parse:              (*parser).decoder,
		HeadDimKey:         true,
		HeadDim:            256,
		MaxPositions:       131072,
		RopeTheta:          1e6,
		ActKey:             "hidden_activation",
		Act:                "gelu_pytorch_tanh",
		EmbedScale:         true,
		Bias:               attentionBiasKey,
		QKNorm:             true,
		PostNorms:          true,
		TieEmbeddings:      true,
		Window:             windowKey,
		SlidingWindow:      4096,
		WindowPattern:      6,
		RopeLocalTheta:     1e4,
		OptionalSoftcaps:   true,
		QueryPreAttnScalar: 256,
	},
	{
		ModelType:        FamilyPhi3,
		Source:           "transformers src/transformers/models/phi3/configuration_phi3.py @v4.51.0",
		LoRATargets:      []string{"qkv_proj"},
		parse:            (*parser).decoder,
		MaxPositions:     4096,
		RopeTheta:        1e4,
		PartialRotary:    true,
		ActKey:           "hidden_act",
		Act:              "silu",
		FusedQKV:         true,
		FusedGateUp:      true,
		Window:           windowKey,
		SlidingWindow:    0, // sliding_window=None
		ResidEmbdDropout: true,
	},
	{
		ModelType:   FamilyGPTNeoX,
		Source:      "transformers src/transformers/models/gpt_neox/configuration_gpt_neox.py @v4.51.0",
		LoRATargets: []string{"query_key_value"},
		parse:       (*parser).neox,
	},
	{
		ModelType:   FamilyPhi,
		Source:      "transformers src/transformers/models/phi/configuration_phi.py @v4.51.0",
		LoRATargets: []string{"q_proj", "v_proj", "fc1", "fc2"},
		parse:       (*parser).phi,
	},
	{
		ModelType:   FamilyFalcon,
		Source:      "transformers src/transformers/models/falcon/configuration_falcon.py @v5.24.0",
		LoRATargets: []string{"query_key_value"},
		parse:       (*parser).falcon,
	},
	{
		// DeepSeek-V2 and -V3: multi-head latent attention, shared and
		// routed experts, dense first layers (models/deepseek.go). peft has
		// no default LoRA targets for them (utils/constants.py @00073fe8):
		// memplan adapts the latent key/value projections every DeepSeek
		// attention has.
		ModelType:   FamilyDeepSeekV2,
		Source:      "transformers src/transformers/models/deepseek_v2/configuration_deepseek_v2.py @v5.24.0 (DeepseekV2Config; the keys of deepseek-ai/DeepSeek-V2 configuration_deepseek.py)",
		LoRATargets: []string{"kv_a_proj_with_mqa", "kv_b_proj"},
		parse:       (*parser).deepseek,
		HeadDimKey:  true,
	},
	{
		ModelType:   FamilyDeepSeekV3,
		Source:      "transformers src/transformers/models/deepseek_v3/configuration_deepseek_v3.py @v5.24.0 (DeepseekV3Config, read at commit 001f85b3)",
		LoRATargets: []string{"kv_a_proj_with_mqa", "kv_b_proj"},
		parse:       (*parser).deepseek,
		HeadDimKey:  true,
	},
	{
		ModelType:   FamilyBERT,
		Source:      "transformers src/transformers/models/bert/configuration_bert.py @v4.51.0",
		LoRATargets: []string{"query", "value"},
		parse:       (*parser).bert,
	},
	{
		ModelType:   FamilyViT,
		Source:      "transformers src/transformers/models/vit/configuration_vit.py @v4.51.0",
		LoRATargets: []string{"query", "value"},
		parse:       (*parser).vit,
	},
}

// family is one row of families. Past ModelType, Source, LoRATargets and
// parse, the fields are the defaults and policies that (*parser).decoder
// reads for the llama-like decoders; a row with its own parse function
// leaves them zero (only HeadDimKey is consulted for every row).
type family struct {
	ModelType string // config.json "model_type"
	// Source is the transformers configuration file (and version) whose
	// class defaults the row and its parse function follow.
	Source string
	// LoRATargets is peft's TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING
	// entry: the modules LoRA adapts when no targets are given.
	LoRATargets []string
	// parse reads the family's config keys into a (the shared keys
	// model_type, architectures and torch_dtype are already read).
	parse func(p *parser, a *Arch) error

	// HeadDimKey: config may set "head_dim" independently of
	// hidden_size/num_attention_heads. HeadDim is the class default when
	// it is absent (0: hidden/heads).
	HeadDimKey bool
	HeadDim    int

	MaxPositions  int     // max_position_embeddings default
	RopeTheta     float64 // rope_theta default
	PartialRotary bool    // reads partial_rotary_factor (default 1)

	ActKey string // the config key of the MLP activation
	Act    string // its default

	EmbedScale bool       // embeddings multiplied by sqrt(hidden)
	Bias       biasPolicy // q/k/v and o projection biases
	MLPBiasKey bool       // reads mlp_bias (default false)

	QKNorm      bool // q_norm/k_norm over head_dim
	PostNorms   bool // four norms per layer
	FusedQKV    bool // one qkv_proj
	FusedGateUp bool // one gate_up_proj

	TieEmbeddings bool // tie_word_embeddings default

	// Window is how the config sets a sliding window; SlidingWindow is the
	// sliding_window default (0: none). WindowAlternating puts the window
	// on every other layer only.
	Window            windowPolicy
	SlidingWindow     int
	WindowAlternating bool
	// WindowPattern n > 0: the window is on every layer but each n-th
	// (sliding_window_pattern, or the config's layer_types), and
	// RopeLocalTheta is rope_local_base_freq's default for those layers.
	WindowPattern  int
	RopeLocalTheta float64
	// OptionalSoftcaps: attn_logit_softcapping and final_logit_softcapping
	// default to none (null) but are read when set.
	OptionalSoftcaps bool

	// Soft-capping defaults (0: the config has no such key).
	AttnLogitSoftcap   float64 // attn_logit_softcapping
	FinalLogitSoftcap  float64 // final_logit_softcapping
	QueryPreAttnScalar float64 // query_pre_attn_scalar

	// MoE: every MLP is a sparse mixture of num_local_experts (required)
	// experts; ExpertsPerToken is the num_experts_per_tok default.
	// ExpertsKey names the expert count's key instead (Experts its default,
	// 0: required), ExpertWidthKey the expert width's key (ExpertWidth its
	// default; "": intermediate_size is the expert width), NormTopKKey reads
	// norm_topk_prob (default false); such a row also refuses dense layers
	// (mlp_only_layers, decoder_sparse_step other than 1).
	MoE             bool
	ExpertsPerToken int
	ExpertsKey      string
	Experts         int
	ExpertWidthKey  string
	ExpertWidth     int
	NormTopKKey     bool

	ResidEmbdDropout bool // reads resid_pdrop and embd_pdrop (default 0)
}

// biasPolicy is how a decoder's attention projections get their biases.
type biasPolicy int

const (
	noBias           biasPolicy = iota // never
	attentionBiasKey                   // "attention_bias" (default false) sets q/k/v and o
	qkvBiasOnly                        // q/k/v always, o never (Qwen2Attention)
)

// windowPolicy is how a decoder's config sets its sliding window. An
// explicit "sliding_window": null disables the window (as in transformers);
// an absent key takes the row's default.
type windowPolicy int

const (
	noWindow     windowPolicy = iota // no sliding window
	windowKey                        // "sliding_window"
	windowIfUsed                     // "sliding_window", only when "use_sliding_window" (default false)
)

// lookupFamily returns the row of model type mt, or nil.
func lookupFamily(mt string) *family {
	for i := range families {
		if families[i].ModelType == mt {
			return &families[i]
		}
	}
	return nil
}

// Families returns the supported model_type values, sorted.
func Families() []string {
	out := make([]string, len(families))
	for i, f := range families {
		out[i] = f.ModelType
	}
	sort.Strings(out)
	return out
}

func knownFamily(f string) bool { return lookupFamily(f) != nil }

// explicitHeadDimFamily reports whether the family lets config.json set
// head_dim independently of hidden_size/num_attention_heads.
func explicitHeadDimFamily(f string) bool {
	r := lookupFamily(f)
	return r != nil && r.HeadDimKey
}

// DefaultLoRATargets is peft's default LoRA target modules for the family
// (TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING), a fresh slice; a
// family outside the table gets peft's most common entry, q_proj and v_proj.
func DefaultLoRATargets(modelType string) []string {
	if r := lookupFamily(modelType); r != nil {
		return append([]string(nil), r.LoRATargets...)
	}
	return []string{"q_proj", "v_proj"}
}
