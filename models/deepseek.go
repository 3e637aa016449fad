package models

// deepseek reads DeepseekV2Config and DeepseekV3Config (transformers
// src/transformers/models/deepseek_v3/configuration_deepseek_v3.py and
// modeling_deepseek_v3.py @00b676f8; DeepSeek's own configuration_deepseek.py
// and modeling_deepseek.py in the deepseek-ai/DeepSeek-V2 and -V3 model
// repositories have the same keys): multi-head latent attention, shared and
// routed experts, dense first layers. Every size that fixes the parameter
// count is required; q_lora_rank null means a plain q_proj (DeepSeek-V2-Lite).
func (p *parser) deepseek(a *Arch) error {
	for _, part := range []func(*Arch) error{p.coreSizes, p.deepseekMLA, p.deepseekExperts, p.deepseekRest} {
		if err := part(a); err != nil {
			return err
		}
	}
	return nil
}

// deepseekMLA reads the latent attention's ranks and head widths.
func (p *parser) deepseekMLA(a *Arch) error {
	var err error
	if a.KVHeads, err = p.optPos(a.Heads, maxHeads, "num_key_value_heads"); err != nil {
		return err
	}
	if a.KVHeads != a.Heads {
		return p.errf("\"num_key_value_heads\" (%d) must equal \"num_attention_heads\" (%d): latent attention up-projects keys and values for every head", a.KVHeads, a.Heads)
	}
	if _, present := p.m["q_lora_rank"]; !present {
		return p.errf("missing \"q_lora_rank\" (null for a plain q_proj)")
	}
	if !p.isNull("q_lora_rank") {
		if a.QLoRARank, err = p.reqPos(maxDim, "q_lora_rank"); err != nil {
			return err
		}
	}
	if a.KVLoRARank, err = p.reqPos(maxDim, "kv_lora_rank"); err != nil {
		return err
	}
	nope, err := p.reqPos(maxDim, "qk_nope_head_dim")
	if err != nil {
		return err
	}
	if a.QKRopeDim, err = p.reqPos(maxDim, "qk_rope_head_dim"); err != nil {
		return err
	}
	if a.QKRopeDim%2 != 0 {
		return p.errf("\"qk_rope_head_dim\" must be even (rotary pairs), got %d", a.QKRopeDim)
	}
	if a.VHeadDim, err = p.reqPos(maxDim, "v_head_dim"); err != nil {
		return err
	}
	a.HeadDim = nope + a.QKRopeDim
	if a.HeadDim > maxDim {
		return p.errf("\"qk_nope_head_dim\" + \"qk_rope_head_dim\" = %d exceeds the supported maximum %d", a.HeadDim, maxDim)
	}
	bias, err := p.boolDef(false, "attention_bias")
	a.QKVBias, a.OutBias = bias, bias
	return err
}

// deepseekExperts reads the routed and shared experts and the dense first
// layers (DeepseekV3DecoderLayer: layer_idx >= first_k_dense_replace has
// DeepseekV3MoE, the others DeepseekV3MLP; DeepSeek's modeling_deepseek.py
// also asks layer_idx % moe_layer_freq == 0).
func (p *parser) deepseekExperts(a *Arch) error {
	var err error
	a.DenseIntermediate = a.Intermediate
	if a.NumExperts, err = p.reqPos(maxExperts, "n_routed_experts"); err != nil {
		return err
	}
	if a.ExpertsPerToken, err = p.reqPos(maxExperts, "num_experts_per_tok"); err != nil {
		return err
	}
	if a.ExpertsPerToken > a.NumExperts {
		return p.errf("\"num_experts_per_tok\" (%d) must not exceed \"n_routed_experts\" (%d)", a.ExpertsPerToken, a.NumExperts)
	}
	if a.Intermediate, err = p.reqPos(maxDim, "moe_intermediate_size"); err != nil {
		return err
	}
	if a.SharedExperts, err = p.reqNonNeg(maxExperts, "n_shared_experts"); err != nil {
		return err
	}
	if a.DenseLayers, err = p.reqNonNeg(maxLayers, "first_k_dense_replace"); err != nil {
		return err
	}
	if a.DenseLayers > a.Layers {
		return p.errf("\"first_k_dense_replace\" (%d) exceeds \"num_hidden_layers\" (%d)", a.DenseLayers, a.Layers)
	}
	if a.DenseLayers == 0 {
		a.DenseIntermediate = 0
	}
	freq, err := p.optPos(1, maxLayers, "moe_layer_freq")
	if err != nil {
		return err
	}
	if freq != 1 {
		return p.errf("\"moe_layer_freq\": %d (dense layers between the expert layers) is not supported for %s", freq, a.Family)
	}
	if a.NormTopK, err = p.boolDef(a.Family == FamilyDeepSeekV3, "norm_topk_prob"); err != nil {
		return err
	}
	a.MTPLayers, err = p.optNonNeg(0, maxLayers, "num_nextn_predict_layers")
	return err
}

// deepseekRest reads the positions, norms, activation and dropouts.
func (p *parser) deepseekRest(a *Arch) error {
	var err error
	// Required: DeepseekV2Config and DeepseekV3Config default it differently.
	if a.MaxPositions, err = p.reqPos(maxPositions, "max_position_embeddings"); err != nil {
		return err
	}
	a.PosEmbedding = PosRotary
	if a.RopeTheta, err = p.posFloat(10000, "rope_theta"); err != nil {
		return err
	}
	// Rotary covers qk_rope_head_dim of each query and key head.
	a.RotaryPct = float64(a.QKRopeDim) / float64(a.HeadDim)
	a.Norm = RMSNorm
	if a.NormEps, err = p.eps(1e-6, "rms_norm_eps"); err != nil {
		return err
	}
	a.GatedMLP = true
	if a.Act, err = p.act("silu", "hidden_act"); err != nil {
		return err
	}
	if a.TieEmbeddings, err = p.boolDef(false, "tie_word_embeddings"); err != nil {
		return err
	}
	a.AttnDropout, err = p.prob(0, "attention_dropout")
	return err
}

// reqNonNeg reads a required integer >= 0.
func (p *parser) reqNonNeg(max int, key string) (int, error) {
	if _, ok := p.get(key); !ok {
		return 0, p.errf("missing %q", key)
	}
	return p.optNonNeg(0, max, key)
}
