package published

import (
	"fmt"
	"math"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/memplan/memplan/allocator"
	"github.com/memplan/memplan/engine"
	"github.com/memplan/memplan/hw"
	"github.com/memplan/memplan/lower"
	"github.com/memplan/memplan/models"
	"github.com/memplan/memplan/models/build"
	"github.com/memplan/memplan/ops"
	"github.com/memplan/memplan/recipe"
	"github.com/memplan/memplan/units"
)

// Lack is a capability memplan lacks to express a row, with the field that
// needs it.
type Lack struct {
	Field      string `json:"field"`
	Capability string `json:"capability"`
}

func (l Lack) String() string { return l.Field + ": " + l.Capability }

// frameworks maps a row's framework to the recipe that follows it.
var frameworks = map[string]string{
	"litgpt": "litgpt", "lit-gpt": "litgpt",
	"hf-trainer": "hf", "transformers": "hf", "peft": "hf", "accelerate": "hf", "trl": "hf",
	// Fine-tuning tools that run transformers' Trainer and models with peft.
	"axolotl": "hf", "llama-factory": "hf", "llamafactory": "hf", "hf": "hf", "huggingface": "hf",
	"torchtune": "torchtune", "torchtitan": "torchtitan",
	"deepspeed": "deepspeed", "megatron-lm": "megatron", "megatron": "megatron", "nemo": "megatron",
	"pytorch": "pytorch", "torch": "pytorch",
}

// Job maps a row to a recipe and a job. dir is the published file's
// directory (model configs are relative to it). A row memplan cannot
// express returns the capabilities it lacks (and a nil spec).
//
// It is a driver over a rowMapper's phases, in this order (the order of the
// lacks it reports): the measured metric, the model, the GPU, the mode and
// sizes, the libraries whose version decides memory, the precision, what
// only training has (optimizer, checkpointing, loss), the parallel layout,
// and PEFT with quantization; the recipe then fills the spec.
func (r *Row) Job(dir string) (*engine.Spec, *recipe.Recipe, []Lack) {
	fw := strings.ToLower(strings.TrimSpace(r.Framework))
	name, ok := frameworks[fw]
	if !ok {
		return nil, nil, []Lack{{"framework", fmt.Sprintf("no recipe for framework %q (recipes: %s)", r.Framework, strings.Join(recipe.Names(), ", "))}}
	}
	rec, err := recipe.Load(name)
	if err != nil {
		return nil, nil, []Lack{{"framework", err.Error()}}
	}
	m := &rowMapper{r: r, tool: fw, framework: name, rec: rec.Clone()}
	m.s.FirstStep = true
	m.metric()
	m.model(dir)
	m.gpu()
	m.sizes()
	m.libraries()
	m.era()
	m.gqaInSDPA()
	m.zeroGradFromNotes()
	m.attentionFromNotes()
	m.precision()
	if m.s.Mode == engine.Train {
		m.training()
	}
	m.parallel()
	m.reservedMetric()
	m.peft()
	m.quantization()
	if len(m.lacks) > 0 {
		return nil, m.rec, m.lacks
	}
	if err := m.rec.Apply(&m.s, nil); err != nil {
		return nil, m.rec, []Lack{{"framework", err.Error()}}
	}
	return &m.s, m.rec, nil
}

// rowMapper holds what Job's phases share: the row, the recipe being set in
// the framework's terms, the spec being filled and the lacks found so far.
type rowMapper struct {
	r         *Row
	tool      string // the row's framework, lower case (hf-trainer, axolotl, …)
	framework string // the recipe's name
	rec       *recipe.Recipe
	s         engine.Spec
	lacks     []Lack
	e         Era
}

func (m *rowMapper) lack(field, f string, a ...any) {
	m.lacks = append(m.lacks, Lack{field, fmt.Sprintf(f, a...)})
}

// metric: allocated bytes are predicted by the simulator, reserved ones by
// the caching allocator's replay of its programs (Predict), nvidia-smi as
// reserved plus what the process holds outside the allocator; a source
// naming no statistic is a lack.
func (m *rowMapper) metric() {
	if m.r.Metric == UnknownMetric {
		m.lack("metric", "the source names no statistic; allocated and nvidia-smi readings only bracket it")
	}
}

// era: what the row's PyTorch release and CUDA version decide.
//
//   - Before 2.0, zero_grad() defaults to set_to_none=False
//     (torch/optim/optimizer.py and torch/nn/modules/module.py @v1.13.1;
//     2.0 flipped the default), so gradients stay allocated between steps
//     in loops that call it with the default: transformers' Trainer
//     (model.zero_grad(), trainer.py @v4.15.0) and plain PyTorch loops
//     (zeroGradDefault). Notes naming set_to_none say it outright.
//   - Before 2.0, autograd sums a tensor's later gradients out of place
//     (autograd.inplace-sums=false; #88339 made 2.0 add in place).
//   - Before 2.0, the cuBLAS workspace is cuBLAS's own cudaMalloc, not a
//     caching-allocator block (PyTorch #83461 moved it into the allocator
//     for 2.0; #95668: "1.13 does not have this issue", 8519680 bytes
//     allocated by a 2.0 nightly): it leaves the allocated peak and joins
//     the memory outside the allocator, one per thread (forward, autograd).
//   - The CUDA context is the contextTable's measurement for the era's
//     module loading, CUDA version and GPU, when one covers it; else the
//     recipe's cuda.overhead stays.
func (m *rowMapper) era() {
	m.e = EraOf(m.r)
	outside := units.Bytes(-1)
	gpu := ""
	if m.s.GPU != nil {
		gpu = m.s.GPU.Name
	}
	if ctx, _, ok := contextOf(m.e, gpu); ok {
		outside = ctx
	}
	if !m.e.Before(2, 0) {
		if outside >= 0 {
			mustSet(m.rec, fmt.Sprintf("cuda.overhead=%d", int64(outside)))
		}
		return
	}
	if zeroGradDefault[m.framework] {
		mustSet(m.rec, "loop.zero-grad=in-place")
	}
	// pytorch/pytorch@00d40e7f input_buffer.cpp: in place for sparse only.
	mustSet(m.rec, "autograd.inplace-sums=false")
	ws := units.Bytes(0)
	switch v := m.rec.Value("cuda.cublas-workspace"); v {
	case "auto":
		ws = (&hw.GPU{}).CublasWorkspace()
		if m.s.GPU != nil {
			ws = m.s.GPU.CublasWorkspace()
		}
	case "":
	default:
		ws, _ = units.ParseBytes(v)
	}
	mustSet(m.rec, "cuda.cublas-workspace=0")
	if outside < 0 {
		outside, _ = units.ParseBytes(m.rec.Value("cuda.overhead"))
	}
	mustSet(m.rec, fmt.Sprintf("cuda.overhead=%d", int64(outside+2*ws)))
}

