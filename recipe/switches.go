package recipe

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/memplan/memplan/allocator"
	"github.com/memplan/memplan/engine"
	"github.com/memplan/memplan/lower"
	"github.com/memplan/memplan/models"
	"github.com/memplan/memplan/models/build"
	"github.com/memplan/memplan/ops"
	"github.com/memplan/memplan/units"
)

// Switch is one behaviour a recipe sets: a key, the values it takes, and
// what it does to a job. Adding a switch is one row of the switches table.
type Switch struct {
	Key string
	// Values describes the allowed values (shown in errors and listings).
	Values string
	// Doc says what the switch changes in memory.
	Doc string
	// Flag is the plan flag that sets the same thing, if any: a flag given
	// on the command line wins over the recipe's value, and a --set of the
	// switch must agree with it (Recipe.Apply). This column is the one
	// mapping of setting keys to flags.
	Flag string
	// Training: the switch changes only what a training step has (the
	// optimizer and its step, the loss, what backward saves, the loop
	// around them, sharding and checkpointing), so inference ignores it:
	// Recipe.Apply skips it, and the CLI warns about a --set of it.
	Training bool
	apply    func(s *engine.Spec, v string) error
}

var switches = []Switch{
	{Key: "precision", Flag: "precision", Values: strings.Join(ops.PrecisionNames(), ", ") + " (or a framework's name: bf16-true, bf16-mixed, 16-true, 16-mixed, 32-true), or checkpoint",
		Doc: "where parameters, gradients and optimizer state live and what autocast computes in; checkpoint: the parameters train in the dtype the model's config.json names (from_pretrained's dtype \"auto\"): under the Trainer's bf16=True (--precision's default), autocast-bf16 over a bfloat16 checkpoint; --precision's value over a float32 or unnamed one, a trace, or QLoRA (whose unquantized rest peft casts to float32); a float16 checkpoint is refused unless --precision is given",
		apply: func(s *engine.Spec, v string) (err error) {
			if v == "checkpoint" {
				s.Precision, err = checkpointPrecision(s)
				return err
			}
			s.Precision, err = ops.ParsePrecision(v)
			return err
		}},
	{Key: "optimizer", Training: true, Flag: "optimizer", Values: strings.Join(lower.OptimizerNames(), ", "),
		Doc: "the optimizer family: which state it keeps per parameter",
		apply: func(s *engine.Spec, v string) (err error) {
			s.Optimizer, err = lower.ParseOptimizer(v)
			return err
		}},
	{Key: "optimizer.impl", Training: true, Flag: "optimizer-impl", Values: "foreach, single, fused",
		Doc: "how the step runs: foreach (multi-tensor temporaries as large as the state), single (per-parameter), fused (no temporaries)",
		apply: func(s *engine.Spec, v string) (err error) {
			s.Impl, err = lower.ParseImpl(v)
			return err
		}},
	{Key: "optimizer.state-dtype", Training: true, Values: "auto, float32, bfloat16, float16",
		Doc: "the dtype of the optimizer's state where it follows the parameters (Adam's moments, momentum): auto takes the precision's (float32 with master weights, else the parameters' dtype)",
		apply: choice([]string{"auto", "float32|fp32", "bfloat16|bf16", "float16|fp16"}, func(s *engine.Spec, i int) {
			s.Sem.StateDType = []units.DType{units.Invalid, units.F32, units.BF16, units.F16}[i]
		})},
	{Key: "optimizer.paged", Training: true, Values: "true, false",
		Doc:   "optimizer state in CUDA unified memory (bitsandbytes paged optimizers): outside the caching allocator and max_memory_allocated",
		apply: boolSwitch(func(s *engine.Spec, b bool) { s.Sem.PagedOptimizer = b })},
	{Key: "model.code", Values: "hf, litgpt",
		Doc: "whose modeling code runs the model: transformers' per-family classes, or lit-gpt's one GPT class (fused qkv kept alive through attention, LoRA on parts of the fused qkv with zero_pad's index_copy)",
		apply: func(s *engine.Spec, v string) (err error) {
			s.Sem.Code, err = build.ParseCode(v)
			return err
		}},
	{Key: "kernels.rms-norm", Values: "eager, fp32-weight, fused",
		Doc: "eager: RMSNorm as transformers' LlamaRMSNorm runs it (a float32 copy of the input, pow, mean, rsqrt, two products: the float32 input and the normalised states are saved); fp32-weight: the same ops with the weight applied to the float32 normalised states before the cast back, which are saved instead (torch.nn.functional.rms_norm over a float32 copy with a 16-bit weight, torchtune 0.5+'s RMSNorm: the fused kernel wants matching dtypes, aten/src/ATen/native/layer_norm.cpp @v2.14.1 warns \"Cannot dispatch to fused implementation\" and runs the composite ops; litgpt 0.5's own RMSNorm, litgpt/model.py @v0.5.13: x.float(), x * rsqrt(mean(x * x)), times weight.float(), cast back); fused: one kernel saving its input and a float32 rstd (apex, Liger, Transformer Engine). Otherwise litgpt's own RMSNorm follows model.code",
		apply: choice([]string{"eager", "fp32-weight", "fused"}, func(s *engine.Spec, i int) {
			s.Sem.EagerRMSNorm, s.Sem.RMSNormFP32Weight = i < 2, i == 1
		})},
	{Key: "kernels.gelu", Values: "eager, fused",
		Doc:   "eager: gelu_new (GPT-2, Phi) as transformers' NewGELUActivation runs it (pow, tanh and products: the input, 0.5*x, tanh and 1+tanh are saved); fused: one GELU kernel saving its input (Megatron, lit-gpt, torch.compile). Other GELUs are one kernel either way",
		apply: choice([]string{"eager", "fused"}, func(s *engine.Spec, i int) { s.Sem.EagerGELU = i == 0 })},
	{Key: "kernels.swiglu", Values: "eager, fused",
		Doc:   "eager: silu(gate) * up as two ops (silu's output is kept too); fused: one kernel keeping only gate and up (Liger's LigerSiLUMulFunction)",
		apply: choice([]string{"eager", "fused"}, func(s *engine.Spec, i int) { s.Sem.FusedSwiGLU = i == 1 })},
	{Key: "moe.experts", Values: "loop, grouped-mm",
		Doc:   "how a mixture of experts runs its routed experts. loop: one nn.Linear per expert projection and a Python loop that gathers each expert's rows and index_adds its output (transformers 4.x MixtralSparseMoeBlock); grouped-mm: two 3-D parameters per layer (gate_up_proj, down_proj) and one grouped matmul over every routed row for each, its rows sorted by expert, the routing weights applied before the inverse permutation and the sum over top_k (transformers 5.x's default experts_implementation, integrations/moe.py grouped_mm_experts_forward): gradients come whole per layer, and peft's all-linear and bitsandbytes' 4-bit layers leave the experts and the router (a parameter applied with F.linear) alone",
		apply: choice([]string{"loop", "grouped-mm"}, func(s *engine.Spec, i int) { s.Sem.GroupedExperts = i == 1 })},
	{Key: "attention.mla-cache", Values: "expanded, latent",
		Doc:   "what inference caches for multi-head latent attention (DeepSeek V2, V3). expanded: every head's key and value states (transformers 4.x's DynamicCache of the states kv_b_proj made); latent: the compressed latent after kv_a_layernorm and the one rotary key, kv_lora_rank + qk_rope_head_dim a token a layer, from which kv_b_proj expands every head's keys and values over the whole cache at each step (transformers 5.x DeepseekV2/V3Attention.forward: cache.update(kv_nope, k_rot), then expand_kv)",
		apply: choice([]string{"expanded", "latent"}, func(s *engine.Spec, i int) { s.Sem.MLALatentCache = i == 1 })},
	{Key: "kernels.silu", Values: "fused, hand-written",
		Doc:   "fused: F.silu, one kernel saving its input; hand-written: x * torch.sigmoid(x), as the CS336 course models write it (cs336_basics/model.py), which also keeps the sigmoid's result",
		apply: choice([]string{"fused", "hand-written"}, func(s *engine.Spec, i int) { s.Sem.HandSiLU = i == 1 })},
	{Key: "kernels.softmax", Values: "fused, hand-written",
		Doc:   "eager attention's softmax. fused: one kernel saving its output; hand-written: exp(x - max) / sum, as the CS336 course's nn_utils.softmax, which also keeps exp's result, the row sums and max's indices",
		apply: choice([]string{"fused", "hand-written"}, func(s *engine.Spec, i int) { s.Sem.HandSoftmax = i == 1 })},
	{Key: "attention.repeat-kv", Values: "true, false",
		Doc:   "grouped-query attention copies k and v to every query head before SDPA (transformers' repeat_kv: always before 4.54, and from 4.54 with an attention mask or before PyTorch 2.5), so SDPA saves heads/kv-heads times more; false: SDPA takes the grouped heads (enable_gqa, flash-attn, torchtune's own expand is a copy too)",
		apply: boolSwitch(func(s *engine.Spec, b bool) { s.Sem.RepeatKV = b })},
	{Key: "autograd.mean-saves-input", Training: true, Values: "true, false",
		Doc:   "autograd keeps mean.dim's input for backward (PyTorch 2.1's MeanBackward1 holds self_): an unfused RMSNorm then saves x*x per norm",
		apply: boolSwitch(func(s *engine.Spec, b bool) { s.Sem.MeanSavesInput = b })},
	{Key: "autograd.inplace-sums", Training: true, Values: "true, false",
		Doc:   "autograd adds a tensor's later gradient into the one it holds when it can steal it (dense, not a view: PyTorch 2.0's engine, pytorch/pytorch#88339); false: every sum out of place, a new buffer while both operands live (PyTorch 1.x)",
		apply: boolSwitch(func(s *engine.Spec, b bool) { s.Sem.OutOfPlaceSums = !b })},
	{Key: "optimizer.in-backward", Training: true, Values: "true, false",
		Doc:   "each parameter's optimizer step runs inside backward as soon as its gradient is complete, and the gradient is freed (torchtune optimizer_in_bwd); needs --accum 1",
		apply: boolSwitch(func(s *engine.Spec, b bool) { s.Sem.OptimizerInBackward = b })},
	{Key: "loss", Training: true, Values: build.LossForms(),
		Doc: "fp32-logits: logits.float() then cross-entropy (transformers); native: cross-entropy in the logits' dtype; chunked: the head and cross-entropy chunk by chunk, upcast per chunk in the loss (fp32) or all chunks when the model returns (fp32-outputs, Lightning Fabric); fused-linear: Liger's fused linear cross-entropy, logits one chunk of about N·H values at a time, only the gradients of the hidden states and head kept",
		apply: func(s *engine.Spec, v string) (err error) {
			s.Sem.Loss, err = build.ParseLoss(v)
			return err
		}},
	{Key: "lora.adapter-dtype", Values: "float32, model",
		Doc:   "float32: peft keeps adapters over a 16-bit model in float32 (autocast_adapter_dtype=True); model: adapters in the model's dtype",
		apply: choice([]string{"float32|fp32", "model"}, func(s *engine.Spec, i int) { s.Sem.LoRAModelDType = i == 1 })},
	{Key: "lora.dropout", Training: true, Values: "per-target, shared",
		Doc:   "per-target: one dropout (mask and output) per adapted linear (peft); shared: one per input, shared by the adapters that read it (litgpt's fused qkv)",
		apply: choice([]string{"per-target", "shared"}, func(s *engine.Spec, i int) { s.Sem.LoRASharedDropout = i == 1 })},
	{Key: "bitsandbytes", Training: true, Values: "a version, e.g. 0.41.1",
		Doc: "bitsandbytes up to 0.43.2 saves every 4-bit linear's input for backward (fixed by bitsandbytes #1270 in 0.43.3)",
		apply: func(s *engine.Spec, v string) error {
			old, err := versionBefore(v, [3]int{0, 43, 3})
			if err != nil {
				return err
			}
			s.Sem.Quant.SavesInput = old
			return nil
		}},
	{Key: "qlora.quantize", Values: "all-linear, targets",
		Doc:   "which base linears QLoRA stores in 4 bits: every linear of the body (transformers' load_in_4bit, Lightning's plugin) or only the ones LoRA adapts (torchtune's LoRALinear(quantize_base=True))",
		apply: choice([]string{"all-linear", "targets"}, func(s *engine.Spec, i int) { s.Sem.Quant.TargetsOnly = i == 1 })},
	{Key: "qlora.prepare-kbit", Values: "true, false",
		Doc:   "peft's prepare_model_for_kbit_training casts every parameter that is not 4-bit (embeddings, norms, biases, the head) to float32, so the residual stream and logits run in float32 too",
		apply: boolSwitch(func(s *engine.Spec, b bool) { s.Sem.Quant.FP32Rest = b })},
	{Key: "qlora.head", Values: "true, false",
		Doc:   "the LM head is a 4-bit linear too (Lightning's bitsandbytes plugin swaps every torch.nn.Linear; transformers' load_in_4bit keeps the head)",
		apply: boolSwitch(func(s *engine.Spec, b bool) { s.Sem.Quant.Head = b })},
	{Key: "qlora.quant-state-dtype", Values: "compute, float16",
		Doc:   "float16: weights were quantised from a float16 copy, so each dequantisation returns float16 and a second copy in the compute dtype (4 bytes per weight, transient); compute: one copy",
		apply: choice([]string{"compute", "float16|fp16"}, func(s *engine.Spec, i int) { s.Sem.Quant.DequantCopy = i == 1 })},
	{Key: "qlora.double-quant", Values: "true, false",
		Doc:   "NF4 absmax constants quantised again to 8 bits (bnb.nf4-dq) or kept in float32 (bnb.nf4)",
		apply: boolSwitch(func(s *engine.Spec, b bool) { s.Sem.Quant.NoDoubleQuant = !b })},
	{Key: "fsdp.flat-params", Training: true, Values: "true, false",
		Doc:   "FSDP1 FlatParameters (use_orig_params=True): frozen and trainable weights of a wrapped unit share one flat gradient, no_sync accumulation keeps unsharded gradients, the root unit stays unsharded between forward and backward; false: per-parameter sharding that skips frozen weights (FSDP2, DeepSpeed ZeRO-3)",
		apply: boolSwitch(func(s *engine.Spec, b bool) { s.Sem.FSDPFlat = b })},
	{Key: "loop.hold-outputs", Training: true, Values: "false, backward, true (until the next forward returns)",
		Doc: "how long the loop keeps the model's output (logits) in a variable: false drops it once the loss exists (transformers Trainer, torchtune, torchtitan); backward keeps it through backward; true keeps it until the next forward rebinds it, through the optimizer step (litgpt, hand-written loops)",
		apply: choice([]string{"false|none", "backward", "true|next-forward"}, func(s *engine.Spec, i int) {
			s.Sem.Hold = []lower.Hold{lower.HoldNone, lower.HoldBackward, lower.HoldNextForward}[i]
		})},
	{Key: "loop.zero-grad", Training: true, Values: "set-to-none, in-place, after-forward",
		Doc: "set-to-none: zero_grad(set_to_none=True) after the step (PyTorch 2's default); in-place: set_to_none=False, gradients stay allocated across iterations (PyTorch < 2.0's default); after-forward: zero_grad between forward and backward, so the previous step's gradients are alive during the forward",
		apply: choice([]string{"set-to-none", "in-place", "after-forward"}, func(s *engine.Spec, i int) {
			s.Sem.ZeroGrad = []lower.ZeroGrad{lower.ZeroToNone, lower.ZeroInPlace, lower.ZeroAfterForward}[i]
		})},
	{Key: "cuda.cublas-workspace", Values: "auto (32 MiB on compute capability 9.0, else 8519680), or bytes per thread, e.g. 0",
		Doc: "cuBLAS workspace the caching allocator hands each thread's handle (main and autograd) since PyTorch 2.0: counted in the allocated peak",
		apply: func(s *engine.Spec, v string) error {
			if v == "auto" {
				s.Sem.Workspace = engine.AutoWorkspace
				return nil
			}
			return bytesSwitch(func(s *engine.Spec, b units.Bytes) { s.Sem.Workspace = b })(s, v)
		}},
	{Key: "cuda.overhead", Values: "bytes, e.g. 1343MiB or 0",
		Doc:   "device memory outside the caching allocator (CUDA context, kernels, communicators): subtracted from the GPU before fits is decided",
		apply: bytesSwitch(func(s *engine.Spec, b units.Bytes) { s.Sem.Overhead = b })},
	{Key: "nccl.overhead", Values: "bytes per communicator, e.g. 544MB or 0",
		Doc:   "device memory NCCL allocates outside the caching allocator for each parallel group of more than one GPU (data, tensor, pipeline, expert): subtracted before fits is decided",
		apply: bytesSwitch(func(s *engine.Spec, b units.Bytes) { s.Sem.CommOverhead = b })},
	{Key: "cuda.alloc-conf", Flag: "alloc-conf", Values: "PYTORCH_CUDA_ALLOC_CONF's options, e.g. expandable_segments:True (\"\" for PyTorch's default)",
		Doc: "the caching allocator's settings the framework launches with: they decide the reserved peak (segments, splitting, expandable segments), not the allocated one",
		apply: func(s *engine.Spec, v string) error {
			if _, err := allocator.ParseConf(v); err != nil {
				return err
			}
			s.Sem.AllocConf = v
			return nil
		}},
	{Key: "attention", Flag: "attention", Values: "sdpa, eager",
		Doc: "attention kernel: sdpa (flash/memory-efficient, no score matrix saved) or eager (softmax scores saved)",
		apply: func(s *engine.Spec, v string) (err error) {
			s.Attention, err = build.ParseAttention(v)
			return err
		}},
	{Key: "checkpoint", Training: true, Flag: "checkpoint", Values: "none, full, every=K, modules=GLOB, selective, selective-op",
		Doc: "activation checkpointing as the framework applies it",
		apply: func(s *engine.Spec, v string) (err error) {
			s.Checkpoint, err = engine.ParseCheckpoint(v)
			return err
		}},
}

