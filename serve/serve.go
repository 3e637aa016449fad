// Package serve plans a model served the way vLLM serves it: weights in the
// serving dtype (or quantized), a profile run that measures the peak of one
// forward over --max-num-batched-tokens flattened tokens, paged KV blocks in
// the memory gpu_memory_utilization leaves, and the numbers vLLM logs at
// start-up (# GPU blocks, GPU KV cache size, maximum concurrency), with time
// to first token and decode throughput at the roofline.
//
// The accounting follows vLLM's worker, which sizes the KV cache as
//
//	available = total_gpu_memory × gpu_memory_utilization − peak − non_torch
//	num_gpu_blocks = available // cache_block_size
//
// where peak is torch's allocated peak during the profile run (the weights
// plus the forward's activations) and non_torch what lives outside the
// caching allocator (CUDA context, NCCL buffers): vllm/worker/worker.py
// determine_num_available_blocks @v0.6.4 (PR #9352, "Use
// torch.cuda.memory_stats() to profile peak memory usage") and the same
// formula in vllm/v1/worker/gpu_worker.py determine_available_memory
// @0012cf691b7e69423244d2b1405f4b6832156e19. The cache block is
// CacheEngine.get_cache_block_size (vllm/worker/cache_engine.py): per layer a
// key and a value block of block_size × num_kv_heads/tp × head_size elements
// of the KV-cache dtype. Maximum concurrency is num_gpu_blocks × block_size /
// max_model_len (vllm/executor/executor_base.py initialize_cache @v0.6.4,
// v1/core/kv_cache_utils.py @PR #13596).
//
// What counts as non-torch memory changed with vLLM 0.7, whose worker takes
// its baseline after the CUDA context: Spec.Release picks the profiler (V064
// by default, V07). Under TP the row-parallel layers' all-reduce is out of
// place, so the profile peak holds one more [N, hidden] (layerElems).
//
// CUDA graphs are captured after the KV cache is allocated
// (worker.py _warm_up_model → capture_model), so their memory is outside
// the budget gpu_memory_utilization sets; Result.CUDAGraphs estimates it.
package serve

import (
	"errors"
	"fmt"
	"math"

	"github.com/memplan/memplan/hw"
	"github.com/memplan/memplan/models"
	"github.com/memplan/memplan/units"
)

// Defaults of vLLM's engine arguments (vllm/engine/arg_utils.py and
// vllm/config.py @v0.6.4).
const (
	DefaultBlockSize   = 16   // CacheConfig block_size on CUDA
	DefaultUtilization = 0.90 // gpu_memory_utilization
	DefaultMaxNumSeqs  = 256  // SchedulerConfig max_num_seqs
	// DefaultChunkedTokens is max_num_batched_tokens under chunked prefill
	// when none is given (SchedulerConfig: 512 for the V0 engine).
	DefaultChunkedTokens = 512
	// chunkedPrefillAbove: EngineArgs enables chunked prefill by default
	// when max_model_len exceeds 32K tokens (arg_utils.py
	// create_engine_config, use_context_length > 32K).
	chunkedPrefillAbove = 32 * 1024
	// minBatchedTokens: without chunked prefill max_num_batched_tokens is
	// max(max_model_len, 2048) (SchedulerConfig _DEFAULT_MAX_NUM_BATCHED_TOKENS).
	minBatchedTokens = 2048
	// vocabPadding: VocabParallelEmbedding pads the vocabulary to a
	// multiple of 64 before splitting it over TP ranks
	// (vllm/model_executor/layers/vocab_parallel_embedding.py
	// DEFAULT_VOCAB_PADDING_SIZE).
	vocabPadding = 64
	// maxGraphBatch: V0 captures decode CUDA graphs for batch sizes 1, 2, 4
	// and 8·i up to 256, capped at max_num_seqs (worker/model_runner.py
	// _BATCH_SIZES_TO_CAPTURE).
	maxGraphBatch = 256
)