// zeroGradDefault: the recipes whose loop calls zero_grad() with PyTorch's
// default, so the default of the row's PyTorch decides.
var zeroGradDefault = map[string]bool{"hf": true, "pytorch": true}

// zeroGradFromNotes: notes naming set_to_none decide over the era.
func (m *rowMapper) zeroGradFromNotes() {
	t := strings.ReplaceAll(strings.ToLower(m.r.Notes), " ", "")
	switch {
	case strings.Contains(t, "set_to_none=false"):
		mustSet(m.rec, "loop.zero-grad=in-place")
	case strings.Contains(t, "set_to_none=true"):
		mustSet(m.rec, "loop.zero-grad=set-to-none")
	}
}

// attentionFromNotes: the attention kernel when the notes name it (eager
// attention saves the softmax scores; a recipe's default is SDPA).
func (m *rowMapper) attentionFromNotes() {
	t := strings.ToLower(m.r.Notes)
	switch {
	case strings.Contains(t, "eager attention") || strings.Contains(t, "attn_implementation='eager'") || strings.Contains(t, "attn_implementation=\"eager\""):
		mustSet(m.rec, "attention=eager")
	case strings.Contains(t, "sdpa attention") || strings.Contains(t, "attn_implementation='sdpa'"):
		mustSet(m.rec, "attention=sdpa")
	case (m.framework == "hf" || m.framework == "deepspeed") && flashAttention(t):
		// transformers' flash-attention path hands grouped heads to
		// flash_attn_func, which saves q, k, v, the output and the log-sum-exp
		// as SDPA's flash kernel does, and never calls repeat_kv
		// (modeling_flash_attention_utils.py _flash_attention_forward @v4.46.0).
		mustSet(m.rec, "attention=sdpa")
		mustSet(m.rec, "attention.repeat-kv=false")
	}
}

// reservedMetric: a reserved-type or nvidia-smi row of a job that gathers
// sharded parameters (FSDP, ZeRO-3) needs the side streams' pools, which
// the allocator replay does not have.
func (m *rowMapper) reservedMetric() {
	if m.r.Allocated() || m.r.Metric == UnknownMetric || m.s.ZeRO < 3 || m.s.DP < 2 {
		return
	}
	m.lack("metric", "%s of a sharded job: FSDP2 all-gathers parameters into blocks of its all-gather copy-in stream and reduce-scatters gradients on its own stream (torch/distributed/_composable/fsdp/_fsdp_param_group.py, FSDPCommContext), and the caching allocator keeps a stream's freed blocks for that stream; memplan's allocator replay runs every request on one stream", m.r.Metric)
}

// model: a catalog name, or a config file relative to dir.
func (m *rowMapper) model(dir string) {
	var err error
	if n := m.r.Model.Name; n != nil {
		if m.s.Model, err = models.Lookup(*n); err != nil {
			m.lack("model.name", "%v", err)
		}
		return
	}
	p := *m.r.Model.Config
	if !filepath.IsAbs(p) {
		p = filepath.Join(dir, p)
	}
	if m.s.Model, err = models.LoadFile(p); err != nil {
		m.lack("model.config", "%v", err)
	}
}

// gpu: the row's GPU; an oom row cannot be decided without one.
func (m *rowMapper) gpu() {
	var err error
	if g := m.r.GPU; g != nil {
		if m.s.GPU, err = hw.Lookup(*g); err != nil {
			m.lack("gpu", "%v", err)
		}
	} else if m.r.Outcome == OutcomeOOM {
		m.lack("gpu", "an oom row needs the GPU to decide it does not fit, and the row names none")
	}
}

// sizes: micro-batch, sequence, accumulation; a generate row is inference
// whose KV cache is sized by max_new_tokens in its notes.
func (m *rowMapper) sizes() {
	r, s := m.r, &m.s
	s.MicroBatch, s.Seq = r.MicroBatch, r.Seq
	s.Accum = 1
	if r.Accum != nil {
		s.Accum = *r.Accum
	}
	if r.Mode != "generate" {
		return
	}
	s.Mode = engine.Infer
	s.FirstStep = false
	s.Accum = 1
	if t := newTokensRE.FindStringSubmatch(r.Notes); t == nil {
		m.lack("notes", "a generate row needs max_new_tokens=N in its notes to size the KV cache")
	} else {
		s.GenTokens, _ = strconv.Atoi(t[1])
	}
}

// libraries: the versions that decide memory: bitsandbytes; transformers
// under the recipes that run its modeling code, whose 5.x runs a mixture's
// experts as grouped matmuls over 3-D parameters by default
// (modeling_utils.py get_correct_experts_implementation @v5.24.0) where 4.x
// loops over per-expert linears. (transformers from 4.54 on also hands
// grouped heads to SDPA where the PyTorch release allows: gqaInSDPA, after
// the era.)
func (m *rowMapper) libraries() {
	for lib, v := range m.r.Libraries {
		if strings.EqualFold(lib, "bitsandbytes") {
			if err := m.rec.Set("bitsandbytes=" + strings.Fields(v + " x")[0]); err != nil {
				m.lack("libraries.bitsandbytes", "%v", err)
			}
		}
	}
	if v, ok := m.transformers(); ok && !versionBefore(v, 5, 0) {
		mustSet(m.rec, "moe.experts=grouped-mm")
		mustSet(m.rec, "attention.mla-cache=latent")
	}
}

