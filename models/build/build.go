// Package build turns a models.Arch into the forward ir.Graph of one
// micro-batch, op by op, as the HuggingFace transformers implementation of
// that family runs it in eager PyTorch. Module paths are the HF ones
// ("model.layers.3.self_attn"), so reports line up with what users see in
// their own code.
package build

import (
	"errors"
	"fmt"
	"math"
	"strconv"

	"github.com/memplan/memplan/ir"
	"github.com/memplan/memplan/models"
	"github.com/memplan/memplan/ops"
	"github.com/memplan/memplan/units"
)

// Attention selects the attention implementation.
type Attention uint8

const (
	// SDPA is torch.nn.functional.scaled_dot_product_attention on its
	// flash / memory-efficient path (HF attn_implementation="sdpa").
	SDPA Attention = iota
	// Eager is HF's eager attention: explicit scores, softmax, dropout.
	Eager
)

// ParseAttention reads "sdpa" (or "flash") and "eager".
func ParseAttention(s string) (Attention, error) {
	switch s {
	case "sdpa", "flash", "flash_attention_2":
		return SDPA, nil
	case "eager":
		return Eager, nil
	}
	return 0, fmt.Errorf("unknown attention %q (want eager or sdpa)", s)
}

func (a Attention) String() string {
	if a == Eager {
		return "eager"
	}
	return "sdpa"
}

// Options of one graph. MicroBatch and Seq must be positive.
type Options struct {
	MicroBatch int
	Seq        int
	Precision  ops.Precision
	Attention  Attention
	Device     ops.Device
	// Training builds autograd's saved tensors, dropout and the loss.
	Training bool
	// KVContext is the KV-cache length per sequence in inference (prompt
	// plus generated tokens); 0 means no cache.
	KVContext int

	// TP is the tensor-parallel degree t (Megatron-LM; 0 or 1: none). The
	// graph is one rank's: column-parallel q/k/v (or fused qkv) and
	// fc1/gate/up keep out/t features (heads/t and KV heads/t) behind the f
	// operator (identity forward, all-reduce of the input gradient);
	// row-parallel o_proj/fc2/down keep in/t features and all-reduce their
	// output (g; bias added after it, whole); the token embedding and the LM
	// head are vocab-parallel ([V/t, h], padded, see MakeVocabDivisibleBy)
	// and the loss is Megatron's vocab-parallel cross-entropy over [s,b,V/t]
	// logits. Norms, position embeddings and the MoE router are replicated.
	// t must divide heads, KV heads and the intermediate size. Decoder
	// families only.
	TP int
	// SP adds sequence parallelism (needs TP > 1 and t | Seq, training
	// only): outside the tensor-parallel regions the residual stream,
	// norms, dropouts and adds run on s/t tokens; an all-gather precedes
	// each column-parallel linear (which saves its sharded input and
	// gathers it again in backward) and a reduce-scatter follows each
	// row-parallel one.
	SP bool
	// MakeVocabDivisibleBy pads the vocabulary, under TP, to a multiple of
	// MakeVocabDivisibleBy·t (Megatron's --make-vocab-size-divisible-by,
	// whose default is 128). 0 pads only to a multiple of t, so a vocabulary
	// t divides is kept as it is.
	MakeVocabDivisibleBy int
	// EP is the expert-parallel degree for mixture-of-experts models (0 or
	// 1: none): each rank holds experts/EP experts; tokens go to them by an
	// all-to-all (group "ep") and come back by another. With data parallel
	// = EP each rank's T tokens make T·top_k·EP/experts rows per local
	// expert. EP must divide the expert count; not combined with TP.
	EP int
	// LoRA, when set, freezes every base parameter and adds trainable
	// low-rank adapters to the target linears (peft semantics and names).
	LoRA *LoRA
	// Loss is how a causal LM's loss is computed (the zero value:
	// transformers' float32 logits).
	Loss Loss
	// Code is whose modeling code runs the decoder (the zero value:
	// transformers').
	Code Code
	// FusedSwiGLU runs silu(gate) * up as one kernel that keeps only its
	// inputs (Liger's SwiGLU), instead of eager ops that also keep silu's
	// output.
	FusedSwiGLU bool
	// GroupedExperts runs a mixture's routed experts as transformers 5.x
	// does by default: two 3-D parameters per layer (gate_up_proj, down_proj)
	// and one grouped matmul over every routed row for each (see
	// groupedExperts), instead of 4.x's loop over per-expert linears.
	GroupedExperts bool
	// MLALatentCache caches multi-head latent attention's compressed
	// latent and its one rotary key in inference, and expands per-head keys
	// and values from the cache at every step (transformers 5.x's
	// DeepseekV2/V3Attention: cache.update(kv_nope, k_rot), then
	// expand_kv), instead of 4.x's cache of the expanded keys and values.
	MLALatentCache bool
	// HandSiLU runs SiLU as x * torch.sigmoid(x), as the CS336 course
	// models write it (cs336-basics/cs336_basics/model.py silu, the 2025
	// basics package vendored in assignment2-systems, e.g.
	// LJX2017/assignment2-systems @3778b997): sigmoid keeps its result and
	// the product keeps x and it, one more tensor of x's size than F.silu,
	// which keeps x.
	HandSiLU bool
	// HandSoftmax runs eager attention's softmax as exp(x - max) / sum, as
	// the course's cs336_basics/nn_utils.py softmax does: exp keeps its
	// result and the division keeps it and the row sums, max.dim its
	// indices, besides the probabilities the context matmul keeps (where
	// softmax keeps only them).
	HandSoftmax bool
	// RepeatKV copies grouped k and v to every query head before SDPA
	// (transformers' repeat_kv; SDPA's enable_gqa is used only from 4.54 on,
	// on PyTorch 2.5+ and without an attention mask).
	RepeatKV bool
	// EagerGELU runs gelu_new as transformers' NewGELUActivation, eager ops
	// that keep four tensors of the input's size, instead of one fused GELU
	// that keeps its input (Megatron, lit-gpt, torch.compile).
	EagerGELU bool
	// EagerRMSNorm runs RMSNorm as the modeling code's own eager ops
	// (transformers' LlamaRMSNorm: a float32 copy, pow, mean, rsqrt, two
	// products), instead of one fused kernel that saves its input and a
	// float32 rstd (apex FusedRMSNorm, Liger, Transformer Engine).
	EagerRMSNorm bool
	// RMSNormFP32Weight (with EagerRMSNorm) applies the weight to the
	// float32 normalised states and casts the product back, so the float32
	// normalised states are kept for the weight's gradient instead of their
	// cast (torch.nn.functional.rms_norm over a float32 copy, as torchtune
	// 0.5+'s RMSNorm calls it, run as composite ops on CPU; Gemma's norm;
	// litgpt 0.5's own RMSNorm, which it replaces under CodeLitGPT).
	RMSNormFP32Weight bool
	// MeanSavesInput: autograd keeps mean.dim's input (PyTorch 2.1), which
	// unfused RMSNorms (litgpt's) pay for with an x*x per norm.
	MeanSavesInput bool
	// QLoRA (with LoRA) stores every linear weight of the transformer body
	// as NF4 with double-quantised constants (bitsandbytes 4-bit, as
	// transformers' load_in_4bit, which leaves the LM head and classifier
	// alone); norms and embeddings stay in the parameter dtype.
	QLoRA bool
	// Quant says how the 4-bit base behaves (the zero value: bitsandbytes
	// >= 0.43.3 with double quantisation).
	Quant Quant
	// Layers, when set, builds only the decoder layers [Layers[0],
	// Layers[1]) of the stack (named by their index in the whole model),
	// with the embeddings before them and the final norm, head and loss
	// after: the part of the model a pipeline stage runs, plus the ends
	// that strategy.Pipeline places on the first and last stages. The zero
	// value builds every layer. Decoder families only.
	Layers [2]int
	// FSDPFlat (training with LoRA) builds the graph FSDP1 runs with
	// FlatParameters (use_orig_params=True): in every layer that holds a
	// trainable adapter, the frozen base weights are read through views of
	// the layer's FlatParameter, which requires grad, so autograd keeps
	// what their weight gradients need (fsdp.go). The weights themselves
	// stay frozen: strategy.ZeRO{Flat: true} adds their gradients.
	FSDPFlat bool
}