// Release is the vLLM release whose memory profiler a plan follows. The
// two differ in what they subtract as non-torch memory (validateRelease).
type Release string

const (
	// V064: vLLM 0.6.4's worker (PR #9352) subtracts every byte outside
	// torch's allocator on the device after the profile run, the CUDA
	// context included (vllm#10517's 0.6.4 logs: non_torch_memory 0.35 GiB
	// on one RTX 3090). The default.
	V064 Release = "0.6"
	// V07: vLLM 0.7's worker takes its baseline snapshot once CUDA is
	// initialised and before the distributed environment exists
	// (vllm/worker/worker.py init_device @v0.7.1: torch.cuda.set_device,
	// empty_cache, reset_peak_memory_stats, then self.baseline_snapshot =
	// MemorySnapshot(), then init_worker_distributed_environment) and
	// subtracts only the non-torch memory grown past it: NCCL's buffers
	// under TP, not the CUDA context.
	V07 Release = "0.7"
)

// Non-torch memory (outside the caching allocator), the same cited
// figures the training recipes use (recipe/recipes/hf.yaml cuda.overhead,
// nccl.overhead): the CUDA context with lazy module loading, and the
// buffers of one NCCL communicator (the TP group).
const (
	CUDAContext units.Bytes = 400_000_000
	NCCLBuffers units.Bytes = 544_000_000
)

// ErrSpec wraps every invalid serving spec.
var ErrSpec = errors.New("invalid serving spec")

// Field names a serving input; errors name it in braces ("{tp}") so the CLI
// can render flags and a library caller its own names.
type Field string

const (
	FieldModel          Field = "model"
	FieldGPU            Field = "gpu"
	FieldTP             Field = "tp"
	FieldDType          Field = "dtype"
	FieldQuant          Field = "quantization"
	FieldKVDType        Field = "kv-cache-dtype"
	FieldBlockSize      Field = "block-size"
	FieldUtilization    Field = "gpu-memory-utilization"
	FieldMaxModelLen    Field = "max-model-len"
	FieldBatchedTokens  Field = "max-num-batched-tokens"
	FieldMaxNumSeqs     Field = "max-num-seqs"
	FieldContext        Field = "context"
	FieldNonTorch       Field = "non-torch-memory"
	FieldPrompt         Field = "prompt"
	FieldTotalMemory    Field = "total-memory"
	FieldChunkedPrefill Field = "chunked-prefill"
	FieldRequests       Field = "requests"
	FieldRelease        Field = "vllm-version"
)

// FieldError is an invalid value of one field; Msg names fields as
// "{field}".
type FieldError struct {
	Field Field
	Msg   string
}

func (e *FieldError) Error() string { return e.Msg }
func (e *FieldError) Unwrap() error { return ErrSpec }

func bad(f Field, format string, args ...any) error {
	return &FieldError{Field: f, Msg: fmt.Sprintf(format, args...)}
}

