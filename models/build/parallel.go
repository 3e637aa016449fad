package build

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/memplan/memplan/ir"
	"github.com/memplan/memplan/models"
	"github.com/memplan/memplan/units"
)

// par is how a linear is split over the tensor-parallel group.
type par uint8

const (
	// replicated: every rank holds the whole weight (routers, heads of
	// encoders, anything under TP = 1).
	replicated par = iota
	// colPar: Megatron ColumnParallelLinear, out/t output features; its
	// input comes through colIn (f, or the sequence-parallel all-gather).
	colPar
	// rowPar: Megatron RowParallelLinear, in/t input features; the output is
	// all-reduced (g) or reduce-scattered (SP) and the bias added after.
	rowPar
	// rowPartial: row-parallel without the reduction (MoE experts, whose
	// partial sums are reduced once after the combine).
	rowPartial
)

// checkParallel validates the parallel and fine-tuning options against the
// architecture. Every error is one line naming the offending option.
func checkParallel(a *models.Arch, o *Options) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrBadOptions, fmt.Sprintf(format, args...))
	}
	// about is an option's refusal naming options as {tp}, {sp}, {ep},
	// {seq} (OptionError), so that a caller names them as its user does.
	about := func(option, format string, args ...any) error {
		return &OptionError{Option: option, Msg: fmt.Sprintf(format, args...)}
	}
	if o.TP < 0 {
		return bad("tensor-parallel degree must not be negative, got %d", o.TP)
	}
	if o.EP < 0 {
		return bad("expert-parallel degree must not be negative, got %d", o.EP)
	}
	if o.MakeVocabDivisibleBy < 0 {
		return bad("make-vocab-size-divisible-by must not be negative, got %d", o.MakeVocabDivisibleBy)
	}
	t := max(o.TP, 1)
	if o.SP && t <= 1 {
		return about("sp", "{sp} needs {tp} above 1, got %d", o.TP)
	}
	if t > 1 {
		if a.Encoder {
			return about("tp", "{tp} %d: tensor parallelism is modelled for decoder families only, not %s", t, a.Family)
		}
		for _, d := range []struct {
			name string
			v    int
		}{{"attention heads", a.Heads}, {"KV heads", a.KVHeads}, {"intermediate size", a.Intermediate},
			{"dense-layer intermediate size", a.DenseIntermediate}} {
			if d.v%t != 0 {
				return about("tp", "{tp} %d does not divide %s's %s (%d)", t, a.Name, d.name, d.v)
			}
		}
	}
	if o.SP {
		if !o.Training {
			return about("sp", "{sp}: sequence parallelism applies to training only")
		}
		if o.Seq%t != 0 {
			return about("sp", "{sp} needs {tp} %d to divide {seq} %d", t, o.Seq)
		}
		if a.IsMoE() {
			return about("sp", "{sp}: sequence parallelism with mixture-of-experts layers is not modelled")
		}
	}
	if ep := max(o.EP, 1); ep > 1 {
		if !a.IsMoE() {
			return about("ep", "{ep} %d: expert parallelism needs a mixture-of-experts model; %s is dense", ep, a.Name)
		}
		if a.NumExperts%ep != 0 {
			return about("ep", "{ep} %d does not divide %s's %d experts", ep, a.Name, a.NumExperts)
		}
		if t > 1 {
			return about("ep", "{ep} %d: expert parallelism together with {tp} is not modelled", ep)
		}
	}
	if o.QLoRA && o.LoRA == nil {
		return bad("QLoRA needs LoRA adapters (set LoRA)")
	}
	if o.LoRA != nil {
		if err := o.LoRA.validate(); err != nil {
			return err
		}
	}
	return nil
}

// paddedVocab is Megatron's _vocab_size_with_padding: the vocabulary rounded
// up to a multiple of divisibleBy·t (divisibleBy 0 counts as 1).
func paddedVocab(v, t, divisibleBy int) int {
	mult := max(divisibleBy, 1) * t
	return (v + mult - 1) / mult * mult
}

// localHeads are this rank's query heads, KV heads and head size.
func (m *builder) localHeads() (A, KV, D int64) {
	return int64(m.a.Heads / m.tp), int64(m.a.KVHeads / m.tp), int64(m.a.HeadDim)
}

func (m *builder) comm(kind ir.CommKind, group ir.Group, ranks int, x ir.TensorID) *ir.Comm {
	return &ir.Comm{Kind: kind, Bytes: m.b.Tensor(x).Bytes, Group: group, Ranks: ranks}
}