// Switches lists every switch.
func Switches() []Switch { return append([]Switch(nil), switches...) }

func lookup(key string) (*Switch, error) {
	for i := range switches {
		if switches[i].Key == key {
			return &switches[i], nil
		}
	}
	keys := make([]string, len(switches))
	for i, s := range switches {
		keys[i] = s.Key
	}
	return nil, fmt.Errorf("unknown switch %q (switches: %s)", key, strings.Join(keys, ", "))
}

// choice is a switch of named values; the error lists them in order.
func choice(names []string, set func(s *engine.Spec, i int)) func(*engine.Spec, string) error {
	return func(s *engine.Spec, v string) error {
		for i, n := range names {
			for _, alias := range strings.Split(n, "|") {
				if v == alias {
					set(s, i)
					return nil
				}
			}
		}
		var first []string
		for _, n := range names {
			first = append(first, strings.Split(n, "|")[0])
		}
		last := len(first) - 1
		return fmt.Errorf("want %s or %s", strings.Join(first[:last], ", "), first[last])
	}
}

func boolSwitch(f func(*engine.Spec, bool)) func(*engine.Spec, string) error {
	return func(s *engine.Spec, v string) error {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return fmt.Errorf("want true or false")
		}
		f(s, b)
		return nil
	}
}

func bytesSwitch(f func(*engine.Spec, units.Bytes)) func(*engine.Spec, string) error {
	return func(s *engine.Spec, v string) error {
		b, err := units.ParseBytesOrZero(v)
		if errors.Is(err, units.ErrTooLarge) || err == nil && b > maxSwitchBytes {
			return fmt.Errorf("over the limit of %s (no GPU holds a TiB)", maxSwitchBytes)
		}
		if err != nil {
			return fmt.Errorf("want a byte size such as 8519680, 8MiB or 0")
		}
		f(s, b)
		return nil
	}
}