// transformers is the row's transformers release (major, minor) under the
// recipes that run its modeling code (hf, deepspeed): libraries.transformers,
// or the framework's version when the framework is transformers itself
// (hf-trainer). ok is false when neither gives one ("x (pinned)" counts, a
// bound such as ">=x" does not).
func (m *rowMapper) transformers() (v [2]int, ok bool) {
	if m.framework != "hf" && m.framework != "deepspeed" {
		return v, false
	}
	for lib, s := range m.r.Libraries {
		if strings.EqualFold(lib, "transformers") {
			if mm := versionRE.FindStringSubmatch(strings.TrimSpace(s)); mm != nil {
				return atoi2(mm[1], mm[2]), true
			}
			return v, false
		}
	}
	switch m.tool {
	case "hf-trainer", "transformers":
		if mm := versionRE.FindStringSubmatch(strings.TrimSpace(m.r.FrameworkVersion)); mm != nil {
			return atoi2(mm[1], mm[2]), true
		}
	}
	return v, false
}

// gqaInSDPA: from transformers 4.54 on, SDPA takes grouped k and v with
// enable_gqa=True instead of repeat_kv's copies when PyTorch is 2.5 or later
// and the attention mask is None (integrations/sdpa_attention.py
// use_gqa_in_sdpa @v4.54.0, the same in v5.0.0; 4.48-4.53 copy always). The
// mask is None when the causal mask can be left to SDPA's is_causal: no
// padding token in the batch, and a sliding window, if any, longer than the
// sequence (masking_utils.py _ignore_causal_mask_sdpa @v4.54.0). CUDA's
// flash and memory-efficient kernels take the grouped heads (PyTorch
// aten/src/ATen/native/transformers/cuda/sdp_utils.cpp,
// backend_supports_grouped_query_attention), so SDPA saves k and v at the
// key/value heads; 5.24 asks besides for k and v heads of one width, at most
// 256 (flash's limit), which the earlier releases' kernels needed too.
// Measured with transformers 5.24.0 on CPU (a 2-layer Llama, 8 heads, 2
// key/value heads): use_gqa_in_sdpa gets no mask and says yes on every layer
// for an all-ones attention_mask, gets the mask and says no with 3 tokens
// padded. Padded batches (the notes say so) keep the copies; a
// model that windows some layers only, at a sequence the window masks,
// copies on those layers only, which one switch for every layer cannot say.
func (m *rowMapper) gqaInSDPA() {
	v, ok := m.transformers()
	if !ok || versionBefore(v, 4, 54) || !m.e.Known() || m.e.Before(2, 5) || paddedBatches(m.r.Notes) {
		return
	}
	a := m.s.Model
	if a != nil && (a.HeadDim > 256 || a.VDim() != a.HeadDim) {
		return // 5.24's use_gqa_in_sdpa: key.shape[-1] == value.shape[-1] <= 256 (flash's limit)
	}
	if a != nil && a.SlidingWindow > 0 && m.r.Seq >= a.SlidingWindow {
		if a.SlidingWindowAlternating || a.SlidingWindowPattern > 0 {
			m.lack("model", "transformers %d.%d hands grouped heads to SDPA on the full-attention layers and copies them on the sliding-window ones (seq %d reaches the window of %d), and attention.repeat-kv is one switch for every layer", v[0], v[1], m.r.Seq, a.SlidingWindow)
		}
		return
	}
	mustSet(m.rec, "attention.repeat-kv=false")
}

// paddedBatches reports whether the notes say the batches hold padding
// tokens (and so an attention mask with zeros).
func paddedBatches(notes string) bool {
	t := strings.ToLower(notes)
	for _, no := range []string{"no padding", "unpadded", "without padding", "no pad token", "not padded"} {
		t = strings.ReplaceAll(t, no, "")
	}
	return strings.Contains(t, "pad")
}

// precision, in the framework's terms (and, for a Trainer's autocast flag,
// the dtype transformers loaded the model in: loadedPrecision).
func (m *rowMapper) precision() {
	p, ok := precisionOf(m.r.Precision)
	if !ok {
		m.lack("precision", "%q is not a precision policy memplan models (it has %s)", m.r.Precision, strings.Join(ops.PrecisionNames(), ", "))
		return
	}
	if p, ok = m.loadedPrecision(p); ok {
		mustSet(m.rec, "precision="+p.String())
	}
}

