package build

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/memplan/memplan/ir"
	"github.com/memplan/memplan/units"
)

// LossKind is how a causal LM's loss is computed from the last hidden state.
type LossKind uint8

const (
	// LossFP32Logits is transformers' ForCausalLMLoss: the head's logits,
	// logits.float(), cross_entropy over [B·S, V] (log_softmax saves its
	// float32 output).
	LossFP32Logits LossKind = iota
	// LossNative is cross_entropy on the logits in their own dtype (no
	// upcast): litgpt's chunked_cross_entropy with lm_head_chunk_size=0.
	LossNative
	// LossChunked applies the head and cross_entropy chunk by chunk of the
	// sequence, so the logits of the whole batch never exist at once; each
	// chunk's log_softmax output is still saved for backward.
	LossChunked
	// LossFusedLinear is a fused linear cross-entropy (Liger-Kernel's
	// LigerFusedLinearCrossEntropy): the logits exist one chunk of tokens at a
	// time and only the gradients of the hidden states and the head are kept.
	LossFusedLinear
)

// Upcast says where a chunked loss's logits become float32.
type Upcast uint8

const (
	// UpcastNone: cross_entropy on the logits in their dtype.
	UpcastNone Upcast = iota
	// UpcastChunk: each chunk is cast inside the loss, right before its
	// cross_entropy (torchtune's CEWithChunkedOutputLoss).
	UpcastChunk
	// UpcastOutputs: every chunk is cast when the model returns, before the
	// loss runs (Lightning Fabric's precision.convert_output casts every
	// floating output to float32), so all float32 chunks exist together.
	UpcastOutputs
)

// Loss configures the loss of a causal LM.
type Loss struct {
	Kind LossKind
	// ChunkTokens is the number of tokens per chunk (litgpt's
	// lm_head_chunk_size=128); when 0, Chunks splits the sequence into that
	// many chunks (torchtune's num_output_chunks=8).
	ChunkTokens, Chunks int
	// Rows, when set, runs the head whole and only cross_entropy in chunks
	// of Rows rows of the flattened, shifted logits (litgpt 0.5
	// finetune/full.py: chunked_cross_entropy(logits[..., :-1, :],
	// targets[..., 1:]), chunk_size=128, litgpt/utils.py @v0.5.13).
	Rows int
	// Upcast is where chunks become float32.
	Upcast Upcast
}

// String is the form ParseLoss reads.
func (l Loss) String() string {
	switch l.Kind {
	case LossNative:
		return "native"
	case LossFusedLinear:
		return "fused-linear"
	case LossChunked:
		var sb strings.Builder
		sb.WriteString("chunked")
		if l.Rows > 0 {
			fmt.Fprintf(&sb, ":rows=%d", l.Rows)
		} else if l.ChunkTokens > 0 {
			fmt.Fprintf(&sb, ":tokens=%d", l.ChunkTokens)
		} else {
			fmt.Fprintf(&sb, ":chunks=%d", l.Chunks)
		}
		switch l.Upcast {
		case UpcastChunk:
			sb.WriteString(",fp32")
		case UpcastOutputs:
			sb.WriteString(",fp32-outputs")
		}
		return sb.String()
	}
	return "fp32-logits"
}

// ParseLoss reads fp32-logits, native, or chunked:tokens=N / chunked:chunks=N
// followed by ",fp32" (each chunk upcast in the loss) or ",fp32-outputs"
// (every chunk upcast when the model returns).
func ParseLoss(s string) (Loss, error) {
	t := strings.ToLower(strings.TrimSpace(s))
	switch t {
	case "", "fp32-logits", "hf":
		return Loss{}, nil
	case "native":
		return Loss{Kind: LossNative}, nil
	case "fused-linear", "liger":
		return Loss{Kind: LossFusedLinear}, nil
	}
	rest, ok := strings.CutPrefix(t, "chunked")
	if !ok {
		return Loss{}, fmt.Errorf("unknown loss %q (want fp32-logits, native, chunked:tokens=N[,fp32|,fp32-outputs], chunked:chunks=N[,...] or chunked:rows=N[,...])", s)
	}
	l := Loss{Kind: LossChunked, Chunks: 8}
	rest = strings.TrimPrefix(rest, ":")
	for _, kv := range strings.Split(rest, ",") {
		switch kv {
		case "":
			continue
		case "fp32":
			l.Upcast = UpcastChunk
			continue
		case "fp32-outputs":
			l.Upcast = UpcastOutputs
			continue
		}
		k, v, _ := strings.Cut(kv, "=")
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 || n > MaxTokens {
			return Loss{}, fmt.Errorf("loss %q: %s must be a positive integer", s, k)
		}
		switch k {
		case "tokens":
			l.ChunkTokens, l.Chunks, l.Rows = n, 0, 0
		case "chunks":
			l.Chunks, l.ChunkTokens, l.Rows = n, 0, 0
		case "rows":
			l.Rows, l.Chunks, l.ChunkTokens = n, 0, 0
		default:
			return Loss{}, fmt.Errorf("loss %q: unknown key %q (want tokens, chunks, rows, fp32 or fp32-outputs)", s, k)
		}
	}
	return l, nil
}