// maxSwitchBytes bounds the byte switches (an overhead, a workspace): each
// is memory of one GPU, and none holds a TiB, so 1024 TiB leaves room for a
// generous mistake that a plan then refuses against its GPU (overheads that
// leave it nothing: engine.Spec.Validate) while every sum of them stays far
// inside a size. Overheads of 4194303 TiB wrapped the usable memory's sum
// into millions of TiB.
const maxSwitchBytes = 1024 * units.TiB

// versionBefore reports whether version v (major.minor.patch, a suffix
// after the numbers ignored) is older than ref.
func versionBefore(v string, ref [3]int) (bool, error) {
	t := strings.TrimPrefix(strings.TrimSpace(v), "v")
	parts := strings.SplitN(t, ".", 3)
	var n [3]int
	for i, p := range parts {
		end := 0
		for end < len(p) && p[end] >= '0' && p[end] <= '9' {
			end++
		}
		if end == 0 || end > 6 {
			return false, fmt.Errorf("want a version such as 0.41.1, got %q", v)
		}
		n[i], _ = strconv.Atoi(p[:end])
	}
	if len(parts) < 2 {
		return false, fmt.Errorf("want a version such as 0.41.1, got %q", v)
	}
	for i := range n {
		if n[i] != ref[i] {
			return n[i] < ref[i], nil
		}
	}
	return false, nil
}