// ErrBadOptions wraps option errors.
var ErrBadOptions = errors.New("bad options")

// MaxTokens bounds micro-batch × sequence (and the KV context) so sizes
// never overflow int64.
const MaxTokens = 1 << 31

// MaxEagerScores bounds eager attention's score elements (micro-batch ×
// heads × sequence × context).
const MaxEagerScores = 1 << 56

// Graph builds the forward graph of a for one micro-batch.
func Graph(a *models.Arch, o Options) (*ir.Graph, error) {
	g, m, err := graph(a, o, nil)
	if err != nil || len(m.flatViews) == 0 {
		return g, err
	}
	return flatGraph(a, o, g, m)
}

// graph builds the graph; flatSkip names the layers (FSDPFlat) whose
// weights stay plain frozen parameters.
func graph(a *models.Arch, o Options, flatSkip map[string]bool) (*ir.Graph, *builder, error) {
	if err := a.Validate(); err != nil {
		return nil, nil, err
	}
	if o.MicroBatch <= 0 {
		return nil, nil, fmt.Errorf("%w: micro-batch must be positive, got %d", ErrBadOptions, o.MicroBatch)
	}
	if a.Family != models.FamilyViT && o.Seq <= 0 {
		return nil, nil, fmt.Errorf("%w: sequence length must be positive, got %d", ErrBadOptions, o.Seq)
	}
	if int64(o.MicroBatch)*int64(max(o.Seq, o.KVContext, 1)) > MaxTokens {
		return nil, nil, fmt.Errorf("%w: micro-batch × sequence = %d tokens is too large", ErrBadOptions, int64(o.MicroBatch)*int64(o.Seq))
	}
	if o.Attention == SDPA && o.Code == CodeHF && a.AttnLogitSoftcap > 0 {
		// SDPA cannot soft-cap attention logits: transformers refuses sdpa for
		// Gemma2 and runs it eagerly (Gemma2PreTrainedModel._supports_sdpa =
		// False, "sdpa does not support softcapping", transformers
		// src/transformers/models/gemma2/modeling_gemma2.py @v5.24.0; v4.46's
		// _check_and_enable_sdpa picked eager unless sdpa was asked for).
		o.Attention = Eager
	}
	ctx := int64(max(o.Seq, o.KVContext))
	if o.Attention == Eager && int64(o.MicroBatch)*int64(a.Heads)*int64(max(o.Seq, 1))*ctx > MaxEagerScores {
		return nil, nil, fmt.Errorf("%w: eager attention scores of %d × %d heads × %d × %d elements are too large", ErrBadOptions, o.MicroBatch, a.Heads, o.Seq, ctx)
	}
	if o.KVContext < 0 || (o.KVContext > 0 && o.KVContext < o.Seq) {
		return nil, nil, fmt.Errorf("%w: KV-cache context %d must be at least the sequence %d", ErrBadOptions, o.KVContext, o.Seq)
	}
	if err := checkParallel(a, &o); err != nil {
		return nil, nil, err
	}
	if o.Layers != [2]int{} {
		if a.Encoder {
			return nil, nil, fmt.Errorf("%w: a layer range is for decoder families, not %s", ErrBadOptions, a.Family)
		}
		if o.Layers[0] < 0 || o.Layers[0] >= o.Layers[1] || o.Layers[1] > a.Layers {
			return nil, nil, fmt.Errorf("%w: layer range [%d, %d) is not inside %s's %d layers", ErrBadOptions, o.Layers[0], o.Layers[1], a.Name, a.Layers)
		}
	} else {
		o.Layers = [2]int{0, a.Layers}
	}
	m := &builder{a: a, o: o, b: ops.NewBuilder(ops.Config{Precision: o.Precision, Device: o.Device, Training: o.Training}),
		tp: max(o.TP, 1), ep: max(o.EP, 1), vocab: a.Vocab, shardOf: map[ir.TensorID]ir.TensorID{}, flatSkip: flatSkip}
	if m.tp > 1 {
		m.vocab = paddedVocab(a.Vocab, m.tp, o.MakeVocabDivisibleBy)
	}
	if o.LoRA != nil {
		m.lora = newLoRAState(a, o.LoRA, o.Code)
	}
	// About what a decoder layer adds (measured on llama: 25 nodes, 40
	// tensors), and the ends.
	n := o.Layers[1] - o.Layers[0]
	m.b.Reserve(28*n+32, 44*n+64)
	switch a.Family {
	case models.FamilyBERT:
		m.bert()
	case models.FamilyViT:
		m.vit()
	default:
		m.decoder()
	}
	if m.retry {
		m = &builder{a: m.a, o: m.o, b: ops.NewBuilder(ops.Config{Precision: o.Precision, Device: o.Device, Training: o.Training}),
			tp: m.tp, ep: m.ep, vocab: m.vocab, shardOf: map[ir.TensorID]ir.TensorID{}, lora: m.lora, frozenPrefix: true, flatSkip: flatSkip}
		m.decoder()
	}
	if m.err != nil {
		return nil, nil, m.err
	}
	if m.lora != nil {
		if err := m.lora.unmatched(a, m.linearNames); err != nil {
			return nil, nil, err
		}
	}
	return m.b.Graph(), m, nil
}

type builder struct {
	a *models.Arch
	o Options
	b *ops.Builder
	// tp and ep are the parallel degrees (1: none); vocab is the
	// (padded, under TP) vocabulary.
	tp, ep, vocab int
	// shardOf maps a sequence-parallel all-gather's output to its shard.
	shardOf map[ir.TensorID]ir.TensorID
	lora    *loraState
	// err is an option the builder found it cannot honour.
	err error
	// qkvParts are the adapted parts of the fused qkv being built
	// (fusedQKVParts), nil otherwise.
	qkvParts []int64
	// headNF4 holds the LM head's 4-bit constants when the head is
	// quantised (Quant.Head).
	headNF4 *[2]ir.TensorID
	// linearNames are the leaf names of the linears LoRA can target, in
	// first-seen order.
	linearNames []string
	// A layer slice's input was assumed to require grad (assumedGrad);
	// retry when its layers turned out frozen, building again with
	// frozenPrefix.
	assumedGrad, retry, frozenPrefix bool
	// flatViews are the frozen weights built as views of a FlatParameter
	// that requires grad (FSDPFlat); flatSkip the layers left out.
	flatViews []ir.TensorID
	flatSkip  map[string]bool
	// fullRope is Gemma 3's second cos/sin pair, for its full-attention
	// layers, when hasFullRope.
	fullRope    [2]ir.TensorID
	hasFullRope bool
}

