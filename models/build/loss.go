package build

import (
	"fmt"
	"slices"
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

// lossNames are the losses without options, each with its aliases (the
// first is the name messages list).
var lossNames = []struct {
	names []string
	kind  LossKind
}{
	{[]string{"fp32-logits", "hf", ""}, LossFP32Logits},
	{[]string{"native"}, LossNative},
	{[]string{"fused-linear", "liger"}, LossFusedLinear},
}

// chunkSizes are the sizes a chunked loss takes one of (none: chunks=8,
// torchtune's num_output_chunks), chunkUpcasts where its chunks become
// float32 (none: cross_entropy in the logits' dtype). ParseLoss and
// LossForms read them.
var (
	chunkSizes = []struct {
		key string
		set func(l *Loss, n int)
	}{
		{"tokens", func(l *Loss, n int) { l.ChunkTokens = n }},
		{"chunks", func(l *Loss, n int) { l.Chunks = n }},
		{"rows", func(l *Loss, n int) { l.Rows = n }},
	}
	chunkUpcasts = []struct {
		name string
		up   Upcast
	}{{"fp32", UpcastChunk}, {"fp32-outputs", UpcastOutputs}}
)

// LossForms lists every form ParseLoss reads, for its messages and the
// loss switch's listing.
func LossForms() string {
	var forms []string
	for _, n := range lossNames {
		forms = append(forms, n.names[0])
	}
	sizes, ups := chunkOptions()
	return fmt.Sprintf("%s, or chunked[:OPTIONS], OPTIONS comma-separated: at most one of %s (default chunks=8) and at most one of %s",
		strings.Join(forms, ", "), strings.Join(sizes, ", "), strings.Join(ups, ", "))
}

// chunkOptions are the options of a chunked loss as written: its sizes
// (key=N) and its upcasts.
func chunkOptions() (sizes, ups []string) {
	for _, c := range chunkSizes {
		sizes = append(sizes, c.key+"=N")
	}
	for _, u := range chunkUpcasts {
		ups = append(ups, u.name)
	}
	return sizes, ups
}

// ParseLoss reads a loss (LossForms): fp32-logits, native, fused-linear, or
// chunked with options after a colon: one size (tokens=N, chunks=N, rows=N)
// and one upcast (",fp32": each chunk upcast in the loss; ",fp32-outputs":
// every chunk upcast when the model returns), in any order. A second size
// or upcast is refused naming both: the last one winning made
// "fp32,fp32-outputs" and "fp32-outputs,fp32" different losses.
func ParseLoss(s string) (Loss, error) {
	t := strings.ToLower(strings.TrimSpace(s))
	for _, n := range lossNames {
		if slices.Contains(n.names, t) {
			return Loss{Kind: n.kind}, nil
		}
	}
	l := Loss{Kind: LossChunked, Chunks: 8}
	if t == "chunked" {
		return l, nil
	}
	opts, ok := strings.CutPrefix(t, "chunked:")
	if !ok {
		return Loss{}, fmt.Errorf("unknown loss %q (want %s)", s, LossForms())
	}
	var size, up string // the options that set them
	for _, opt := range strings.Split(opts, ",") {
		k, v, valued := strings.Cut(opt, "=")
		if i := slices.IndexFunc(chunkUpcasts, func(u struct {
			name string
			up   Upcast
		}) bool {
			return u.name == k
		}); i >= 0 {
			if valued {
				return Loss{}, fmt.Errorf("loss %q: %s takes no value", s, k)
			}
			if up != "" {
				return Loss{}, lossTwice(s, up, opt, "upcasts in one place")
			}
			up, l.Upcast = opt, chunkUpcasts[i].up
			continue
		}
		i := slices.IndexFunc(chunkSizes, func(c struct {
			key string
			set func(l *Loss, n int)
		}) bool {
			return c.key == k
		})
		switch n, err := strconv.Atoi(v); {
		case opt == "":
			return Loss{}, fmt.Errorf("loss %q: an empty option (want %s)", s, LossForms())
		case i < 0:
			sizes, ups := chunkOptions()
			return Loss{}, fmt.Errorf("loss %q: unknown key %q (want %s or %s)", s, k, strings.Join(append(sizes, ups[:len(ups)-1]...), ", "), ups[len(ups)-1])
		case err != nil || n <= 0 || n > MaxTokens:
			return Loss{}, fmt.Errorf("loss %q: %s must be a positive integer", s, k)
		case size != "":
			return Loss{}, lossTwice(s, size, opt, "takes one of tokens, chunks, rows")
		default:
			size, l.Chunks = opt, 0
			chunkSizes[i].set(&l, n)
		}
	}
	return l, nil
}

// lossTwice refuses a second option a of the kind first set (a size or an
// upcast): the same key given twice, or two that contradict.
func lossTwice(s, first, second, rule string) error {
	k1, _, _ := strings.Cut(first, "=")
	if k2, _, _ := strings.Cut(second, "="); k1 == k2 {
		return fmt.Errorf("loss %q: %s and %s: %s is given twice", s, first, second, k1)
	}
	return fmt.Errorf("loss %q: %s and %s contradict: a chunked loss %s", s, first, second, rule)
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
