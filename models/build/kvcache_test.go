package build

import (
	"fmt"
	"github.com/memplan/memplan/models"
	"reflect"
	"testing"

	"github.com/memplan/memplan/ir"
	"github.com/memplan/memplan/ops"
)

// Inference caches Falcon's one key and value head (multi-query) for the
// prompt and the generated tokens, as every family's attention does:
// falcon-7b had no cache at all, so --gen-tokens changed nothing (physical
// sweep, round 24). 2 × 32 layers × 1 head × 64 × 2 bytes = 8 KiB a token.
func TestFalconInferenceCache(t *testing.T) {
	a := lookup(t, "falcon-7b")
	for _, at := range []Attention{SDPA, Eager} {
		g, bytes := cacheBytes(t, a, Options{MicroBatch: 2, Seq: 16, KVContext: 48, Precision: ops.BF16, Attention: at})
		if want := int64(2 * 32 * 1 * 64 * 2 * 2 * 48); bytes != want {
			t.Errorf("attention %v: %d bytes of KV cache, want %d", at, bytes, want)
		}
		if got, want := tensorShape(t, g, "transformer.h.3.self_attention.k_cache"), []int64{2, 1, 48, 64}; !reflect.DeepEqual(got, want) {
			t.Errorf("attention %v: k_cache %v, want %v", at, got, want)
		}
	}
}

// A sliding-window layer caches at most its window in inference (a static
// cache's min(sliding_window, max_cache_len), transformers' cache_utils.py
// @v5.24.0), a full-attention layer the whole context: Gemma 2 alternates
// them from a sliding layer 0, Gemma 3 attends in full on each n-th layer.
// Every layer had cached the whole context (physical sweep, round 24:
// gemma-2-9b at 8,192 tokens 33% over). A prompt longer than the window
// stays whole through prefill (DynamicSlidingWindowLayer keeps a view of
// the prompt-long cat it returns: sweep E, round 25, measured on CPU).
func TestSlidingWindowInferenceCache(t *testing.T) {
	for _, c := range []struct {
		model  string
		prompt int
		layers []int   // layers checked
		want   []int64 // their cached tokens
	}{
		{"gemma-2-9b", 16, []int{0, 1, 2, 3}, []int64{4096, 8192, 4096, 8192}},
		{"gemma-3-1b", 16, []int{0, 4, 5, 11}, []int64{512, 512, 8192, 8192}},
		{"llama-3.2-1b", 16, []int{0, 1}, []int64{8192, 8192}},
		{"gemma-3-1b", 2048, []int{0, 5}, []int64{2048, 8192}},
		{"gemma-2-9b", 8192, []int{0, 1}, []int64{8192, 8192}},
		{"gemma-2-9b", 6000, []int{0, 1}, []int64{6000, 8192}},
	} {
		a := lookup(t, c.model)
		g, err := Graph(a, Options{MicroBatch: 1, Seq: c.prompt, KVContext: 8192, Precision: ops.BF16})
		if err != nil {
			t.Fatal(err)
		}
		for i, l := range c.layers {
			shape := tensorShape(t, g, fmt.Sprintf("model.layers.%d.self_attn.k_cache", l))
			if got := shape[2]; got != c.want[i] {
				t.Errorf("%s, prompt %d: layer %d caches %d tokens, want %d", c.model, c.prompt, l, got, c.want[i])
			}
		}
	}
}

// Under amp transformers' rotary product promotes bfloat16 keys to the
// float32 tables' dtype (mul and add follow type promotion), so its cache
// keeps float32 keys beside bfloat16 values; pure bf16 and lit-gpt's
// apply_rope (roped.to(x.dtype)) keep bfloat16 keys. Sweep E, round 25:
// transformers 5.24.0 on CPU cached 393,216 B for a 4-layer llama config at
// 2 × 128 tokens of 64 key elements a layer (4·256·64·(4+2)), 1.5× the
// 262,144 B of bfloat16 keys memplan gave.
func TestRotaryKeysCachedInTheirPromotedDType(t *testing.T) {
	a := lookup(t, "llama-3-8b")
	const b, tokens = 2, 48
	perToken := int64(a.Layers * a.KVHeads * a.HeadDim) // elements of K (or V) per token
	for _, c := range []struct {
		name string
		o    Options
		k, v int64 // bytes per element
	}{
		{"hf amp-bf16", Options{Precision: ops.AMPBF16}, 4, 2},
		{"hf pure-bf16", Options{Precision: ops.BF16}, 2, 2},
		{"litgpt amp-bf16", Options{Precision: ops.AMPBF16, Code: CodeLitGPT}, 2, 2},
	} {
		o := c.o
		o.MicroBatch, o.Seq, o.KVContext, o.Attention = b, 16, tokens, SDPA
		_, bytes := cacheBytes(t, a, o)
		if want := perToken * b * tokens * (c.k + c.v); bytes != want {
			t.Errorf("%s: %d bytes of KV cache, want %d (%d-byte keys, %d-byte values)", c.name, bytes, want, c.k, c.v)
		}
	}
}