// Spec is one vLLM deployment of a model on TP GPUs of one kind.
type Spec struct {
	Model *models.Arch
	GPU   *hw.GPU
	// TotalMemory overrides the GPU's total memory (what
	// torch.cuda.mem_get_info reports; vLLM logs it as total_gpu_memory).
	TotalMemory units.Bytes
	// TP is the tensor-parallel degree (default 1).
	TP int
	// DType is the serving dtype of activations and unquantized weights
	// (default: the config's torch_dtype, float32 served as bfloat16, or
	// float16 on GPUs without bfloat16, as vLLM's _get_and_verify_dtype).
	DType units.DType
	// Quant is the weight quantization (default none).
	Quant Quant
	// KVDType is the KV-cache dtype (default DType; FP8 for
	// --kv-cache-dtype fp8).
	KVDType units.DType
	// BlockSize is tokens per KV block (default 16).
	BlockSize int
	// Utilization is gpu_memory_utilization (default 0.9).
	Utilization float64
	// MaxModelLen is the longest request (default the model's positions).
	MaxModelLen int
	// ChunkedPrefill: nil takes vLLM's default (on above 32K tokens).
	ChunkedPrefill *bool
	// MaxNumBatchedTokens is the profile run's token count (default 512
	// under chunked prefill, else max(MaxModelLen, 2048)).
	MaxNumBatchedTokens int
	// MaxNumSeqs is the scheduler's sequence limit (default 256): the
	// profile run's sequences, whose last tokens get logits.
	MaxNumSeqs int
	// Context is the tokens per request the concurrency is asked at
	// (default MaxModelLen).
	Context int
	// Prompt is the prompt length time to first token is priced at
	// (default Context).
	Prompt int
	// NonTorch is device memory outside the caching allocator that the
	// profile counts: zero takes the Release's (V064: CUDAContext, plus
	// NCCLBuffers when TP > 1; V07: NCCLBuffers when TP > 1); negative
	// counts none (vLLM before PR #9352 took its baseline after the CUDA
	// context was created).
	NonTorch units.Bytes
	// Release is the vLLM release whose profiler is followed (default
	// V064).
	Release Release
	// nonTorchWhat says what NonTorch holds (set by Validate).
	nonTorchWhat string
	// EnforceEager skips CUDA-graph capture (no graph memory).
	EnforceEager bool
	// GroupSize is AWQ's and GPTQ's group (default the config's
	// quantization_config, else 128).
	GroupSize int
}

// Validate fills the defaults and checks every field.
func (s *Spec) Validate() error {
	if s.Model == nil {
		return bad(FieldModel, "no {model}")
	}
	a := s.Model
	if a.Encoder || a.Vocab == 0 {
		return bad(FieldModel, "%s is an encoder; serving plans decoder models with a KV cache", a.Name)
	}
	if s.GPU == nil && s.TotalMemory <= 0 {
		return bad(FieldGPU, "serving needs a {gpu} (or a {total-memory})")
	}
	if s.TotalMemory < 0 {
		return bad(FieldTotalMemory, "{total-memory} must be positive")
	}
	if s.TotalMemory == 0 {
		s.TotalMemory = s.GPU.TotalMemory
	}
	if err := s.validateParallel(); err != nil {
		return err
	}
	if err := s.validateQuant(); err != nil {
		return err
	}
	if err := s.validateDTypes(); err != nil {
		return err
	}
	if err := s.validateSizes(); err != nil {
		return err
	}
	return s.validateProducts()
}

// configQuant maps a config.json's quantization_config onto the scheme
// vLLM loads it as (vLLM reads quant_method from the config, and
// bitsandbytes' 8-bit as int8 weights with a float32 scale per row).
func configQuant(q *models.Quantization) Quant {
	switch {
	case q.Method == "awq":
		return AWQ
	case q.Method == "gptq":
		return GPTQ
	case q.Method == "fp8":
		return FP8
	case q.Method == "bitsandbytes" && q.Bits == 8:
		return Int8
	}
	return NF4
}

// validateQuant takes the weight quantization from the model's
// quantization_config when the spec names none, and refuses a
// --quantization that contradicts it (vLLM's ModelConfig._verify_quantization
// raises the same).
func (s *Spec) validateQuant() error {
	cq := s.Model.Quant
	if s.GroupSize < 0 {
		return bad(FieldQuant, "the quantization group size must be positive, got %d", s.GroupSize)
	}
	if cq == nil {
		return nil
	}
	want := configQuant(cq)
	if s.Quant != NoQuant && s.Quant != want {
		return bad(FieldQuant, "{quantization} %s contradicts %s's quantization_config (%s)", s.Quant, s.Model.Name, cq)
	}
	s.Quant = want
	if s.GroupSize == 0 {
		s.GroupSize = cq.GroupSize
	}
	return nil
}