// seqShape is x's shape with the sequence dimension (1 of [B, S, ...])
// multiplied by num/den.
func (m *builder) seqShape(x ir.TensorID, num, den int64) []int64 {
	s := m.b.Shape(x)
	s[1] = s[1] * num / den
	return s
}

// colIn is the input side of a column-parallel region: f (identity forward,
// all-reduce of the input gradient) under TP, the sequence all-gather under
// SP (whose backward reduce-scatters). It returns x itself without TP.
func (m *builder) colIn(x ir.TensorID) ir.TensorID {
	if m.tp <= 1 {
		return x
	}
	b := m.b
	if m.o.SP {
		full := m.seqShape(x, int64(m.tp), 1)
		bytes := b.Tensor(x).DType.Size(numelOf(full))
		y := b.Collective("sp_all_gather", "sp_gather", x, full,
			&ir.Comm{Kind: ir.AllGather, Bytes: bytes, Group: ir.TensorGroup, Ranks: m.tp},
			&ir.Comm{Kind: ir.ReduceScatter, Bytes: bytes, Group: ir.TensorGroup, Ranks: m.tp})
		m.shardOf[y] = x
		return y
	}
	return b.Collective("tp_copy", "tp_f", x, nil, nil, m.comm(ir.AllReduce, ir.TensorGroup, m.tp, x))
}

// rowOut is the output side of a row-parallel region: g (all-reduce forward,
// identity backward) under TP, a reduce-scatter to s/t tokens under SP.
func (m *builder) rowOut(y ir.TensorID) ir.TensorID {
	if m.tp <= 1 {
		return y
	}
	b := m.b
	if m.o.SP {
		return b.Collective("sp_reduce_scatter", "sp_reduce_scatter", y, m.seqShape(y, 1, int64(m.tp)),
			m.comm(ir.ReduceScatter, ir.TensorGroup, m.tp, y), m.comm(ir.AllGather, ir.TensorGroup, m.tp, y))
	}
	return b.Collective("tp_all_reduce", "tp_g", y, nil, m.comm(ir.AllReduce, ir.TensorGroup, m.tp, y), nil)
}

// scatterSeq splits a replicated [B, S, H] tensor to this rank's s/t tokens
// under SP (Megatron's scatter_to_sequence_parallel_region: a contiguous
// copy of the slice; all-gather of the gradient in backward).
func (m *builder) scatterSeq(x ir.TensorID) ir.TensorID {
	if !m.o.SP {
		return x
	}
	return m.b.Collective("sp_split", "sp_split", x, m.seqShape(x, 1, int64(m.tp)), nil, m.comm(ir.AllGather, ir.TensorGroup, m.tp, x))
}

func numelOf(shape []int64) int64 {
	n := int64(1)
	for _, d := range shape {
		n *= d
	}
	return n
}

// tokenEmbedding registers the token embedding under the current scope and
// looks ids up. Under TP it is Megatron's VocabParallelEmbedding: [V/t, H]
// rows, ids shifted and masked into this rank's range (a copy the lookup
// saves), the partial result all-reduced — or, under SP when no position
// embedding is added afterwards (scatter), reduce-scattered to s/t tokens.
func (m *builder) tokenEmbedding(ids ir.TensorID, scatter bool) (w, x ir.TensorID) {
	b, H := m.b, int64(m.a.Hidden)
	w = m.param("weight", int64(m.vocab/m.tp), H)
	if m.tp <= 1 {
		return w, b.Embedding("out", w, ids)
	}
	masked := b.Copy("masked_input", ids)
	x = b.Embedding("out", w, masked)
	if m.o.SP && scatter {
		return w, m.rowOut(x)
	}
	return w, b.Collective("tp_all_reduce", "tp_g", x, nil, m.comm(ir.AllReduce, ir.TensorGroup, m.tp, x), nil)
}

// lmHead applies the output projection w to x. Under TP it is a
// column-parallel linear over the (padded) vocabulary that keeps its logits
// sharded ([B, S, V/t]); inference gathers them for sampling.
func (m *builder) lmHead(x, w ir.TensorID) ir.TensorID {
	b := m.b
	bias := m.headBias()
	if m.tp <= 1 {
		return m.headLinear("logits", x, w, bias)
	}
	xin := m.colIn(x)
	logits := b.Linear("logits", xin, w, bias)
	if shard, ok := m.shardOf[xin]; ok {
		b.SaveShard(shard, m.comm(ir.AllGather, ir.TensorGroup, m.tp, xin))
	}
	if !m.o.Training {
		full := b.Shape(logits)
		full[len(full)-1] *= int64(m.tp)
		logits = b.Collective("tp_all_gather", "logits_gathered", logits, full, &ir.Comm{Kind: ir.AllGather,
			Bytes: b.Tensor(logits).DType.Size(numelOf(full)), Group: ir.TensorGroup, Ranks: m.tp}, nil)
	}
	return logits
}