// LoadedPrecision is the pure precision of a model loaded in its
// checkpoint's dtype, transformers 5.x's from_pretrained default
// (modeling_utils.py _get_dtype @v5.0.0: dtype None means "auto", the
// config's dtype): pure-bf16 or pure-fp16; false for a float32 or unnamed
// dtype.
func LoadedPrecision(m *models.Arch) (ops.Precision, bool) {
	if m == nil {
		return 0, false
	}
	switch strings.ToLower(strings.TrimPrefix(m.TorchDType, "torch.")) {
	case "bfloat16":
		return ops.PureBF16, true
	case "float16":
		return ops.PureFP16, true
	}
	return 0, false
}

// checkpointPrecision is the precision switch's checkpoint value: the
// parameters trained as loaded under the Trainer's bf16=True (--precision's
// default, amp-bf16): a bfloat16 checkpoint is autocast-bf16 (bfloat16
// state, autocast casting only what is float32: peft's adapters and their
// inputs, measured by the framework suite's hf5 cases); a float32 or
// unnamed checkpoint, a trace, and QLoRA (peft's
// prepare_model_for_kbit_training casts what is not 4-bit to float32) keep
// the flag's precision; a float16 checkpoint autocast to bfloat16 has no
// memplan precision and is refused.
func checkpointPrecision(s *engine.Spec) (ops.Precision, error) {
	loaded, ok := LoadedPrecision(s.Model)
	if !ok || s.QLoRA || s.Trace != nil {
		return s.Precision, nil
	}
	if loaded == ops.PureFP16 {
		return 0, fmt.Errorf("%s's checkpoint is float16 and loads so (from_pretrained's dtype \"auto\"); the Trainer's bf16=True autocasts it to bfloat16, which memplan has no precision for: give --precision pure-fp16 (the Trainer with neither bf16 nor fp16) or amp-bf16 (from_pretrained(dtype=torch.float32))", s.Model.Name)
	}
	return ops.AutocastBF16, nil
}
