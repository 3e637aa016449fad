package models

import "testing"

// realParamCounts is the exact parameter count of each catalog model as its
// PyTorch module holds it (sum of p.numel() over model.parameters(), tied
// weights once, buffers excluded). Sources were looked up in public
// material; "keras-hub preset" means the "params" field of the model's
// preset in keras-team/keras-hub (keras-nlp), "HF safetensors total" the
// safetensors.total field of the HuggingFace model API, "numel" a printed
// sum(p.numel()) / num_parameters() of the transformers model.
//
// Every number was also re-derived from the module structure (see the
// formulas in breakdown), and agrees. Early Llama-2 uploads additionally
// stored rotary inv_freq buffers in the checkpoint (head_dim/2 per layer),
// so some published "safetensors total" figures for them are larger by
// exactly layers*head_dim/2 (e.g. 68,976,653,312 for Llama-2-70b-hf =
// 68,976,648,192 + 80*64); those buffers are not parameters.
var realParamCounts = map[string]int64{
	// GPT2LMHeadModel, lm_head tied to wte. numel printout
	// "GPT2LMHeadModel<all params:124439808>" (hiq print_model docstring);
	// many GPT-2 parameter-count tests (12 layers, d=768: 124439808).
	"gpt2": 124_439_808,
	// keras-hub gpt2_medium_en preset "params": 354823168.
	"gpt2-medium": 354_823_168,
	// keras-hub gpt2_large_en preset "params": 774030080.
	"gpt2-large": 774_030_080,
	// keras-hub gpt2_extra_large_en preset "params": 1557611200.
	"gpt2-xl": 1_557_611_200,
	// GGUF metadata "parameters: 6738415616" of TheBloke/Llama-2-7B-Chat-GGUF;
	// model-size tables "meta-llama/Llama-2-7b-chat-hf": 6_738_415_616; LLaMA-1
	// 7B (identical shapes) keras preset and PEFT "all params: 6738415616".
	"llama-2-7b": 6_738_415_616,
	// Published per-model tables (parameters_raw 13015864320) and a
	// derivation 327680000 + 40*317204480 + 5120 = 13015864320.
	"llama-2-13b": 13_015_864_320,
	// togethercomputer/llama-2-70b table and Megatron "TOTAL_PARAMS=68976648192"
	// (HF safetensors total 68976653312 includes 80*64 inv_freq buffers).
	"llama-2-70b": 68_976_648_192,
	// HF safetensors total of meta-llama/Llama-3.1-8B (same shapes as 3-8B):
	// 8030261248; GGUF general.parameter_count 8030261248.
	"llama-3-8b":   8_030_261_248,
	"llama-3.1-8b": 8_030_261_248,
	// HF safetensors total {"total": 70553706496} (meta-llama/Llama-3.1-70B,
	// identical shapes to Meta-Llama-3-70B).
	"llama-3-70b": 70_553_706_496,
	// Llama-3.2-1B totalParameters 1235814400 (tied embeddings), also a
	// transformers test constant LLAMA_3_2_1B_PARAMETER_COUNT.
	"llama-3.2-1b": 1_235_814_400,
	// sum(p.numel()) of TinyLlama-1.1B-intermediate-step-1431k-3T printed as
	// 1100048384; safetensors metadata {"F32": 1100048384}.
	"tinyllama-1.1b": 1_100_048_384,
	// GGUF general.parameter_count of Mistral-7B: 7241732096.
	"mistral-7b": 7_241_732_096,
	// HF safetensors total of Mixtral-8x7B-Instruct-v0.1 (same shapes as the
	// base model): 46702792704; keras-hub mixtral preset 46702792704.
	"mixtral-8x7b": 46_702_792_704,
	// Qwen2ForCausalLM "total parameters: 494032768" (tied embeddings).
	"qwen2.5-0.5b": 494_032_768,
	// HF API "total": 7615616512 for Qwen2.5-7B(-Instruct); GGUF
	// general.parameter_count 7615616512.
	"qwen2.5-7b": 7_615_616_512,
	// keras-hub qwen2.5_instruct_32b_en preset "params": 32763876352; GGUF
	// general.parameter_count of qwen2.5:32b 32763876352.
	"qwen2.5-32b-it": 32_763_876_352,
	// HF safetensors {"total":8190735360,"parameters":{"BF16":8190735360}}
	// for Qwen/Qwen3-8B.
	"qwen3-8b": 8_190_735_360,
	// keras-hub gemma_2b_en preset "params": 2506172416 (tied embeddings).
	"gemma-2b": 2_506_172_416,
	// keras-hub gemma_7b_en preset "params": 8537680896.
	"gemma-7b": 8_537_680_896,
	// HF safetensors total 9241705984 for google/gemma-2-9b; keras-hub
	// gemma2_9b_en preset 9241705984.
	"gemma-2-9b": 9_241_705_984,
	// keras-hub phi3_mini_4k_instruct_en preset "params": 3821079552; HF
	// NumWeights 3821079552 for microsoft/Phi-3-mini-4k-instruct.
	"phi-3-mini": 3_821_079_552,
	// HF safetensors total 1418270720 for microsoft/phi-1_5 (Hub metadata
	// "safetensors_total_params: 1418270720"), also a printed
	// sum(p.numel()) 1418270720 of a phi-1.5 reimplementation. Derived:
	// embed 51200*2048 + 24*(LN 2*2048 + q,k,v,dense 4*(2048*2048+2048)
	// + fc1,fc2 2*2048*8192+8192+2048) + final LN 2*2048 + lm_head
	// 51200*2048+51200 = 104857600 + 24*50354176 + 4096 + 104908800.
	"phi-1.5": 1_418_270_720,
	// microsoft/phi-2 model card: "Phi-2 is a Transformer with 2.7 billion
	// parameters"; HF safetensors parameters {"F16": 2779683840} (Hub API
	// record) and total_parameters 2779683840 in public model registries.
	"phi-2": 2_779_683_840,
	// transformers 5.24.0 FalconForCausalLM(falcon-7b's config.json)
	// .num_parameters() on the meta device: 6921720704, lm_head tied to
	// word_embeddings (counted once). Derived: embed 65024*4544 + 32*(LN
	// 2*4544 + query_key_value 4544*(71+2)*64 + dense 4544*4544 + MLP
	// 2*4544*18176) + ln_f 2*4544. (The Hub's "7.22B" for tiiuae/falcon-7b
	// counts the checkpoint's stored copy of lm_head.weight again:
	// 6921720704 + 65024*4544 = 7217189760.)
	"falcon-7b": 6_921_720_704,
	// keras-hub gemma3_1b preset "params": 999885952; HF safetensors
	// total 999885952 for google/gemma-3-1b-it (same shapes as -pt).
	// Derived: tied embed 262144*1152 + 26*(attn 2949120 + mlp 3*1152*6912
	// + 4 norms 4*1152 + q/k norms 2*256) + final norm 1152.
	"gemma-3-1b": 999_885_952,
	// Qwen/Qwen3-30B-A3B model card: "Number of Parameters: 30.5B in total";
	// GGUF general.parameter_count 30532122624 (qwen3moe, 48 blocks, 128
	// experts of width 768). Derived: embed+lm_head 2*151936*2048 + 48*(attn
	// 18874368 + experts 128*3*2048*768 + router 2048*128 + norms 4352) +
	// final norm 2048.
	"qwen3-30b-a3b": 30_532_122_624,
	// DeepSeek: no exact published totals were found; derived from the
	// module shapes of DeepseekV3ForCausalLM (transformers
	// modeling_deepseek_v3.py @00b676f8; DeepseekV2ForCausalLM has the same
	// modules; the V3 router's e_score_correction_bias is a buffer there)
	// and checked against the published rounded totals in
	// TestDeepSeekPublishedTotals: V2-Lite "15.7B", V2 "236B", V3 "671B".
	// V2-Lite: embed+head 2*102400*2048 + 27*(attn q_proj 2048*16*192 +
	// kv_a 2048*576 + kv_b 512*16*256 + o 16*128*2048 + norms 2*2048+512)
	// + 1 dense MLP 3*2048*10944 + 26*(64 experts 3*2048*1408 + router
	// 64*2048 + 2 shared 3*2048*2816) + final norm 2048.
	"deepseek-v2-lite": 15_706_484_224,
	// V2: q_a 5120*1536, q_a_layernorm 1536, q_b 1536*128*192; 60 layers,
	// 1 dense (12288), 59 MoE (160 experts of 1536, 2 shared).
	"deepseek-v2": 235_741_434_880,
	// V3 main model (the 61 layers transformers loads; 3 dense of 18432, 58
	// MoE of 256 experts of 2048 and 1 shared); MTPParamCount is apart.
	"deepseek-v3": 671_026_404_352,
	// GPTNeoXForCausalLM sizes with embeddings, Pythia size tables:
	// '160m': 162322944, '1.4b': 1414647808.
	"pythia-160m": 162_322_944,
	"pythia-1.4b": 1_414_647_808,
	// BertModel (with pooler): TFBertModel summary 109482240 and "109482240
	// match EXACTLY with Huggingface implementation:
	// BertModel.from_pretrained('bert-base-uncased')"; hiq printout
	// "BertModel<all params:109482240>".
	"bert-base": 109_482_240,
	// BertModel.from_pretrained("bert-large-uncased") 335141888; keras-hub
	// bert_large_en_uncased preset "params": 335141888.
	"bert-large": 335_141_888,
	// ViTForImageClassification (google/vit-base-patch16-224: no pooler,
	// 1000-class head). No published HF total found; derived from the module:
	//   embeddings: cls 768 + pos 197*768 + patch conv 3*16*16*768 + 768 = 742,656
	//   12 layers * (2 LN 4*768 + qkv 3*(768*768+768) + out 768*768+768
	//                + fc1 768*3072+3072 + fc2 3072*768+768) = 12*7,087,872 = 85,054,464
	//   final LN 1,536; classifier 768*1000+1000 = 769,000
	//   total 86,567,656
	// which equals torchvision's ViT_B_16_Weights "num_params": 86567656 (same
	// module structure, 1000 classes). ViTModel with pooler would be 86,389,248.
	"vit-base": 86_567_656,
}

