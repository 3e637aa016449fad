package models

import (
	"encoding/json"
	"math"
	"strings"
	"testing"
)

// The published totals, rounded as they are published: DeepSeek-V2-Lite
// "15.7B" and DeepSeek-V2 "236B" total parameters (deepseek-ai/DeepSeek-V2
// README.md, model table; DeepSeek-V2 paper arXiv 2405.04434), DeepSeek-V3
// "671B" main-model parameters and "11.5B unique parameters" in its MTP
// module's decoder layer (deepseek-ai/DeepSeek-V3 README_WEIGHTS.md).
func TestDeepSeekPublishedTotals(t *testing.T) {
	for _, c := range []struct {
		model string
		unit  float64 // the published precision
		want  float64 // in units
	}{
		{"deepseek-v2-lite", 1e8, 157},
		{"deepseek-v2", 1e9, 236},
		{"deepseek-v3", 1e9, 671},
	} {
		a, err := Lookup(c.model)
		if err != nil {
			t.Fatal(err)
		}
		if got := math.Round(float64(a.ParamCount()) / c.unit); got != c.want {
			t.Errorf("%s: %d parameters rounds to %g x %g, published %g", c.model, a.ParamCount(), got, c.unit, c.want)
		}
	}
	v3, err := Lookup("deepseek-v3")
	if err != nil {
		t.Fatal(err)
	}
	// The MTP module: enorm, hnorm, eh_proj (2*7168 -> 7168), one expert
	// decoder layer, shared_head.norm. Its decoder layer alone (attention,
	// experts, norms) is README_WEIGHTS.md's "11.5B unique parameters".
	perNorms, _ := normParams[int64](v3)
	layer := attentionParams[int64](v3) + mlpParams[int64](v3) + perNorms
	if got := math.Round(float64(layer) / 1e8); got != 115 {
		t.Errorf("deepseek-v3 MTP decoder layer: %d parameters, want 11.5B", layer)
	}
	const H = 7168
	if got, want := v3.MTPParamCount(), layer+3*H+2*H*H; got != want || v3.MTPLayers != 1 {
		t.Errorf("deepseek-v3 MTPParamCount = %d (%d modules), want %d", got, v3.MTPLayers, want)
	}
	// What the checkpoint holds: the main model, the MTP module and its own
	// stored copies of embed_tokens and shared_head.head (layer 61 repeats
	// them: README_WEIGHTS.md), 684,489,830,400 elements; the README's
	// "685B" total also counts the float32 weight_scale_inv of the FP8
	// checkpoint's 128x128 blocks (not modelled).
	if got := v3.ParamCount() + v3.MTPParamCount() + 2*129280*H; got != 684_489_830_400 {
		t.Errorf("deepseek-v3 checkpoint tensors: %d", got)
	}
	if lite, _ := Lookup("deepseek-v2-lite"); lite.MTPParamCount() != 0 {
		t.Errorf("deepseek-v2-lite has no MTP module, got %d", lite.MTPParamCount())
	}
}

// MLA's KV cache holds the latent and the shared rotary key: (d_c +
// d_h^R) = 512 + 64 = 576 elements per token per layer for DeepSeek-V2 and
// V3 (DeepSeek-V2 paper, arXiv 2405.04434, section 2.1.2 and Table 1:
// (d_c + d_h^R)·l = 9/2·d_h·l with d_c = 4·d_h, d_h^R = d_h/2, d_h = 128),
// against 2·n_h·d_h·l = 2·128·192 for the keys and values transformers
// caches uncompressed.
func TestDeepSeekKVCacheElems(t *testing.T) {
	for _, n := range []string{"deepseek-v2-lite", "deepseek-v2", "deepseek-v3"} {
		a, err := Lookup(n)
		if err != nil {
			t.Fatal(err)
		}
		if got := a.KVCacheElems(); got != 576 || got*2 != 9*128 {
			t.Errorf("%s: KVCacheElems = %d, want 576 (9/2 x d_h 128)", n, got)
		}
		if !a.MLA() || a.HeadDim != 192 || a.VDim() != 128 {
			t.Errorf("%s: MLA %v head_dim %d v %d, want true 192 128", n, a.MLA(), a.HeadDim, a.VDim())
		}
	}
	l, _ := Lookup("llama-3-8b")
	if got := l.KVCacheElems(); got != 2*8*128 {
		t.Errorf("llama-3-8b KVCacheElems = %d, want %d", got, 2*8*128)
	}
}