func (m *builder) bs() (int64, int64) { return int64(m.o.MicroBatch), int64(m.o.Seq) }

// linear registers weight (and bias) under the current scope and applies it
// (a replicated linear; see dense).
func (m *builder) linear(name string, x ir.TensorID, in, out int, bias bool) ir.TensorID {
	return m.dense(name, x, in, out, bias, replicated)
}

// param registers a base-model parameter: trainable, or frozen under LoRA.
func (m *builder) param(name string, shape ...int64) ir.TensorID {
	if m.lora != nil {
		if m.flatView() {
			id := m.b.Param(name, shape...)
			m.flatViews = append(m.flatViews, id)
			return id
		}
		if m.o.QLoRA && m.o.Quant.FP32Rest {
			// peft's prepare_model_for_kbit_training casts every
			// parameter that is not 4-bit to float32.
			return m.b.TypedFrozenParam(name, units.F32, shape...)
		}
		return m.b.FrozenParam(name, shape...)
	}
	return m.b.Param(name, shape...)
}

// norm applies the family's normalisation with its parameters.
func (m *builder) norm(name string, x ir.TensorID, dim int) ir.TensorID {
	defer m.b.Enter(name)()
	w := m.param("weight", int64(dim))
	if m.a.Norm == models.RMSNorm && m.o.Code == CodeLitGPT && !m.o.RMSNormFP32Weight {
		return m.litgptRMSNorm(x, w)
	}
	if m.a.Norm == models.RMSNorm && m.o.EagerRMSNorm {
		return m.hfRMSNorm(x, w)
	}
	if m.a.Norm == models.RMSNorm {
		return m.b.RMSNorm("out", x, w)
	}
	bi := ir.NoTensor
	if m.a.NormBias {
		bi = m.param("bias", int64(dim))
	}
	return m.b.LayerNorm("out", x, w, bi)
}

func (m *builder) act(name string, x ir.TensorID) ir.TensorID {
	switch m.a.Act {
	case "silu", "swish":
		if m.o.HandSiLU {
			return m.b.Binary("mul", name, x, m.b.Unary("sigmoid", name+".sigmoid", x))
		}
		return m.b.Unary("silu", name, x)
	case "relu":
		return m.b.Unary("relu", name, x)
	case "tanh":
		return m.b.Unary("tanh", name, x)
	}
	if m.a.Act == "gelu_new" && m.o.EagerGELU && m.o.Code == CodeHF {
		return m.newGELU(name, x)
	}
	// gelu, gelu_pytorch_tanh, ...: one fused GELU that saves its input
	// (nn.GELU / F.gelu(approximate="tanh")).
	return m.b.Unary("gelu", name, x)
}

// newGELU is transformers' NewGELUActivation (GPT-2's and Phi's gelu_new),
// eager ops: 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x +
// 0.044715 * torch.pow(x, 3.0)))) (transformers src/transformers/
// activations.py @v5.24.0, unchanged since v4.x). Autograd keeps x (pow's
// input), 0.5 * x and 1 + tanh (the last product's operands) and tanh's
// result: four tensors of x's size where a fused GELU keeps one.
func (m *builder) newGELU(name string, x ir.TensorID) ir.TensorID {
	b := m.b
	defer b.Enter(name)()
	half := b.Scale("half", x)
	inner := b.Scale("cube_scaled", b.Unary("pow2", "cube", x))
	inner = b.Scale("scaled", b.Binary("add", "sum", x, inner))
	onePlus := b.Scale("one_plus", b.Unary("tanh", "tanh", inner)) // 1.0 + t: add.Scalar saves nothing
	return b.Binary("mul", "out", half, onePlus)
}

// layerPrefix is the HF module path of the decoder stack.
func (m *builder) stackPath() (root, layers string) {
	switch m.a.Family {
	case models.FamilyGPT2, models.FamilyFalcon:
		return "transformer", "transformer.h"
	case models.FamilyGPTNeoX:
		return "gpt_neox", "gpt_neox.layers"
	}
	return "model", "model.layers"
}

// decoder builds a decoder-only model: input ids (and labels when
// training), embeddings, the rotary tables, the eager causal mask, the
// layers of the slice, the final norm, and the LM head with the loss.
func (m *builder) decoder() {
	a, b := m.a, m.b
	B, S := m.bs()
	ids := b.Input("input_ids", units.I64, B, S)
	var labels ir.TensorID
	if m.o.Training {
		labels = b.Input("labels", units.I64, B, S)
	}
	root, layers := m.stackPath()
	wte, x := m.embeddings(root, ids)
	cos, sin := m.rotaryTables(root, "")
	if n := a.SlidingWindowPattern; n > 1 && n <= a.Layers {
		// Gemma 3 with both layer types: one cos/sin pair per type
		// (Gemma3TextModel.forward, transformers
		// src/transformers/models/gemma3/modeling_gemma3.py @v5.24.0:
		// position_embeddings[layer_type] for set(config.layer_types));
		// the full-attention layers take the second.
		m.fullRope[0], m.fullRope[1] = m.rotaryTables(root, "_global")
		m.hasFullRope = true
	}
	var mask ir.TensorID
	if a.Family == models.FamilyFalcon {
		mask = m.falconMask(root)
	} else {
		mask = m.causalMask(root)
	}
	x = m.layerStack(layers, x, cos, sin, mask)
	x = m.finalNorm(root, x)
	if a.Family == models.FamilyFalcon && m.o.Attention == Eager {
		b.Release(mask) // FalconModel.forward's causal_mask lives until it returns
	}
	if !m.o.Training && m.o.KVContext > 0 {
		// Generation computes logits for the last position only.
		x = b.View("last_token", x, B, 1, int64(a.Hidden))
	}
	m.headAndLoss(x, wte, labels)
}

// embeddings are the token embedding (wte: its weight), GPT-2's learned
// positions, the embedding scale and dropout.
func (m *builder) embeddings(root string, ids ir.TensorID) (wte, x ir.TensorID) {
	a, b := m.a, m.b
	defer b.Enter(root)()
	embName := "embed_tokens"
	switch a.Family {
	case models.FamilyGPT2:
		embName = "wte"
	case models.FamilyGPTNeoX:
		embName = "embed_in"
	case models.FamilyFalcon:
		embName = "word_embeddings"
	}
	func() {
		defer b.Enter(embName)()
		wte, x = m.tokenEmbedding(ids, a.Family != models.FamilyGPT2)
	}()
	if a.Family == models.FamilyGPT2 {
		func() {
			defer b.Enter("wpe")()
			_, S := m.bs()
			wpe := m.param("weight", int64(a.MaxPositions), int64(a.Hidden))
			pos := b.Buffer("position_ids", units.I64, 1, S)
			pe := b.Embedding("out", wpe, pos)
			x = b.Binary("add", "embeds", x, pe)
		}()
		x = m.scatterSeq(x)
	}
	if a.EmbedScale {
		x = b.Scale("embed_scale", x)
	}
	x = b.Dropout(m.embedDropoutName(), x, a.EmbdDropout)
	return wte, x
}

