package models

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/memplan/memplan/internal/boundedio"
)

// ParseHFConfig parses the contents of a HuggingFace config.json into an
// Arch. name labels errors and becomes Arch.Name.
//
// Fields that fix the parameter count (hidden size, layers, heads, vocab,
// FFN width, learned position-table size, expert count, ViT image/patch
// size) are required even where the transformers class has a default: a
// silently defaulted size would give a wrong plan. Every other field falls
// back to the transformers class default when absent or null, e.g. gpt2
// n_inner=null -> 4*n_embd, num_key_value_heads -> num_attention_heads,
// tie_word_embeddings per family, gpt2 activation_function -> gelu_new.
//
// Errors are one line, prefixed "<name>: ", and name the offending
// field. ParseHFConfig never panics, and an Arch it returns passes Validate.
func ParseHFConfig(data []byte, name string) (*Arch, error) {
	if name == "" {
		name = "config.json"
	}
	p := &parser{name: name}
	a, err := p.parse(data)
	if err != nil {
		return nil, err
	}
	if err := a.Validate(); err != nil {
		return nil, err
	}
	return a, nil
}

// LoadFile reads and parses a config.json file; the path becomes Arch.Name.
func LoadFile(path string) (*Arch, error) {
	data, err := boundedio.ReadFile(path, boundedio.SmallFile)
	if err != nil {
		return nil, fmt.Errorf("%w", err)
	}
	return ParseHFConfig(data, path)
}

type parser struct {
	name string
	m    map[string]json.RawMessage
	fam  *family // the row of the config's model_type
}

func (p *parser) errf(format string, args ...any) error {
	return fmt.Errorf("%s: %s", p.name, fmt.Sprintf(format, args...))
}

func (p *parser) parse(data []byte) (*Arch, error) {
	// A UTF-8 byte order mark (Windows editors write one) is not part of
	// the JSON; Python's json.load with utf-8-sig reads past it too.
	trimmed := bytes.TrimSpace(bytes.TrimPrefix(data, []byte("\xef\xbb\xbf")))
	if len(trimmed) == 0 {
		return nil, p.errf("empty file")
	}
	if trimmed[0] != '{' {
		return nil, p.errf("not a JSON object")
	}
	if err := json.Unmarshal(trimmed, &p.m); err != nil {
		return nil, p.errf("invalid JSON: %s", oneLine(err.Error()))
	}
	mt, ok, err := p.str("model_type")
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, p.errf("missing \"model_type\" (supported: %s)", strings.Join(Families(), ", "))
	}
	a := &Arch{Name: p.name, Family: mt}
	if arch, ok := p.firstArchitecture(); ok {
		a.Architecture = arch
	}
	if a.TorchDType, _, err = p.strDef("", "torch_dtype", "dtype"); err != nil {
		return nil, err
	}
	if err := p.checkHonoured(a.TorchDType); err != nil {
		return nil, err
	}
	if p.fam = lookupFamily(mt); p.fam == nil {
		return nil, p.errf("unsupported model_type %q (supported: %s)", mt, strings.Join(Families(), ", "))
	}
	if err = p.fam.parse(p, a); err != nil {
		return nil, err
	}
	if a.Quant, err = p.quantization(); err != nil {
		return nil, err
	}
	return a, nil
}

// gpt2: GPT2Config field names.
func (p *parser) gpt2(a *Arch) error {
	var err error
	if a.Hidden, err = p.reqPos(maxDim, "n_embd"); err != nil {
		return err
	}
	if a.Layers, err = p.reqPos(maxLayers, "n_layer"); err != nil {
		return err
	}
	if a.Heads, err = p.reqPos(maxHeads, "n_head"); err != nil {
		return err
	}
	if a.Vocab, err = p.reqPos(maxVocab, "vocab_size"); err != nil {
		return err
	}
	// n_positions sizes the learned position table; very old configs only had n_ctx.
	if a.MaxPositions, err = p.reqPos(maxPositions, "n_positions", "n_ctx"); err != nil {
		return err
	}
	if a.Intermediate, err = p.optPos(4*a.Hidden, maxDim, "n_inner"); err != nil {
		return err
	}
	if err = p.headDim(a, 0); err != nil {
		return err
	}
	a.KVHeads = a.Heads
	a.PosEmbedding = PosLearned
	a.Norm, a.NormBias = LayerNorm, true
	a.GatedMLP = false
	a.FusedQKV = true
	a.QKVBias, a.OutBias, a.MLPBias = true, true, true
	if a.Act, err = p.act("gelu_new", "activation_function"); err != nil {
		return err
	}
	if a.NormEps, err = p.eps(1e-5, "layer_norm_epsilon"); err != nil {
		return err
	}
	if a.TieEmbeddings, err = p.boolDef(true, "tie_word_embeddings"); err != nil {
		return err
	}
	if a.AttnDropout, err = p.prob(0.1, "attn_pdrop"); err != nil {
		return err
	}
	if a.HiddenDropout, err = p.prob(0.1, "resid_pdrop"); err != nil {
		return err
	}
	if a.EmbdDropout, err = p.prob(0.1, "embd_pdrop"); err != nil {
		return err
	}
	return nil
}

