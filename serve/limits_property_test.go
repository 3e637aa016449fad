package serve

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"

	"pgregory.net/rapid"

	"github.com/memplan/memplan/hw"
	"github.com/memplan/memplan/models"
	"github.com/memplan/memplan/units"
)

// TestPropertyServingAtTheLimits plans random deployments at the limits: a
// config.json each of whose dimensions the models parser accepts (hidden,
// intermediate and head_dim up to 2^20, heads 2^14, layers 2^12, experts
// 2^12, vocabulary 2^24, positions 2^26; the parser refuses past 10^15
// parameters), every serving flag up to its limit (--max-num-batched-tokens
// and --max-model-len 2^26, --max-num-seqs 2^20, --block-size 2^16, --tp a
// divisor of the heads, --total-memory up to 2^62 bytes), any dtype and
// quantization. Each is refused in one line naming a flag, or every size
// is in [0, 2^62], every count and time non-negative and finite, and max
// --requests and --context answer within the same bounds. Issue 15: a
// config of 16384 heads of head_dim 2^20 at 2^26 batched tokens reported a
// 48 GiB activation peak (the attention phase's 2^62 elements wrapped) and
// a KV block of 0 bytes.
func TestPropertyServingAtTheLimits(t *testing.T) {
	g, err := hw.Lookup("h100")
	if err != nil {
		t.Fatal(err)
	}
	planned, tried := 0, 0
	defer func() { t.Logf("%d of %d planned, the rest refused", planned, tried) }()
	// Ten rounds of rapid's 100 checks (0.3 s): the wrap above needs
	// several dimensions at their edges at once.
	for range 10 {
		rapid.Check(t, func(rt *rapid.T) { checkServing(rt, g, &planned, &tried) })
	}
}

// checkServing plans one drawn deployment and checks its answers.
func checkServing(rt *rapid.T, g *hw.GPU, planned, tried *int) {
	a := drawModel(rt)
	if a == nil {
		return
	}
	s := drawServe(rt, a, g)
	*tried++
	r, err := Plan(s)
	if err != nil {
		oneFieldLine(rt, err)
		return
	}
	*planned++
	checkResult(rt, r)
	if n, rr, err := MaxRequests(s, 0); err != nil {
		oneFieldLine(rt, err)
	} else if n < 0 || rr == nil {
		rt.Fatalf("max --requests: %d", n)
	}
	s.Context, s.Prompt = 0, 0
	if c, err := MaxContext(s, rapid.Int64Range(1, 1<<20).Draw(rt, "requests")); err != nil {
		oneFieldLine(rt, err)
	} else if c.Context < 0 || c.Context > 1<<26 {
		rt.Fatalf("max --context: %d", c.Context)
	}
}

// log2Int draws 1, the limit 2^maxLog, or 2^k plus up to 2^k−1 more for k
// in [0, maxLog] (the edges a third of the time each: products of several
// dimensions reach the limits together only so).
func log2Int(rt *rapid.T, maxLog int, label string) int {
	switch rapid.IntRange(0, 2).Draw(rt, label+" edge") {
	case 0:
		return 1
	case 1:
		return 1 << maxLog
	}
	k := rapid.IntRange(0, maxLog).Draw(rt, label+" log2")
	return 1<<k + rapid.IntRange(0, 1<<k-1).Draw(rt, label+" extra")
}

// log2Edge is log2Int's exponent alone: 0, maxLog or any between.
func log2Edge(rt *rapid.T, maxLog int, label string) int {
	return rapid.SampledFrom([]int{0, maxLog, rapid.IntRange(0, maxLog).Draw(rt, label+" any")}).Draw(rt, label)
}

// drawModel writes a llama or mixtral config.json of random dimensions and
// parses it as memplan does (nil: the parser refused it).
func drawModel(rt *rapid.T) *models.Arch {
	logHeads := log2Edge(rt, 14, "log2 heads")
	cfg := map[string]any{
		"model_type":              "llama",
		"hidden_size":             log2Int(rt, 20, "hidden"),
		"intermediate_size":       1 << log2Edge(rt, 20, "log2 intermediate"),
		"num_hidden_layers":       min(log2Int(rt, 12, "layers"), 1<<12),
		"num_attention_heads":     1 << logHeads,
		"num_key_value_heads":     1 << min(log2Edge(rt, 14, "log2 kv heads"), logHeads),
		"head_dim":                log2Int(rt, 20, "head_dim"),
		"vocab_size":              min(log2Int(rt, 24, "vocab"), 1<<24),
		"max_position_embeddings": 1 << log2Edge(rt, 26, "log2 positions"),
		"rms_norm_eps":            1e-5,
	}
	if rapid.Bool().Draw(rt, "moe") {
		cfg["model_type"] = "mixtral"
		e := 1 << rapid.IntRange(1, 12).Draw(rt, "log2 experts")
		cfg["num_local_experts"], cfg["num_experts_per_tok"] = e, rapid.IntRange(1, e).Draw(rt, "experts per token")
	}
	data, _ := json.Marshal(cfg)
	a, err := models.ParseHFConfig(data, "drawn")
	if err != nil {
		return nil
	}
	return a
}