// causalMask is eager attention's mask (ir.NoTensor for the fused kernels).
func (m *builder) causalMask(root string) ir.TensorID {
	a, b := m.a, m.b
	if m.o.Attention != Eager {
		return ir.NoTensor
	}
	defer b.Enter(root)()
	if a.Family == models.FamilyGPT2 {
		// GPT2Attention's registered bool buffer "bias" (max_positions²),
		// one per layer in HF but identical; where() saves a view of it.
		return b.Buffer("h.attn.bias", units.Bool, 1, 1, int64(a.MaxPositions), int64(a.MaxPositions))
	}
	// _prepare_4d_causal_attention_mask: a [B,1,S,S] additive mask
	// in the compute dtype, built once per forward.
	B, S := m.bs()
	return b.Zeros("causal_mask", m.computeDType(), B, 1, S, S)
}

// layerStack runs the layers of the slice (Options.Layers) over x.
//
// The layers before a slice are like its own: when the slice trains
// parameters, so do they, and the hidden state entering the slice requires
// grad even over frozen embeddings (LoRA). Graph builds again without the
// assumption when the slice trains none.
// afterStack is the room layerStack leaves for the nodes and tensors
// after the last layer: more than any head and loss builds (a few tens).
const afterStack = 256

func (m *builder) layerStack(layers string, x, cos, sin, mask ir.TensorID) ir.TensorID {
	b := m.b
	firstParam := len(b.Graph().Params)
	if m.o.Layers[0] > 0 && m.o.Training && !b.Tensor(x).RequiresGrad && !m.frozenPrefix {
		b.Tensor(x).RequiresGrad = true
		m.assumedGrad = true
	}
	g := b.Graph()
	for i := m.o.Layers[0]; i < m.o.Layers[1]; i++ {
		nodes, tensors := len(g.Nodes), len(g.Tensors)
		func() {
			defer b.Enter(layers + "." + strconv.Itoa(i))()
			c, s := cos, sin
			if n := m.a.SlidingWindowPattern; m.hasFullRope && (i+1)%n == 0 {
				c, s = m.fullRope[0], m.fullRope[1]
			}
			x = m.decoderLayer(i, x, c, s, mask)
		}()
		// Room for the rest at this layer's size: a mixture-of-experts
		// layer adds tens of times a dense one's nodes (deepseek-v3's
		// 256 experts), past Graph's reserve, and growing the lists
		// by doubling copied the graph again and again.
		// And room for what follows the stack (the final norm, the head
		// and the loss: tens of nodes), or the last of them copies it all
		// once more (0.45 s of deepseek-v3's plan).
		left := m.o.Layers[1] - 1 - i
		b.Reserve(left*(len(g.Nodes)-nodes)+afterStack, left*(len(g.Tensors)-tensors)+afterStack)
	}
	if m.assumedGrad {
		m.retry = true
		for _, id := range b.Graph().Params[firstParam:] {
			if b.Tensor(id).RequiresGrad {
				m.retry = false
				break
			}
		}
	}
	return x
}

// finalNorm is the norm after the last layer, under the family's name.
func (m *builder) finalNorm(root string, x ir.TensorID) ir.TensorID {
	defer m.b.Enter(root)()
	name := "norm"
	switch m.a.Family {
	case models.FamilyGPT2, models.FamilyFalcon:
		name = "ln_f"
	case models.FamilyGPTNeoX:
		name = "final_layer_norm"
	case models.FamilyPhi:
		name = "final_layernorm"
	}
	return m.norm(name, x, m.a.Hidden)
}

// headAndLoss is the LM head and, when training, the loss: chunk by chunk
// for a chunked or fused-linear loss (litgpt's lm_head_chunk_size,
// torchtune's num_output_chunks), else over the whole logits.
func (m *builder) headAndLoss(x, wte, labels ir.TensorID) {
	a := m.a
	headName := "lm_head"
	if a.Family == models.FamilyGPTNeoX {
		headName = "embed_out"
	}
	chunked := m.o.Training && m.tp <= 1 && a.FinalLogitSoftcap == 0 &&
		(m.o.Loss.Kind == LossChunked || m.o.Loss.Kind == LossFusedLinear && !a.LMHeadBias && !(m.o.QLoRA && m.o.Quant.Head))
	logits, w, err := m.lmHeadOf(headName, x, wte, chunked)
	if err != nil {
		m.err = err
		return
	}
	switch {
	case chunked && m.o.Loss.Kind == LossFusedLinear:
		m.fusedLinearLoss(headName, x, w, labels)
	case chunked:
		m.chunkedLoss(headName, x, w, labels)
	default:
		m.logitsOut(logits, x, labels)
	}
}

// lmHeadOf is the head's weight w (wte when tied; NF4 under QLoRA's head
// quantization) and, unless the loss is chunked, the logits (with a LoRA
// branch when LoRA targets the head).
func (m *builder) lmHeadOf(headName string, x, wte ir.TensorID, chunked bool) (logits, w ir.TensorID, err error) {
	a, b := m.a, m.b
	H := int64(a.Hidden)
	defer b.Enter(headName)()
	w = wte
	if !a.TieEmbeddings {
		if m.o.QLoRA && m.o.Quant.Head && m.tp <= 1 {
			w = b.TypedFrozenParam("weight", units.NF4, int64(m.vocab), H)
			absmax, nested := m.nf4Constants(int64(m.vocab) * H)
			m.headNF4 = &[2]ir.TensorID{absmax, nested}
		} else {
			w = m.param("weight", int64(m.vocab/m.tp), H)
		}
	}
	head := m.lora != nil && m.lora.matchesHead(b.Module())
	if head && (chunked || m.tp > 1) {
		return logits, w, fmt.Errorf("%w: LoRA on the LM head is modelled only with the whole-logits loss and no tensor parallelism", ErrBadOptions)
	}
	if !chunked {
		logits = m.lmHead(x, w)
		if head {
			m.noteLinear(headName)
			logits = m.loraBranch(x, logits, H, int64(m.vocab))
		}
	}
	return logits, w, nil
}

// logitsOut soft-caps the logits (Gemma 2), makes them the graph's output
// and, when training, computes the loss over them (vocab-parallel under
// tensor parallelism).
func (m *builder) logitsOut(logits, x, labels ir.TensorID) {
	b := m.b
	if m.a.FinalLogitSoftcap > 0 {
		logits = b.Scale("softcap.div", logits)
		logits = b.Unary("tanh", "softcap.tanh", logits)
		logits = b.Scale("softcap.mul", logits)
	}
	b.Graph().Outputs = append(b.Graph().Outputs, logits)
	if !m.o.Training {
		return
	}
	defer b.Enter("loss")()
	if m.tp > 1 {
		m.vocabParallelLoss(logits, labels)
		return
	}
	m.logitsLoss(logits, x, labels)
}