// decoder handles the llama-like families (llama, mistral, mixtral, qwen2,
// qwen3, gemma, gemma2, phi3): RMSNorm, rotary positions, gated MLP, with
// the defaults and policies of the config's row of families.
func (p *parser) decoder(a *Arch) error {
	for _, part := range []func(*Arch) error{p.decoderHeads, p.decoderPositions, p.decoderLayers,
		p.decoderWindow, p.decoderSoftcaps, p.decoderExperts, p.decoderDropouts} {
		if err := part(a); err != nil {
			return err
		}
	}
	return nil
}

// decoderHeads reads the sizes, the KV heads and the head dimension.
func (p *parser) decoderHeads(a *Arch) error {
	var err error
	if err = p.coreSizes(a); err != nil {
		return err
	}
	if a.KVHeads, err = p.optPos(a.Heads, maxHeads, "num_key_value_heads"); err != nil {
		return err
	}
	if err = p.headDim(a, p.fam.HeadDim); err != nil {
		return err
	}
	if a.Heads%a.KVHeads != 0 {
		return p.errf("\"num_key_value_heads\" (%d) must divide \"num_attention_heads\" (%d)", a.KVHeads, a.Heads)
	}
	return nil
}

// decoderPositions reads the rotary positions.
func (p *parser) decoderPositions(a *Arch) error {
	f := p.fam
	var err error
	if a.MaxPositions, err = p.optPos(f.MaxPositions, maxPositions, "max_position_embeddings"); err != nil {
		return err
	}
	a.PosEmbedding = PosRotary
	if a.RopeTheta, err = p.posFloat(f.RopeTheta, "rope_theta"); err != nil {
		return err
	}
	a.RotaryPct = 1
	if f.PartialRotary {
		if a.RotaryPct, err = p.frac(1, "partial_rotary_factor"); err != nil {
			return err
		}
	}
	return nil
}

// decoderLayers reads the norm, the MLP's activation, the biases and the family's layer policies.
func (p *parser) decoderLayers(a *Arch) error {
	f := p.fam
	var err error
	a.Norm = RMSNorm
	if a.NormEps, err = p.eps(1e-6, "rms_norm_eps"); err != nil {
		return err
	}
	a.GatedMLP = true
	if a.Act, err = p.act(f.Act, f.ActKey); err != nil {
		return err
	}
	a.EmbedScale = f.EmbedScale
	switch f.Bias {
	case attentionBiasKey:
		bias, err := p.boolDef(false, "attention_bias")
		if err != nil {
			return err
		}
		a.QKVBias, a.OutBias = bias, bias
	case qkvBiasOnly:
		a.QKVBias, a.OutBias = true, false
	}
	if f.MLPBiasKey {
		if a.MLPBias, err = p.boolDef(false, "mlp_bias"); err != nil {
			return err
		}
	}
	a.QKNorm = f.QKNorm
	a.PostNorms = f.PostNorms
	a.FusedQKV, a.FusedGateUp = f.FusedQKV, f.FusedGateUp
	a.TieEmbeddings, err = p.boolDef(f.TieEmbeddings, "tie_word_embeddings")
	return err
}

// decoderWindow reads the sliding window. An explicit "sliding_window": null disables the window (as in
// transformers); an absent key takes the class default.
func (p *parser) decoderWindow(a *Arch) error {
	f := p.fam
	window := func(def int) (int, error) {
		if p.isNull("sliding_window") {
			return 0, nil
		}
		return p.optNonNeg(def, maxPositions, "sliding_window")
	}
	var err error
	switch f.Window {
	case windowKey:
		if a.SlidingWindow, err = window(f.SlidingWindow); err != nil {
			return err
		}
	case windowIfUsed:
		use, err := p.boolDef(false, "use_sliding_window")
		if err != nil {
			return err
		}
		if use {
			if a.SlidingWindow, err = window(f.SlidingWindow); err != nil {
				return err
			}
		}
	}
	a.SlidingWindowAlternating = f.WindowAlternating && a.SlidingWindow > 0
	if f.WindowPattern > 0 {
		if a.SlidingWindowPattern, err = p.windowPattern(a, f.WindowPattern); err != nil {
			return err
		}
		if a.RopeLocalTheta, err = p.posFloat(f.RopeLocalTheta, "rope_local_base_freq"); err != nil {
			return err
		}
	}
	return nil
}

