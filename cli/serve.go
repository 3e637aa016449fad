package cli

import (
	"errors"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strings"

	"github.com/memplan/memplan/serve"
	"github.com/memplan/memplan/units"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// serveFlags are plan --mode serve's flags, named as vLLM's engine
// arguments.
type serveFlags struct {
	dtype, quant, kvDType, totalMemory, release string
	blockSize, maxModelLen, batchedTokens, seqs int
	context, prompt                             int
	util                                        float64
	chunked, eager                              bool
	changed                                     func(string) bool
	// flags is the command's flag set: the flags given are checked
	// against what serve mode reads.
	flags *pflag.FlagSet
	// contextAsked: max solves for --context (given '?').
	contextAsked bool
}

func (f *serveFlags) register(fl *pflag.FlagSet) {
	f.changed, f.flags = fl.Changed, fl
	fl.StringVar(&f.dtype, "dtype", "auto", "serve: weights and activations dtype (auto: the config's torch_dtype; bfloat16, float16, float32)")
	fl.StringVar(&f.quant, "quantization", "none", "serve: weight quantization: "+strings.Join(serve.QuantNames(), ", "))
	fl.StringVar(&f.kvDType, "kv-cache-dtype", "auto", "serve: KV-cache dtype (auto: --dtype; fp8)")
	intVar(fl, &f.blockSize, "block-size", serve.DefaultBlockSize, "serve: tokens per paged KV block")
	fl.Float64Var(&f.util, "gpu-memory-utilization", serve.DefaultUtilization, "serve: fraction of the GPU's memory vLLM may use")
	intVar(fl, &f.maxModelLen, "max-model-len", 0, "serve: longest request in tokens (default the model's positions)")
	intVar(fl, &f.batchedTokens, "max-num-batched-tokens", 0, "serve: tokens of one scheduler step, the profile run's batch (default 512 with chunked prefill, else max(--max-model-len, 2048))")
	intVar(fl, &f.seqs, "max-num-seqs", serve.DefaultMaxNumSeqs, "serve: sequences per scheduler step")
	fl.BoolVar(&f.chunked, "chunked-prefill", false, "serve: chunked prefill (default: on above 32K tokens of --max-model-len, as vLLM)")
	fl.BoolVar(&f.eager, "enforce-eager", false, "serve: no CUDA graphs")
	intVar(fl, &f.context, "context", 0, "serve: tokens per request for the concurrency (default --max-model-len)")
	intVar(fl, &f.prompt, "prompt", 0, "serve: prompt tokens time to first token is priced at (default --context)")
	fl.StringVar(&f.totalMemory, "total-memory", "", "serve: the GPU's total memory as torch.cuda.mem_get_info reports it (default the catalog's)")
	fl.StringVar(&f.release, "vllm-version", string(serve.V064), "serve: the vLLM release whose memory profiler to follow: 0.6 (v0.6.4: the CUDA context counts as non-torch memory) or 0.7 (v0.7 on: only what grows after it, NCCL's buffers)")
}

// serveReads are the flags outside serveFlags that serve mode reads: the
// model, its GPU and tensor-parallel degree, the mode, max's --requests,
// --json, and --no-timeline and --no-chart, which leave out what a serving
// report never has (scripts that pass them to every plan keep working).
// Every other flag given in serve mode is refused by name (unreadByServe):
// training's, the recipe's, the plots' and the reserved prediction's, and
// any flag plan gains later until serve mode reads it.
var serveReads = []string{"model", "gpu", "tp", "mode", "requests", "json", "no-timeline", "no-chart"}

// serveOwn are the flags serveFlags registers, by name.
var serveOwn = registeredNames((&serveFlags{}).register)

// serveReadsFlag reports whether serve mode reads flag name.
func serveReadsFlag(name string) bool { return serveOwn()[name] || slices.Contains(serveReads, name) }

// unreadByServe refuses the first flag given (in name order) that serve
// mode does not read.
func (f *serveFlags) unreadByServe() error {
	if n := firstGiven(f.flags, func(n string) bool { return !serveReadsFlag(n) }); n != "" {
		return fmt.Errorf("--%s does not apply to --mode serve", n)
	}
	return nil
}

// unreadOutsideServe refuses the first serving flag given (in name order)
// to a job of another mode, which would ignore it: a --quantization or
// --block-size, valid or not, changes nothing about training or inference.
func (f *serveFlags) unreadOutsideServe(mode string) error {
	if n := firstGiven(f.flags, func(n string) bool { return serveOwn()[n] }); n != "" {
		return fmt.Errorf("--%s applies to --mode serve, not --mode %s", n, mode)
	}
	return nil
}

// spec reads the serving job.
func (f *serveFlags) spec(p *planFlags) (serve.Spec, error) {
	var s serve.Spec
	if err := f.unreadByServe(); err != nil {
		return s, err
	}
	m, err := resolveModel(p.model)
	if err != nil {
		return s, err
	}
	s.Model, s.TP = m, p.tp
	if p.gpu != "" {
		if s.GPU, err = lookupGPU(p.gpu); err != nil {
			return s, err
		}
	}
	if f.totalMemory != "" {
		if s.TotalMemory, err = units.ParseBytes(f.totalMemory); err != nil {
			return s, fmt.Errorf("--total-memory: %v", err)
		}
		if s.TotalMemory <= 0 {
			return s, fmt.Errorf("--total-memory must be positive, got %q", f.totalMemory)
		}
	}
	if f.dtype != "auto" {
		if s.DType, err = units.ParseDType(f.dtype); err != nil {
			return s, badChoice("--dtype", f.dtype, "auto", "bfloat16", "float16", "float32")
		}
	}
	if f.kvDType != "auto" {
		if s.KVDType, err = units.ParseDType(f.kvDType); err != nil {
			return s, badChoice("--kv-cache-dtype", f.kvDType, "auto", "fp8", "bfloat16", "float16", "float32")
		}
	}
	if s.Quant, err = serve.ParseQuant(f.quant); err != nil {
		return s, serveErr(err)
	}
	if f.changed("gpu-memory-utilization") && !(f.util > 0 && f.util <= 1) {
		return s, fmt.Errorf("--gpu-memory-utilization must be in (0, 1], got %g", f.util)
	}
	s.BlockSize, s.Utilization, s.MaxModelLen = f.blockSize, f.util, f.maxModelLen
	s.MaxNumBatchedTokens, s.MaxNumSeqs, s.Context, s.Prompt = f.batchedTokens, f.seqs, f.context, f.prompt
	s.EnforceEager, s.Release = f.eager, serve.Release(f.release)
	if f.changed("chunked-prefill") {
		on := f.chunked
		s.ChunkedPrefill = &on
	}
	for _, c := range []struct {
		flag string
		v    int
	}{{"block-size", f.blockSize}, {"max-num-seqs", f.seqs}, {"max-model-len", f.maxModelLen}, {"max-num-batched-tokens", f.batchedTokens},
		{"context", f.context}, {"prompt", f.prompt}} {
		if f.changed(c.flag) && c.v <= 0 && !(c.flag == "context" && f.contextAsked) {
			return s, fmt.Errorf("--%s must be positive, got %d", c.flag, c.v)
		}
	}
	return s, nil
}

var fieldRef = regexp.MustCompile(`\{([a-z0-9-]+)\}`)

// serveErr renders a serving field error's {field} names as flags.
func serveErr(err error) error {
	var fe *serve.FieldError
	if errors.As(err, &fe) {
		return errors.New(fieldRef.ReplaceAllString(err.Error(), "--$1"))
	}
	return err
}

// runServe is plan --mode serve.
func (f *serveFlags) run(cmd *cobra.Command, stdout io.Writer, p *planFlags) error {
	s, err := f.spec(p)
	if err != nil {
		return err
	}
	if s.GPU != nil {
		if w := overGPU("--total-memory", s.TotalMemory, s.GPU); w != "" {
			warn(cmd.ErrOrStderr(), []string{w})
		}
	}
	r, err := serve.Plan(s)
	if err != nil {
		return serveErr(err)
	}
	err = emit(stdout, p.jsonOut,
		func(w io.Writer) error { return writeJSON(w, serveJSON(r)) },
		func(w io.Writer) error { return writeServeText(w, r) })
	if err != nil {
		return err
	}
	return fitsVerdict(true, r.Fits)
}

// serveReport is the memplan.serve/v1 JSON.
type serveReport struct {
	Schema               string  `json:"schema"`
	Model                string  `json:"model"`
	GPU                  string  `json:"gpu,omitempty"`
	TP                   int     `json:"tp"`
	DType                string  `json:"dtype"`
	Quantization         string  `json:"quantization"`
	KVCacheDType         string  `json:"kv_cache_dtype"`
	BlockSize            int     `json:"block_size"`
	GPUMemoryUtilization float64 `json:"gpu_memory_utilization"`
	MaxModelLen          int     `json:"max_model_len"`
	MaxNumBatchedTokens  int     `json:"max_num_batched_tokens"`
	MaxNumSeqs           int     `json:"max_num_seqs"`
	ChunkedPrefill       bool    `json:"chunked_prefill"`
	VLLMVersion          string  `json:"vllm_version"`
	TotalMemory          int64   `json:"total_gpu_memory_bytes"`
	Budget               int64   `json:"budget_bytes"`
	Weights              int64   `json:"weights_bytes"`
	Activation           int64   `json:"activation_peak_bytes"`
	ActivationAt         string  `json:"activation_peak_at"`
	NonTorch             int64   `json:"non_torch_bytes"`
	KVAvailable          int64   `json:"kv_cache_bytes"`
	BlockBytes           int64   `json:"block_bytes"`
	Blocks               int64   `json:"gpu_blocks"`
	Tokens               int64   `json:"kv_cache_tokens"`
	MaxConcurrency       float64 `json:"max_concurrency"`
	Context              int     `json:"context"`
	Requests             int64   `json:"requests_at_context"`
	Fits                 bool    `json:"fits"`
	CUDAGraphs           int64   `json:"cuda_graph_bytes"`
	TTFTSeconds          float64 `json:"ttft_seconds,omitempty"`
	Prompt               int     `json:"prompt"`
	DecodeBatch          int64   `json:"decode_batch,omitempty"`
	DecodeTokensPerSec   float64 `json:"decode_tokens_per_sec,omitempty"`
	PerRequestTokensSec  float64 `json:"per_request_tokens_per_sec,omitempty"`
}

func serveJSON(r *serve.Result) serveReport {
	s := r.Spec
	j := serveReport{Schema: "memplan.serve/v1", Model: s.Model.Name, TP: s.TP, DType: s.DType.String(), Quantization: s.Quant.String(),
		KVCacheDType: s.KVDType.String(), BlockSize: s.BlockSize, GPUMemoryUtilization: s.Utilization, MaxModelLen: s.MaxModelLen,
		MaxNumBatchedTokens: s.MaxNumBatchedTokens, MaxNumSeqs: s.MaxNumSeqs, ChunkedPrefill: *s.ChunkedPrefill, VLLMVersion: string(s.Release),
		TotalMemory: int64(s.TotalMemory), Budget: int64(r.Budget), Weights: int64(r.Weights), Activation: int64(r.Activation),
		ActivationAt: r.ActivationAt, NonTorch: int64(r.NonTorch), KVAvailable: int64(max(r.KVAvailable, 0)), BlockBytes: int64(r.BlockBytes),
		Blocks: r.Blocks, Tokens: r.Tokens, MaxConcurrency: r.MaxConcurrency, Context: s.Context, Requests: r.ConcurrencyAtContext,
		Fits: r.Fits, CUDAGraphs: int64(r.CUDAGraphs), Prompt: s.Prompt}
	if s.GPU != nil {
		j.GPU = s.GPU.Name
	}
	if t := r.Timing; t != nil {
		j.TTFTSeconds, j.DecodeBatch, j.DecodeTokensPerSec, j.PerRequestTokensSec = t.TTFT.Seconds(), t.DecodeBatch, t.DecodeTokensPerSec, t.PerRequestTokensPerSec
	}
	return j
}

func writeServeText(w io.Writer, r *serve.Result) error {
	s := r.Spec
	gpu := "total " + s.TotalMemory.String()
	if s.GPU != nil {
		gpu = s.GPU.Name
	}
	var b strings.Builder
	fmt.Fprintf(&b, "memplan · %s · serve (vLLM) · %s × tp %d · %s weights (%s) · KV cache %s, block %d\n\n", s.Model.Name, gpu, s.TP, s.DType, s.Quant, s.KVDType, s.BlockSize)
	fmt.Fprintf(&b, "Per GPU: total_gpu_memory %.2f GiB × gpu_memory_utilization %.2f = %.2f GiB\n", s.TotalMemory.GiBf(), s.Utilization, r.Budget.GiBf())
	fmt.Fprintf(&b, "  weights            %9.2f GiB\n", r.Weights.GiBf())
	fmt.Fprintf(&b, "  activation peak    %9.2f GiB  profile run of %d tokens (%d sequences), at the %s\n", r.Activation.GiBf(), s.MaxNumBatchedTokens, s.MaxNumSeqs, r.ActivationAt)
	fmt.Fprintf(&b, "  non-torch memory   %9.2f GiB  %s\n", r.NonTorch.GiBf(), s.NonTorchWhat())
	fmt.Fprintf(&b, "  KV cache           %9.2f GiB\n\n", max(r.KVAvailable, 0).GiBf())
	fmt.Fprintf(&b, "# GPU blocks: %d (%s each)\n", r.Blocks, r.BlockBytes)
	fmt.Fprintf(&b, "GPU KV cache size: %d tokens\n", r.Tokens)
	fmt.Fprintf(&b, "Maximum concurrency for %d tokens per request: %.2fx\n", s.MaxModelLen, r.MaxConcurrency)
	fmt.Fprintf(&b, "Concurrent requests of %d tokens: %d\n", s.Context, r.ConcurrencyAtContext)
	if !s.EnforceEager {
		fmt.Fprintf(&b, "CUDA graphs: about %s more, captured after the KV cache (outside --gpu-memory-utilization)\n", r.CUDAGraphs)
	}
	if t := r.Timing; t != nil {
		fmt.Fprintf(&b, "\nRoofline (ideal efficiency, %s matmuls): time to first token %.3f s for a %d-token prompt; decode %d sequences at %.0f tokens/s (%.1f tokens/s each)\n",
			t.ComputeDType, t.TTFT.Seconds(), s.Prompt, t.DecodeBatch, t.DecodeTokensPerSec, t.PerRequestTokensPerSec)
	}
	if !r.Fits {
		if r.Blocks == 0 {
			b.WriteString("\nDOES NOT FIT: no memory is left for the KV cache (vLLM: \"No available memory for the cache blocks\")\n")
		} else {
			fmt.Fprintf(&b, "\nDOES NOT FIT: the KV cache holds %d tokens, fewer than --max-model-len %d (vLLM refuses to start)\n", r.Tokens, s.MaxModelLen)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}