// loadedPrecision is the precision of a Trainer row whose flag (bf16=True,
// fp16=True, axolotl's bf16: true: autocast, p) names no load dtype, given
// the dtype the framework loads the model in and what it casts after. Left
// as p: recipes other than hf, a quantized base under the Trainer itself
// (bitsandbytes and peft's prepare_model_for_kbit_training make the rest
// float32: qlora.prepare-kbit), FSDP and DeepSpeed
// (accelerate upcasts low-precision parameters to float32 under FSDP's mixed
// precision; DeepSpeed's bf16/fp16 engine keeps float32 masters), and a
// dtype the row names itself (in precision or notes).
//
//   - transformers' Trainer: 4.x loads float32 unless told (torch_dtype=None:
//     the default dtype), so autocast runs over float32 parameters; 5.x
//     loads the checkpoint's dtype (dtype=None becomes "auto", config.dtype:
//     modeling_utils.py PreTrainedModel.from_pretrained and _get_dtype
//     @v5.0.0), so a bfloat16 checkpoint trains bfloat16 parameters,
//     gradients and AdamW state under an autocast that casts nothing, the
//     job of a 4.x row passing torch_dtype=bfloat16. Measured with
//     transformers 5.24.0: a Llama saved in bfloat16 comes back from
//     from_pretrained(path) with every parameter bfloat16. A checkpoint
//     naming no 16-bit dtype stays as p.
//   - LLaMA-Factory loads in the compute dtype (patcher.py patch_config:
//     init_kwargs["torch_dtype"] = model_args.compute_dtype) and then casts
//     the trainable parameters to float32 (adapter.py init_adapter
//     @01d87b82, cast_trainable_params_to_fp32, unless pure_bf16): LoRA trains float32
//     adapters over a 16-bit base, full fine-tuning float32 parameters
//     under autocast (p).
//   - axolotl loads in the dtype of its flag (utils/config normalize_config:
//     bf16 -> cfg.torch_dtype = torch.bfloat16, fp16 -> float16) and keeps
//     embed_tokens, lm_head and every norm in float32 unless an adapter or a
//     flash-attention backend makes it cast them back (loaders/model.py
//     _configure_embedding_dtypes): LoRA and full fine-tuning with flash
//     attention train 16-bit parameters; full fine-tuning with SDPA or eager
//     attention a per-module mix memplan has no precision for (a lack).
//
// Autocast to the other 16-bit dtype over 16-bit parameters has no memplan
// precision either, and fp16=True over float16 parameters that train
// stops at the first step (the GradScaler refuses float16 gradients); both
// are lacks. LoRA adapters are float32 (peft's autocast_adapter_dtype,
// LLaMA-Factory's cast), so a float16 base with fp16=True trains.
func (m *rowMapper) loadedPrecision(p ops.Precision) (ops.Precision, bool) {
	loader := m.tool == "llama-factory" || m.tool == "llamafactory" || m.tool == "axolotl"
	if m.framework != "hf" || (p != ops.AMPBF16 && p != ops.AMPFP16) || m.s.Model == nil || m.r.Quantization != nil && !loader {
		return p, true
	}
	if st := strings.ToLower(m.r.Parallel.Strategy); st != "" && st != "none" && st != "ddp" {
		return p, true
	}
	notes := strings.ToLower(m.r.Precision + " " + m.r.Notes)
	if strings.Contains(notes, "dtype") {
		return p, true
	}
	lora := m.r.PEFT != nil
	var loaded ops.Precision // the parameters' dtype as a pure precision
	var why string           // who loads them so
	autocast := true         // the Trainer's bf16=True autocasts over them
	// pure_bf16 trains "in purely bf16 precision (without AMP)"
	// (LLaMA-Factory hparams/finetuning_args.py): no autocast over it
	pureBF16 := strings.Contains(strings.ReplaceAll(notes, " ", ""), "pure_bf16")
	switch {
	case m.r.Quantization != nil && lora:
		// QLoRA under the tools: the parameters left unquantized stay in
		// the compute dtype. LLaMA-Factory never calls peft's
		// prepare_model_for_kbit_training (model_utils/checkpointing.py
		// prepare_model_for_training casts norms to float32 only with
		// upcast_layernorm, off by default); axolotl calls it and then
		// casts the norms and embed_tokens/lm_head back (the adapter path
		// of _configure_embedding_dtypes).
		mustSet(m.rec, "qlora.prepare-kbit=false")
		loaded, why = pure(p), "the unquantized rest stays in the compute dtype"
	case m.tool == "llama-factory" || m.tool == "llamafactory":
		if !lora && !pureBF16 {
			return p, true // full fine-tuning: trainable parameters cast to float32
		}
		loaded, why, autocast = pure(p), "LLaMA-Factory loads the base in the compute dtype", !pureBF16
	case m.tool == "axolotl":
		if !lora && !flashAttention(notes) {
			m.lack("precision", "axolotl keeps embed_tokens, lm_head and every norm in float32 and the rest in the %s it loads (full fine-tuning with SDPA or eager attention: loaders/model.py _configure_embedding_dtypes), a per-module mix memplan has no precision for", dtypeName(pure(p)))
			return p, false
		}
		loaded, why = pure(p), "axolotl loads the model in its flag's dtype"
	default:
		v, known := m.transformers()
		if !known || versionBefore(v, 5, 0) {
			return p, true
		}
		var ok bool
		if loaded, ok = recipe.LoadedPrecision(m.s.Model); !ok {
			return p, true
		}
		why = fmt.Sprintf("transformers %d.%d loads the checkpoint's %s (from_pretrained's dtype \"auto\")", v[0], v[1], dtypeName(loaded))
	}
	switch {
	case loaded == pure(p) && p == ops.AMPBF16 && autocast:
		return ops.AutocastBF16, true
	case loaded == pure(p) && (p == ops.AMPBF16 || lora):
		return loaded, true // no autocast over them (LLaMA-Factory's pure_bf16), or LoRA's float32 adapters under fp16=True
	case loaded == pure(p):
		m.lack("precision", "%s, and %s over float16 parameters stops at the first step: the Trainer's GradScaler refuses to unscale float16 gradients", why, m.r.Precision)
	default:
		m.lack("precision", "%s, and %s over %s parameters is autocast to the other 16-bit dtype, which memplan has no precision for", why, m.r.Precision, dtypeName(loaded))
	}
	return p, false
}

// trainerDefaultFused reports whether a row's optimizer is the Trainer's
// default AdamW in an era whose default is the fused kernel: from
// transformers 4.54 on PyTorch 2.8+, TrainingArguments.optim defaults to
// adamw_torch_fused (training_args.py default_optim @v4.54.0, the same in
// v5.0.0; adamw_torch, foreach, before). Only a row that calls its optimizer
// the default and names no Trainer optim, kernel or library gets it; the
// tools that set their own optimizer (axolotl) do not.
func (m *rowMapper) trainerDefaultFused(opt string, kvs []string) bool {
	t := strings.ToLower(opt)
	if !strings.Contains(t, "default") || m.tool == "axolotl" {
		return false
	}
	for _, kv := range kvs {
		if kv != "optimizer=adamw" {
			return false // an implementation, state or optimizer of its own
		}
	}
	for _, named := range []string{"adamw_torch", "adamw_hf", "adamw_apex", "adamw_bnb", "foreach", "fused", "transformers.adamw", "8bit"} {
		if strings.Contains(t, named) {
			return false
		}
	}
	v, ok := m.transformers()
	return ok && !versionBefore(v, 4, 54) && m.e.Known() && !m.e.Before(2, 8)
}

// dtypeName names a pure 16-bit precision's dtype as PyTorch does.
func dtypeName(p ops.Precision) string {
	if p == ops.PureFP16 {
		return "float16"
	}
	return "bfloat16"
}

// pure is the precision whose parameters are autocast p's compute dtype.
func pure(p ops.Precision) ops.Precision {
	if p == ops.AMPFP16 {
		return ops.PureFP16
	}
	return ops.PureBF16
}

// flashAttention reports whether the notes name flash-attention 2 (or 3)
// as the attention backend: transformers' attn_implementation or
// use_flash_attention_2, axolotl's flash_attention: true.
func flashAttention(notes string) bool {
	t := strings.NewReplacer(" ", "", "\"", "", "'", "", "-", "_").Replace(strings.ToLower(notes))
	for _, k := range []string{"flash_attention_2", "flash_attention_3", "flash_attn", "flash_attention:true", "flash_attention=true", "use_flash_attention_2=true", "flashattention2", "flashattention_2"} {
		if strings.Contains(t, k) {
			return true
		}
	}
	return false
}

