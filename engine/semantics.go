package engine

import (
	"github.com/memplan/memplan/hw"
	"github.com/memplan/memplan/lower"
	"github.com/memplan/memplan/models/build"
	"github.com/memplan/memplan/ops"
	"github.com/memplan/memplan/units"
)

// Semantics are the behaviours of the framework that runs a job, where
// frameworks differ in what decides memory. Recipes (package recipe) set
// them; the zero value is transformers and peft on plain PyTorch 2 with
// nothing outside the caching allocator counted. Semantics is comparable,
// so cache keys carry it whole.
type Semantics struct {
	// Recipe names the recipe the semantics came from, for reports.
	Recipe string
	// Code is whose modeling code runs the model (transformers', litgpt's).
	Code build.Code
	// FusedSwiGLU keeps only gate and up for a gated MLP's backward.
	FusedSwiGLU bool
	// GroupedExperts runs a mixture's routed experts as 3-D parameters and
	// grouped matmuls (transformers 5.x), not a loop over per-expert
	// linears (4.x).
	GroupedExperts bool
	// MLALatentCache caches MLA's compressed latent and rotary key in
	// inference (transformers 5.x), not the expanded keys and values.
	MLALatentCache bool
	// HandSiLU and HandSoftmax run SiLU and eager attention's softmax as
	// hand-written elementwise ops (x * sigmoid(x), exp(x - max) / sum).
	HandSiLU, HandSoftmax bool
	// RepeatKV copies grouped k and v to every head before SDPA.
	RepeatKV bool
	// EagerGELU runs gelu_new as transformers' eager NewGELUActivation
	// rather than one fused GELU.
	EagerGELU bool
	// EagerRMSNorm runs RMSNorm as transformers' eager ops rather than one
	// fused kernel.
	EagerRMSNorm bool
	// RMSNormFP32Weight (with EagerRMSNorm) applies the weight in float32
	// before the cast back (torchtune 0.5+ on CPU kernels).
	RMSNormFP32Weight bool
	// MeanSavesInput: autograd keeps mean.dim's input (PyTorch 2.1).
	MeanSavesInput bool
	// OutOfPlaceSums: autograd sums every later gradient of a tensor read
	// by several nodes out of place (PyTorch 1.x; lower.TrainConfig).
	OutOfPlaceSums bool
	// Loss is how a causal LM's loss is computed.
	Loss build.Loss
	// LoRAModelDType keeps LoRA adapters in the model's dtype (litgpt,
	// torchtune) instead of peft's float32; LoRASharedDropout applies
	// lora_dropout once per input (litgpt's fused qkv) instead of once per
	// target.
	LoRAModelDType, LoRASharedDropout bool
	// Quant is how QLoRA's 4-bit base layers behave (bitsandbytes version,
	// double quantisation).
	Quant build.Quant
	// PagedOptimizer keeps the optimizer state in CUDA unified memory
	// (bitsandbytes paged optimizers): outside the caching allocator.
	PagedOptimizer bool
	// OptimizerInBackward steps each parameter inside backward as soon as
	// its gradient is complete and frees the gradient (torchtune's
	// optimizer_in_bwd).
	OptimizerInBackward bool
	// StateDType overrides the dtype of the optimizer's state (Invalid:
	// the precision's, float32 with master weights).
	StateDType units.DType
	// Hold is how long the loop keeps the model's outputs (logits) in a
	// variable; ZeroGrad when and how it clears gradients.
	Hold     lower.Hold
	ZeroGrad lower.ZeroGrad
	// Workspace is the cuBLAS workspace each thread allocates through the
	// caching allocator (counted in the allocated peak); AutoWorkspace takes
	// the GPU's default (hw.GPU.CublasWorkspace).
	Workspace units.Bytes
	// FSDPFlat shards with FSDP1's FlatParameters (use_orig_params=True):
	// a wrapped unit's frozen and trainable weights share one flat
	// parameter, so frozen weights get gradients too, gradient accumulation
	// under no_sync keeps each unit's unsharded gradient, and the root unit
	// is not resharded after forward. Without it, ZeRO-3 shards per
	// parameter and skips frozen ones (FSDP2, DeepSpeed).
	FSDPFlat bool
	// CommOverhead is the device memory NCCL takes per communicator
	// (buffers per channel and peer, outside the caching allocator), added
	// to Overhead for each parallel group of more than one GPU.
	CommOverhead units.Bytes
	// AllocConf is the PYTORCH_CUDA_ALLOC_CONF the framework runs the
	// caching allocator with (allocator.ParseConf's vocabulary; "" is
	// PyTorch's default), for the reserved prediction.
	AllocConf string
	// Overhead is device memory outside the caching allocator (the CUDA
	// context and kernel images, communicator buffers): subtracted from the
	// GPU's memory before "fits" is decided.
	Overhead units.Bytes
}

// AutoWorkspace asks for the GPU's default cuBLAS workspace.
const AutoWorkspace units.Bytes = -1

// resolve fills what depends on the GPU.
func (m *Semantics) resolve(g *hw.GPU, d ops.Device) {
	if d == ops.CPU {
		m.Workspace = 0 // no cuBLAS handle on CPU kernels
	}
	if m.Workspace == AutoWorkspace {
		m.Workspace = (&hw.GPU{}).CublasWorkspace()
		if g != nil {
			m.Workspace = g.CublasWorkspace()
		}
	}
}

// buildOptions applies the semantics to a graph's options.
func (m Semantics) buildOptions(o *build.Options) {
	o.Loss = m.Loss
	o.Quant = m.Quant
	o.Code = m.Code
	o.MeanSavesInput = m.MeanSavesInput
	o.EagerRMSNorm = m.EagerRMSNorm
	o.RMSNormFP32Weight = m.RMSNormFP32Weight
	o.EagerGELU = m.EagerGELU
	o.RepeatKV = m.RepeatKV
	o.FusedSwiGLU = m.FusedSwiGLU
	o.GroupedExperts = m.GroupedExperts
	o.MLALatentCache = m.MLALatentCache
	o.HandSiLU, o.HandSoftmax = m.HandSiLU, m.HandSoftmax
	if o.LoRA != nil && (m.LoRAModelDType || m.LoRASharedDropout) {
		l := *o.LoRA
		l.ModelDType, l.SharedDropout = m.LoRAModelDType, m.LoRASharedDropout
		o.LoRA = &l
	}
}