// logitsLoss is the loss over the whole logits, x being the hidden states
// the head read.
func (m *builder) logitsLoss(logits, x, labels ir.TensorID) {
	a, b := m.a, m.b
	B, S := m.bs()
	// transformers' ForCausalLMLoss: logits.float(), labels shifted by
	// padding, cross_entropy over [B*S, V]; LossNative keeps the dtype.
	lf := logits
	if m.o.Loss.Kind == LossFP32Logits {
		lf = b.To(logits, units.F32)
	}
	flat := b.View("logits_flat", lf, B*S, int64(a.Vocab))
	lab := b.View("labels_flat", labels, B*S)
	b.CrossEntropy("cross_entropy", flat, lab)
	// The logits live until the loss exists: transformers computes the loss
	// inside the model's forward (modeling_llama.py @v4.46.0
	// LlamaForCausalLM.forward: logits = self.lm_head(...); loss =
	// self.loss_function(logits, labels, ...); ForCausalLMLoss's logits =
	// logits.float() rebinds only its own argument), and a loop that computes
	// it holds its variable through the call. transformers' forward also
	// keeps the base model's output, and with it the last hidden state (the
	// final norm's output), in its locals until it returns.
	held := []ir.TensorID{logits}
	if m.o.Code == CodeHF {
		held = append(held, x)
	}
	b.Release(held...)
}

// rotaryTables makes the rotary cos and sin tables (unset without rotary
// positions: the callers read them only for rotary models). transformers computes them in every forward from position_ids,
// which default to cache_position.unsqueeze(0): [1, S, rd] in the hidden
// states' dtype, alive while a layer's rotary product keeps them for
// backward (modeling_llama.py @v4.46.0 LlamaModel.forward,
// LlamaRotaryEmbedding.forward: cos.to(dtype=x.dtype)). Otherwise they are
// resident tables of the batch's positions.
func (m *builder) rotaryTables(root, suffix string) (cos, sin ir.TensorID) {
	a, b := m.a, m.b
	if a.PosEmbedding != models.PosRotary {
		return cos, sin
	}
	B, S := m.bs()
	defer b.Enter(root + ".rotary_emb")()
	rd := int64(math.Round(float64(a.HeadDim) * rotaryFrac(a)))
	if m.o.Code == CodeHF && m.o.Training {
		return b.Zeros("cos"+suffix, b.ActDType(), 1, S, rd), b.Zeros("sin"+suffix, b.ActDType(), 1, S, rd)
	}
	return b.Buffer("cos"+suffix, b.ActDType(), B, S, rd), b.Buffer("sin"+suffix, b.ActDType(), B, S, rd)
}

func rotaryFrac(a *models.Arch) float64 {
	if a.RotaryPct > 0 {
		return a.RotaryPct
	}
	return 1
}

// computeDType is the dtype attention scores are produced in.
func (m *builder) computeDType() units.DType {
	if d := m.o.Precision.AutocastDType(); d != units.Invalid {
		return d
	}
	return m.o.Precision.ParamDType()
}

func (m *builder) decoderLayer(i int, x, cos, sin, mask ir.TensorID) ir.TensorID {
	a, b := m.a, m.b
	switch a.Family {
	case models.FamilyGPT2:
		h := m.norm("ln_1", x, a.Hidden)
		att := func() ir.TensorID { defer b.Enter("attn")(); return m.attention(i, h, cos, sin, mask) }()
		x = b.Binary("add", "residual1", x, att)
		h = m.norm("ln_2", x, a.Hidden)
		mlp := func() ir.TensorID { defer b.Enter("mlp")(); return m.mlp(h) }()
		return b.Binary("add", "residual2", x, mlp)
	case models.FamilyPhi:
		return m.phiLayer(i, x, cos, sin, mask)
	case models.FamilyFalcon:
		return m.falconLayer(i, x, cos, sin, mask)
	case models.FamilyDeepSeekV2, models.FamilyDeepSeekV3:
		return m.deepseekLayer(i, x, cos, sin, mask)
	case models.FamilyGPTNeoX:
		h1 := m.norm("input_layernorm", x, a.Hidden)
		att := func() ir.TensorID { defer b.Enter("attention")(); return m.attention(i, h1, cos, sin, mask) }()
		att = b.Dropout("post_attention_dropout", att, a.HiddenDropout)
		if a.ParallelResidual {
			h2 := m.norm("post_attention_layernorm", x, a.Hidden)
			mlp := func() ir.TensorID { defer b.Enter("mlp")(); return m.mlp(h2) }()
			mlp = b.Dropout("post_mlp_dropout", mlp, a.HiddenDropout)
			y := b.Binary("add", "mlp_plus_attn", mlp, att)
			return b.Binary("add", "residual", y, x)
		}
		x = b.Binary("add", "residual1", att, x)
		h2 := m.norm("post_attention_layernorm", x, a.Hidden)
		mlp := func() ir.TensorID { defer b.Enter("mlp")(); return m.mlp(h2) }()
		mlp = b.Dropout("post_mlp_dropout", mlp, a.HiddenDropout)
		return b.Binary("add", "residual2", mlp, x)
	}
	h := m.norm("input_layernorm", x, a.Hidden)
	att := func() ir.TensorID { defer b.Enter("self_attn")(); return m.attention(i, h, cos, sin, mask) }()
	if a.PostNorms {
		att = m.norm("post_attention_layernorm", att, a.Hidden)
	}
	att = b.Dropout("resid_attn_dropout", att, a.HiddenDropout)
	x = b.Binary("add", "residual1", x, att)
	pre := "post_attention_layernorm"
	if a.PostNorms {
		pre = "pre_feedforward_layernorm"
	}
	h = m.norm(pre, x, a.Hidden)
	var y ir.TensorID
	if a.NumExperts > 0 {
		block := "block_sparse_moe"
		if a.Family == models.FamilyQwen3MoE {
			block = "mlp" // Qwen3MoeDecoderLayer.mlp = Qwen3MoeSparseMoeBlock
		}
		y = func() ir.TensorID { defer b.Enter(block)(); return m.moe(h) }()
	} else {
		y = func() ir.TensorID { defer b.Enter("mlp")(); return m.mlp(h) }()
	}
	if a.PostNorms {
		y = m.norm("post_feedforward_layernorm", y, a.Hidden)
	}
	y = b.Dropout("resid_mlp_dropout", y, a.HiddenDropout)
	return b.Binary("add", "residual2", x, y)
}