// drawServe draws every serving flag up to its limit.
func drawServe(rt *rapid.T, a *models.Arch, g *hw.GPU) Spec {
	s := Spec{Model: a, GPU: g}
	var divs []int // powers of two dividing the heads and the intermediate size
	for d := 1; a.Heads%d == 0 && a.Intermediate%d == 0; d *= 2 {
		divs = append(divs, d)
	}
	s.TP = rapid.SampledFrom(divs).Draw(rt, "tp")
	if rapid.Bool().Draw(rt, "total memory") {
		s.TotalMemory = units.Bytes(1) << max(log2Edge(rt, 62, "log2 total memory"), 20)
	}
	s.MaxModelLen = min(log2Int(rt, 26, "max-model-len"), a.MaxPositions)
	s.MaxNumSeqs = min(log2Int(rt, 20, "max-num-seqs"), 1<<20)
	on := rapid.Bool().Draw(rt, "chunked prefill")
	s.ChunkedPrefill = &on
	s.MaxNumBatchedTokens = max(log2Int(rt, 26, "batched"), s.MaxNumSeqs)
	if !on {
		s.MaxNumBatchedTokens = max(s.MaxNumBatchedTokens, s.MaxModelLen)
	}
	s.MaxNumBatchedTokens = min(s.MaxNumBatchedTokens, 1<<26)
	s.BlockSize = 1 << log2Edge(rt, 16, "log2 block")
	s.Context = rapid.IntRange(0, s.MaxModelLen).Draw(rt, "context")
	s.Prompt = rapid.IntRange(0, s.MaxModelLen).Draw(rt, "prompt")
	s.DType = rapid.SampledFrom([]units.DType{units.Invalid, units.BF16, units.F16, units.F32}).Draw(rt, "dtype")
	s.KVDType = rapid.SampledFrom([]units.DType{units.Invalid, units.FP8, units.F32}).Draw(rt, "kv dtype")
	s.Quant = rapid.SampledFrom([]Quant{NoQuant, Int8, FP8, AWQ, GPTQ, NF4}).Draw(rt, "quant")
	s.EnforceEager = rapid.Bool().Draw(rt, "eager")
	return s
}

// oneFieldLine: a refusal names a serving field, on one line.
func oneFieldLine(rt *rapid.T, err error) {
	var fe *FieldError
	if !errors.As(err, &fe) || strings.Contains(err.Error(), "\n") {
		rt.Fatalf("refused without naming a field in one line: %v", err)
	}
}

// checkResult: sizes in [0, 2^62], counts and times non-negative and
// finite.
func checkResult(rt *rapid.T, r *Result) {
	for what, b := range map[string]units.Bytes{"budget": r.Budget, "weights": r.Weights, "activation": r.Activation,
		"non-torch": r.NonTorch, "block": r.BlockBytes, "CUDA graphs": r.CUDAGraphs} {
		if b < 0 || b > units.MaxBytes {
			rt.Fatalf("%s = %d bytes", what, b)
		}
	}
	if r.BlockBytes == 0 || r.Blocks < 0 || r.Tokens < 0 || r.ConcurrencyAtContext < 0 ||
		math.IsNaN(r.MaxConcurrency) || math.IsInf(r.MaxConcurrency, 0) || r.MaxConcurrency < 0 {
		rt.Fatalf("block %d, blocks %d, tokens %d, concurrency %g / %d", r.BlockBytes, r.Blocks, r.Tokens, r.MaxConcurrency, r.ConcurrencyAtContext)
	}
	if tm := r.Timing; tm != nil {
		if tm.TTFT < 0 || tm.DecodeStep < 0 || tm.DecodeBatch < 0 || !(tm.DecodeTokensPerSec >= 0) || math.IsInf(tm.DecodeTokensPerSec, 0) {
			rt.Fatalf("timing %+v", *tm)
		}
	}
}

// The two products the property found wrapping are refused on their flag,
// in one line; durationOK refuses what a time.Duration cannot hold.
func TestProductsRefused(t *testing.T) {
	g, _ := hw.Lookup("h100")
	cfg := func(hidden, layers int) *models.Arch {
		data := fmt.Sprintf(`{"model_type": "llama", "hidden_size": %d, "intermediate_size": 64, "num_hidden_layers": %d,
			"num_attention_heads": 16384, "num_key_value_heads": 16384, "head_dim": 1048576, "vocab_size": 1000,
			"max_position_embeddings": 67108864}`, hidden, layers)
		a, err := models.ParseHFConfig([]byte(data), "wide.json")
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	for _, c := range []struct {
		s    Spec
		want string
	}{
		{Spec{Model: cfg(64, 1), GPU: g, MaxNumBatchedTokens: 1 << 26, MaxModelLen: 1 << 26},
			"{max-num-batched-tokens} 67108864 × 68719476928 elements a token keeps live in a layer of wide.json is over the limit of 2^58 elements"},
		{Spec{Model: cfg(1, 4096), GPU: g, BlockSize: 1 << 16, MaxModelLen: 1024},
			"{block-size} 65536 × 140737488355328 KV-cache elements per token of wide.json is over the limit of 2^58 elements in one block"},
	} {
		_, err := Plan(c.s)
		var fe *FieldError
		if !errors.As(err, &fe) || !strings.Contains(fe.Msg, c.want) || strings.Contains(fe.Msg, "\n") {
			t.Errorf("got %v, want a field error with %q", err, c.want)
		}
	}
	for _, c := range []struct {
		x  float64
		ok bool
	}{{0, true}, {1e9, true}, {maxSeconds, true}, {maxSeconds * 1.01, false}, {math.Inf(1), false}, {math.NaN(), false}, {-1, false}} {
		if durationOK(c.x) != c.ok {
			t.Errorf("durationOK(%g) = %v", c.x, !c.ok)
		}
	}
}
