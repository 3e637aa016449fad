package models

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// mutate returns the catalog config of model with keys set (nil value
// deletes the key; a json.RawMessage value is inserted verbatim).
func mutate(t testing.TB, model string, set map[string]any) []byte {
	t.Helper()
	loadCatalog()
	data, ok := catalogData[model]
	if !ok {
		t.Fatalf("no catalog model %q", model)
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	for k, v := range set {
		if v == nil {
			delete(m, k)
			continue
		}
		if raw, ok := v.(json.RawMessage); ok {
			m[k] = raw
			continue
		}
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		m[k] = b
	}
	out, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func del(keys ...string) map[string]any {
	m := map[string]any{}
	for _, k := range keys {
		m[k] = nil
	}
	return m
}

func TestParseHFConfigErrors(t *testing.T) {
	cases := []struct {
		name  string
		model string         // catalog config to start from ("" = use data)
		set   map[string]any // mutations
		data  string         // raw input when model == ""
		want  []string       // substrings of the error
	}{
		// Missing required fields, per family.
		{"llama missing heads", "llama-2-7b", del("num_attention_heads"), "", []string{`missing "num_attention_heads"`}},
		{"llama missing hidden", "llama-2-7b", del("hidden_size"), "", []string{`missing "hidden_size"`}},
		{"llama missing layers", "llama-2-7b", del("num_hidden_layers"), "", []string{`missing "num_hidden_layers"`}},
		{"llama missing vocab", "llama-2-7b", del("vocab_size"), "", []string{`missing "vocab_size"`}},
		{"llama missing ffn", "llama-2-7b", del("intermediate_size"), "", []string{`missing "intermediate_size"`}},
		{"mixtral missing experts", "mixtral-8x7b", del("num_local_experts"), "", []string{`missing "num_local_experts"`}},
		{"gpt2 missing n_embd", "gpt2", del("n_embd"), "", []string{`missing "n_embd"`}},
		{"gpt2 missing n_layer", "gpt2", del("n_layer"), "", []string{`missing "n_layer"`}},
		{"gpt2 missing n_head", "gpt2", del("n_head"), "", []string{`missing "n_head"`}},
		{"gpt2 missing positions", "gpt2", del("n_positions", "n_ctx"), "", []string{`missing "n_positions"`}},
		{"gpt2 missing vocab", "gpt2", del("vocab_size"), "", []string{`missing "vocab_size"`}},
		{"neox missing ffn", "pythia-160m", del("intermediate_size"), "", []string{`missing "intermediate_size"`}},
		{"phi missing vocab", "phi-1.5", del("vocab_size"), "", []string{`missing "vocab_size"`}},
		{"phi missing ffn", "phi-1.5", del("intermediate_size"), "", []string{`missing "intermediate_size"`}},
		{"bert missing positions", "bert-base", del("max_position_embeddings"), "", []string{`missing "max_position_embeddings"`}},
		{"vit missing image_size", "vit-base", del("image_size"), "", []string{`missing "image_size"`}},
		{"vit missing patch_size", "vit-base", del("patch_size"), "", []string{`missing "patch_size"`}},
		{"missing model_type", "llama-2-7b", del("model_type"), "", []string{`missing "model_type"`, "llama"}},

		// Zero and negative sizes.
		{"negative hidden", "llama-2-7b", map[string]any{"hidden_size": -4}, "", []string{`"hidden_size" must be positive, got -4`}},
		{"zero layers", "llama-2-7b", map[string]any{"num_hidden_layers": 0}, "", []string{`"num_hidden_layers" must be positive, got 0`}},
		{"zero heads", "gpt2", map[string]any{"n_head": 0}, "", []string{`"n_head" must be positive`}},
		{"negative vocab", "bert-base", map[string]any{"vocab_size": -1}, "", []string{`"vocab_size" must be positive`}},
		{"zero kv heads", "llama-3-8b", map[string]any{"num_key_value_heads": 0}, "", []string{`"num_key_value_heads" must be positive`}},
		{"zero head_dim", "qwen3-8b", map[string]any{"head_dim": 0}, "", []string{`"head_dim" must be positive`}},
		{"negative n_inner", "gpt2", map[string]any{"n_inner": -3072}, "", []string{`"n_inner" must be positive`}},
		{"zero patch", "vit-base", map[string]any{"patch_size": 0}, "", []string{`"patch_size" must be positive`}},
		{"negative window", "mistral-7b", map[string]any{"sliding_window": -1}, "", []string{`"sliding_window" must not be negative`}},
		{"huge hidden", "llama-2-7b", map[string]any{"hidden_size": 1 << 30}, "", []string{`"hidden_size" must be at most`}},
		{"overflowing int", "llama-2-7b", map[string]any{"hidden_size": json.RawMessage("1e300")}, "", []string{`"hidden_size" is out of range`}},

		// Divisibility.
		{"heads do not divide hidden", "llama-2-7b", map[string]any{"num_attention_heads": 30}, "", []string{`"num_attention_heads" (30) must divide "hidden_size" (4096)`}},
		{"gpt2 heads do not divide", "gpt2", map[string]any{"n_head": 7}, "", []string{`"n_head" (7) must divide "n_embd" (768)`}},
		{"kv heads do not divide heads", "llama-3-8b", map[string]any{"num_key_value_heads": 3}, "", []string{`"num_key_value_heads" (3) must divide "num_attention_heads" (32)`}},
		{"patch larger than image", "vit-base", map[string]any{"patch_size": 448}, "", []string{`"patch_size" (448) must not exceed "image_size" (224)`}},
		{"qwen3_moe top-k above experts", "qwen3-30b-a3b", map[string]any{"num_experts_per_tok": 129}, "", []string{`"num_experts_per_tok" (129) must not exceed "num_experts" (128)`}},
		{"qwen3_moe zero experts", "qwen3-30b-a3b", map[string]any{"num_experts": 0}, "", []string{`"num_experts" must be positive`}},
		{"qwen3_moe expert width string", "qwen3-30b-a3b", map[string]any{"moe_intermediate_size": "768"}, "", []string{`"moe_intermediate_size"`}},
		{"qwen3_moe dense step", "qwen3-30b-a3b", map[string]any{"decoder_sparse_step": 2}, "", []string{`"decoder_sparse_step": 2 (dense MLP layers between the expert layers) is not supported for qwen3_moe`}},
		{"qwen3_moe dense layers", "qwen3-30b-a3b", map[string]any{"mlp_only_layers": []int{0}}, "", []string{`"mlp_only_layers" (dense MLP layers among the expert layers) is not supported for qwen3_moe`}},
		{"qwen3_moe dense layers not a list", "qwen3-30b-a3b", map[string]any{"mlp_only_layers": 3}, "", []string{`"mlp_only_layers" must be a list of layer indices, got 3`}},
		{"qwen3_moe norm_topk_prob string", "qwen3-30b-a3b", map[string]any{"norm_topk_prob": "yes"}, "", []string{`"norm_topk_prob" must be true or false`}},
		{"gemma3 layer_types not a list", "gemma-3-1b", map[string]any{"layer_types": "sliding"}, "", []string{`"layer_types" must be a list of "sliding_attention" / "full_attention", got string "sliding"`}},
		{"gemma3 layer_types count", "gemma-3-1b", map[string]any{"layer_types": []string{"full_attention"}}, "", []string{`"layer_types" has 1 entries for 26 layers ("num_hidden_layers")`}},
		{"gemma3 layer_types unknown", "gemma-3-1b", map[string]any{"num_hidden_layers": 2, "layer_types": []string{"sliding_attention", "chunked_attention"}}, "", []string{`"layer_types"[1] is "chunked_attention"; want "sliding_attention" or "full_attention"`}},
		{"gemma3 layer_types irregular", "gemma-3-1b", map[string]any{"num_hidden_layers": 3, "layer_types": []string{"full_attention", "sliding_attention", "full_attention"}}, "", []string{`"layer_types" is not a repeating pattern of sliding layers and one full-attention layer; not supported for gemma3_text`}},
		{"gemma3 pattern zero", "gemma-3-1b", map[string]any{"sliding_window_pattern": 0}, "", []string{`"sliding_window_pattern" must be positive`}},
		{"gemma3 local rope base", "gemma-3-1b", map[string]any{"rope_local_base_freq": -1}, "", []string{`"rope_local_base_freq"`}},
		{"gemma3 softcap string", "gemma-3-1b", map[string]any{"attn_logit_softcapping": "50"}, "", []string{`"attn_logit_softcapping"`}},
		{"top-k above experts", "mixtral-8x7b", map[string]any{"num_experts_per_tok": 9}, "", []string{`"num_experts_per_tok" (9) must not exceed "num_local_experts" (8)`}},

		// Wrong JSON types.
		{"string size", "llama-2-7b", map[string]any{"hidden_size": "big"}, "", []string{`"hidden_size" must be an integer, got string "big"`}},
		{"fractional size", "llama-2-7b", map[string]any{"hidden_size": 4096.5}, "", []string{`"hidden_size" must be an integer, got 4096.5`}},
		{"bool size", "gpt2", map[string]any{"n_layer": true}, "", []string{`"n_layer" must be an integer, got bool true`}},
		{"array size", "bert-base", map[string]any{"intermediate_size": []int{1, 2}}, "", []string{`"intermediate_size" must be an integer, got array`}},
		{"string tie", "llama-2-7b", map[string]any{"tie_word_embeddings": "no"}, "", []string{`"tie_word_embeddings" must be true or false`}},
		{"numeric model_type", "llama-2-7b", map[string]any{"model_type": 3}, "", []string{`"model_type" must be a string, got 3`}},
		{"string eps", "llama-2-7b", map[string]any{"rms_norm_eps": "tiny"}, "", []string{`"rms_norm_eps" must be a number, got string "tiny"`}},
		{"dropout above one", "gpt2", map[string]any{"attn_pdrop": 1.5}, "", []string{`"attn_pdrop" must be in [0, 1], got 1.5`}},
		{"rotary pct zero", "pythia-160m", map[string]any{"rotary_pct": 0}, "", []string{`"rotary_pct" must be in (0, 1], got 0`}},
		{"phi rotary factor zero", "phi-1.5", map[string]any{"partial_rotary_factor": 0}, "", []string{`"partial_rotary_factor" must be in (0, 1], got 0`}},
		{"phi rotary factor above one", "phi-1.5", map[string]any{"partial_rotary_factor": 1.5}, "", []string{`"partial_rotary_factor" must be in (0, 1], got 1.5`}},
		{"phi rotary factor string", "phi-1.5", map[string]any{"partial_rotary_factor": "half"}, "", []string{`"partial_rotary_factor" must be a number, got string "half"`}},
		{"phi rotary under two dims", "phi-1.5", map[string]any{"partial_rotary_factor": 0.01}, "", []string{`"partial_rotary_factor" 0.01 rotates 0 of 64 head dimensions`}},
		{"phi qk_layernorm", "phi-1.5", map[string]any{"qk_layernorm": true}, "", []string{`"qk_layernorm": true is not supported for phi`}},
		{"phi qk_layernorm string", "phi-1.5", map[string]any{"qk_layernorm": "yes"}, "", []string{`"qk_layernorm" must be true or false`}},
		{"phi resid dropout", "phi-1.5", map[string]any{"resid_pdrop": 1.5}, "", []string{`"resid_pdrop" must be in [0, 1], got 1.5`}},
		{"phi layer_norm_eps", "phi-1.5", map[string]any{"layer_norm_eps": 1}, "", []string{`"layer_norm_eps" must be in [0, 1), got 1`}},
		{"phi kv heads do not divide", "phi-1.5", map[string]any{"num_key_value_heads": 5}, "", []string{`"num_key_value_heads" (5) must divide "num_attention_heads" (32)`}},
		{"phi heads do not divide", "phi-1.5", map[string]any{"num_attention_heads": 30}, "", []string{`"num_attention_heads" (30) must divide "hidden_size" (2048)`}},
		{"unknown activation", "llama-2-7b", map[string]any{"hidden_act": "swiglu9"}, "", []string{`"hidden_act": unsupported activation "swiglu9"`}},
		{"relative bert", "bert-base", map[string]any{"position_embedding_type": "relative_key"}, "", []string{`"position_embedding_type" "relative_key" is not supported`}},
		{"id2label not object", "vit-base", map[string]any{"id2label": []string{"a"}}, "", []string{`"id2label" must be an object, got array`}},

		// Unknown family.
		{"unknown model_type", "llama-2-7b", map[string]any{"model_type": "t5"}, "", []string{`unsupported model_type "t5"`, "gpt2", "llama", "mixtral", "vit"}},

		// Malformed files.
		{"empty file", "", nil, "", []string{"config.json: empty file"}},
		{"whitespace file", "", nil, " \n\t ", []string{"config.json: empty file"}},
		{"truncated JSON", "", nil, `{"model_type": "llama", "hidden_size": 40`, []string{"config.json: invalid JSON"}},
		{"trailing garbage", "", nil, `{"model_type": "llama"} x`, []string{"config.json: invalid JSON"}},
		{"top-level array", "", nil, `[1, 2]`, []string{"config.json: not a JSON object"}},
		{"top-level null", "", nil, `null`, []string{"config.json: not a JSON object"}},
		{"a BOM before an array", "", nil, "\xef\xbb\xbf[1]", []string{"config.json: not a JSON object"}},
		// Fields memplan cannot honour: int4 and float8 were served as bfloat16.
		{"torch_dtype int4", "llama-3.2-1b", map[string]any{"torch_dtype": "int4"}, "", []string{`"torch_dtype" "int4": want float32, float16 or bfloat16`}},
		{"torch_dtype float8", "llama-3.2-1b", map[string]any{"torch_dtype": "float8_e4m3fn"}, "", []string{`"torch_dtype" "float8_e4m3fn": want`}},
		{"dtype float64", "llama-3.2-1b", map[string]any{"torch_dtype": nil, "dtype": "float64"}, "", []string{`"dtype" "float64": want`}},
		{"rope_scaling a string", "llama-3.2-1b", map[string]any{"rope_scaling": "yes"}, "", []string{`"rope_scaling" "yes": want a mapping`}},
		{"rope_scaling a list", "llama-3.2-1b", map[string]any{"rope_scaling": []any{1, 2}}, "", []string{`"rope_scaling" [1,2]: want a mapping`}},
		{"rope_scaling a number", "llama-3.2-1b", map[string]any{"rope_scaling": 8}, "", []string{`"rope_scaling" 8: want a mapping`}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			data := []byte(c.data)
			if c.model != "" {
				data = mutate(t, c.model, c.set)
			}
			a, err := ParseHFConfig(data, "config.json")
			if err == nil {
				t.Fatalf("accepted: %+v", a)
			}
			msg := err.Error()
			if !strings.HasPrefix(msg, "config.json: ") {
				t.Errorf("error %q lacks the \"config.json: \" prefix", msg)
			}
			if strings.Contains(msg, "\n") {
				t.Errorf("error is not one line: %q", msg)
			}
			for _, w := range c.want {
				if !strings.Contains(msg, w) {
					t.Errorf("error %q does not contain %q", msg, w)
				}
			}
		})
	}
}

func TestParseHFConfigDefaults(t *testing.T) {
	// gpt2 with the optional fields removed falls back to GPT2Config defaults.
	a, err := ParseHFConfig(mutate(t, "gpt2", del("activation_function", "layer_norm_epsilon", "attn_pdrop", "n_inner")), "x")
	if err != nil {
		t.Fatal(err)
	}
	if a.Intermediate != 4*768 || a.Act != "gelu_new" || a.NormEps != 1e-5 || a.AttnDropout != 0.1 || !a.TieEmbeddings {
		t.Errorf("gpt2 defaults: %+v", a)
	}
	// n_inner: null is the same as absent.
	a, err = ParseHFConfig(mutate(t, "gpt2", map[string]any{"n_inner": json.RawMessage("null")}), "x")
	if err != nil || a.Intermediate != 3072 {
		t.Errorf("n_inner null: %v %+v", err, a)
	}
	// llama without num_key_value_heads is MHA.
	a, err = ParseHFConfig(mutate(t, "llama-3-8b", del("num_key_value_heads")), "x")
	if err != nil || a.KVHeads != 32 {
		t.Errorf("kv heads default: %v %+v", err, a)
	}
	// llama ties only when asked; gemma ties by default.
	a, err = ParseHFConfig(mutate(t, "llama-2-7b", del("tie_word_embeddings")), "x")
	if err != nil || a.TieEmbeddings {
		t.Errorf("llama tie default: %v %+v", err, a)
	}
	a, err = ParseHFConfig(mutate(t, "gemma-2b", del("tie_word_embeddings")), "x")
	if err != nil || !a.TieEmbeddings {
		t.Errorf("gemma tie default: %v %+v", err, a)
	}
	// gemma's legacy hidden_act "gelu" means the tanh approximation.
	if a.Act != "gelu_pytorch_tanh" {
		t.Errorf("gemma act = %q", a.Act)
	}
	// mistral sliding window default and explicit null.
	a, err = ParseHFConfig(mutate(t, "mistral-7b", del("sliding_window")), "x")
	if err != nil || a.SlidingWindow != 4096 {
		t.Errorf("mistral window default: %v %+v", err, a)
	}
	a, err = ParseHFConfig(mutate(t, "mistral-7b", map[string]any{"sliding_window": json.RawMessage("null")}), "x")
	if err != nil || a.SlidingWindow != 0 {
		t.Errorf("mistral window null: %v %+v", err, a)
	}
	// Integral floats are accepted as integers.
	a, err = ParseHFConfig(mutate(t, "llama-2-7b", map[string]any{"hidden_size": json.RawMessage("4096.0")}), "x")
	if err != nil || a.Hidden != 4096 {
		t.Errorf("4096.0: %v %+v", err, a)
	}
	// A ViTModel config gets a pooler and no classifier.
	a, err = ParseHFConfig(mutate(t, "vit-base", map[string]any{"architectures": []string{"ViTModel"}, "num_labels": nil}), "x")
	if err != nil || !a.Pooler || a.NumLabels != 0 || a.ParamCount() != 86_389_248 {
		t.Errorf("ViTModel: %v %+v", err, a)
	}
	// phi without the optional fields falls back to PhiConfig defaults
	// (partial_rotary_factor 0.5, gelu_new, layer_norm_eps 1e-5, MHA,
	// untied head, no dropout); explicit values are read.
	a, err = ParseHFConfig(mutate(t, "phi-1.5", del("partial_rotary_factor", "hidden_act", "layer_norm_eps",
		"num_key_value_heads", "tie_word_embeddings", "resid_pdrop", "embd_pdrop", "qk_layernorm", "rope_theta")), "x")
	if err != nil || a.RotaryPct != 0.5 || a.Act != "gelu_new" || a.NormEps != 1e-5 || a.KVHeads != 32 ||
		a.TieEmbeddings || a.HiddenDropout != 0 || a.EmbdDropout != 0 || a.RopeTheta != 10000 || a.ParamCount() != 1_418_270_720 {
		t.Errorf("phi defaults: %v %+v", err, a)
	}
	a, err = ParseHFConfig(mutate(t, "phi-1.5", map[string]any{"partial_rotary_factor": 0.4, "resid_pdrop": 0.1, "embd_pdrop": 0.05}), "x")
	if err != nil || a.RotaryPct != 0.4 || a.HiddenDropout != 0.1 || a.EmbdDropout != 0.05 {
		t.Errorf("phi values: %v %+v", err, a)
	}
	// A tied phi head keeps its bias: the count drops by the weight only.
	a, err = ParseHFConfig(mutate(t, "phi-1.5", map[string]any{"tie_word_embeddings": true}), "x")
	if err != nil || !a.TieEmbeddings || a.ParamCount() != 1_418_270_720-51200*2048 {
		t.Errorf("phi tied: %v %+v", err, a)
	}
	// id2label sizes the classifier.
	a, err = ParseHFConfig(mutate(t, "vit-base", map[string]any{"num_labels": nil, "id2label": map[string]string{"0": "cat", "1": "dog", "2": "emu"}}), "x")
	if err != nil || a.NumLabels != 3 {
		t.Errorf("id2label: %v %+v", err, a)
	}
}

func TestFamilyFlags(t *testing.T) {
	get := func(n string) *Arch {
		a, err := Lookup(n)
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	if a := get("gpt2"); !a.FusedQKV || a.GatedMLP || a.PosEmbedding != "learned" || a.Norm != "layernorm" || !a.NormBias || !a.TieEmbeddings {
		t.Errorf("gpt2: %+v", a)
	}
	if a := get("qwen2.5-7b"); !a.QKVBias || a.OutBias || a.SlidingWindow != 0 {
		t.Errorf("qwen2: %+v", a)
	}
	if a := get("qwen3-8b"); !a.QKNorm || a.QKVBias || a.HeadDim != 128 {
		t.Errorf("qwen3: %+v", a)
	}
	if a := get("gemma-2-9b"); !a.PostNorms || !a.SlidingWindowAlternating || a.SlidingWindow != 4096 || a.AttnLogitSoftcap != 50 || a.FinalLogitSoftcap != 30 || a.HeadDim != 256 {
		t.Errorf("gemma2: %+v", a)
	}
	if a := get("phi-3-mini"); !a.FusedQKV || !a.FusedGateUp || a.SlidingWindow != 2047 {
		t.Errorf("phi3: %+v", a)
	}
	if a := get("pythia-160m"); !a.ParallelResidual || a.RotaryPct != 0.25 || !a.QKVBias || !a.MLPBias || a.TieEmbeddings {
		t.Errorf("neox: %+v", a)
	}
	if a := get("phi-1.5"); !a.ParallelResidual || !a.SharedNorm || !a.LMHeadBias || a.FusedQKV || a.GatedMLP ||
		a.RotaryPct != 0.5 || !a.QKVBias || !a.OutBias || !a.MLPBias || a.TieEmbeddings || a.Norm != "layernorm" || !a.NormBias || a.Act != "gelu_new" {
		t.Errorf("phi: %+v", a)
	}
	if a := get("mixtral-8x7b"); a.NumExperts != 8 || a.ExpertsPerToken != 2 || a.RopeTheta != 1e6 {
		t.Errorf("mixtral: %+v", a)
	}
	if a := get("bert-base"); !a.Encoder || !a.Pooler || a.TypeVocab != 2 || a.AttnDropout != 0.1 {
		t.Errorf("bert: %+v", a)
	}
	if a := get("vit-base"); a.MaxPositions != 197 || a.NumLabels != 1000 || a.Pooler || a.Vocab != 0 {
		t.Errorf("vit: %+v", a)
	}
	if a := get("llama-3.2-1b"); !a.TieEmbeddings || a.HeadDim != 64 || a.KVHeads != 8 {
		t.Errorf("llama-3.2-1b: %+v", a)
	}
}

func TestLoadFile(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "config.json")
	loadCatalog()
	if err := os.WriteFile(p, catalogData["mistral-7b"], 0o644); err != nil {
		t.Fatal(err)
	}
	a, err := LoadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if a.Name != p || a.ParamCount() != 7_241_732_096 {
		t.Errorf("LoadFile: %+v", a)
	}
	if _, err := LoadFile(filepath.Join(dir, "nope.json")); err == nil || !strings.HasPrefix(err.Error(), "") {
		t.Errorf("missing file: %v", err)
	}
	// Resolve: existing path, .json path, catalog name.
	if a, err := Resolve(p); err != nil || a.Family != FamilyMistral {
		t.Errorf("Resolve(path): %v", err)
	}
	if _, err := Resolve(filepath.Join(dir, "missing.json")); err == nil {
		t.Error("Resolve(missing .json) succeeded")
	}
	if a, err := Resolve("GPT2"); err != nil || a.Family != FamilyGPT2 {
		t.Errorf("Resolve(name): %v", err)
	}
}

func TestValidateRejects(t *testing.T) {
	base, err := Lookup("llama-3-8b")
	if err != nil {
		t.Fatal(err)
	}
	cases := map[string]func(a *Arch){
		"zero hidden":      func(a *Arch) { a.Hidden = 0 },
		"kv not dividing":  func(a *Arch) { a.KVHeads = 5 },
		"bad norm":         func(a *Arch) { a.Norm = "batchnorm" },
		"bad pos":          func(a *Arch) { a.PosEmbedding = "alibi" },
		"topk > experts":   func(a *Arch) { a.NumExperts, a.ExpertsPerToken = 2, 3 },
		"topk without moe": func(a *Arch) { a.ExpertsPerToken = 1 },
		"dropout":          func(a *Arch) { a.HiddenDropout = 2 },
		"unknown family":   func(a *Arch) { a.Family = "rwkv" },
		"huge": func(a *Arch) {
			a.Layers, a.Hidden, a.Intermediate, a.HeadDim = maxLayers, maxDim, maxDim, maxDim/a.Heads
		},
		"rmsnorm bias":        func(a *Arch) { a.NormBias = true },
		"fused gate dense":    func(a *Arch) { a.GatedMLP = false; a.FusedGateUp = true },
		"head dim mismatch":   func(a *Arch) { a.Family = FamilyGPTNeoX; a.HeadDim = 64 },
		"type vocab non-bert": func(a *Arch) { a.TypeVocab = 2 },
		"shared norm serial":  func(a *Arch) { a.SharedNorm = true },
		"phi qk norm":         func(a *Arch) { a.Family, a.QKNorm = FamilyPhi, true },
	}
	for name, f := range cases {
		a := base.Clone()
		f(a)
		if err := a.Validate(); err == nil {
			t.Errorf("%s: Validate accepted %+v", name, a)
		} else if !strings.HasPrefix(err.Error(), "") {
			t.Errorf("%s: error %q lacks prefix", name, err)
		}
	}
	if err := base.Validate(); err != nil {
		t.Errorf("base: %v", err)
	}
	var nilArch *Arch
	if nilArch.Validate() == nil || nilArch.Clone() != nil {
		t.Error("nil Arch")
	}
}

func FuzzParseHFConfig(f *testing.F) {
	loadCatalog()
	for _, n := range catalogNames {
		f.Add(catalogData[n])
	}
	f.Add([]byte(``))
	f.Add([]byte(`{}`))
	f.Add([]byte(`{"model_type":"gpt2","n_embd":64,"n_layer":2,"n_head":4,"n_positions":128,"vocab_size":100}`))
	f.Add([]byte(`{"model_type":"mixtral","hidden_size":64,"num_hidden_layers":1,"num_attention_heads":4,"vocab_size":10,"intermediate_size":8,"num_local_experts":1e3}`))
	// Extreme values (issue 15): the 300-byte config of 4096 layers × 4096
	// experts, sizes at 2^31-1, 2^62 and past int64, negative and
	// non-finite numbers.
	f.Add([]byte(`{"model_type":"mixtral","hidden_size":64,"intermediate_size":64,"num_hidden_layers":4096,"num_attention_heads":4,"num_key_value_heads":4,"vocab_size":100,"num_local_experts":4096,"num_experts_per_tok":2,"max_position_embeddings":512}`))
	f.Add([]byte(`{"model_type":"llama","hidden_size":2147483647,"intermediate_size":2147483647,"num_hidden_layers":2147483647,"num_attention_heads":1,"vocab_size":2147483647}`))
	f.Add([]byte(`{"model_type":"llama","hidden_size":4611686018427387904,"intermediate_size":8,"num_hidden_layers":1,"num_attention_heads":4611686018427387904,"vocab_size":10}`))
	f.Add([]byte(`{"model_type":"gpt2","n_embd":9223372036854775808,"n_layer":-1,"n_head":0,"n_positions":1e309,"vocab_size":-9223372036854775808}`))
	f.Add([]byte(`{"model_type":"llama","hidden_size":64.5,"intermediate_size":"NaN","num_hidden_layers":1e18,"num_attention_heads":4,"vocab_size":10}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		a, err := ParseHFConfig(data, "fuzz.json")
		if err != nil {
			msg := err.Error()
			if !strings.HasPrefix(msg, "") || strings.Contains(msg, "\n") {
				t.Fatalf("bad error %q", msg)
			}
			return
		}
		if err := a.Validate(); err != nil {
			t.Fatalf("accepted arch fails Validate: %v", err)
		}
		n := a.ParamCount()
		if n <= 0 {
			t.Fatalf("ParamCount %d", n)
		}
		var sum int64
		for _, g := range a.ParamBreakdown() {
			sum += g.Total
		}
		if sum != n {
			t.Fatalf("breakdown %d != ParamCount %d", sum, n)
		}
		_ = a.Describe()
	})
}

// Gemma 3's layer pattern and optional soft caps (Gemma3TextConfig @v5.24.0:
// layer_types from sliding_window_pattern, full attention on each n-th layer).
func TestGemma3Pattern(t *testing.T) {
	parse := func(set map[string]any) *Arch {
		t.Helper()
		a, err := ParseHFConfig(mutate(t, "gemma-3-1b", set), "gemma-3-1b")
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	a := parse(nil)
	if a.SlidingWindowPattern != 6 || a.RopeLocalTheta != 1e4 || a.RopeTheta != 1e6 || a.SlidingWindow != 512 ||
		a.AttnLogitSoftcap != 0 || a.FinalLogitSoftcap != 0 || a.QueryPreAttnScalar != 256 || !a.QKNorm || !a.PostNorms || !a.TieEmbeddings {
		t.Errorf("gemma-3-1b: %+v", a)
	}
	types := []string{"sliding_attention", "sliding_attention", "full_attention", "sliding_attention"}
	if a := parse(map[string]any{"num_hidden_layers": 4, "layer_types": types}); a.SlidingWindowPattern != 3 {
		t.Errorf("layer_types %v: pattern %d, want 3", types, a.SlidingWindowPattern)
	}
	if a := parse(map[string]any{"num_hidden_layers": 2, "layer_types": []string{"sliding_attention", "sliding_attention"}}); a.SlidingWindowPattern != 3 {
		t.Errorf("all sliding: pattern %d, want 3 (no full layer among 2)", a.SlidingWindowPattern)
	}
	if a := parse(map[string]any{"attn_logit_softcapping": 50, "final_logit_softcapping": 30}); a.AttnLogitSoftcap != 50 || a.FinalLogitSoftcap != 30 {
		t.Errorf("soft caps read as %v, %v", a.AttnLogitSoftcap, a.FinalLogitSoftcap)
	}
}

// A config.json that a Windows editor saved with a UTF-8 byte order mark
// reads as without it (it was "not a JSON object"); dtypes memplan plans
// in, with or without torch.'s prefix, and a null rope_scaling pass.
func TestParseHFConfigAccepts(t *testing.T) {
	plain := mutate(t, "llama-3.2-1b", nil)
	for name, data := range map[string][]byte{
		"BOM":           append([]byte("\xef\xbb\xbf"), plain...),
		"torch.float16": mutate(t, "llama-3.2-1b", map[string]any{"torch_dtype": "torch.float16"}),
		"float32":       mutate(t, "llama-3.2-1b", map[string]any{"torch_dtype": "float32"}),
		"no dtype":      mutate(t, "llama-3.2-1b", map[string]any{"torch_dtype": nil}),
		"rope null":     mutate(t, "llama-3.2-1b", map[string]any{"rope_scaling": nil}),
	} {
		if _, err := ParseHFConfig(data, "config.json"); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}