// windowPattern reads Gemma 3's layer pattern: "layer_types" when present
// (it must be the periodic pattern transformers derives: full_attention on
// each n-th layer, sliding_attention elsewhere), else
// "sliding_window_pattern" (Gemma3TextConfig.__post_init__ @v5.24.0).
func (p *parser) windowPattern(a *Arch, def int) (int, error) {
	raw, ok := p.get("layer_types")
	if !ok || p.isNull("layer_types") {
		return p.optPos(def, maxLayers, "sliding_window_pattern")
	}
	var types []string
	if json.Unmarshal(raw, &types) != nil {
		return 0, p.errf("\"layer_types\" must be a list of \"sliding_attention\" / \"full_attention\", got %s", describeJSON(raw))
	}
	if len(types) != a.Layers {
		return 0, p.errf("\"layer_types\" has %d entries for %d layers (\"num_hidden_layers\")", len(types), a.Layers)
	}
	n := 0
	for i, t := range types {
		if t != "sliding_attention" && t != "full_attention" {
			return 0, p.errf("\"layer_types\"[%d] is %q; want \"sliding_attention\" or \"full_attention\"", i, t)
		}
		if t == "full_attention" && n == 0 {
			n = i + 1
		}
	}
	if n == 0 {
		n = len(types) + 1 // every layer slides
	}
	for i, t := range types {
		if (t == "full_attention") != ((i+1)%n == 0) {
			return 0, p.errf("\"layer_types\" is not a repeating pattern of sliding layers and one full-attention layer; not supported for %s", a.Family)
		}
	}
	return n, nil
}

// decoderSoftcaps reads the soft caps and the query scalar of the families that have them.
func (p *parser) decoderSoftcaps(a *Arch) error {
	f := p.fam
	var err error
	for _, c := range []struct {
		v   *float64
		def float64
		key string
	}{
		{&a.AttnLogitSoftcap, f.AttnLogitSoftcap, "attn_logit_softcapping"},
		{&a.FinalLogitSoftcap, f.FinalLogitSoftcap, "final_logit_softcapping"},
		{&a.QueryPreAttnScalar, f.QueryPreAttnScalar, "query_pre_attn_scalar"},
	} {
		if c.def == 0 && !(p.fam.OptionalSoftcaps && c.key != "query_pre_attn_scalar") {
			continue // the family has no such key
		}
		if p.isNull(c.key) {
			continue // null: no soft-capping
		}
		if *c.v, err = p.nonNegFloat(c.def, c.key); err != nil {
			return err
		}
	}
	return nil
}

// decoderExperts reads the experts of a mixture-of-experts family.
func (p *parser) decoderExperts(a *Arch) error {
	f := p.fam
	if !f.MoE {
		return nil
	}
	var err error
	key := "num_local_experts"
	if f.ExpertsKey != "" {
		key = f.ExpertsKey
		a.NumExperts, err = p.optPos(f.Experts, maxExperts, key)
	} else {
		a.NumExperts, err = p.reqPos(maxExperts, key)
	}
	if err != nil {
		return err
	}
	if a.ExpertsPerToken, err = p.optPos(f.ExpertsPerToken, maxExperts, "num_experts_per_tok"); err != nil {
		return err
	}
	if a.ExpertsPerToken > a.NumExperts {
		return p.errf("\"num_experts_per_tok\" (%d) must not exceed \"%s\" (%d)", a.ExpertsPerToken, key, a.NumExperts)
	}
	if f.ExpertWidthKey != "" {
		if a.Intermediate, err = p.optPos(f.ExpertWidth, maxDim, f.ExpertWidthKey); err != nil {
			return err
		}
		// Qwen3MoeDecoderLayer: a layer in mlp_only_layers, or whose index+1
		// is not a multiple of decoder_sparse_step, has a dense MLP instead.
		step, err := p.optPos(1, maxLayers, "decoder_sparse_step")
		if err != nil {
			return err
		}
		if step != 1 {
			return p.errf("\"decoder_sparse_step\": %d (dense MLP layers between the expert layers) is not supported for %s", step, a.Family)
		}
		if raw, ok := p.get("mlp_only_layers"); ok && !p.isNull("mlp_only_layers") {
			var layers []json.RawMessage
			if json.Unmarshal(raw, &layers) != nil {
				return p.errf("\"mlp_only_layers\" must be a list of layer indices, got %s", describeJSON(raw))
			}
			if len(layers) > 0 {
				return p.errf("\"mlp_only_layers\" (dense MLP layers among the expert layers) is not supported for %s", a.Family)
			}
		}
	}
	if f.NormTopKKey {
		if a.NormTopK, err = p.boolDef(false, "norm_topk_prob"); err != nil {
			return err
		}
	}
	return nil
}
func (p *parser) decoderDropouts(a *Arch) error {
	var err error
	if a.AttnDropout, err = p.prob(0, "attention_dropout"); err != nil {
		return err
	}
	if p.fam.ResidEmbdDropout {
		if a.HiddenDropout, err = p.prob(0, "resid_pdrop"); err != nil {
			return err
		}
		if a.EmbdDropout, err = p.prob(0, "embd_pdrop"); err != nil {
			return err
		}
	}
	return nil
}