// qkv projects h to q [B,A,S,D], k and v [B,KV,S,D] as views of the
// projection outputs, with the family's module names.
func (m *builder) qkv(h ir.TensorID) (q, k, v ir.TensorID) {
	a, b := m.a, m.b
	B, S := m.bs()
	A, KV, D := m.localHeads()
	// Full widths: dense divides column-parallel outputs by t.
	qd, kd := a.Heads*a.HeadDim, a.KVHeads*a.HeadDim
	switch a.Family {
	case models.FamilyBERT, models.FamilyViT:
		pre := "self."
		if a.Family == models.FamilyViT {
			pre = "attention."
		}
		qo := m.linear(pre+"query", h, a.Hidden, qd, true)
		ko := m.linear(pre+"key", h, a.Hidden, kd, true)
		vo := m.linear(pre+"value", h, a.Hidden, kd, true)
		return b.View("q", qo, B, A, S, D), b.View("k", ko, B, KV, S, D), b.View("v", vo, B, KV, S, D)
	}
	if a.FusedQKV || m.o.Code == CodeLitGPT {
		name := fusedQKVName(a)
		m.qkvParts = m.fusedQKVParts(qd, kd)
		if m.lora != nil {
			m.lora.fusedQKV = true
		}
		y := m.dense(name, h, a.Hidden, qd+2*kd, a.QKVBias, colPar)
		m.qkvParts = nil
		q = b.View("q", y, B, A, S, D)
		k = b.View("k", y, B, KV, S, D)
		v = b.View("v", y, B, KV, S, D)
		return q, k, v
	}
	qo := m.dense("q_proj", h, a.Hidden, qd, a.QKVBias, colPar)
	ko := m.dense("k_proj", h, a.Hidden, kd, a.QKVBias, colPar)
	vo := m.dense("v_proj", h, a.Hidden, kd, a.QKVBias, colPar)
	if a.QKNorm {
		qo = m.norm("q_norm", b.View("q_heads", qo, B, S, A, D), a.HeadDim)
		ko = m.norm("k_norm", b.View("k_heads", ko, B, S, KV, D), a.HeadDim)
	}
	return b.View("q", qo, B, A, S, D), b.View("k", ko, B, KV, S, D), b.View("v", vo, B, KV, S, D)
}

func (m *builder) attention(layer int, h, cos, sin, mask ir.TensorID) ir.TensorID {
	a, b := m.a, m.b
	B, S := m.bs()
	A, KV, D := m.localHeads()
	q, k, v := m.qkv(m.colIn(h))
	if a.PosEmbedding == models.PosRotary {
		q = b.Rotary("q_rot", q, cos, sin, m.rope())
		k = b.Rotary("k_rot", k, cos, sin, m.rope())
	}
	T := S
	if m.o.KVContext > 0 && !m.o.Training {
		// A sliding-window layer caches the window's tokens at most
		// (transformers' StaticSlidingWindowLayer: min(sliding_window,
		// max_cache_len), cache_utils.py @v5.24.0): every layer had
		// cached the whole context (physical sweep, round 24). But the
		// prompt's own states stay whole through prefill:
		// DynamicSlidingWindowLayer.update, generate()'s default, keeps
		// full_key_states[:, :, -sliding_window+1:, :], a view of the
		// prompt-long cat it returns, so that storage lives until the
		// next update (sweep E, round 25, measured with transformers
		// 5.24.0 on CPU: a 4-layer mistral config with a window of 32
		// held 262,144 B after a 2 × 128 prompt, 65,536 B after one
		// decode step). A sliding layer holds max(prompt, window) tokens
		// at most, never past the context.
		T = int64(m.o.KVContext)
		cached := T
		if a.SlidingLayer(layer) {
			cached = min(T, max(S, int64(a.SlidingWindow)))
		}
		kc := b.KVCache("k_cache", b.Tensor(k).DType, B, KV, cached, D)
		vc := b.KVCache("v_cache", b.Tensor(v).DType, B, KV, cached, D)
		kw, vw := b.CacheWrite(k, kc), b.CacheWrite(v, vc)
		if S <= cached {
			k, v, T = kw, vw, cached
		}
	}
	if m.o.Attention == SDPA && m.cpuMathSDPA() {
		if KV != A { // the math path repeats grouped heads (repeat_interleave)
			k = b.Copy("k_repeat", k, B, A, T, D)
			v = b.Copy("v_repeat", v, B, A, T, D)
		}
		return m.attentionOut(m.mathSDPA(q, k, v, T, !a.Encoder), true)
	}
	if m.o.Attention == SDPA {
		if m.o.RepeatKV && KV != A {
			// transformers' repeat_kv before SDPA: expand + reshape
			// copies k and v to every query head, and SDPA saves the
			// copies.
			k = b.Copy("k_repeat", k, B, A, T, D)
			v = b.Copy("v_repeat", v, B, A, T, D)
		}
		return m.attentionOut(b.SDPA("sdpa", q, k, v, !a.Encoder), m.qContiguous())
	}
	// Megatron's CoreAttention (from the q/k copies through the context
	// matmul), the region selective recompute replays.
	o := func() ir.TensorID {
		defer b.Enter("core_attention")()
		if KV != A { // repeat_kv materialises grouped heads
			k = b.Copy("k_repeat", k, B, A, T, D)
			v = b.Copy("v_repeat", v, B, A, T, D)
		}
		// matmul of permuted 4-D operands copies them to contiguous batches;
		// those copies are what bmm saves (REFERENCE.md).
		qc := b.Copy("q_contig", q, B, A, S, D)
		kt := b.Copy("k_t_contig", k, B, A, D, T)
		s := b.MatMul("scores", qc, kt)
		s = b.Scale("scale", s)
		if a.AttnLogitSoftcap > 0 {
			s = b.Scale("softcap.div", s)
			s = b.Unary("tanh", "softcap.tanh", s)
			s = b.Scale("softcap.mul", s)
		}
		if mask != ir.NoTensor {
			if a.Family == models.FamilyGPT2 {
				s = b.Where("masked", b.View("causal_mask", mask, 1, 1, S, T), s)
			} else {
				s = b.Binary("add", "masked", s, mask)
			}
		}
		var p ir.TensorID
		if m.o.HandSoftmax {
			p = m.handSoftmax(s)
		} else if a.Family == models.FamilyGPT2 || a.Encoder {
			p = b.Softmax("probs", s, false)
		} else {
			// softmax(dtype=torch.float32).to(query.dtype)
			p = b.To(b.Softmax("probs", b.To(s, units.F32), false), b.Tensor(s).DType)
		}
		p = b.Dropout("attn_dropout", p, a.AttnDropout)
		vc := b.Copy("v_contig", v, B, A, T, D)
		return b.MatMul("context", p, vc)
	}()
	return m.attentionOut(o, true)
}

// handSoftmax is the CS336 course's softmax over the last dimension
// (cs336-basics/cs336_basics/nn_utils.py softmax, the same in
// stanford-cs336/spring2024-assignment2-systems @79810fc5 and the 2025
// clones): x - torch.max(x, dim, keepdim=True)[0], torch.exp,
// division by torch.sum(..., keepdim=True). Under autocast exp and sum run
// in float32, so the probabilities are float32 like softmax(dtype=float32)'s.
func (m *builder) handSoftmax(s ir.TensorID) ir.TensorID {
	b := m.b
	z := b.Binary("sub", "softmax_shifted", s, b.MaxLast("softmax_max", s))
	e := b.Unary("exp", "softmax_exp", z)
	return b.Binary("div", "probs", e, b.ReduceLast("sum", "softmax_sum", e))
}

