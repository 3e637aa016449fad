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
)

// Loss configures the loss of a causal LM.
type Loss struct {
	Kind LossKind
	// ChunkTokens is the number of tokens per chunk (litgpt's
	// lm_head_chunk_size=128); when 0, Chunks splits the sequence into that
	// many chunks (torchtune's num_output_chunks=8).
	ChunkTokens, Chunks int
	// Upcast casts each chunk's logits to float32 before cross_entropy
	// (torchtune's CEWithChunkedOutputLoss); litgpt does not.
	Upcast bool
}

// String is the form ParseLoss reads.
func (l Loss) String() string {
	switch l.Kind {
	case LossNative:
		return "native"
	case LossChunked:
		var sb strings.Builder
		sb.WriteString("chunked")
		if l.ChunkTokens > 0 {
			fmt.Fprintf(&sb, ":tokens=%d", l.ChunkTokens)
		} else {
			fmt.Fprintf(&sb, ":chunks=%d", l.Chunks)
		}
		if l.Upcast {
			sb.WriteString(",fp32")
		}
		return sb.String()
	}
	return "fp32-logits"
}

// ParseLoss reads fp32-logits, native, or chunked:tokens=N[,fp32] /
// chunked:chunks=N[,fp32].
func ParseLoss(s string) (Loss, error) {
	t := strings.ToLower(strings.TrimSpace(s))
	switch t {
	case "", "fp32-logits", "hf":
		return Loss{}, nil
	case "native":
		return Loss{Kind: LossNative}, nil
	}
	rest, ok := strings.CutPrefix(t, "chunked")
	if !ok {
		return Loss{}, fmt.Errorf("build: unknown loss %q (want fp32-logits, native, chunked:tokens=N[,fp32] or chunked:chunks=N[,fp32])", s)
	}
	l := Loss{Kind: LossChunked, Chunks: 8}
	rest = strings.TrimPrefix(rest, ":")
	for _, kv := range strings.Split(rest, ",") {
		if kv == "" {
			continue
		}
		if kv == "fp32" {
			l.Upcast = true
			continue
		}
		k, v, _ := strings.Cut(kv, "=")
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 || n > maxTokens {
			return Loss{}, fmt.Errorf("build: loss %q: %s must be a positive integer", s, k)
		}
		switch k {
		case "tokens":
			l.ChunkTokens, l.Chunks = n, 0
		case "chunks":
			l.Chunks, l.ChunkTokens = n, 0
		default:
			return Loss{}, fmt.Errorf("build: loss %q: unknown key %q (want tokens, chunks or fp32)", s, k)
		}
	}
	return l, nil
}

// chunkedLoss applies the head weight w to x [B, S, H] chunk by chunk of
// the sequence and sums the chunks' cross_entropy. Each chunk's head saves
// its slice of x (a view) and its log_softmax saves its output; the chunk's
// logits (and float32 copy) die when its log_softmax has run. The labels
// are shifted by one: the last chunk loses a position, and its logits slice
// [..., :-1, :] is not contiguous, so reshape copies it (litgpt finetune
// lora.py: logits[-1] = logits[-1][..., :-1, :]).
func (m *builder) chunkedLoss(head string, x, w, labels ir.TensorID) {
	b := m.b
	B, S := m.bs()
	V := int64(m.vocab)
	H := b.Shape(x)[2]
	step := S
	if c := m.o.Loss.ChunkTokens; c > 0 {
		step = min(int64(c), S)
	} else if n := int64(m.o.Loss.Chunks); n > 0 {
		step = (S + n - 1) / n // torch.chunk: equal chunks, the last smaller
	}
	var total ir.TensorID = ir.NoTensor
	bias := func() ir.TensorID { defer b.Enter(head)(); return m.headBias() }()
	for i, start := 0, int64(0); start < S; i, start = i+1, start+step {
		n := min(step, S-start)
		xs := b.View(fmt.Sprintf("hidden_chunk%d", i), x, B, n, H)
		var lg ir.TensorID
		func() {
			defer b.Enter(head)()
			lg = b.Linear(fmt.Sprintf("logits_chunk%d", i), xs, w, bias)
		}()
		b.Graph().Outputs = append(b.Graph().Outputs, lg)
		func() {
			defer b.Enter("loss")()
			rows := B * n
			if start+n == S && n > 1 {
				// One sequence's slice is contiguous: reshape is a view.
				lg = b.View(fmt.Sprintf("logits_chunk%d_shifted", i), lg, B, n-1, V)
				rows = B * (n - 1)
				if B > 1 {
					lg = b.Copy(fmt.Sprintf("logits_chunk%d_flat", i), lg, rows, V)
				} else {
					lg = b.View(fmt.Sprintf("logits_chunk%d_flat", i), lg, rows, V)
				}
			} else {
				lg = b.View(fmt.Sprintf("logits_chunk%d_flat", i), lg, rows, V)
			}
			if m.o.Loss.Upcast {
				lg = b.To(lg, units.F32)
			}
			lab := b.View(fmt.Sprintf("labels_chunk%d", i), labels, rows)
			l := b.CrossEntropy(fmt.Sprintf("cross_entropy_chunk%d", i), lg, lab)
			if total == ir.NoTensor {
				total = l
			} else {
				total = b.Binary("add", fmt.Sprintf("loss_sum%d", i), total, l)
			}
		}()
	}
	b.Graph().Loss = total
}

// Quant is how QLoRA's 4-bit base layers behave, where bitsandbytes versions
// and framework options differ.
type Quant struct {
	// SavesInput: bitsandbytes <= 0.43.2 saved every 4-bit linear's input
	// for backward (MatMul4Bit ctx.tensors = (A, B); fixed by
	// bitsandbytes #1270 in 0.43.3).
	SavesInput bool
	// NoDoubleQuant keeps one float32 absmax per 64-value block
	// (bnb.nf4, compress_statistics=False) instead of 8-bit absmax with
	// float32 constants per 256 blocks (bnb.nf4-dq).
	NoDoubleQuant bool
}