func TestParamCountsMatchRealCheckpoints(t *testing.T) {
	names := Names()
	if len(names) < 24 {
		t.Fatalf("catalog has %d models, want at least 24", len(names))
	}
	for _, n := range names {
		want, ok := realParamCounts[n]
		if !ok {
			t.Errorf("%s: no reference count in realParamCounts", n)
			continue
		}
		a, err := Lookup(n)
		if err != nil {
			t.Errorf("%s: %v", n, err)
			continue
		}
		if got := a.ParamCount(); got != want {
			t.Errorf("%s: ParamCount = %d, want %d (diff %+d)", n, got, want, got-want)
		}
	}
	for n := range realParamCounts {
		if _, err := Lookup(n); err != nil {
			t.Errorf("reference count for %s, which is not in the catalog: %v", n, err)
		}
	}
}

func TestParamBreakdownSumsToParamCount(t *testing.T) {
	for _, n := range Names() {
		a, err := Lookup(n)
		if err != nil {
			t.Fatal(err)
		}
		var sum int64
		seen := map[string]bool{}
		for _, g := range a.ParamBreakdown() {
			if seen[g.Name] {
				t.Errorf("%s: duplicate group %q", n, g.Name)
			}
			seen[g.Name] = true
			if g.Total < 0 || g.PerLayer < 0 {
				t.Errorf("%s: negative group %+v", n, g)
			}
			layers := int64(a.Layers)
			if g.Name == "mlp" {
				layers -= int64(a.DenseLayers) // PerLayer is an expert layer's
			}
			if g.PerLayer != 0 && g.Total < g.PerLayer*layers {
				t.Errorf("%s: group %q total %d < %d layers * %d", n, g.Name, g.Total, a.Layers, g.PerLayer)
			}
			sum += g.Total
		}
		if sum != a.ParamCount() {
			t.Errorf("%s: breakdown sums to %d, ParamCount %d", n, sum, a.ParamCount())
		}
		for _, want := range []string{"embeddings", "attention", "mlp", "norms", "lm_head"} {
			if !seen[want] {
				t.Errorf("%s: breakdown lacks %q", n, want)
			}
		}
	}
}