// qContiguous reports whether the query reaching attention is contiguous as
// [B, A, S, D] (rather than a transposed view of the projection's
// [B, S, A, D] output), so that SDPA's output, allocated like the query, is
// too. lit-gpt makes q by torch.cat; so do transformers' GPT-NeoX, Phi and
// Phi-3, whose apply_rotary_pos_emb concatenates the rotated and the passed
// dimensions (torch.cat([q_embed, q_pass], dim=-1), even when no dimension
// passes: transformers src/transformers/models/gpt_neox/modeling_gpt_neox.py,
// models/phi/modeling_phi.py PhiAttention.forward, models/phi3/modeling_phi3.py
// apply_rotary_pos_emb @v5.24.0).
func (m *builder) qContiguous() bool {
	if m.o.Code == CodeLitGPT {
		return true
	}
	if m.a.PosEmbedding != models.PosRotary {
		return false
	}
	switch m.a.Family {
	case models.FamilyGPTNeoX, models.FamilyPhi, models.FamilyPhi3:
		return true
	}
	return false
}

// cpuMathSDPA reports whether scaled_dot_product_attention runs its math
// path: on CPU kernels, the flash kernel refuses dropout
// (aten/src/ATen/native/transformers/sdp_utils_cpp.cpp use_flash_attention_cpp,
// check_for_dropout; measured on torch 2.14.1: dropout_p > 0 dispatches
// mul, bmm, _safe_softmax, dropout, bmm instead of
// _scaled_dot_product_flash_attention_for_cpu).
func (m *builder) cpuMathSDPA() bool {
	return m.o.Device == ops.CPU && m.o.Training && m.a.AttnDropout > 0
}

// mathSDPA is ATen's _scaled_dot_product_attention_math (aten/src/ATen/native/
// transformers/attention.cpp @v2.14.1) on q [B,A,S,D], k and v [B,A,T,D]:
// 16-bit inputs are computed in float32 (allow_fp16_bf16_reduction_math_sdp
// is off by default); q and k^T are scaled by sqrt(scale) each; matmul
// copies the transposed views transformers passes (its q, k and v are views
// of the projections' [B, S, A, D] outputs) and saves the copies; a causal
// call adds a float [S, T] bias built from tril(ones); softmax's output, the
// dropout mask (the input's dtype on CPU) and the dropped probabilities are
// saved; the attention weights are also returned cast to the input dtype (a
// transient nobody reads). The output is contiguous as [B, A, S, D].
func (m *builder) mathSDPA(q, k, v ir.TensorID, T int64, causal bool) ir.TensorID {
	b := m.b
	B, S := m.bs()
	A, _, D := m.localHeads()
	dt := b.Tensor(q).DType
	if ac := m.o.Precision.AutocastDType(); ac != units.Invalid {
		dt = ac // autocast runs SDPA in the lower precision (its lower_precision_fp list)
		q, k, v = b.To(q, dt), b.To(k, dt), b.To(v, dt)
	}
	q, k, v = b.To(q, units.F32), b.To(k, units.F32), b.To(v, units.F32)
	contig := m.qContiguous()
	qs := b.Scale("q_scaled", q)
	ks := b.Scale("k_t_scaled", b.View("k_t", k, B, A, D, T))
	if !contig {
		qs = b.Copy("q_contig", qs, B, A, S, D)
		ks = b.Copy("k_t_contig", ks, B, A, D, T)
	}
	s := b.MatMul("scores", qs, ks)
	if causal {
		s = b.Binary("add", "masked", s, b.Zeros("attn_bias", units.F32, S, T))
	}
	p := b.Softmax("probs", s, false)
	p = b.Dropout("attn_dropout", p, m.a.AttnDropout)
	if dt != units.F32 {
		b.To(p, dt)
	}
	o := b.MatMul("context", p, b.Copy("v_contig", v, B, A, T, D))
	return b.To(o, dt)
}

// attentionOut merges heads and applies the output projection (row-parallel
// under TP) and the family's dropout.
func (m *builder) attentionOut(o ir.TensorID, contiguous bool) ir.TensorID {
	a, b := m.a, m.b
	B, S := m.bs()
	A, _, D := m.localHeads()
	// attn_output.transpose(1, 2).contiguous().reshape(B, S, A*D). SDPA's
	// kernels allocate their output like q (empty_like of q's [B, S, A, D]
	// view): transformers' q is a transposed view of q_proj's [B, S, A, D]
	// output (rotary keeps the layout), so the output is [B, S, A, D] in
	// memory, the transpose is contiguous and nothing is copied. lit-gpt
	// makes q by torch.cat, contiguous as [B, A, S, D], so its output is
	// too and the reshape copies; so does eager attention's matmul.
	if contiguous {
		o = b.Copy("merge_heads", o, B, S, A, D)
	}
	o = b.View("merged", o, B, S, A*D)
	outName := "o_proj"
	switch a.Family {
	case models.FamilyGPT2:
		outName = "c_proj"
	case models.FamilyGPTNeoX, models.FamilyPhi, models.FamilyFalcon:
		outName = "dense"
	case models.FamilyBERT, models.FamilyViT:
		outName = "output.dense"
	}
	y := m.dense(outName, o, a.Heads*a.HeadDim, a.Hidden, a.OutBias || a.Encoder, rowPar)
	switch a.Family {
	case models.FamilyGPT2:
		y = b.Dropout("resid_dropout", y, a.HiddenDropout)
	case models.FamilyBERT, models.FamilyViT:
		y = b.Dropout("output.dropout", y, a.HiddenDropout)
	}
	return y
}

func (m *builder) mlp(h ir.TensorID) ir.TensorID {
	a, b := m.a, m.b
	I := a.Intermediate
	h = m.colIn(h)
	switch {
	case a.GatedMLP && a.FusedGateUp:
		gu := m.dense("gate_up_proj", h, a.Hidden, 2*I, a.MLPBias, colPar)
		sh := b.Shape(gu)
		sh[len(sh)-1] /= 2
		gate := b.View("gate", gu, sh...)
		up := b.View("up", gu, sh...)
		y := b.Binary("mul", "gated", m.act("act_fn", gate), up)
		return m.dense("down_proj", y, I, a.Hidden, a.MLPBias, rowPar)
	case a.GatedMLP:
		gate := m.dense("gate_proj", h, a.Hidden, I, a.MLPBias, colPar)
		up := m.dense("up_proj", h, a.Hidden, I, a.MLPBias, colPar)
		var y ir.TensorID
		if m.o.FusedSwiGLU && a.Act == "silu" {
			y = b.FusedSwiGLU("gated", gate, up)
		} else {
			y = b.Binary("mul", "gated", m.act("act_fn", gate), up)
		}
		return m.dense("down_proj", y, I, a.Hidden, a.MLPBias, rowPar)
	}
	fc, proj := "fc1", "fc2"
	switch a.Family {
	case models.FamilyGPT2:
		fc, proj = "c_fc", "c_proj"
	case models.FamilyGPTNeoX:
		fc, proj = "dense_h_to_4h", "dense_4h_to_h"
	}
	y := m.act("act", m.dense(fc, h, a.Hidden, I, a.MLPBias, colPar))
	y = m.dense(proj, y, I, a.Hidden, a.MLPBias, rowPar)
	if a.Family == models.FamilyGPT2 {
		y = b.Dropout("dropout", y, a.HiddenDropout)
	}
	return y
}