// training: the optimizer, activation checkpointing, the loss and Liger's
// fused kernels.
func (m *rowMapper) training() {
	r := m.r
	if r.Optimizer == nil {
		m.lack("optimizer", "a training row needs an optimizer")
	} else {
		kvs := optimizerOf(*r.Optimizer, &m.lacks)
		if m.trainerDefaultFused(*r.Optimizer, kvs) {
			kvs = append(kvs, "optimizer.impl=fused")
		}
		for _, kv := range kvs {
			mustSet(m.rec, kv)
		}
	}
	switch ck := checkpointingOf(r.Checkpointing); ck {
	case "none":
	case "full":
		mustSet(m.rec, "checkpoint=full")
	case "selective-op":
		mustSet(m.rec, "checkpoint=selective-op")
	case "unknown":
		m.lack("activation_checkpointing", "the source does not say whether activations were checkpointed")
	default:
		m.lack("activation_checkpointing", "%q is not a checkpointing policy memplan models (none, full: every block, selective op: torchtitan's op-level policy)", r.Checkpointing)
	}
	if l := lossOf(r.Loss); l != "" {
		mustSet(m.rec, "loss="+l)
	}
	if ligerKernels(r) {
		mustSet(m.rec, "loss=fused-linear")
		mustSet(m.rec, "kernels.rms-norm=fused")
		mustSet(m.rec, "kernels.swiglu=fused")
	}
}

// parallel: the row's strategy as DP, ZeRO and offload.
func (m *rowMapper) parallel() {
	r, s := m.r, &m.s
	switch st := strings.ToLower(r.Parallel.Strategy); st {
	case "", "none":
		if r.GPUs > 1 {
			m.lack("parallel", "%d GPUs without a parallel strategy", r.GPUs)
		}
	case "ddp":
		s.DP = max(r.Parallel.Degree, 1)
	case "fsdp":
		// FULL_SHARD over the row's GPUs is ZeRO-3: with FSDP1 FlatParameters
		// when the recipe says so (fsdp.flat-params: frozen weights in a
		// trained unit get gradients, no_sync keeps unsharded gradients, the
		// root unit stays gathered), else per-parameter sharding (FSDP2's
		// fully_shard). The row's activation_checkpointing sets the
		// checkpointing above.
		s.DP, s.ZeRO = max(r.Parallel.Degree, r.GPUs, 1), 3
		if s.DP < 2 {
			m.lack("parallel", "FSDP over %d GPU shards nothing; the row names no degree", s.DP)
		}
	case "zero", "deepspeed":
		m.zero()
	default:
		m.lack("parallel", "strategy %q is not mapped (none, ddp, fsdp, zero)", r.Parallel.Strategy)
	}
}

// zero: DeepSpeed ZeRO, its stage and offload read from the details.
func (m *rowMapper) zero() {
	r, s := m.r, &m.s
	d := strings.ToLower(r.Parallel.Details)
	st := zeroStageRE.FindStringSubmatch(d)
	if st == nil {
		m.lack("parallel", "ZeRO without a stage in its details (want e.g. \"stage 2\")")
		return
	}
	s.DP = max(r.Parallel.Degree, r.GPUs, 1)
	if s.DP > 1 {
		s.ZeRO = int(st[1][0] - '0')
	}
	s.Offload.Optimizer = strings.Contains(d, "offload_optimizer") || strings.Contains(d, "optimizer offload")
	s.Offload.Params = strings.Contains(d, "offload_param") || strings.Contains(d, "parameter offload")
	if s.Offload.Params {
		s.Offload.Optimizer = false // parameter offload moves the optimizer too
	}
}

// peft: LoRA adapters, targeted in the framework's terms.
func (m *rowMapper) peft() {
	p := m.r.PEFT
	if p == nil {
		return
	}
	if !strings.EqualFold(p.Method, "lora") {
		m.lack("peft", "method %q is not modelled (lora)", p.Method)
		return
	}
	if m.s.Model == nil {
		return
	}
	l := &build.LoRA{Rank: p.R, Alpha: p.Alpha, Dropout: p.Dropout}
	if l.Alpha <= 0 {
		l.Alpha = float64(p.R)
	}
	if m.framework == "litgpt" {
		for _, msg := range litgptLoRA(m.s.Model.Family, l, p.Targets) {
			m.lack("peft.targets", "%s", msg)
		}
	} else {
		l.Targets = hfTargets(p.Targets)
	}
	m.s.LoRA = l
}

// quantization: NF4 4-bit base weights under LoRA (QLoRA).
func (m *rowMapper) quantization() {
	q := m.r.Quantization
	if q == nil {
		return
	}
	switch dq, ok := nf4Of(*q); {
	case !ok:
		m.lack("quantization", "%q is not modelled (NF4 4-bit base weights: bnb.nf4, bnb.nf4-dq, torchao NF4)", *q)
	default:
		m.s.QLoRA = true
		mustSet(m.rec, fmt.Sprintf("qlora.double-quant=%t", dq))
	}
	if m.s.QLoRA && m.s.LoRA == nil {
		m.lack("quantization", "4-bit base weights without LoRA adapters are not modelled")
	}
}

var (
	newTokensRE = regexp.MustCompile(`max_new_tokens\s*=\s*(\d{1,7})`)
	zeroStageRE = regexp.MustCompile(`(?:stage|zero)[\s_:=-]*([0-3])`)
)

// checkpointingOf reads activation checkpointing in the framework's words:
// none, full (every block), unknown, or the text itself.
func checkpointingOf(s string) string {
	t := strings.ToLower(strings.TrimSpace(s))
	switch t {
	case "", "none", "false", "off", "no", "disabled":
		return "none"
	case "full", "true", "on", "yes", "enabled", "gradient_checkpointing=true", "enable_activation_checkpointing: true":
		return "full"
	case "unknown":
		return "unknown"
	}
	if strings.HasPrefix(t, "selective op") || strings.Contains(t, "selective_ac_option='op'") || strings.Contains(t, "selective_ac_option=\"op\"") {
		return "selective-op"
	}
	return t
}