// fusedLinearLoss is Liger's lce_forward for a causal LM: the hidden states
// of all but the last position are made contiguous (hidden_states[..., :-1,
// :].contiguous(), a copy) and flattened, and the fused kernel takes them
// with the head weight (liger_kernel/transformers/model/llama.py lce_forward,
// v0.4).
func (m *builder) fusedLinearLoss(head string, x, w, labels ir.TensorID) {
	b := m.b
	B, S := m.bs()
	H := b.Shape(x)[2]
	defer b.Enter("loss")()
	xs := b.View("shift_hidden_states", x, B, S-1, H)
	xs = b.Copy("shift_hidden_states_contiguous", xs, B*(S-1), H)
	lab := b.View("shift_labels", labels, B*(S-1))
	b.FusedLinearCrossEntropy("fused_linear_cross_entropy", xs, w, lab)
}

// chunkedLoss applies the head weight w to x [B, S, H] chunk by chunk of
// the sequence, then cross_entropy per chunk, and sums the chunks' losses.
// The model returns the list of chunk logits before the loss runs, so every
// chunk's logits exist together (and, with UpcastOutputs, their float32
// copies); each chunk's log_softmax saves its output. The list is the
// model's output (Graph.Outputs): a loop that keeps it holds it through
// backward. The labels are shifted by one: the last chunk loses a position,
// and its logits slice [..., :-1, :] is not contiguous for B > 1, so
// reshape copies it (litgpt finetune/lora.py: logits[-1] =
// logits[-1][..., :-1, :]).
func (m *builder) chunkedLoss(head string, x, w, labels ir.TensorID) {
	b := m.b
	B, S := m.bs()
	V := int64(m.vocab)
	H := b.Shape(x)[2]
	step := S
	if m.o.Loss.Rows > 0 {
		step = S // the head runs whole; cross_entropy is chunked by rows below
	} else if c := m.o.Loss.ChunkTokens; c > 0 {
		step = min(int64(c), S)
	} else if n := int64(m.o.Loss.Chunks); n > 0 {
		step = (S + n - 1) / n // torch.chunk: equal chunks, the last smaller
	}
	var chunks []ir.TensorID
	var lens []int64
	func() {
		defer b.Enter(head)()
		bias := m.headBias()
		for i, start := 0, int64(0); start < S; i, start = i+1, start+step {
			n := min(step, S-start)
			xs := b.View(fmt.Sprintf("hidden_chunk%d", i), x, B, n, H)
			chunks = append(chunks, m.headLinear(fmt.Sprintf("logits_chunk%d", i), xs, w, bias))
			lens = append(lens, n)
		}
	}()
	if m.o.Loss.Upcast == UpcastOutputs {
		for i := range chunks {
			chunks[i] = b.To(chunks[i], units.F32)
		}
	}
	b.Graph().Outputs = append(b.Graph().Outputs, chunks...)
	defer b.Enter("loss")()
	total := ir.NoTensor
	for i, lg := range chunks {
		n := lens[i]
		rows := B * n
		if i == len(chunks)-1 && n > 1 {
			lg = b.View(fmt.Sprintf("logits_chunk%d_shifted", i), lg, B, n-1, V)
			rows = B * (n - 1)
			if B > 1 {
				lg = b.Copy(fmt.Sprintf("logits_chunk%d_flat", i), lg, rows, V)
			} else { // one sequence's slice is contiguous: reshape is a view
				lg = b.View(fmt.Sprintf("logits_chunk%d_flat", i), lg, rows, V)
			}
		} else {
			lg = b.View(fmt.Sprintf("logits_chunk%d_flat", i), lg, rows, V)
		}
		if m.o.Loss.Upcast == UpcastChunk {
			lg = b.To(lg, units.F32)
		}
		lab := b.View(fmt.Sprintf("labels_chunk%d", i), labels, rows)
		if r := int64(m.o.Loss.Rows); r > 0 {
			// logits.split(chunk_size) over the flattened rows, one
			// cross_entropy per split
			for j, start := 0, int64(0); start < rows; j, start = j+1, start+r {
				n := min(r, rows-start)
				l := b.CrossEntropy(fmt.Sprintf("cross_entropy_rows%d", j), b.View(fmt.Sprintf("logits_rows%d", j), lg, n, V), b.View(fmt.Sprintf("labels_rows%d", j), lab, n))
				total = m.addLoss(total, l, fmt.Sprintf("loss_sum_rows%d", j))
			}
			continue
		}
		l := b.CrossEntropy(fmt.Sprintf("cross_entropy_chunk%d", i), lg, lab)
		total = m.addLoss(total, l, fmt.Sprintf("loss_sum%d", i))
	}
	b.Graph().Loss = total
	// The loop holds the list of chunk logits while the loss function runs
	// (torchtune recipes/full_finetune_single_device.py @v0.6.1 _loss_step:
	// loss = self._loss_fn(logits, labels); del logits; litgpt keeps it
	// longer), so every chunk lives until the loss exists.
	b.Release(chunks...)
}

// addLoss sums chunk losses (the first is the total so far).
func (m *builder) addLoss(total, l ir.TensorID, name string) ir.TensorID {
	if total == ir.NoTensor {
		return l
	}
	return m.b.Binary("add", name, total, l)
}