// neox: GPTNeoXConfig (Pythia).
func (p *parser) neox(a *Arch) error {
	var err error
	if err = p.coreSizes(a); err != nil {
		return err
	}
	if err = p.headDim(a, 0); err != nil {
		return err
	}
	a.KVHeads = a.Heads
	if a.MaxPositions, err = p.optPos(2048, maxPositions, "max_position_embeddings"); err != nil {
		return err
	}
	a.PosEmbedding = PosRotary
	if a.RotaryPct, err = p.frac(0.25, "rotary_pct", "partial_rotary_factor"); err != nil {
		return err
	}
	if a.RopeTheta, err = p.posFloat(10000, "rotary_emb_base", "rope_theta"); err != nil {
		return err
	}
	a.Norm, a.NormBias = LayerNorm, true
	if a.NormEps, err = p.eps(1e-5, "layer_norm_eps"); err != nil {
		return err
	}
	if a.Act, err = p.act("gelu", "hidden_act"); err != nil {
		return err
	}
	a.FusedQKV = true
	bias, err := p.boolDef(true, "attention_bias")
	if err != nil {
		return err
	}
	a.QKVBias, a.OutBias, a.MLPBias = bias, bias, true
	if a.ParallelResidual, err = p.boolDef(true, "use_parallel_residual"); err != nil {
		return err
	}
	if a.TieEmbeddings, err = p.boolDef(false, "tie_word_embeddings"); err != nil {
		return err
	}
	if a.AttnDropout, err = p.prob(0, "attention_dropout"); err != nil {
		return err
	}
	if a.HiddenDropout, err = p.prob(0, "hidden_dropout"); err != nil {
		return err
	}
	a.EmbdDropout = a.HiddenDropout // GPTNeoXModel.emb_dropout uses hidden_dropout
	return nil
}

// phi: PhiConfig (phi-1, phi-1.5, phi-2), counted as PhiForCausalLM.
func (p *parser) phi(a *Arch) error {
	var err error
	if err = p.coreSizes(a); err != nil {
		return err
	}
	if err = p.headDim(a, 0); err != nil {
		return err
	}
	if a.KVHeads, err = p.optPos(a.Heads, maxHeads, "num_key_value_heads"); err != nil {
		return err
	}
	if a.Heads%a.KVHeads != 0 {
		return p.errf("\"num_key_value_heads\" (%d) must divide \"num_attention_heads\" (%d)", a.KVHeads, a.Heads)
	}
	if a.MaxPositions, err = p.optPos(2048, maxPositions, "max_position_embeddings"); err != nil {
		return err
	}
	a.PosEmbedding = PosRotary
	if a.RotaryPct, err = p.frac(0.5, "partial_rotary_factor"); err != nil {
		return err
	}
	// PhiAttention: rotary_ndims = int(head_dim * partial_rotary_factor).
	if int(float64(a.HeadDim)*a.RotaryPct) < 2 {
		return p.errf("\"partial_rotary_factor\" %g rotates %d of %d head dimensions, want at least 2", a.RotaryPct, int(float64(a.HeadDim)*a.RotaryPct), a.HeadDim)
	}
	if a.RopeTheta, err = p.posFloat(10000, "rope_theta"); err != nil {
		return err
	}
	qkNorm, err := p.boolDef(false, "qk_layernorm")
	if err != nil {
		return err
	}
	if qkNorm {
		return p.errf("\"qk_layernorm\": true is not supported for phi (q_layernorm/k_layernorm are not modelled)")
	}
	a.Norm, a.NormBias = LayerNorm, true
	if a.NormEps, err = p.eps(1e-5, "layer_norm_eps"); err != nil {
		return err
	}
	if a.Act, err = p.act("gelu_new", "hidden_act"); err != nil {
		return err
	}
	a.QKVBias, a.OutBias, a.MLPBias = true, true, true
	a.ParallelResidual, a.SharedNorm, a.LMHeadBias = true, true, true
	if a.TieEmbeddings, err = p.boolDef(false, "tie_word_embeddings"); err != nil {
		return err
	}
	if a.AttnDropout, err = p.prob(0, "attention_dropout"); err != nil {
		return err
	}
	if a.HiddenDropout, err = p.prob(0, "resid_pdrop"); err != nil {
		return err
	}
	if a.EmbdDropout, err = p.prob(0, "embd_pdrop"); err != nil {
		return err
	}
	return nil
}