// headLinear applies the LM head (4-bit when Quant.Head quantised it).
func (m *builder) headLinear(name string, x, w, bias ir.TensorID) ir.TensorID {
	if q := m.headNF4; q != nil {
		return m.b.LinearNF4(name, x, w, q[0], q[1], bias, m.computeDType(), m.o.Quant.NF4)
	}
	return m.b.Linear(name, x, w, bias)
}

// vocabParallelLoss is Megatron's vocab_parallel_cross_entropy over the
// sharded logits (upcast to float32, as its calculate_logits_max does).
// Three all-reduces of one float32 per token (max, predicted logit, sum of
// exponentials) make its communication.
func (m *builder) vocabParallelLoss(logits, labels ir.TensorID) {
	b := m.b
	B, S := m.bs()
	lf := b.To(logits, units.F32)
	lab := b.View("labels_flat", labels, B*S)
	b.VocabParallelCrossEntropy("cross_entropy", lf, lab, &ir.Comm{Kind: ir.AllReduce, Bytes: units.F32.Size(3 * B * S), Group: ir.TensorGroup, Ranks: m.tp})
}

// dense is every linear of the model body: name is its module under the
// current scope, in and out the full (unsharded) feature counts, p its
// tensor-parallel split. It registers the weight (trainable, frozen under
// LoRA, NF4 under QLoRA), applies it, adds the LoRA branch when name is a
// target, and for rowPar reduces the output over the group and adds the
// (whole) bias after the reduction.
func (m *builder) dense(name string, x ir.TensorID, in, out int, bias bool, p par) ir.TensorID {
	b := m.b
	inL, outL := int64(in), int64(out)
	switch p {
	case colPar:
		outL /= int64(m.tp)
	case rowPar, rowPartial:
		inL /= int64(m.tp)
	}
	// Megatron adds a row-parallel bias once, after the reduction.
	lateBias := bias && p == rowPar && m.tp > 1
	var y ir.TensorID
	func() {
		defer b.Enter(name)()
		m.noteLinear(name)
		target := m.lora != nil && m.lora.matches(b.Module(), name)
		func() {
			if target {
				defer b.Enter("base_layer")()
			}
			y = m.baseLinear(x, inL, outL, bias && !lateBias, !m.o.Quant.TargetsOnly || target)
		}()
		if target {
			y = m.loraBranch(x, y, inL, outL)
		}
	}()
	if p != rowPar {
		return y
	}
	y = m.rowOut(y)
	if lateBias {
		func() {
			defer b.Enter(name)()
			y = b.Binary("add", "bias_add", y, m.param("bias", int64(out)))
		}()
	}
	return y
}

// baseLinear registers and applies the weight of a linear in the current
// scope.
// quantised says whether QLoRA makes this one 4-bit (Quant.TargetsOnly
// quantises only the adapted linears).
func (m *builder) baseLinear(x ir.TensorID, in, out int64, bias, quantised bool) ir.TensorID {
	b := m.b
	if m.o.QLoRA && quantised {
		w := b.TypedFrozenParam("weight", units.NF4, out, in)
		absmax, nested := m.nf4Constants(out * in)
		bi := ir.NoTensor
		if bias {
			bi = m.param("bias", out)
		}
		return b.LinearNF4("out", x, w, absmax, nested, bi, m.computeDType(), m.o.Quant.NF4)
	}
	w := m.param("weight", out, in)
	bi := ir.NoTensor
	if bias {
		bi = m.param("bias", out)
	}
	y := b.Linear("out", x, w, bi)
	if shard, ok := m.shardOf[x]; ok {
		b.SaveShard(shard, m.comm(ir.AllGather, ir.TensorGroup, m.tp, x))
	}
	return y
}

// NF4 double quantisation (Dettmers et al., "QLoRA", 2023, §2): one 8-bit
// absmax per 64-value block, and those absmax values quantised again with
// one float32 constant per 256 of them: 8/64 + 32/(64·256) = 0.127 bits per
// parameter on top of the 4-bit codes. bitsandbytes also keeps two small
// per-tensor code tables and an offset (about 1 KiB a tensor), left out here.
const (
	nf4Block       = 64
	nf4NestedBlock = 256
)

