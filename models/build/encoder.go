package build

import (
	"strconv"

	"github.com/memplan/memplan/ir"
	"github.com/memplan/memplan/units"
)

// defaultLabels is the classification head used to train an encoder whose
// checkpoint has none (BertModel): BertForSequenceClassification's default
// num_labels = 2.
const defaultLabels = 2

// classify applies the sequence-classification head and, when training, the
// cross-entropy loss over [B] labels.
func (m *builder) classify(pooled ir.TensorID) {
	a, b := m.a, m.b
	B, _ := m.bs()
	n := a.NumLabels
	if n == 0 {
		n = defaultLabels
	}
	pooled = b.Dropout("classifier_dropout", pooled, a.HiddenDropout)
	// The head stays trainable and unquantised under LoRA/QLoRA (peft's
	// SEQ_CLS task keeps it in modules_to_save; transformers leaves it out of
	// the 4-bit conversion).
	logits := func() ir.TensorID {
		defer b.Enter("classifier")()
		w := b.Param("weight", int64(n), int64(a.Hidden))
		return b.Linear("out", pooled, w, b.Param("bias", int64(n)))
	}()
	if !m.o.Training {
		return
	}
	labels := b.Input("labels", units.I64, B)
	defer b.Enter("loss")()
	b.CrossEntropy("cross_entropy", b.To(logits, units.F32), labels)
}

// bert is BertForSequenceClassification (post-LN encoder, pooler, head).
func (m *builder) bert() {
	a, b := m.a, m.b
	B, S := m.bs()
	H := int64(a.Hidden)
	ids := b.Input("input_ids", units.I64, B, S)
	types := b.Input("token_type_ids", units.I64, B, S)
	var x ir.TensorID
	func() {
		defer b.Enter("bert.embeddings")()
		emb := func(name string, rows int, idx ir.TensorID) ir.TensorID {
			defer b.Enter(name)()
			return b.Embedding("out", m.param("weight", int64(rows), H), idx)
		}
		x = emb("word_embeddings", a.Vocab, ids)
		pos := b.Buffer("position_ids", units.I64, 1, S)
		x = b.Binary("add", "plus_pos", x, emb("position_embeddings", a.MaxPositions, pos))
		x = b.Binary("add", "plus_type", x, emb("token_type_embeddings", a.TypeVocab, types))
		x = m.norm("LayerNorm", x, a.Hidden)
		x = b.Dropout("dropout", x, a.EmbdDropout)
	}()
	mask := ir.NoTensor
	if m.o.Attention == Eager {
		func() {
			defer b.Enter("bert")()
			mask = b.Zeros("extended_attention_mask", m.computeDType(), B, 1, 1, S)
		}()
	}
	for i := 0; i < a.Layers; i++ {
		func() {
			defer b.Enter("bert.encoder.layer." + strconv.Itoa(i))()
			att := func() ir.TensorID {
				defer b.Enter("attention")()
				return m.attention(i, x, ir.NoTensor, ir.NoTensor, mask)
			}()
			x = func() ir.TensorID {
				defer b.Enter("attention.output")()
				return m.norm("LayerNorm", b.Binary("add", "residual", att, x), a.Hidden)
			}()
			y := func() ir.TensorID {
				defer b.Enter("intermediate")()
				return m.act("act", m.linear("dense", x, a.Hidden, a.Intermediate, true))
			}()
			x = func() ir.TensorID {
				defer b.Enter("output")()
				y := b.Dropout("dropout", m.linear("dense", y, a.Intermediate, a.Hidden, true), a.HiddenDropout)
				return m.norm("LayerNorm", b.Binary("add", "residual", y, x), a.Hidden)
			}()
		}()
	}
	first := b.View("first_token", x, B, H)
	if a.Pooler {
		func() {
			defer b.Enter("bert.pooler")()
			first = b.Unary("tanh", "activation", m.linear("dense", first, a.Hidden, a.Hidden, true))
		}()
	}
	m.classify(first)
}

// vit is ViTForImageClassification (pre-LN encoder over patches + CLS).
func (m *builder) vit() {
	a, b := m.a, m.b
	B := int64(m.o.MicroBatch)
	H := int64(a.Hidden)
	N := int64(a.NumPatches())
	m.o.Seq = int(N + 1)
	pixels := b.Input("pixel_values", b.ActDType(), B, int64(a.Channels), int64(a.ImageSize), int64(a.ImageSize))
	var x ir.TensorID
	func() {
		defer b.Enter("vit.embeddings")()
		cls := m.param("cls_token", 1, 1, H)
		pos := m.param("position_embeddings", 1, N+1, H)
		p := func() ir.TensorID {
			defer b.Enter("patch_embeddings.projection")()
			w := m.param("weight", H, int64(a.Channels), int64(a.PatchSize), int64(a.PatchSize))
			bi := m.param("bias", H)
			return b.Conv2d("out", pixels, w, bi, int64(a.PatchSize))
		}()
		p = b.View("patches", p, B, N, H) // flatten(2).transpose(1, 2)
		x = b.Cat("with_cls", 1, b.View("cls_expand", cls, B, 1, H), p)
		x = b.Binary("add", "plus_pos", x, pos)
		x = b.Dropout("dropout", x, a.EmbdDropout)
	}()
	for i := 0; i < a.Layers; i++ {
		func() {
			defer b.Enter("vit.encoder.layer." + strconv.Itoa(i))()
			h := m.norm("layernorm_before", x, a.Hidden)
			att := func() ir.TensorID {
				defer b.Enter("attention")()
				return m.attention(i, h, ir.NoTensor, ir.NoTensor, ir.NoTensor)
			}()
			x = b.Binary("add", "residual1", att, x)
			h = m.norm("layernorm_after", x, a.Hidden)
			y := func() ir.TensorID {
				defer b.Enter("intermediate")()
				return m.act("act", m.linear("dense", h, a.Hidden, a.Intermediate, true))
			}()
			y = func() ir.TensorID {
				defer b.Enter("output")()
				return b.Dropout("dropout", m.linear("dense", y, a.Intermediate, a.Hidden, true), a.HiddenDropout)
			}()
			x = b.Binary("add", "residual2", y, x)
		}()
	}
	func() { defer b.Enter("vit")(); x = m.norm("layernorm", x, a.Hidden) }()
	first := b.View("cls_out", x, B, H)
	if a.Pooler {
		func() {
			defer b.Enter("vit.pooler")()
			first = b.Unary("tanh", "activation", m.linear("dense", first, a.Hidden, a.Hidden, true))
		}()
	}
	m.classify(first)
}