func (s *Spec) validateParallel() error {
	a := s.Model
	if s.TP == 0 {
		s.TP = 1
	}
	if s.TP < 0 {
		return bad(FieldTP, "{tp} must be positive, got %d", s.TP)
	}
	if a.Heads%s.TP != 0 {
		return bad(FieldTP, "{tp} %d must divide %s's %d attention heads", s.TP, a.Name, a.Heads)
	}
	// vLLM replicates KV heads when tp exceeds them (QKVParallelLinear:
	// num_kv_head_replicas = tp / total_num_kv_heads), so tp must divide or
	// be a multiple of the KV heads.
	if a.KVHeads%s.TP != 0 && s.TP%a.KVHeads != 0 {
		return bad(FieldTP, "{tp} %d neither divides nor is a multiple of %s's %d KV heads", s.TP, a.Name, a.KVHeads)
	}
	if a.Intermediate%s.TP != 0 {
		return bad(FieldTP, "{tp} %d must divide %s's intermediate size %d", s.TP, a.Name, a.Intermediate)
	}
	return nil
}

func (s *Spec) validateDTypes() error {
	if s.DType == units.Invalid {
		s.DType = units.BF16
		if d, err := units.ParseDType(s.Model.TorchDType); err == nil && d == units.F16 {
			s.DType = units.F16
		}
		if s.GPU != nil && s.GPU.BF16 <= 0 {
			s.DType = units.F16
		}
	}
	switch s.DType {
	case units.BF16, units.F16, units.F32:
	default:
		return bad(FieldDType, "{dtype} must be bfloat16, float16 or float32, got %s", s.DType)
	}
	if s.GPU != nil && s.DType == units.BF16 && s.GPU.BF16 <= 0 {
		return bad(FieldDType, "the %s has no bfloat16 arithmetic; serve it with {dtype} float16", s.GPU.Name)
	}
	if s.KVDType == units.Invalid {
		s.KVDType = s.DType
	}
	switch s.KVDType {
	case units.BF16, units.F16, units.F32, units.FP8:
	default:
		return bad(FieldKVDType, "{kv-cache-dtype} must be auto, fp8, bfloat16, float16 or float32, got %s", s.KVDType)
	}
	if s.Quant == FP8 && s.GPU != nil && s.GPU.FP8 <= 0 {
		// vLLM runs FP8 weights on GPUs without FP8 arithmetic through the
		// weight-only Marlin kernel (fp8_marlin), same storage.
		return nil
	}
	return nil
}