// lossOf reads a loss the row names that the recipe does not imply.
func lossOf(s *string) string {
	if s == nil {
		return ""
	}
	t := strings.ToLower(*s)
	if strings.Contains(t, "liger") || strings.Contains(t, "fused linear cross") || strings.Contains(t, "fused_linear_cross") {
		return "fused-linear"
	}
	return ""
}

// ligerKernels reports whether the row ran Liger's kernels through
// transformers (use_liger_kernel=True): fused linear cross-entropy and a
// fused RMSNorm among them.
func ligerKernels(r *Row) bool {
	t := strings.ToLower(r.Notes + " " + r.Precision + " " + r.FrameworkVersion)
	if r.Loss != nil {
		t += " " + strings.ToLower(*r.Loss)
	}
	return strings.Contains(t, "use_liger_kernel=true") || strings.Contains(t, "use_liger_kernel: true") || strings.Contains(t, "liger kernels")
}

// nf4Of reads a 4-bit NF4 quantisation and whether its constants are
// double-quantised (bnb.nf4-dq, bnb_4bit_use_double_quant, torchao's
// NF4Tensor with its int8 scalers).
func nf4Of(s string) (dq, ok bool) {
	t := strings.ToLower(strings.TrimSpace(s))
	if !strings.Contains(t, "nf4") {
		return false, false
	}
	return strings.Contains(t, "-dq") || strings.Contains(t, "double") || strings.Contains(t, "torchao"), true
}

// torchtuneTargets maps torchtune's module names to transformers' (the
// names memplan's builders use).
var torchtuneTargets = map[string]string{"output_proj": "o_proj", "w1": "gate_proj", "w2": "down_proj", "w3": "up_proj"}

func hfTargets(ts []string) []string {
	out := make([]string, 0, len(ts))
	for _, t := range ts {
		if n, ok := torchtuneTargets[t]; ok {
			t = n
		}
		if strings.EqualFold(t, "all") || strings.EqualFold(t, "all_linear") {
			t = "all-linear"
		}
		out = append(out, t)
	}
	return out
}

func mustSet(r *recipe.Recipe, kv string) {
	if err := r.Set(kv); err != nil {
		panic("" + err.Error()) // every value set here is valid
	}
}

func firstClause(s string) string {
	if i := strings.IndexAny(s, ";."); i > 0 {
		s = s[:i]
	}
	if len(s) > 120 {
		s = s[:120] + "…"
	}
	return strings.TrimSpace(s)
}

// precisionOf reads a precision in the framework's terms.
func precisionOf(s string) (ops.Precision, bool) {
	t := strings.NewReplacer(" ", "", "\"", "", "'", "", "--", "").Replace(strings.ToLower(s))
	t = strings.ReplaceAll(t, ":", "=")
	t = strings.ReplaceAll(t, "dtype=", "dtype: ")
	for _, c := range []struct {
		has string
		p   ops.Precision
	}{
		{"mixedprecisionpolicy", 255}, // FSDP2's bf16 compute over fp32 shards: not a row yet
		// A model loaded in 16 bits (from_pretrained torch_dtype) keeps its
		// parameters, gradients and AdamW state there, whatever autocast
		// the Trainer adds.
		{"torch_dtype: torch.bfloat16", ops.PureBF16}, {"torch_dtype: bfloat16", ops.PureBF16},
		{"torch_dtype: torch.float16", ops.PureFP16}, {"torch_dtype: float16", ops.PureFP16},
		// autocast's own dtype argument, then from_pretrained's as
		// transformers 5.x names it (dtype), before the Trainer's flags.
		{"autocast(dtype: torch.bfloat16)", ops.AMPBF16}, {"autocast(dtype: torch.float16)", ops.AMPFP16},
		{"dtype: torch.bfloat16", ops.PureBF16}, {"dtype: bfloat16", ops.PureBF16},
		{"dtype: torch.float16", ops.PureFP16}, {"dtype: float16", ops.PureFP16},
		{"bf16-true", ops.PureBF16}, {"16-true", ops.PureFP16},
		{"bf16-mixed", ops.AMPBF16}, {"16-mixed", ops.AMPFP16},
		{"dtype: bf16", ops.PureBF16}, {"dtype: fp16", ops.PureFP16}, {"dtype: fp32", ops.FP32},
		{"fp16=true", ops.AMPFP16}, {"bf16=true", ops.AMPBF16}, {"fp16true", ops.AMPFP16}, {"bf16true", ops.AMPBF16},
		{"amp-bf16", ops.AMPBF16}, {"amp-fp16", ops.AMPFP16},
		{"fp32", ops.FP32}, {"32-true", ops.FP32},
	} {
		if strings.Contains(t, c.has) {
			return c.p, c.p != 255
		}
	}
	p, err := ops.ParsePrecision(s)
	return p, err == nil
}

// optimizerOf reads an optimizer description ("torch.optim.AdamW (...)",
// "bitsandbytes.optim.PagedAdamW", "adamw_hf", ...) into switch settings.
func optimizerOf(s string, lacks *[]Lack) []string {
	t := strings.ToLower(s)
	t = strings.NewReplacer(" ", "", "_", "").Replace(t)
	has := func(x string) bool { return strings.Contains(t, x) }
	var out []string
	switch {
	case has("adamw4bit") || has("adam4bit"):
		out = append(out, "optimizer=adamw4bit-torchao")
	case has("torchao") && (has("adamw8bit") || has("adam8bit")):
		out = append(out, "optimizer=adamw8bit-torchao")
	case has("pagedadamw8bit") || has("pagedadam8bit"):
		out = append(out, "optimizer=adamw8bit", "optimizer.paged=true")
	case has("pagedadamw") || has("pagedadam"):
		out = append(out, "optimizer=adamw", "optimizer.paged=true")
	case has("adam8bit") || has("adamw8bit") || has("adamwbnb8bit"):
		out = append(out, "optimizer=adamw8bit")
	case has("adafactor"):
		out = append(out, "optimizer=adafactor")
	case has("adamwhf") || has("transformers.adamw"):
		// transformers.AdamW is a per-parameter loop.
		out = append(out, "optimizer=adamw", "optimizer.impl=single")
	case has("adamw"):
		out = append(out, "optimizer=adamw")
	case has("adam"):
		out = append(out, "optimizer=adam")
	case has("sgd") && has("momentum"):
		out = append(out, "optimizer=sgd-momentum")
	case has("sgd"):
		out = append(out, "optimizer=sgd")
	default:
		*lacks = append(*lacks, Lack{"optimizer", fmt.Sprintf("%q is not an optimizer memplan models (%s)", firstClause(s), strings.Join(lower.OptimizerNames(), ", "))})
		return nil
	}
	if has("optimizerinbwd") || has("optimizerinbackward") {
		out = append(out, "optimizer.in-backward=true")
	}
	switch {
	case has("fused=false"):
	case has("fused"): // fused=True, adamw_torch_fused, apex FusedAdam
		out = append(out, "optimizer.impl=fused")
	case has("foreach=false"):
		out = append(out, "optimizer.impl=single")
	case has("foreach=true"):
		out = append(out, "optimizer.impl=foreach")
	}
	return out
}