// DeepSeek-V2's apply_rotary_emb multiplies in complex float32 and casts
// back (type_as), so under amp its cached rotary key stays bfloat16 where
// DeepSeek-V3's apply_rotary_pos_emb promotes it to float32; the latent,
// kv_a_layernorm's output (a float32 weight times bfloat16), is float32 in
// both. Measured on CPU under bfloat16 autocast, a 2-layer config at 2 × 32
// tokens (kv_lora_rank 32, qk_rope_head_dim 8): transformers 5.24.0 cached
// 18,432 B for deepseek_v2 (memplan gave 20,480 before) and 20,480 B for
// deepseek_v3; 4.57.1's expanded cache 40,960 B for deepseek_v2.
func TestDeepSeekV2RotaryKeyKeepsItsDType(t *testing.T) {
	const b, tokens = 2, 48
	for _, c := range []struct {
		model string
		rot   int64 // bytes per rotary-key element
	}{{"deepseek-v2-lite", 2}, {"deepseek-v3", 4}} {
		a := lookup(t, c.model)
		o := Options{MicroBatch: b, Seq: 16, KVContext: tokens, Precision: ops.AMPBF16, Attention: SDPA, MLALatentCache: true}
		_, bytes := cacheBytes(t, a, o)
		if want := int64(a.Layers*b*tokens) * (int64(a.KVLoRARank)*4 + int64(a.QKRopeDim)*c.rot); bytes != want {
			t.Errorf("%s amp-bf16: %d bytes of latent cache, want %d (float32 latent, %d-byte rotary key)", c.model, bytes, want, c.rot)
		}
	}
}

// cacheBytes builds a's graph with o and sums its KV-cache buffers.
func cacheBytes(t *testing.T, a *models.Arch, o Options) (*ir.Graph, int64) {
	t.Helper()
	g, err := Graph(a, o)
	if err != nil {
		t.Fatal(err)
	}
	var bytes int64
	for _, id := range g.Buffers {
		if x := g.Tensors[id]; x.Cat == ir.KVCache {
			bytes += int64(x.Bytes)
		}
	}
	return g, bytes
}

// transformers 5.x caches multi-head latent attention's compressed latent
// and its one rotary key, kv_lora_rank + qk_rope_head_dim a token a layer
// (DeepseekV2/V3Attention.forward @v5.24.0: cache.update(kv_nope, k_rot)),
// 4.x every head's expanded keys and values: 8.9× more for DeepSeek-V2-Lite
// (sweep E, round 25, measured on CPU: 122,880 B for a tiny deepseek_v2
// config where the expanded cache gave 983,040).
func TestMLALatentCache(t *testing.T) {
	a := lookup(t, "deepseek-v2-lite")
	const b, tokens = 2, 48
	o := Options{MicroBatch: b, Seq: 16, KVContext: tokens, Precision: ops.BF16, Attention: SDPA}
	_, expanded := cacheBytes(t, a, o)
	o.MLALatentCache = true
	g, latent := cacheBytes(t, a, o)
	if want := int64(a.Layers*b*tokens*(a.KVLoRARank+a.QKRopeDim)) * 2; latent != want {
		t.Errorf("latent cache %d bytes, want %d", latent, want)
	}
	if want := int64(a.Layers*b*tokens*a.Heads*(a.HeadDim+a.VHeadDim)) * 2; expanded != want {
		t.Errorf("expanded cache %d bytes, want %d", expanded, want)
	}
	if got, want := tensorShape(t, g, "model.layers.0.self_attn.kv_nope_cache"), []int64{b, 1, tokens, int64(a.KVLoRARank)}; !reflect.DeepEqual(got, want) {
		t.Errorf("kv_nope_cache %v, want %v", got, want)
	}
}
