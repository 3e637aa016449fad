package serve

import (
	"encoding/json"
	"errors"
	"math"
	"os"
	"strings"
	"testing"

	"github.com/memplan/memplan/hw"
	"github.com/memplan/memplan/models"
	"github.com/memplan/memplan/units"
)

func mustModel(t *testing.T, name string) *models.Arch {
	t.Helper()
	m, err := models.Resolve(name)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func mustGPU(t *testing.T, name string) *hw.GPU {
	t.Helper()
	g, err := hw.Lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// gib is a figure vLLM logs in GiB with two decimals.
func gib(x float64) units.Bytes { return units.Bytes(x * float64(units.GiB)) }

// TestPublishedStartupLogs checks memplan's KV blocks and maximum
// concurrency against vLLM start-up logs published in vLLM's issue
// tracker, each within 5%. Every spec gives what the log's command and
// version give (model, GPU, tp, dtype, gpu_memory_utilization,
// max_model_len); nothing is fitted to the logged result. Where the log
// prints total_gpu_memory, the case is checked twice: with the catalog
// GPU's total memory (what a user planning the job has) and with the
// logged figure (which isolates the accounting from the GPU's driver).
func TestPublishedStartupLogs(t *testing.T) {
	cases := []struct {
		name, url     string
		model, gpu    string
		tp            int
		maxModelLen   int
		util          float64
		nonTorch      units.Bytes
		release       Release     // the vLLM release's profiler (default V064)
		loggedTotal   units.Bytes // 0: not logged
		blocks        int64
		concurrency   float64 // 0: not logged
		weightsLogged units.Bytes
		weightsDigits int // decimals the log prints weights with (default 4)
	}{
		{
			// vLLM 0.6.4 (worker.py "Memory profiling results"), default
			// 0.9, no chunked prefill at 20000 tokens:
			// "Loading model weights took 14.9888 GB", "# GPU blocks: 1952",
			// "Maximum concurrency for 20000 tokens per request: 1.56x".
			name: "llama-3.1-8b rtx-3090 max_model_len 20000", url: "https://github.com/vllm-project/vllm/issues/10517",
			model: "llama-3.1-8b", gpu: "rtx-3090", tp: 1, maxModelLen: 20000, util: 0.90,
			loggedTotal: gib(23.58), blocks: 1952, concurrency: 1.56, weightsLogged: gib(14.9888),
		},
		{
			// Same thread and machine, max_model_len 29000: "# GPU blocks:
			// 1478", "Maximum concurrency for 29000 tokens per request:
			// 0.82x" (vLLM then refuses to start: 23648 tokens < 29000).
			name: "llama-3.1-8b rtx-3090 max_model_len 29000", url: "https://github.com/vllm-project/vllm/issues/10517",
			model: "llama-3.1-8b", gpu: "rtx-3090", tp: 1, maxModelLen: 29000, util: 0.90,
			loggedTotal: gib(23.58), blocks: 1478, concurrency: 0.82, weightsLogged: gib(14.9888),
		},
		{
			// vLLM PR #2031 (v0.2.x, "Fix peak memory profiling"), which
			// changed worker.py's profile_num_available_blocks from
			// "peak_memory = torch.cuda.max_memory_allocated()" to
			// "free_gpu_memory, total_gpu_memory = torch.cuda.mem_get_info();
			// peak_memory = total_gpu_memory - free_gpu_memory" (its review
			// thread quotes the diff), so the CUDA context counts, as in
			// v0.6.4 (the default). Llama2-7B, TP=1, 1xA100-80GB, default
			// utilization 0.9 and max_model_len 4096: "This PR: # GPU
			// blocks: 7351".
			name: "llama-2-7b a100-80gb (PR 2031)", url: "https://github.com/vllm-project/vllm/pull/2031",
			model: "llama-2-7b", gpu: "a100-80gb", tp: 1, maxModelLen: 4096, util: 0.90,
			blocks: 7351,
		},
		{
			// The same PR's figures for the main branch before it ("Current
			// main: # GPU blocks: 7449"), whose peak was torch's
			// max_memory_allocated alone: no non-torch memory counted
			// (NonTorch < 0).
			name: "llama-2-7b a100-80gb (before PR 2031)", url: "https://github.com/vllm-project/vllm/pull/2031",
			model: "llama-2-7b", gpu: "a100-80gb", tp: 1, maxModelLen: 4096, util: 0.90, nonTorch: -1,
			blocks: 7449,
		},
		{
			// PR #2031, "Llama2-70B with TP=4 and 4xA100-80GB - Current
			// main: # GPU blocks: 31615" (torch's allocated peak alone, as
			// above). The PR's own figure for this case, 20865, is left out:
			// its total − free holds 12.5 GiB per GPU more than memplan's
			// peak at TP=4 (README, serving).
			name: "llama-2-70b 4×a100-80gb tp 4 (before PR 2031)", url: "https://github.com/vllm-project/vllm/pull/2031",
			model: "llama-2-70b", gpu: "a100-80gb", tp: 4, maxModelLen: 4096, util: 0.90, nonTorch: -1,
			blocks: 31615,
		},
		{
			// vLLM PR #10511 (v0.6.5 dev, "overhaul memory profiling"),
			// sanity check on one H100: `vllm serve meta-llama/Meta-Llama-3-8B`
			// (defaults: max_model_len 8192 from the config, utilization
			// 0.9): "total_gpu_memory 79.22GiB", "model weights take
			// 14.96GiB", "available_kv_cache_memory 53.29GiB". The log
			// gives the KV memory, not the blocks: 53.29 GiB over 2 MiB
			// blocks is 27284 blocks (±3 for the two-decimal rounding).
			// The split differs: that build logged non_torch_memory 1.79
			// GiB and an activation peak of 1.26 GiB where memplan has
			// 0.37 and 0.84 GiB (the 1.79 doubles exactly to 3.58 GiB at
			// tp 2 in the same comment, and PR #12126 logs 0.16 GiB a month
			// later on the same GPU); both err the same way, so memplan's
			// KV cache is +3.4% here.
			name: "llama-3-8b h100 (PR 10511)", url: "https://github.com/vllm-project/vllm/pull/10511",
			model: "llama-3-8b", gpu: "h100", tp: 1, maxModelLen: 8192, util: 0.90,
			loggedTotal: gib(79.22), blocks: 27284, weightsLogged: gib(14.96), weightsDigits: 2,
		},
		{
			// vllm-project/vllm#15815 (V0 engine, "Initializing a V0 LLM
			// engine (v0.7.1)", dtype=torch.bfloat16, max_seq_len=10000,
			// tensor_parallel_size=2, chunked_prefill_enabled=False):
			// Qwen2.5-32B-Instruct on two L40S, utilization 0.90.
			// "total_gpu_memory (44.42GiB) x gpu_memory_utilization (0.90) =
			// 39.98GiB", "model weights take 30.71GiB; non_torch_memory
			// takes 0.30GiB; PyTorch activation peak memory takes 1.26GiB;
			// the rest of the memory reserved for KV Cache is 7.71GiB",
			// "# CUDA blocks: 3947" (2 MiB blocks: 4 KV heads per rank × 128
			// × 64 layers). The same formula as v0.6.4 (39.98 − 30.71 −
			// 0.30 − 1.26 = 7.71), with V07's non-torch baseline. memplan's
			// three terms: weights 30.52 GiB, the parameter bytes (the log's
			// 30.71 is 0.19 GiB more, not modelled); profile peak 1.15 GiB
			// (MLP phase at 10000 tokens with the out-of-place all-reduce's
			// copy; logged 1.26); non-torch 0.51 GiB (one NCCL communicator;
			// logged 0.30). Without V07 (the CUDA context counted too) it
			// would be 3.7–3.9% low.
			name: "qwen2.5-32b-it 2×l40s tp 2 (vllm 15815)", url: "https://github.com/vllm-project/vllm/issues/15815",
			model: "qwen2.5-32b-it", gpu: "l40s", tp: 2, maxModelLen: 10000, util: 0.90, release: V07,
			loggedTotal: gib(44.42), blocks: 3947,
		},
		{
			// vllm-project/vllm#12663, the same vLLM (v0.7.1, V0 engine),
			// model and tp as #15815 on two 48 GB GPUs the excerpt does not
			// name (total_gpu_memory 47.50 GiB), max_model_len 12288. The
			// engine line of the same run (11:50, duplicated in #12664):
			// "Initializing a V0 LLM engine (v0.7.1) with config:
			// model='.../Qwen2.5-32B-Instruct', ... dtype=torch.bfloat16,
			// max_seq_len=12288, ... tensor_parallel_size=2, ...
			// enforce_eager=True, ... chunked_prefill_enabled=False". The
			// profile: "total_gpu_memory (47.50GiB) x gpu_memory_utilization
			// (0.90) = 42.75GiB", "model weights take 30.71GiB;
			// non_torch_memory takes 0.29GiB; PyTorch activation peak memory
			// takes 1.54GiB; the rest of the memory reserved for KV Cache is
			// 10.21GiB", "# CUDA blocks: 5225", "Maximum concurrency for
			// 12288 tokens per request: 6.80x". The same three terms as
			// #15815 err the same ways (weights −0.19, peak 1.42 for 1.54,
			// non-torch 0.51 for 0.29 GiB).
			name: "qwen2.5-32b-it 2×48 GB tp 2 (vllm 12663)", url: "https://github.com/vllm-project/vllm/issues/12663",
			model: "qwen2.5-32b-it", tp: 2, maxModelLen: 12288, util: 0.90, release: V07,
			loggedTotal: gib(47.50), blocks: 5225, concurrency: 6.80,
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			totals := []units.Bytes{0}
			if c.loggedTotal > 0 {
				totals = append(totals, c.loggedTotal)
			}
			var gpu *hw.GPU
			if c.gpu == "" {
				// The log does not name its GPU: only its
				// total_gpu_memory is checked.
				totals = totals[1:]
			} else {
				gpu = mustGPU(t, c.gpu)
			}
			for _, total := range totals {
				r, err := Plan(Spec{Model: mustModel(t, c.model), GPU: gpu, TP: c.tp, MaxModelLen: c.maxModelLen,
					Utilization: c.util, NonTorch: c.nonTorch, TotalMemory: total, Release: c.release})
				if err != nil {
					t.Fatal(err)
				}
				t.Logf("total %.2f GiB: memplan %d GPU blocks, log %d (%+.1f%%)", r.Spec.TotalMemory.GiBf(), r.Blocks, c.blocks, 100*(float64(r.Blocks)/float64(c.blocks)-1))
				if e := rel(float64(r.Blocks), float64(c.blocks)); e > 0.05 {
					t.Errorf("total %v: %d GPU blocks, log %d (%s): %.1f%% off", total, r.Blocks, c.blocks, c.url, 100*e)
				}
				if c.concurrency > 0 {
					if e := rel(r.MaxConcurrency, c.concurrency); e > 0.05 {
						t.Errorf("total %v: maximum concurrency %.2fx, log %.2fx (%s): %.1f%% off", total, r.MaxConcurrency, c.concurrency, c.url, 100*e)
					}
				}
				if c.weightsLogged > 0 {
					// vLLM logs weights in GiB with four decimals (two
					// after PR #10511).
					digits := c.weightsDigits
					if digits == 0 {
						digits = 4
					}
					if d := math.Abs(r.Weights.GiBf() - c.weightsLogged.GiBf()); d > math.Pow(10, -float64(digits)) {
						t.Errorf("weights %.4f GiB, log %.4f GiB", r.Weights.GiBf(), c.weightsLogged.GiBf())
					}
				}
			}
		})
	}
}

func rel(got, want float64) float64 { return math.Abs(got-want) / want }

// TestProfileRunPeak checks the profile run's activation peak against the
// peak_torch_memory − weights vLLM 0.6.4 logged in vllm-project/vllm#10517
// (RTX 3090, Llama-3.1-8B): 17.06 − 14.99 GiB at 20000 tokens, 17.98 −
// 14.99 at 29000, 15.05 − 14.99 at 512 (max_model_len 35000 turns chunked
// prefill on), to the logged precision (±0.01 GiB each side).
func TestProfileRunPeak(t *testing.T) {
	m, g := mustModel(t, "llama-3.1-8b"), mustGPU(t, "rtx-3090")
	for _, c := range []struct {
		maxModelLen int
		peak        float64
	}{{20000, 17.06}, {29000, 17.98}, {35000, 15.05}} {
		r, err := Plan(Spec{Model: m, GPU: g, MaxModelLen: c.maxModelLen})
		if err != nil {
			t.Fatal(err)
		}
		got := (r.Weights + r.Activation).GiBf()
		if math.Abs(got-c.peak) > 0.02 {
			t.Errorf("max_model_len %d: peak_torch_memory %.3f GiB, log %.2f GiB", c.maxModelLen, got, c.peak)
		}
	}
}

// TestReleaseNonTorch: vLLM 0.6.4's profiler counts the CUDA context as
// non-torch memory, 0.7's takes its baseline after it; both count NCCL's
// buffers under TP; a given figure is kept.
func TestReleaseNonTorch(t *testing.T) {
	m, g := mustModel(t, "llama-3-8b"), mustGPU(t, "h100")
	for _, c := range []struct {
		rel      Release
		tp       int
		nonTorch units.Bytes
		want     units.Bytes
		what     string
	}{
		{"", 1, 0, CUDAContext, "CUDA context"},
		{V064, 2, 0, CUDAContext + NCCLBuffers, "CUDA context and NCCL buffers"},
		{V07, 1, 0, 0, "none past vLLM 0.7's baseline"},
		{V07, 2, 0, NCCLBuffers, "NCCL buffers"},
		{V07, 2, 1 << 30, 1 << 30, "as given"},
		{V064, 1, -1, 0, "as given"},
	} {
		r, err := Plan(Spec{Model: m, GPU: g, TP: c.tp, MaxModelLen: 8192, Release: c.rel, NonTorch: c.nonTorch})
		if err != nil {
			t.Fatal(err)
		}
		if r.NonTorch != c.want || !strings.HasPrefix(r.Spec.NonTorchWhat(), c.what) {
			t.Errorf("release %q tp %d: non-torch %v (%s), want %v (%s)", c.rel, c.tp, r.NonTorch, r.Spec.NonTorchWhat(), c.want, c.what)
		}
	}
}

// TestTPAllReduceOutOfPlace: under TP one more [N, H] (the all-reduced copy
// of o_proj's and down_proj's output) is live at each phase's peak than the
// rank's share of the unsharded layer would hold.
func TestTPAllReduceOutOfPlace(t *testing.T) {
	m := mustModel(t, "llama-3-8b")
	H, I := int64(m.Hidden), int64(m.Intermediate)
	one := Spec{Model: m, TP: 1}
	two := Spec{Model: m, TP: 2}
	_, mlp1 := layerElems(&one)
	_, mlp2 := layerElems(&two)
	if want := 2*H + 3*I + H; mlp1 != want {
		t.Errorf("tp 1 mlp %d elements per token, want %d", mlp1, want)
	}
	if want := 2*H + 3*I/2 + 2*H; mlp2 != want {
		t.Errorf("tp 2 mlp %d elements per token, want %d", mlp2, want)
	}
}

// TestBlockBytes is CacheEngine.get_cache_block_size by hand: Llama-3-8B
// (32 layers, 8 KV heads of 128) at block 16 in bfloat16 is 2 MiB; fp8
// halves it; tp 2 halves the heads.
func TestBlockBytes(t *testing.T) {
	m := mustModel(t, "llama-3-8b")
	for _, c := range []struct {
		s    Spec
		want units.Bytes
	}{
		{Spec{Model: m, BlockSize: 16, TP: 1, KVDType: units.BF16}, 2 << 20},
		{Spec{Model: m, BlockSize: 16, TP: 1, KVDType: units.FP8}, 1 << 20},
		{Spec{Model: m, BlockSize: 32, TP: 2, KVDType: units.BF16}, 2 << 20},
	} {
		if got := BlockBytes(&c.s); got != c.want {
			t.Errorf("%+v: %d bytes, want %d", c.s.KVDType, got, c.want)
		}
	}
}

// TestQuantizedWeights checks the storage of each scheme on Llama-3-8B's
// body against the per-layer formula of its vLLM linear method, and that
// the schemes order as their bytes per weight do: 16 bits, 8 bits plus a
// float32 per output channel (int8) or per tensor (fp8), 4 bits plus a
// float32 per 64 (nf4), 4 bits plus a float16 scale and a 4-bit zero per
// 128 and GPTQ's int32 g_idx per input.
func TestQuantizedWeights(t *testing.T) {
	m, g := mustModel(t, "llama-3-8b"), mustGPU(t, "h100")
	w := map[Quant]units.Bytes{}
	for _, q := range []Quant{NoQuant, Int8, FP8, AWQ, GPTQ, NF4} {
		r, err := Plan(Spec{Model: m, GPU: g, Quant: q})
		if err != nil {
			t.Fatal(err)
		}
		w[q] = r.Weights
	}
	if !(w[NoQuant] > w[Int8] && w[Int8] > w[FP8] && w[FP8] > w[NF4] && w[NF4] > w[GPTQ] && w[GPTQ] > w[AWQ]) {
		t.Errorf("weights not ordered: %v", w)
	}
	// AWQ on one 4096x4096 linear: 8 MiB of int4, 32 groups × 4096 outputs
	// of float16 scales (256 KiB) and int4 zeros (64 KiB).
	if got := linearBytes(AWQ, 4096, 4096, units.BF16); got != 8<<20+256<<10+64<<10 {
		t.Errorf("AWQ 4096x4096: %d bytes", got)
	}
	// The unquantized embedding and LM head (2 × 128256 × 4096 bf16) stay.
	if w[AWQ] < units.Bytes(2*128256*4096*2) {
		t.Errorf("AWQ weights %v dropped the bf16 embedding and head", w[AWQ])
	}
}

// TestMaxRequestsMonotone: more context per request never admits more
// requests, and the count equals the blocks over the blocks one request
// holds.
func TestMaxRequestsMonotone(t *testing.T) {
	s := Spec{Model: mustModel(t, "llama-3-8b"), GPU: mustGPU(t, "h100"), MaxModelLen: 8192}
	prev := int64(math.MaxInt64)
	for _, ctx := range []int{128, 1000, 2048, 4096, 8192} {
		n, r, err := MaxRequests(s, ctx)
		if err != nil {
			t.Fatal(err)
		}
		if n > prev {
			t.Errorf("context %d admits %d requests, more than a shorter context's %d", ctx, n, prev)
		}
		if want := r.Blocks / int64((ctx+15)/16); n != want {
			t.Errorf("context %d: %d requests, want %d", ctx, n, want)
		}
		prev = n
	}
}

// TestTiming: the roofline is positive, TP shortens time to first token,
// and decode is bandwidth-bound for one 8B request on an H100 (one read of
// the weights per token).
func TestTiming(t *testing.T) {
	m, g := mustModel(t, "llama-3-8b"), mustGPU(t, "h100")
	one, err := Plan(Spec{Model: m, GPU: g, MaxModelLen: 8192, MaxNumSeqs: 1, MaxNumBatchedTokens: 8192})
	if err != nil {
		t.Fatal(err)
	}
	two, err := Plan(Spec{Model: m, GPU: g, MaxModelLen: 8192, TP: 2, MaxNumSeqs: 1, MaxNumBatchedTokens: 8192})
	if err != nil {
		t.Fatal(err)
	}
	if one.Timing == nil || one.Timing.TTFT <= 0 || two.Timing.TTFT >= one.Timing.TTFT {
		t.Fatalf("TTFT tp1 %v, tp2 %v", one.Timing.TTFT, two.Timing.TTFT)
	}
	want := g.MemBandwidth / float64(one.Weights+units.Bytes(8192/16)*one.BlockBytes)
	if got := one.Timing.PerRequestTokensPerSec; math.Abs(got-want)/want > 1e-6 {
		t.Errorf("decode %.1f tokens/s, bandwidth bound %.1f", got, want)
	}
}

// TestBadSpecs: every invalid field is one error naming it, never a panic.
func TestBadSpecs(t *testing.T) {
	m, g := mustModel(t, "llama-3-8b"), mustGPU(t, "h100")
	bert := mustModel(t, "bert-base")
	t4 := mustGPU(t, "t4")
	for _, c := range []struct {
		s     Spec
		field Field
		text  string
	}{
		{Spec{GPU: g}, FieldModel, "no {model}"},
		{Spec{Model: bert, GPU: g}, FieldModel, "encoder"},
		{Spec{Model: m}, FieldGPU, "{gpu}"},
		{Spec{Model: m, GPU: g, TP: 3}, FieldTP, "divide"},
		{Spec{Model: m, GPU: g, TP: -1}, FieldTP, "positive"},
		{Spec{Model: m, GPU: g, DType: units.I8}, FieldDType, "{dtype}"},
		{Spec{Model: m, GPU: t4, DType: units.BF16}, FieldDType, "bfloat16"},
		{Spec{Model: m, GPU: g, KVDType: units.I64}, FieldKVDType, "{kv-cache-dtype}"},
		{Spec{Model: m, GPU: g, BlockSize: -16}, FieldBlockSize, "{block-size}"},
		{Spec{Model: m, GPU: g, Utilization: 1.5}, FieldUtilization, "(0, 1]"},
		{Spec{Model: m, GPU: g, Utilization: math.NaN()}, FieldUtilization, "(0, 1]"},
		{Spec{Model: m, GPU: g, MaxModelLen: 1 << 20}, FieldMaxModelLen, "positions"},
		{Spec{Model: m, GPU: g, MaxModelLen: -1}, FieldMaxModelLen, "{max-model-len}"},
		{Spec{Model: m, GPU: g, MaxNumBatchedTokens: 1024}, FieldBatchedTokens, "smaller than {max-model-len}"},
		{Spec{Model: m, GPU: g, MaxNumBatchedTokens: 8192, MaxNumSeqs: 10000}, FieldBatchedTokens, "{max-num-seqs}"},
		{Spec{Model: m, GPU: g, MaxNumSeqs: -2}, FieldMaxNumSeqs, "{max-num-seqs}"},
		{Spec{Model: m, GPU: g, Context: 9000}, FieldContext, "{context}"},
		{Spec{Model: m, GPU: g, Prompt: -5}, FieldPrompt, "{prompt}"},
		{Spec{Model: m, TotalMemory: -1}, FieldGPU, "{gpu}"},
		{Spec{Model: m, GPU: g, Release: "0.5"}, FieldRelease, `{vllm-version} must be 0.6 (vLLM 0.6.4's profiler) or 0.7 (vLLM 0.7's), got "0.5"`},
	} {
		_, err := Plan(c.s)
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Field != c.field || !strings.Contains(err.Error(), c.text) || !errors.Is(err, ErrSpec) {
			t.Errorf("%+v: got %v, want a %s error with %q", c.s, err, c.field, c.text)
		}
	}
	if _, err := ParseQuant("marlin-3bit"); err == nil || !strings.Contains(err.Error(), `"marlin-3bit"`) {
		t.Errorf("ParseQuant: %v", err)
	}
}

// TestDoesNotFit: a 70B model in bfloat16 on one 80 GB GPU leaves no KV
// cache (vLLM: "No available memory for the cache blocks").
func TestDoesNotFit(t *testing.T) {
	r, err := Plan(Spec{Model: mustModel(t, "llama-3-70b"), GPU: mustGPU(t, "h100")})
	if err != nil {
		t.Fatal(err)
	}
	if r.Fits || r.Blocks != 0 || r.KVAvailable >= 0 {
		t.Errorf("fits %v with %d blocks, %v available", r.Fits, r.Blocks, r.KVAvailable)
	}
	r, err = Plan(Spec{Model: mustModel(t, "llama-3-70b"), GPU: mustGPU(t, "h100"), TP: 2})
	if err != nil {
		t.Fatal(err)
	}
	if !r.Fits || r.Blocks == 0 {
		t.Errorf("tp 2: fits %v with %d blocks", r.Fits, r.Blocks)
	}
}

// quantModel is Llama-3-8B's catalog config with quantization_config qc.
func quantModel(t *testing.T, qc string) *models.Arch {
	t.Helper()
	data, err := os.ReadFile("../models/catalog/llama-3-8b.json")
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	m["quantization_config"] = json.RawMessage(qc)
	if data, err = json.Marshal(m); err != nil {
		t.Fatal(err)
	}
	a, err := models.ParseHFConfig(data, "awq/config.json")
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// TestConfigQuantization: a config's quantization_config sets the weights'
// scheme and group when --quantization is not given, the same plan as
// naming it; a contradicting --quantization is refused naming both.
func TestConfigQuantization(t *testing.T) {
	g := mustGPU(t, "h100")
	awq := quantModel(t, `{"quant_method": "awq", "bits": 4, "group_size": 128}`)
	fromConfig, err := Plan(Spec{Model: awq, GPU: g, MaxModelLen: 8192})
	if err != nil {
		t.Fatal(err)
	}
	named, err := Plan(Spec{Model: mustModel(t, "llama-3-8b"), GPU: g, MaxModelLen: 8192, Quant: AWQ})
	if err != nil {
		t.Fatal(err)
	}
	if fromConfig.Spec.Quant != AWQ || fromConfig.Weights != named.Weights {
		t.Errorf("config awq: %s, %v; --quantization awq: %v", fromConfig.Spec.Quant, fromConfig.Weights, named.Weights)
	}
	g64, err := Plan(Spec{Model: quantModel(t, `{"quant_method": "gptq", "bits": 4, "group_size": 64}`), GPU: g, MaxModelLen: 8192})
	if err != nil {
		t.Fatal(err)
	}
	g128, err := Plan(Spec{Model: mustModel(t, "llama-3-8b"), GPU: g, MaxModelLen: 8192, Quant: GPTQ})
	if err != nil {
		t.Fatal(err)
	}
	if g64.Spec.Quant != GPTQ || g64.Weights <= g128.Weights {
		t.Errorf("gptq group 64: %s %v, not above group 128's %v", g64.Spec.Quant, g64.Weights, g128.Weights)
	}
	bnb8, err := Plan(Spec{Model: quantModel(t, `{"quant_method": "bitsandbytes", "load_in_8bit": true}`), GPU: g, MaxModelLen: 8192})
	if err != nil || bnb8.Spec.Quant != Int8 {
		t.Errorf("bitsandbytes 8-bit: %v %v", err, bnb8)
	}
	_, err = Plan(Spec{Model: awq, GPU: g, MaxModelLen: 8192, Quant: FP8})
	var fe *FieldError
	if !errors.As(err, &fe) || fe.Field != FieldQuant || !strings.Contains(err.Error(), "contradicts") || !strings.Contains(err.Error(), "awq 4-bit") {
		t.Errorf("--quantization fp8 on an awq config: %v", err)
	}
}