// falcon: FalconConfig as FalconForCausalLM runs it (transformers
// src/transformers/models/falcon/modeling_falcon.py @v5.24.0), falcon-7b's
// structure: parallel attention and MLP after one input_layernorm,
// multi-query attention (one key and one value head in the fused
// query_key_value), rotary positions, no biases. The other structures
// (alibi, new_decoder_architecture's grouped heads and two norms, a
// sequential block, biases) are refused by key.
func (p *parser) falcon(a *Arch) error {
	var err error
	if a.Hidden, err = p.reqPos(maxDim, "hidden_size"); err != nil {
		return err
	}
	if a.Layers, err = p.reqPos(maxLayers, "num_hidden_layers"); err != nil {
		return err
	}
	if a.Heads, err = p.reqPos(maxHeads, "num_attention_heads"); err != nil {
		return err
	}
	if a.Vocab, err = p.reqPos(maxVocab, "vocab_size"); err != nil {
		return err
	}
	if err = p.headDim(a, 0); err != nil {
		return err
	}
	for _, f := range []struct {
		key       string
		def, want bool
		why       string
	}{
		{"alibi", false, false, "ALiBi attention biases are not modelled"},
		{"new_decoder_architecture", false, false, "the grouped-head decoder of Falcon-40B/180B is not modelled"},
		{"parallel_attn", true, true, "the sequential block is not modelled"},
		{"multi_query", true, true, "multi-head key/value projections are not modelled"},
		{"bias", false, false, "linear biases are not modelled"},
	} {
		v, err := p.boolDef(f.def, f.key)
		if err != nil {
			return err
		}
		if v != f.want {
			return p.errf("%q: %v is not supported for falcon (%s; falcon-7b's structure is)", f.key, v, f.why)
		}
	}
	a.KVHeads = 1
	if a.Intermediate, err = p.optPos(4*a.Hidden, maxDim, "ffn_hidden_size"); err != nil {
		return err
	}
	if a.MaxPositions, err = p.optPos(2048, maxPositions, "max_position_embeddings"); err != nil {
		return err
	}
	a.PosEmbedding, a.RotaryPct = PosRotary, 1
	if a.RopeTheta, err = p.posFloat(10000, "rope_theta"); err != nil {
		return err
	}
	a.Norm, a.NormBias = LayerNorm, true
	if a.NormEps, err = p.eps(1e-5, "layer_norm_epsilon"); err != nil {
		return err
	}
	if a.Act, err = p.act("gelu", "activation"); err != nil {
		return err
	}
	a.FusedQKV, a.ParallelResidual, a.SharedNorm = true, true, true
	if a.TieEmbeddings, err = p.boolDef(true, "tie_word_embeddings"); err != nil {
		return err
	}
	if a.AttnDropout, err = p.prob(0, "attention_dropout"); err != nil {
		return err
	}
	if a.HiddenDropout, err = p.prob(0, "hidden_dropout"); err != nil {
		return err
	}
	return nil
}

// bert: BertConfig, counted as BertModel with pooler.
func (p *parser) bert(a *Arch) error {
	var err error
	if err = p.coreSizes(a); err != nil {
		return err
	}
	if err = p.headDim(a, 0); err != nil {
		return err
	}
	a.KVHeads = a.Heads
	if a.MaxPositions, err = p.reqPos(maxPositions, "max_position_embeddings"); err != nil {
		return err
	}
	pet, _, err := p.strDef("absolute", "position_embedding_type")
	if err != nil {
		return err
	}
	if pet != "absolute" {
		return p.errf("\"position_embedding_type\" %q is not supported (only \"absolute\")", pet)
	}
	if a.TypeVocab, err = p.optNonNeg(2, maxVocab, "type_vocab_size"); err != nil {
		return err
	}
	a.PosEmbedding = PosLearned
	a.Norm, a.NormBias = LayerNorm, true
	if a.NormEps, err = p.eps(1e-12, "layer_norm_eps"); err != nil {
		return err
	}
	if a.Act, err = p.act("gelu", "hidden_act"); err != nil {
		return err
	}
	a.QKVBias, a.OutBias, a.MLPBias = true, true, true
	a.Encoder, a.Pooler = true, true
	if a.AttnDropout, err = p.prob(0.1, "attention_probs_dropout_prob"); err != nil {
		return err
	}
	if a.HiddenDropout, err = p.prob(0.1, "hidden_dropout_prob"); err != nil {
		return err
	}
	a.EmbdDropout = a.HiddenDropout // BertEmbeddings.dropout uses hidden_dropout_prob
	return nil
}