func (s *Spec) validateSizes() error {
	a := s.Model
	if s.BlockSize == 0 {
		s.BlockSize = DefaultBlockSize
	}
	if s.BlockSize < 0 || s.BlockSize > 1<<16 {
		return bad(FieldBlockSize, "{block-size} must be in [1, 65536], got %d", s.BlockSize)
	}
	if s.Utilization == 0 {
		s.Utilization = DefaultUtilization
	}
	if !(s.Utilization > 0 && s.Utilization <= 1) {
		return bad(FieldUtilization, "{gpu-memory-utilization} must be in (0, 1], got %g", s.Utilization)
	}
	if s.MaxModelLen == 0 {
		s.MaxModelLen = a.MaxPositions
	}
	if s.MaxModelLen <= 0 || s.MaxModelLen > 1<<26 {
		return bad(FieldMaxModelLen, "{max-model-len} must be in [1, 2^26], got %d", s.MaxModelLen)
	}
	if a.MaxPositions > 0 && s.MaxModelLen > a.MaxPositions {
		return bad(FieldMaxModelLen, "{max-model-len} %d exceeds %s's %d positions (max_position_embeddings)", s.MaxModelLen, a.Name, a.MaxPositions)
	}
	if s.MaxNumSeqs == 0 {
		s.MaxNumSeqs = DefaultMaxNumSeqs
	}
	if s.MaxNumSeqs < 0 || s.MaxNumSeqs > 1<<20 {
		return bad(FieldMaxNumSeqs, "{max-num-seqs} must be in [1, 2^20], got %d", s.MaxNumSeqs)
	}
	if s.ChunkedPrefill == nil {
		on := s.MaxModelLen > chunkedPrefillAbove
		s.ChunkedPrefill = &on
	}
	if s.MaxNumBatchedTokens == 0 {
		s.MaxNumBatchedTokens = max(s.MaxModelLen, minBatchedTokens)
		if *s.ChunkedPrefill {
			s.MaxNumBatchedTokens = DefaultChunkedTokens
		}
	}
	if s.MaxNumBatchedTokens < 0 || s.MaxNumBatchedTokens > 1<<26 {
		return bad(FieldBatchedTokens, "{max-num-batched-tokens} must be in [1, 2^26], got %d", s.MaxNumBatchedTokens)
	}
	if !*s.ChunkedPrefill && s.MaxNumBatchedTokens < s.MaxModelLen {
		// SchedulerConfig._verify_args.
		return bad(FieldBatchedTokens, "{max-num-batched-tokens} %d is smaller than {max-model-len} %d; without {chunked-prefill} a prompt must fit one batch", s.MaxNumBatchedTokens, s.MaxModelLen)
	}
	if s.MaxNumBatchedTokens < s.MaxNumSeqs {
		return bad(FieldBatchedTokens, "{max-num-batched-tokens} %d is smaller than {max-num-seqs} %d", s.MaxNumBatchedTokens, s.MaxNumSeqs)
	}
	if s.Context == 0 {
		s.Context = s.MaxModelLen
	}
	if s.Context < 0 || s.Context > s.MaxModelLen {
		return bad(FieldContext, "{context} must be in [1, {max-model-len} %d], got %d", s.MaxModelLen, s.Context)
	}
	if s.Prompt == 0 {
		s.Prompt = s.Context
	}
	if s.Prompt < 0 || s.Prompt > s.MaxModelLen {
		return bad(FieldPrompt, "{prompt} must be in [1, {max-model-len} %d], got %d", s.MaxModelLen, s.Prompt)
	}
	return s.validateRelease()
}

// validateRelease checks the vLLM release and fills the non-torch memory
// its profiler subtracts.
func (s *Spec) validateRelease() error {
	switch s.Release {
	case "":
		s.Release = V064
	case V064, V07:
	default:
		return bad(FieldRelease, "{vllm-version} must be %s (vLLM 0.6.4's profiler) or %s (vLLM 0.7's), got %q", V064, V07, string(s.Release))
	}
	if s.NonTorch != 0 {
		s.nonTorchWhat = "as given"
		s.NonTorch = max(s.NonTorch, 0)
		return nil
	}
	s.nonTorchWhat = "CUDA context"
	if s.Release == V064 {
		s.NonTorch = CUDAContext
	} else {
		s.nonTorchWhat = "none past vLLM 0.7's baseline, which follows the CUDA context"
	}
	if s.TP > 1 {
		s.NonTorch += NCCLBuffers
		s.nonTorchWhat = map[Release]string{V064: "CUDA context and NCCL buffers", V07: "NCCL buffers (vLLM 0.7's baseline follows the CUDA context)"}[s.Release]
	}
	return nil
}

// NonTorchWhat says what the non-torch memory of a validated spec holds.
func (s *Spec) NonTorchWhat() string { return s.nonTorchWhat }

