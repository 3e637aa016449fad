package serve

import (
	"math"
	"testing"

	"github.com/memplan/memplan/hw"
	"github.com/memplan/memplan/models"
	"github.com/memplan/memplan/units"
)

// DeepSeek's multi-head latent attention under vLLM: a KV block holds
// kv_lora_rank + qk_rope_head_dim = 576 elements per token and layer (no
// separate value, the same on every TP rank: get_cache_block_size with
// use_mla), and the weights on one GPU are the checkpoint's parameters in
// the serving dtype (plus the rotary cache) at TP 1, an eighth of the
// layers' at TP 8.
func TestMLABlocksAndWeights(t *testing.T) {
	gpu, err := hw.Lookup("h200")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		model string
		tp    int
	}{{"deepseek-v2-lite", 1}, {"deepseek-v2-lite", 2}, {"deepseek-v3", 8}} {
		a, err := models.Lookup(c.model)
		if err != nil {
			t.Fatal(err)
		}
		s := Spec{Model: a, GPU: gpu, TP: c.tp, MaxModelLen: 4096}
		r, err := Plan(s)
		if err != nil {
			t.Fatalf("%s tp %d: %v", c.model, c.tp, err)
		}
		if want := units.Bytes(16 * 576 * a.Layers * 2); r.BlockBytes != want {
			t.Errorf("%s tp %d: block %d bytes, want 16 tokens x 576 x %d layers x 2 bytes = %d", c.model, c.tp, r.BlockBytes, a.Layers, want)
		}
		whole := float64(a.ParamCount()) * 2
		if c.tp == 1 {
			// Exact up to the vocabulary padding and the rotary cache.
			if got := float64(r.Weights); got < whole || got > whole*1.005 {
				t.Errorf("%s: weights %.4g bytes, checkpoint %.4g", c.model, got, whole)
			}
			continue
		}
		// Split: norms, routers and the latent down-projections are
		// replicated, so a rank holds a little more than 1/tp.
		if got := float64(r.Weights); got < whole/float64(c.tp) || got > whole/float64(c.tp)*1.06 {
			t.Errorf("%s tp %d: weights %.4g bytes, 1/%d of the checkpoint is %.4g", c.model, c.tp, got, c.tp, whole/float64(c.tp))
		}
	}
}

// Two published vLLM start-ups of DeepSeek-V2-Lite check the MLA entry of
// 576 bfloat16 elements per token and layer, replicated over TP ranks:
//   - vllm#15871 (v0.8.3, max_model_len 32768): "0.95 GiB KV cache is
//     needed" for one request of 32768 tokens: 32768 x 576 x 27 x 2 B =
//     0.949 GiB.
//   - vllm#20665 (TP 2 x PP 2 on four L4s): the first pipeline stage (14
//     of the 27 layers) logs "Available KV cache memory: 12.13 GiB" and
//     the engine "GPU KV cache size: 807,792 tokens": 12.13 GiB / (14 x
//     576 x 2 B) = 807,560 tokens, inside the rounding of the two-decimal
//     GiB figure (±0.04%).
func TestMLAPublishedKVSizes(t *testing.T) {
	a, err := models.Lookup("deepseek-v2-lite")
	if err != nil {
		t.Fatal(err)
	}
	perToken := func(a *models.Arch, tp int) float64 {
		s := Spec{Model: a, TP: tp, BlockSize: 16, KVDType: units.BF16}
		return float64(BlockBytes(&s)) / 16
	}
	if got := 32768 * perToken(a, 1) / (1 << 30); math.Round(got*100) != 95 {
		t.Errorf("vllm#15871: one 32768-token request needs %.4f GiB, logged 0.95", got)
	}
	stage := a.Clone()
	stage.Layers = 14
	tokens := 12.13 * (1 << 30) / perToken(stage, 2)
	if e := math.Abs(tokens/807792 - 1); e > 0.0005 {
		t.Errorf("vllm#20665: %.0f tokens in 12.13 GiB over 14 layers, logged 807,792 (%.3f%% off)", tokens, 100*e)
	}
}