// vit: ViTConfig. A ViTForImageClassification checkpoint has no pooler and a
// classifier; anything else is counted as ViTModel with its pooler.
func (p *parser) vit(a *Arch) error {
	var err error
	if a.Hidden, err = p.reqPos(maxDim, "hidden_size"); err != nil {
		return err
	}
	if a.Layers, err = p.reqPos(maxLayers, "num_hidden_layers"); err != nil {
		return err
	}
	if a.Heads, err = p.reqPos(maxHeads, "num_attention_heads"); err != nil {
		return err
	}
	if a.Intermediate, err = p.reqPos(maxDim, "intermediate_size"); err != nil {
		return err
	}
	if err = p.headDim(a, 0); err != nil {
		return err
	}
	a.KVHeads = a.Heads
	if a.ImageSize, err = p.reqPos(maxDim, "image_size"); err != nil {
		return err
	}
	if a.PatchSize, err = p.reqPos(maxDim, "patch_size"); err != nil {
		return err
	}
	if a.PatchSize > a.ImageSize {
		return p.errf("\"patch_size\" (%d) must not exceed \"image_size\" (%d)", a.PatchSize, a.ImageSize)
	}
	if a.Channels, err = p.optPos(3, maxDim, "num_channels"); err != nil {
		return err
	}
	a.MaxPositions = a.NumPatches() + 1
	if a.MaxPositions > maxPositions {
		return p.errf("\"image_size\"/\"patch_size\" gives %d patches, more than the supported %d", a.MaxPositions-1, maxPositions-1)
	}
	a.PosEmbedding = PosLearned
	a.Norm, a.NormBias = LayerNorm, true
	if a.NormEps, err = p.eps(1e-12, "layer_norm_eps"); err != nil {
		return err
	}
	if a.Act, err = p.act("gelu", "hidden_act"); err != nil {
		return err
	}
	if a.QKVBias, err = p.boolDef(true, "qkv_bias"); err != nil {
		return err
	}
	a.OutBias, a.MLPBias = true, true
	a.Encoder = true
	if a.Architecture == "ViTForImageClassification" {
		// PretrainedConfig: num_labels = len(id2label), default 2.
		n, err := p.numLabels()
		if err != nil {
			return err
		}
		a.NumLabels = n
	} else {
		a.Pooler = true
	}
	if a.AttnDropout, err = p.prob(0, "attention_probs_dropout_prob"); err != nil {
		return err
	}
	if a.HiddenDropout, err = p.prob(0, "hidden_dropout_prob"); err != nil {
		return err
	}
	a.EmbdDropout = a.HiddenDropout // ViTEmbeddings.dropout uses hidden_dropout_prob
	return nil
}

// coreSizes reads the HF-standard required sizes.
func (p *parser) coreSizes(a *Arch) error {
	var err error
	if a.Hidden, err = p.reqPos(maxDim, "hidden_size"); err != nil {
		return err
	}
	if a.Layers, err = p.reqPos(maxLayers, "num_hidden_layers"); err != nil {
		return err
	}
	if a.Heads, err = p.reqPos(maxHeads, "num_attention_heads"); err != nil {
		return err
	}
	if a.Vocab, err = p.reqPos(maxVocab, "vocab_size"); err != nil {
		return err
	}
	if a.Intermediate, err = p.reqPos(maxDim, "intermediate_size"); err != nil {
		return err
	}
	return nil
}

// headDim sets a.HeadDim from "head_dim" when the family allows it
// (def > 0 is the class default, def == 0 means hidden/heads), otherwise
// requires heads to divide hidden.
func (p *parser) headDim(a *Arch, def int) error {
	if p.fam.HeadDimKey {
		if _, ok := p.get("head_dim"); ok || def > 0 {
			hd, err := p.optPos(def, maxDim, "head_dim")
			if err != nil {
				return err
			}
			a.HeadDim = hd
			return nil
		}
	}
	hk, nk := "hidden_size", "num_attention_heads"
	if a.Family == FamilyGPT2 {
		hk, nk = "n_embd", "n_head"
	}
	if a.Hidden%a.Heads != 0 {
		return p.errf("%q (%d) must divide %q (%d)", nk, a.Heads, hk, a.Hidden)
	}
	a.HeadDim = a.Hidden / a.Heads
	return nil
}