// Without double quantisation (bnb.nf4, compress_statistics=False) each
// block keeps a float32 absmax: 32/64 = 0.5 bits per parameter.
func (m *builder) nf4Constants(n int64) (absmax, nested ir.TensorID) {
	blocks := (n + nf4Block - 1) / nf4Block
	if m.o.Quant.NoDoubleQuant {
		return m.b.QuantState("weight.absmax", units.F32, blocks), ir.NoTensor
	}
	nb := (blocks + nf4NestedBlock - 1) / nf4NestedBlock
	return m.b.QuantState("weight.absmax", units.U8, blocks), m.b.QuantState("weight.nested_absmax", units.F32, nb)
}

// moeEP is the MoE block under expert parallelism (Megatron's all-to-all
// token dispatcher): the router runs on this rank's T tokens; their top_k
// copies are permuted by expert, exchanged with an all-to-all over the "ep"
// group, processed by this rank's experts/EP experts — each gets
// T·top_k·EP/experts rows, balanced routing assumed, with data parallel =
// EP — sent back by a second all-to-all, weighted by the routing
// probabilities and summed per token.
func (m *builder) moeEP(h ir.TensorID) ir.TensorID {
	a, b := m.a, m.b
	B, S := m.bs()
	H, E, K, ep := int64(a.Hidden), int64(a.NumExperts), int64(a.ExpertsPerToken), int64(m.ep)
	T := B * S
	local := E / ep
	rows := (T*K*ep + E - 1) / E
	flat := b.View("hidden_flat", h, T, H)
	logits := m.dense("gate", flat, a.Hidden, a.NumExperts, false, replicated)
	probs := b.Softmax("routing_probs", b.To(logits, units.F32), false)
	wts, idx := b.TopK("topk", probs, K)
	wts = b.To(wts, b.Tensor(flat).DType)
	perm := b.Index("permutation", idx, T*K)
	sent := b.IndexSelect("permuted_tokens", flat, perm, T*K)
	recvShape := []int64{local * rows, H}
	recv := b.Collective("all_to_all", "dispatch", sent, recvShape, m.comm(ir.AllToAll, ir.ExpertGroup, m.ep, sent),
		&ir.Comm{Kind: ir.AllToAll, Bytes: b.Tensor(flat).DType.Size(numelOf(recvShape)), Group: ir.ExpertGroup, Ranks: m.ep})
	outs := make([]ir.TensorID, 0, local)
	for e := int64(0); e < local; e++ {
		func() {
			defer b.Enter("experts." + strconv.FormatInt(e, 10))()
			cur := b.View("tokens", recv, rows, H) // torch.split of the received rows
			w1 := m.dense(m.expertLinear(0), cur, a.Hidden, a.Intermediate, false, replicated)
			w3 := m.dense(m.expertLinear(1), cur, a.Hidden, a.Intermediate, false, replicated)
			y := b.Binary("mul", "gated", m.act("act_fn", w1), w3)
			outs = append(outs, m.dense(m.expertLinear(2), y, a.Intermediate, a.Hidden, false, replicated))
		}()
	}
	y := outs[0]
	if len(outs) > 1 {
		y = b.Cat("expert_outputs", 0, outs...)
	}
	back := b.Collective("all_to_all", "combine", y, []int64{T * K, H}, m.comm(ir.AllToAll, ir.ExpertGroup, m.ep, y),
		&ir.Comm{Kind: ir.AllToAll, Bytes: b.Tensor(flat).DType.Size(T * K * H), Group: ir.ExpertGroup, Ranks: m.ep})
	back = b.Binary("mul", "weighted", back, b.View("weights_flat", wts, T*K, 1))
	acc := b.Zeros("final_hidden_states", b.Tensor(flat).DType, T, H)
	acc = b.IndexAdd("unpermute", acc, perm, back)
	return b.View("out", acc, B, S, H)
}

// OptionError is a parallel option refused against the architecture. Msg
// names options as {key} (tp, sp, ep, seq: the keys of engine's fields),
// which Error words as this package does; engine turns it into a field
// error, so the CLI names --tp and a job file tp.
type OptionError struct {
	Option, Msg string
}

// optionWords are the words Error uses for an option.
var optionWords = strings.NewReplacer("{tp}", "tensor parallelism", "{sp}", "sequence parallelism", "{ep}", "expert parallelism", "{seq}", "sequence length")

func (e *OptionError) Error() string {
	return ErrBadOptions.Error() + ": " + optionWords.Replace(e.Msg)
}

// Unwrap makes an OptionError a bad option (errors.Is ErrBadOptions).
func (e *OptionError) Unwrap() error { return ErrBadOptions }