// litgptTargets maps litgpt's LoRA switches (lora_projection, lora_mlp)
// to each family's module names under litgpt's model code; lora_query,
// lora_key and lora_value adapt parts of the fused qkv linear (LoRA.QKV).
var litgptTargets = map[string]map[string][]string{
	models.FamilyGPTNeoX: {"projection": {"dense"}, "mlp": {"dense_h_to_4h", "dense_4h_to_h"}},
	models.FamilyGPT2:    {"projection": {"attn.c_proj"}, "mlp": {"c_fc", "mlp.c_proj"}},
	models.FamilyPhi:     {"projection": {"dense"}, "mlp": {"fc1", "fc2"}},
	"":                   {"projection": {"o_proj"}, "mlp": {"gate_proj", "up_proj", "down_proj"}},
}

// fusedQKVName is the fused qkv linear of a family under litgpt's code.
func fusedQKVName(family string) string {
	switch family {
	case models.FamilyGPTNeoX:
		return "query_key_value"
	case models.FamilyGPT2:
		return "c_attn"
	}
	return "qkv_proj"
}

func litgptLoRA(family string, l *build.LoRA, ts []string) (missing []string) {
	m, ok := litgptTargets[family]
	if !ok {
		m = litgptTargets[""]
	}
	var qkv [3]bool
	for _, t := range ts {
		switch k := strings.ToLower(t); k {
		case "query", "key", "value":
			qkv[slices.Index([]string{"query", "key", "value"}, k)] = true
			continue
		case "head":
			missing = append(missing, "LoRA on the LM head under litgpt's chunked head (lora_head) is not modelled")
			continue
		}
		names, ok := m[strings.ToLower(t)]
		if !ok {
			missing = append(missing, fmt.Sprintf("litgpt LoRA target %q is not mapped (query, key, value, projection, mlp)", t))
			continue
		}
		l.Targets = append(l.Targets, names...)
	}
	if qkv != [3]bool{} {
		l.Targets = append(l.Targets, fusedQKVName(family))
		l.QKV = &qkv
	}
	return missing
}

// Result is one row's prediction.
type Result struct {
	ID       string      `json:"id"`
	Metric   string      `json:"metric"`
	Outcome  string      `json:"outcome"`
	Measured units.Bytes `json:"measured_bytes"`
	// Predicted is the allocated peak over the first and the steady steps
	// (0 when the row is not expressible).
	Predicted units.Bytes `json:"predicted_bytes"`
	// RelError is (predicted − measured) / measured (ok rows only).
	RelError *float64 `json:"rel_error,omitempty"`
	// Fits is whether the job fits its GPU (nil without a GPU).
	Fits *bool `json:"fits,omitempty"`
	// Recipe is the recipe the row was mapped to.
	Recipe string `json:"recipe,omitempty"`
	// Lacks lists what memplan cannot express (the row is not predicted).
	Lacks []Lack `json:"lacks,omitempty"`
	// Bound says why the prediction is a range, Lower to Predicted, rather
	// than an estimate (such rows stay out of the headline).
	Bound string      `json:"bound,omitempty"`
	Lower units.Bytes `json:"lower_bytes,omitempty"`
	// Reserved is the caching allocator's reserved peak over the first and
	// the steady steps (reserved-type and nvidia-smi rows); Outside what
	// the process holds on the device outside it (nvidia-smi rows: the CUDA
	// context, cuBLAS's own workspaces before PyTorch 2.0, NCCL's buffers),
	// with OutsideSource citing the context's size. For these rows
	// Predicted is Reserved (+ Outside).
	Reserved      units.Bytes `json:"reserved_bytes,omitempty"`
	Outside       units.Bytes `json:"outside_bytes,omitempty"`
	OutsideSource string      `json:"outside_source,omitempty"`
	// Err is a planning error.
	Err        string `json:"error,omitempty"`
	Confidence string `json:"confidence"`
}

// Compared reports whether the row has a measured number to compare with.
func (r *Result) Compared() bool { return r.RelError != nil }