func (p *parser) numLabels() (int, error) {
	if raw, ok := p.get("id2label"); ok {
		var m map[string]json.RawMessage
		if err := json.Unmarshal(raw, &m); err != nil {
			return 0, p.errf("\"id2label\" must be an object, got %s", describeJSON(raw))
		}
		if len(m) == 0 {
			return 0, p.errf("\"id2label\" must not be empty")
		}
		return len(m), nil
	}
	return p.optPos(2, maxVocab, "num_labels")
}

func (p *parser) firstArchitecture() (string, bool) {
	raw, ok := p.get("architectures")
	if !ok {
		return "", false
	}
	var list []json.RawMessage
	if json.Unmarshal(raw, &list) != nil || len(list) == 0 {
		return "", false
	}
	var s string
	if json.Unmarshal(list[0], &s) != nil {
		return "", false
	}
	return s, true
}

// get returns the raw value of key, treating an explicit null as absent.
func (p *parser) get(key string) (json.RawMessage, bool) {
	raw, ok := p.m[key]
	if !ok || bytes.Equal(bytes.TrimSpace(raw), []byte("null")) {
		return nil, false
	}
	return raw, true
}

// isNull reports whether key is present with an explicit null value.
func (p *parser) isNull(key string) bool {
	raw, ok := p.m[key]
	return ok && bytes.Equal(bytes.TrimSpace(raw), []byte("null"))
}

// first returns the first present key among keys (aliases, preferred first).
func (p *parser) first(keys []string) (string, json.RawMessage, bool) {
	for _, k := range keys {
		if raw, ok := p.get(k); ok {
			return k, raw, true
		}
	}
	return keys[0], nil, false
}

func (p *parser) intValue(key string, raw json.RawMessage) (int, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return 0, p.errf("%q must be an integer, got %s", key, describeJSON(raw))
	}
	num, ok := v.(json.Number)
	if !ok {
		return 0, p.errf("%q must be an integer, got %s", key, describeJSON(raw))
	}
	if i, err := strconv.ParseInt(num.String(), 10, 64); err == nil {
		if i > math.MaxInt32 || i < math.MinInt32 {
			return 0, p.errf("%q is out of range: %s", key, num)
		}
		return int(i), nil
	}
	f, err := strconv.ParseFloat(num.String(), 64)
	if err != nil || math.IsInf(f, 0) || f != math.Trunc(f) {
		return 0, p.errf("%q must be an integer, got %s", key, num)
	}
	if f > math.MaxInt32 || f < math.MinInt32 {
		return 0, p.errf("%q is out of range: %s", key, num)
	}
	return int(f), nil
}

func (p *parser) floatValue(key string, raw json.RawMessage) (float64, error) {
	var v any
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	if err := dec.Decode(&v); err != nil {
		return 0, p.errf("%q must be a number, got %s", key, describeJSON(raw))
	}
	num, ok := v.(json.Number)
	if !ok {
		return 0, p.errf("%q must be a number, got %s", key, describeJSON(raw))
	}
	f, err := strconv.ParseFloat(num.String(), 64)
	if err != nil || math.IsInf(f, 0) || math.IsNaN(f) {
		return 0, p.errf("%q is out of range: %s", key, num)
	}
	return f, nil
}

// reqPos reads a required positive integer (the first present alias).
func (p *parser) reqPos(max int, keys ...string) (int, error) {
	k, raw, ok := p.first(keys)
	if !ok {
		return 0, p.errf("missing %q", k)
	}
	return p.checkPos(k, raw, max)
}

// optPos reads an optional positive integer, def when absent or null.
func (p *parser) optPos(def, max int, keys ...string) (int, error) {
	k, raw, ok := p.first(keys)
	if !ok {
		return def, nil
	}
	return p.checkPos(k, raw, max)
}

func (p *parser) checkPos(k string, raw json.RawMessage, max int) (int, error) {
	v, err := p.intValue(k, raw)
	if err != nil {
		return 0, err
	}
	if v <= 0 {
		return 0, p.errf("%q must be positive, got %d", k, v)
	}
	if v > max {
		return 0, p.errf("%q must be at most %d, got %d", k, max, v)
	}
	return v, nil
}

// optNonNeg reads an optional integer >= 0.
func (p *parser) optNonNeg(def, max int, keys ...string) (int, error) {
	k, raw, ok := p.first(keys)
	if !ok {
		return def, nil
	}
	v, err := p.intValue(k, raw)
	if err != nil {
		return 0, err
	}
	if v < 0 {
		return 0, p.errf("%q must not be negative, got %d", k, v)
	}
	if v > max {
		return 0, p.errf("%q must be at most %d, got %d", k, max, v)
	}
	return v, nil
}