// Spot checks of individual groups against hand-computed module shapes.
func TestParamBreakdownGroups(t *testing.T) {
	group := func(a *Arch, name string) ParamGroup {
		for _, g := range a.ParamBreakdown() {
			if g.Name == name {
				return g
			}
		}
		t.Fatalf("%s: no group %q", a.Name, name)
		return ParamGroup{}
	}
	cases := []struct {
		model, group    string
		perLayer, total int64
	}{
		// gpt2: wte 50257*768 + wpe 1024*768; tied head.
		{"gpt2", "embeddings", 0, 50257*768 + 1024*768},
		{"gpt2", "lm_head", 0, 0},
		{"gpt2", "attention", 768*2304 + 2304 + 768*768 + 768, 12 * (768*2304 + 2304 + 768*768 + 768)},
		// llama-2-7b: q,k,v,o 4096x4096 no bias; untied head.
		{"llama-2-7b", "attention", 4 * 4096 * 4096, 32 * 4 * 4096 * 4096},
		{"llama-2-7b", "lm_head", 0, 32000 * 4096},
		{"llama-2-7b", "norms", 2 * 4096, 32*2*4096 + 4096},
		// mixtral: 8 experts x 3 x 4096x14336 + router 4096x8.
		{"mixtral-8x7b", "mlp", 8*3*4096*14336 + 4096*8, 32 * (8*3*4096*14336 + 4096*8)},
		// qwen2.5-0.5b: q 896x896+896, k,v 896x128+128, o 896x896 (no bias).
		{"qwen2.5-0.5b", "attention", 896*896 + 896 + 2*(896*128+128) + 896*896, 24 * (896*896 + 896 + 2*(896*128+128) + 896*896)},
		// qwen3-8b: q/k norms over head_dim 128.
		{"qwen3-8b", "norms", 2*4096 + 2*128, 36*(2*4096+2*128) + 4096},
		// gemma-2-9b: 4 RMSNorms per layer.
		{"gemma-2-9b", "norms", 4 * 3584, 42*4*3584 + 3584},
		// bert-base: embeddings LayerNorm counted in norms, pooler separate.
		{"bert-base", "norms", 2 * 2 * 768, 12*2*2*768 + 2*768},
		{"bert-base", "pooler", 0, 768*768 + 768},
		{"bert-base", "embeddings", 0, 30522*768 + 512*768 + 2*768},
		// vit-base: classifier 768x1000+1000.
		{"vit-base", "classifier", 0, 768*1000 + 1000},
		// phi-1.5: one shared input_layernorm per layer; lm_head has a bias.
		{"phi-1.5", "norms", 2 * 2048, 24*2*2048 + 2*2048},
		{"phi-1.5", "lm_head", 0, 51200*2048 + 51200},
		{"phi-1.5", "attention", 4 * (2048*2048 + 2048), 24 * 4 * (2048*2048 + 2048)},
		// deepseek-v2-lite: MLA with a plain q_proj (2048 -> 16*192),
		// kv_a_proj_with_mqa 2048 -> 512+64, kv_b_proj 512 -> 16*(128+128),
		// o_proj 16*128 -> 2048; norms add kv_a_layernorm (512).
		{"deepseek-v2-lite", "attention", 2048*16*192 + 2048*576 + 512*16*256 + 16*128*2048, 27 * (2048*16*192 + 2048*576 + 512*16*256 + 16*128*2048)},
		{"deepseek-v2-lite", "norms", 2*2048 + 512, 27*(2*2048+512) + 2048},
		// deepseek-v3: q_a 7168 -> 1536, q_b 1536 -> 128*192; norms add
		// q_a_layernorm and kv_a_layernorm. mlp: 3 dense layers of 18432,
		// 58 expert layers (256 experts of 2048, router, 1 shared expert).
		{"deepseek-v3", "attention", 7168*1536 + 1536*128*192 + 7168*576 + 512*128*256 + 128*128*7168, 61 * (7168*1536 + 1536*128*192 + 7168*576 + 512*128*256 + 128*128*7168)},
		{"deepseek-v3", "norms", 2*7168 + 1536 + 512, 61*(2*7168+1536+512) + 7168},
		{"deepseek-v3", "mlp", 257*3*7168*2048 + 7168*256, 3*3*7168*18432 + 58*(257*3*7168*2048+7168*256)},
		// phi-3-mini: fused qkv 3072 -> 9216, gate_up 3072 -> 16384.
		{"phi-3-mini", "mlp", 3072*16384 + 8192*3072, 32 * (3072*16384 + 8192*3072)},
	}
	for _, c := range cases {
		a, err := Lookup(c.model)
		if err != nil {
			t.Fatal(err)
		}
		g := group(a, c.group)
		if g.PerLayer != c.perLayer || g.Total != c.total {
			t.Errorf("%s %s: got per-layer %d total %d, want %d %d", c.model, c.group, g.PerLayer, g.Total, c.perLayer, c.total)
		}
	}
}