// Predict maps and plans one row.
func Predict(row *Row, dir string) Result {
	res := Result{ID: row.ID, Metric: row.Metric, Outcome: row.Outcome, Measured: row.MeasuredBytes(), Confidence: row.Confidence}
	spec, rec, lacks := row.Job(dir)
	if rec != nil {
		res.Recipe = rec.Name
	}
	if len(lacks) > 0 {
		res.Lacks = lacks
		return res
	}
	// Without pipelining, three micro-steps (first, between, last) peak as
	// any k >= 3 do (search.TestPropertySimAccumShowsPeak, and for FSDP1's
	// flat gradients engine.TestPropertyFSDPFlat): plan with three.
	if spec.PP < 2 && spec.Accum > 3 {
		spec.Accum = 3
	}
	pr, err := engine.PlanWith(*spec, engine.Options{NoTimeline: true})
	if err != nil {
		res.Err = err.Error()
		return res
	}
	peak := pr.Sim.Peak.Total
	if pr.First != nil && pr.First.Peak.Total > peak {
		peak = pr.First.Peak.Total
	}
	res.Predicted = peak
	if !row.Allocated() {
		if err := res.reserved(pr, spec, row); err != nil {
			res.Err = err.Error()
			return res
		}
		peak = res.Predicted
	}
	// A padded dataset of random samples has one batch of the longest
	// sample (seq), which the source forces into the first micro-step; the
	// rest are shorter, by how much the row does not say. Planning every
	// micro-step at seq bounds the run from above; the first micro-step
	// alone (the job with no accumulation) from below. Where the two differ
	// by more than 1%, the peak depends on the unknown lengths: the row gets
	// both bounds and stays out of the headline.
	if spec.Accum > 1 && row.Allocated() && variableLength(row.Notes) {
		one := *spec
		one.Accum = 1
		if p1, err := engine.PlanWith(one, engine.Options{NoTimeline: true}); err == nil {
			low := p1.Sim.Peak.Total
			if p1.First != nil && p1.First.Peak.Total > low {
				low = p1.First.Peak.Total
			}
			if float64(peak-low) > 0.01*float64(peak) {
				res.Lower = low
				res.Bound = fmt.Sprintf("between the first micro-step alone (%s) and every micro-step at the longest sample (%s): the peak falls in a later micro-step, whose random batch is shorter than seq %d by an amount the row does not give", low, peak, row.Seq)
			}
		}
	}
	if pr.Capacity > 0 {
		f := pr.Fits
		res.Fits = &f
	}
	if row.Outcome == OutcomeOK && res.Measured > 0 {
		e := float64(peak-res.Measured) / float64(res.Measured)
		res.RelError = &e
	}
	return res
}

// reserved predicts a reserved-type row as the allocator replay's reserved
// peak of the planned programs (first and steady steps) under the recipe's
// PYTORCH_CUDA_ALLOC_CONF, and an nvidia-smi row as that plus what the
// process holds outside the allocator (engine.Spec.OutsideAllocator).
func (res *Result) reserved(pr *engine.Result, spec *engine.Spec, row *Row) error {
	cfg, err := allocator.ParseConf(spec.Sem.AllocConf)
	if err != nil {
		return fmt.Errorf("allocator settings %q: %v", spec.Sem.AllocConf, err)
	}
	rv, err := pr.PredictReserved(cfg, false, false)
	if err != nil {
		return err
	}
	res.Reserved, res.Predicted = rv.Peak, rv.Peak
	if row.Metric == NvidiaSMI {
		res.Outside = spec.OutsideAllocator()
		res.Predicted += res.Outside
		res.OutsideSource = contextSourceOf(row, spec)
	}
	return nil
}

// contextSourceOf cites the CUDA context's size the row was predicted with.
func contextSourceOf(row *Row, spec *engine.Spec) string {
	gpu := ""
	if spec.GPU != nil {
		gpu = spec.GPU.Name
	}
	if _, src, ok := contextOf(EraOf(row), gpu); ok {
		return src
	}
	return "the " + spec.Sem.Recipe + " recipe's cuda.overhead"
}

// variableLength reports whether the notes describe batches of random,
// padded samples (so seq is the longest batch, not every batch).
func variableLength(notes string) bool {
	t := strings.ToLower(notes)
	return strings.Contains(t, "random") && (strings.Contains(t, "padded") || strings.Contains(t, "longest"))
}

// Summary aggregates compared rows.
type Summary struct {
	Rows int `json:"rows"`
	// Compared, Median and Worst cover allocated-type ok rows.
	Compared int     `json:"compared"`
	Median   float64 `json:"median_abs_rel_error"`
	Worst    float64 `json:"worst_abs_rel_error"`
	WorstID  string  `json:"worst_id,omitempty"`
	// ReservedCompared, ReservedMedian and ReservedWorst cover the
	// reserved-type and nvidia-smi ok rows, apart from the headline.
	ReservedCompared int     `json:"reserved_compared"`
	ReservedMedian   float64 `json:"reserved_median_abs_rel_error"`
	ReservedWorst    float64 `json:"reserved_worst_abs_rel_error"`
	ReservedWorstID  string  `json:"reserved_worst_id,omitempty"`
	// OOM rows predicted not to fit, of those predicted.
	OOMRight     int `json:"oom_right"`
	OOMPredicted int `json:"oom_predicted"`
	// Bounds are rows predicted as a range (Result.Bound); BoundsHold
	// counts those whose measurement lies in it (within 1%).
	Bounds     int `json:"bounds"`
	BoundsHold int `json:"bounds_hold"`
	// Lacking rows and planning errors.
	Lacking int `json:"lacking"`
	Errors  int `json:"errors"`
}

// Summarize computes the summary of results.
func Summarize(rs []Result) Summary {
	s := Summary{Rows: len(rs)}
	var alloc, reserved errStats
	for i := range rs {
		r := &rs[i]
		switch {
		case len(r.Lacks) > 0:
			s.Lacking++
		case r.Err != "":
			s.Errors++
		case r.Outcome == OutcomeOOM:
			s.OOMPredicted++
			if r.Fits != nil && !*r.Fits {
				s.OOMRight++
			}
		case r.Bound != "" && r.Compared():
			s.Bounds++
			if m := float64(r.Measured); m <= 1.01*float64(r.Predicted) && m >= 0.99*float64(r.Lower) {
				s.BoundsHold++
			}
		case r.Compared() && (r.Metric == MaxAllocated || r.Metric == ActivePeak):
			alloc.add(r)
		case r.Compared():
			reserved.add(r)
		}
	}
	s.Compared, s.Median, s.Worst, s.WorstID = alloc.summary()
	s.ReservedCompared, s.ReservedMedian, s.ReservedWorst, s.ReservedWorstID = reserved.summary()
	return s
}

// errStats collects |relative error|s and the worst row.
type errStats struct {
	errs    []float64
	worst   float64
	worstID string
}

func (e *errStats) add(r *Result) {
	x := math.Abs(*r.RelError)
	e.errs = append(e.errs, x)
	if x > e.worst {
		e.worst, e.worstID = x, r.ID
	}
}

// summary is the count, median, worst and worst row.
func (e *errStats) summary() (int, float64, float64, string) {
	n := len(e.errs)
	if n == 0 {
		return 0, 0, 0, ""
	}
	sort.Float64s(e.errs)
	med := e.errs[n/2]
	if n%2 == 0 {
		med = (e.errs[n/2-1] + e.errs[n/2]) / 2
	}
	return n, med, e.worst, e.worstID
}