// deepseekConfig is DeepSeek-V2-Lite's config.json keys with edits.
func deepseekConfig(t *testing.T, edit func(m map[string]any)) []byte {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(mutate(t, "deepseek-v2-lite", nil), &m); err != nil {
		t.Fatal(err)
	}
	if edit != nil {
		edit(m)
	}
	out, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestDeepSeekParse(t *testing.T) {
	a, err := ParseHFConfig(deepseekConfig(t, nil), "lite.json")
	if err != nil {
		t.Fatal(err)
	}
	if a.QLoRARank != 0 || a.KVLoRARank != 512 || a.QKRopeDim != 64 || a.DenseLayers != 1 || a.DenseIntermediate != 10944 ||
		a.Intermediate != 1408 || a.SharedExperts != 2 || a.NumExperts != 64 || a.ExpertsPerToken != 6 || a.NormTopK {
		t.Errorf("parsed %+v", a)
	}
	if got := a.RotaryPct * float64(a.HeadDim); math.Abs(got-64) > 1e-9 {
		t.Errorf("rotary dims %g, want 64", got)
	}
	v3, err := Lookup("deepseek-v3")
	if err != nil {
		t.Fatal(err)
	}
	if !v3.NormTopK || v3.QLoRARank != 1536 || v3.DenseLayers != 3 || !v3.MoELayer(3) || v3.MoELayer(2) {
		t.Errorf("deepseek-v3 parsed %+v", v3)
	}
	if d := v3.Describe(); !strings.Contains(d, "256 experts top-8 x ffn 2048 + 1 shared") {
		t.Errorf("Describe = %q", d)
	}
}

func TestDeepSeekBadConfigs(t *testing.T) {
	cases := []struct {
		name string
		edit func(m map[string]any)
		want string
	}{
		{"no kv_lora_rank", func(m map[string]any) { delete(m, "kv_lora_rank") }, `missing "kv_lora_rank"`},
		{"no q_lora_rank", func(m map[string]any) { delete(m, "q_lora_rank") }, `missing "q_lora_rank"`},
		{"zero q_lora_rank", func(m map[string]any) { m["q_lora_rank"] = 0 }, `"q_lora_rank" must be positive`},
		{"odd rope", func(m map[string]any) { m["qk_rope_head_dim"] = 63 }, `"qk_rope_head_dim" must be even`},
		{"string v_head_dim", func(m map[string]any) { m["v_head_dim"] = "128" }, `"v_head_dim" must be an integer`},
		{"no qk_nope_head_dim", func(m map[string]any) { delete(m, "qk_nope_head_dim") }, `missing "qk_nope_head_dim"`},
		{"gqa", func(m map[string]any) { m["num_key_value_heads"] = 8 }, `"num_key_value_heads" (8) must equal "num_attention_heads" (16)`},
		{"no routed experts", func(m map[string]any) { delete(m, "n_routed_experts") }, `missing "n_routed_experts"`},
		{"top-k too large", func(m map[string]any) { m["num_experts_per_tok"] = 65 }, `"num_experts_per_tok" (65) must not exceed "n_routed_experts" (64)`},
		{"no shared", func(m map[string]any) { delete(m, "n_shared_experts") }, `missing "n_shared_experts"`},
		{"negative shared", func(m map[string]any) { m["n_shared_experts"] = -1 }, `"n_shared_experts" must not be negative`},
		{"no moe width", func(m map[string]any) { delete(m, "moe_intermediate_size") }, `missing "moe_intermediate_size"`},
		{"dense beyond layers", func(m map[string]any) { m["first_k_dense_replace"] = 28 }, `"first_k_dense_replace" (28) exceeds "num_hidden_layers" (27)`},
		{"no first_k", func(m map[string]any) { delete(m, "first_k_dense_replace") }, `missing "first_k_dense_replace"`},
		{"layer freq", func(m map[string]any) { m["moe_layer_freq"] = 2 }, `"moe_layer_freq": 2 (dense layers between the expert layers) is not supported for deepseek_v2`},
		{"mtp", func(m map[string]any) { m["num_nextn_predict_layers"] = -1 }, `"num_nextn_predict_layers" must not be negative`},
		{"block fp8", func(m map[string]any) {
			m["quantization_config"] = map[string]any{"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": []int{128, 128}}
		}, "fp8 with weight_block_size (block-wise scales) is not supported"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := ParseHFConfig(deepseekConfig(t, c.edit), "ds.json")
			if err == nil {
				t.Fatalf("accepted, want %q", c.want)
			}
			msg := err.Error()
			if !strings.HasPrefix(msg, "ds.json: ") || !strings.Contains(msg, c.want) || strings.Contains(msg, "\n") {
				t.Errorf("error %q, want one line with %q", msg, c.want)
			}
		})
	}
}

// TestDeepSeekValidate: latent attention and shared experts are DeepSeek's
// fields; an Arch built by hand with them elsewhere, or inconsistent, fails.
func TestDeepSeekValidate(t *testing.T) {
	l, _ := Lookup("llama-3-8b")
	l.KVLoRARank = 512
	if err := l.Validate(); err == nil || !strings.Contains(err.Error(), "DeepSeek's") {
		t.Errorf("llama with a latent rank: %v", err)
	}
	for _, c := range []struct {
		edit func(a *Arch)
		want string
	}{
		{func(a *Arch) { a.QKRopeDim = 192 }, "QKRopeDim must be in [1, 191]"},
		{func(a *Arch) { a.DenseLayers = 2; a.DenseIntermediate = 0 }, "DenseIntermediate must be in"},
		{func(a *Arch) { a.KVHeads = 8 }, "KVHeads must equal Heads"},
	} {
		a, _ := Lookup("deepseek-v2-lite")
		c.edit(a)
		if err := a.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("got %v, want %q", err, c.want)
		}
	}
}