// Result is what vLLM would log at start-up, per GPU of the TP group, and
// the roofline timing.
type Result struct {
	Spec Spec
	// Budget is total_gpu_memory × gpu_memory_utilization.
	Budget units.Bytes
	// Weights are the model weights on one GPU (quantized where asked),
	// with the rotary cos/sin cache.
	Weights units.Bytes
	// Activation is the profile run's activation peak above the weights.
	Activation units.Bytes
	// ActivationAt says where the profile run peaks.
	ActivationAt string
	// NonTorch is memory outside the caching allocator.
	NonTorch units.Bytes
	// KVAvailable is what is left for the KV cache (negative: nothing).
	KVAvailable units.Bytes
	// BlockBytes is one KV block over every layer (cache_block_size).
	BlockBytes units.Bytes
	// Blocks is # GPU blocks; Tokens = Blocks × BlockSize (the GPU KV
	// cache size vLLM logs).
	Blocks, Tokens int64
	// MaxConcurrency is Tokens / MaxModelLen (vLLM's "Maximum concurrency
	// for N tokens per request"); ConcurrencyAtContext the same at
	// Spec.Context, in whole requests (each holds ceil(context/block)
	// blocks).
	MaxConcurrency       float64
	ConcurrencyAtContext int64
	// Fits: at least one request of MaxModelLen fits the cache (vLLM
	// refuses to start otherwise, raise_if_cache_size_invalid).
	Fits bool
	// CUDAGraphs estimates the graph pool captured after the KV cache
	// (outside the budget; 0 with EnforceEager).
	CUDAGraphs units.Bytes
	// Timing at the roofline (nil without a GPU or when nothing fits).
	Timing *Timing
}

// Plan validates s and computes what vLLM logs at start-up. Bounded:
// Tokens = Blocks × BlockSize ≤ KVAvailable / 2 (a block holds at least
// two bytes per token), and the budget is at most --total-memory's 2^62.
func Plan(s Spec) (*Result, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	r := &Result{Spec: s, NonTorch: s.NonTorch}
	r.Budget = units.Bytes(math.Floor(float64(s.TotalMemory) * s.Utilization))
	w, err := weightBytes(&s)
	if err != nil {
		return nil, err
	}
	r.Weights = w
	r.Activation, r.ActivationAt = profilePeak(&s)
	r.KVAvailable = r.Budget - r.Weights - r.Activation - r.NonTorch
	r.BlockBytes = BlockBytes(&s)
	if r.KVAvailable > 0 {
		r.Blocks = int64(r.KVAvailable) / int64(r.BlockBytes)
	}
	r.Tokens = r.Blocks * int64(s.BlockSize)
	r.MaxConcurrency = float64(r.Tokens) / float64(s.MaxModelLen)
	perReq := int64((s.Context + s.BlockSize - 1) / s.BlockSize)
	r.ConcurrencyAtContext = r.Blocks / perReq
	r.Fits = r.Tokens >= int64(s.MaxModelLen)
	if !s.EnforceEager {
		r.CUDAGraphs = graphPool(&s)
	}
	if s.GPU != nil && r.Fits {
		if r.Timing, err = roofline(&s, r); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// MaxRequests is the number of concurrent requests of context tokens each
// that the KV cache of s holds (every request holds ceil(context/block)
// blocks), with the plan it comes from. It is what `memplan max --requests`
// answers; context 0 takes s.Context.
func MaxRequests(s Spec, context int) (int64, *Result, error) {
	if context != 0 {
		s.Context = context
	}
	r, err := Plan(s)
	if err != nil {
		return 0, nil, err
	}
	return r.ConcurrencyAtContext, r, nil
}

// kvHeadsPerRank is the KV heads one GPU holds: heads/tp, or one replica
// when tp exceeds the KV heads (QKVParallelLinear).
func kvHeadsPerRank(s *Spec) int {
	return max(s.Model.KVHeads/s.TP, 1)
}

// BlockBytes is CacheEngine.get_cache_block_size: key and value blocks of
// every layer (vllm/worker/cache_engine.py). Under multi-head latent
// attention (DeepSeek) the cache holds one entry of kv_lora_rank +
// qk_rope_head_dim per token and layer, no separate value, on every TP
// rank (get_cache_block_size: value_cache_entry = 0 when use_mla; the MLA
// backends' KV cache shape [blocks, block_size, 576]).
// A validated spec's block holds at most 2^58 elements (validateProducts).
func BlockBytes(s *Spec) units.Bytes {
	return s.KVDType.Size(int64(s.BlockSize) * kvElemsPerToken(s))
}