// optFloat reads an optional number and checks it with ok.
func (p *parser) optFloat(def float64, check func(float64) bool, want string, keys ...string) (float64, error) {
	k, raw, ok := p.first(keys)
	if !ok {
		return def, nil
	}
	v, err := p.floatValue(k, raw)
	if err != nil {
		return 0, err
	}
	if !check(v) {
		return 0, p.errf("%q must be %s, got %v", k, want, v)
	}
	return v, nil
}

func (p *parser) prob(def float64, keys ...string) (float64, error) {
	return p.optFloat(def, func(v float64) bool { return v >= 0 && v <= 1 }, "in [0, 1]", keys...)
}

func (p *parser) frac(def float64, keys ...string) (float64, error) {
	return p.optFloat(def, func(v float64) bool { return v > 0 && v <= 1 }, "in (0, 1]", keys...)
}

func (p *parser) eps(def float64, keys ...string) (float64, error) {
	return p.optFloat(def, func(v float64) bool { return v >= 0 && v < 1 }, "in [0, 1)", keys...)
}

func (p *parser) posFloat(def float64, keys ...string) (float64, error) {
	return p.optFloat(def, func(v float64) bool { return v > 0 }, "positive", keys...)
}

func (p *parser) nonNegFloat(def float64, keys ...string) (float64, error) {
	return p.optFloat(def, func(v float64) bool { return v >= 0 }, ">= 0", keys...)
}

func (p *parser) boolDef(def bool, keys ...string) (bool, error) {
	k, raw, ok := p.first(keys)
	if !ok {
		return def, nil
	}
	var b bool
	if err := json.Unmarshal(raw, &b); err != nil {
		return false, p.errf("%q must be true or false, got %s", k, describeJSON(raw))
	}
	return b, nil
}

// str reads an optional string; ok reports presence.
func (p *parser) str(keys ...string) (string, bool, error) {
	k, raw, ok := p.first(keys)
	if !ok {
		return "", false, nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", false, p.errf("%q must be a string, got %s", k, describeJSON(raw))
	}
	return s, true, nil
}

func (p *parser) strDef(def string, keys ...string) (string, bool, error) {
	s, ok, err := p.str(keys...)
	if err != nil || !ok {
		return def, ok, err
	}
	return s, true, nil
}

func (p *parser) act(def string, keys ...string) (string, error) {
	s, ok, err := p.str(keys...)
	if err != nil {
		return "", err
	}
	if !ok {
		return def, nil
	}
	if !knownActs[s] {
		return "", p.errf("%q: unsupported activation %q", keys[0], s)
	}
	return s, nil
}

// describeJSON names a JSON value's type (and short value) for error messages.
func describeJSON(raw json.RawMessage) string {
	t := bytes.TrimSpace(raw)
	if len(t) == 0 {
		return "nothing"
	}
	short := func(s string) string {
		s = oneLine(s)
		if len(s) > 40 {
			s = s[:40] + "..."
		}
		return s
	}
	switch t[0] {
	case '"':
		return "string " + short(string(t))
	case '{':
		return "object"
	case '[':
		return "array"
	case 't', 'f':
		return "bool " + short(string(t))
	case 'n':
		return "null"
	}
	return short(string(t))
}

func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}

// checkHonoured refuses fields memplan reads a meaning from but cannot
// honour, rather than planning something else: a torch_dtype other than
// float32, float16 or bfloat16 (int4 or float8_e4m3fn were served as
// bfloat16; a quantized checkpoint says so in quantization_config), and a
// rope_scaling that is not a mapping or null ("yes" was accepted).
func (p *parser) checkHonoured(dtype string) error {
	switch strings.ToLower(strings.TrimPrefix(dtype, "torch.")) {
	case "", "float32", "float16", "bfloat16":
	default:
		key := "torch_dtype"
		if _, ok := p.m[key]; !ok {
			key = "dtype"
		}
		return p.errf("%q %q: want float32, float16 or bfloat16 (a quantized checkpoint names its quantization in quantization_config)", key, cut(dtype))
	}
	if raw, ok := p.m["rope_scaling"]; ok {
		if v := bytes.TrimSpace(raw); !bytes.Equal(v, []byte("null")) && (len(v) == 0 || v[0] != '{') {
			return p.errf("\"rope_scaling\" %s: want a mapping (such as {\"rope_type\": \"llama3\", \"factor\": 8.0}) or null", cut(oneLine(string(v))))
		}
	}
	return nil
}

// cut is s cut to 64 bytes for a message.
func cut(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}