// groupedExperts is transformers 5.x's experts (MixtralExperts,
// Qwen3MoeExperts, DeepseekV3Experts: 3-D parameters gate_up_proj
// [experts, 2·I, H] and down_proj [experts, H, I]) as its default
// experts_implementation runs them: integrations/moe.py
// grouped_mm_experts_forward @v5.24.0 (modeling_utils.py
// get_correct_experts_implementation picks "grouped_mm" when none is
// asked for). Over the S = tokens·top_k routed rows: sort the expert ids
// (values and the permutation), gather the rows (perm // top_k) and their
// weights, count the rows per expert (histc over an int32 copy, cumsum to
// int32 offsets), one grouped matmul up, silu(gate) · up on its halves, one
// grouped matmul down, the routing weights applied, the inverse
// permutation (empty_like, arange, index_put_) and gather, and the sum over
// top_k. Autograd keeps the gathered rows, both matmuls' inputs and
// outputs, the gathered weights, the offsets and the three indices; the
// sorted ids, the int32 copy and the counts stay in locals until the
// function returns. A loss over these parameters gets whole [experts, …]
// gradients, and peft's all-linear and bitsandbytes' 4-bit layers, which
// take nn.Linear modules, leave them alone (and the router too: moe builds
// it as a parameter applied with F.linear). src is the [T, H] input, wts
// and idx the router's [T, K] weights and expert indices.
func (m *builder) groupedExperts(src, wts, idx ir.TensorID) ir.TensorID {
	a, b := m.a, m.b
	T := b.Shape(src)[0]
	H, E, K, I := int64(a.Hidden), int64(a.NumExperts), int64(a.ExpertsPerToken), int64(a.Intermediate)/int64(m.tp)
	S := T * K
	gateUp := m.param("gate_up_proj", E, 2*I, H)
	down := m.param("down_proj", E, H, I)
	ids := b.Index("expert_ids_g", idx, S) // torch.sort: values
	perm := b.Index("perm", idx, S)        // and the permutation
	rows := b.Index("token_idx", perm, S)  // perm // num_top_k
	x := b.IndexSelect("selected_hidden_states_g", src, rows, S)
	w := b.IndexSelect("sample_weights_g", b.View("sample_weights", wts, S, 1), perm, S)
	// histc's input: a float32 copy on CPU, int32 on CUDA (4 bytes either way).
	hin := b.IndexOf("histc_input", ids, units.I32, S)
	counts := b.IndexOf("tokens_per_expert", hin, units.I32, E)
	offs := b.IndexOf("offsets", counts, units.I32, E)
	up := b.GroupedMM("gate_up", b.To(x, b.Tensor(gateUp).DType), gateUp, offs)
	gate := b.View("gate", up, S, I)
	upv := b.View("up", up, S, I)
	y := b.Binary("mul", "gated", m.act("act_fn", gate), upv)
	y = b.GroupedMM("down_proj", b.To(y, b.Tensor(down).DType), down, offs)
	y = b.Binary("mul", "weighted_out", y, w)
	inv := b.Index("inv_perm", perm, S) // torch.empty_like(perm)
	b.Release(b.Index("arange", perm, S))
	y = b.IndexSelect("unpermuted", y, inv, S)
	out := b.SumDim("final_hidden_states", b.View("per_token", y, T, K, H), 1)
	b.Release(ids, hin, counts)
	return b.To(out, b.Tensor(src).DType)
}

// moe is MixtralSparseMoeBlock, and Qwen3MoeSparseMoeBlock (the same
// router, softmax in float32, top-k and per-expert gated MLPs; with
// norm_topk_prob the top-k weights are divided by their sum:
// transformers src/transformers/models/qwen3_moe/modeling_qwen3_moe.py
// Qwen3MoeTopKRouter @v5.24.0). Routing is assumed balanced: each expert
// receives tokens·top_k/experts rows (the expectation under the
// load-balancing objective); real routing varies per batch. Under TP the
// experts are column/row-parallel behind one f on their input and one g on
// the combined output; the router stays replicated. Under EP see moeEP.
func (m *builder) moe(h ir.TensorID) ir.TensorID {
	if m.ep > 1 {
		return m.moeEP(h)
	}
	a, b := m.a, m.b
	B, S := m.bs()
	H, E, K := int64(a.Hidden), int64(a.NumExperts), int64(a.ExpertsPerToken)
	T := B * S
	flat := b.View("hidden_flat", h, T, H)
	var logits ir.TensorID
	if m.o.GroupedExperts {
		// 5.x's router (MixtralTopKRouter, Qwen3MoeTopKRouter,
		// DeepseekV3TopkRouter) is a parameter applied with F.linear, not
		// an nn.Linear: peft's all-linear and 4-bit layers pass it by.
		func() {
			defer b.Enter("gate")()
			logits = m.baseLinear(flat, H, E, false, false)
		}()
	} else {
		logits = m.dense("gate", flat, a.Hidden, a.NumExperts, false, replicated)
	}
	probs := b.Softmax("routing_probs", b.To(logits, units.F32), false)
	wts, idx := b.TopK("topk", probs, K)
	if a.NormTopK {
		// router_top_value /= router_top_value.sum(dim=-1, keepdim=True):
		// the sum saves sizes only and the division both operands
		// (derivatives.yaml sum.dim_IntList, div.Tensor), which is what
		// mean and mul save, on the same [T, 1] and [T, K] shapes.
		sum := b.MeanLast("topk_sum", wts, false)
		wts = b.Binary("mul", "topk_norm", wts, sum)
	}
	wts = b.To(wts, b.Tensor(flat).DType)
	if m.o.GroupedExperts {
		acc := func() ir.TensorID { defer b.Enter("experts")(); return m.groupedExperts(m.colIn(flat), wts, idx) }()
		return b.View("out", m.rowOut(acc), B, S, H)
	}
	acc := b.Zeros("final_hidden_states", b.Tensor(flat).DType, T, H)
	rows := (T*K + E - 1) / E
	src := m.colIn(flat)
	for e := int64(0); e < E; e++ {
		func() {
			defer b.Enter("experts." + strconv.FormatInt(e, 10))()
			top := b.Index("top_x", idx, rows)
			cur := b.IndexSelect("current_state", src, top, rows)
			w1 := m.dense(m.expertLinear(0), cur, a.Hidden, a.Intermediate, false, colPar)
			w3 := m.dense(m.expertLinear(1), cur, a.Hidden, a.Intermediate, false, colPar)
			y := b.Binary("mul", "gated", m.act("act_fn", w1), w3)
			y = m.dense(m.expertLinear(2), y, a.Intermediate, a.Hidden, false, rowPartial)
			rw := b.IndexSelect("routing_weight", b.View("weights_flat", wts, T*K, 1), top, rows)
			y = b.Binary("mul", "weighted", y, rw)
			acc = b.IndexAdd("index_add", acc, top, y)
		}()
	}
	acc = m.rowOut(acc)
	return b.View("out", acc, B, S, H)
}
