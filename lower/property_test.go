package lower

import (
	"reflect"
	"testing"

	"pgregory.net/rapid"

	"github.com/memplan/memplan/ir"
	"github.com/memplan/memplan/ops"
	"github.com/memplan/memplan/sim"
	"github.com/memplan/memplan/units"
)

// genGraph draws a random forward graph from the op table through the
// Builder: a chain with residual branches, views, dropout, norms, matmuls,
// ending in a cross-entropy loss.
func genGraph(t *rapid.T, training bool) (*ir.Graph, ops.Precision) {
	prec := ops.Precision(rapid.IntRange(0, 4).Draw(t, "precision"))
	dev := ops.Device(rapid.IntRange(0, 1).Draw(t, "device"))
	b := ops.NewBuilder(ops.Config{Precision: prec, Device: dev, Training: training})
	B := int64(rapid.IntRange(1, 4).Draw(t, "batch"))
	S := int64(rapid.IntRange(1, 16).Draw(t, "seq"))
	H := int64(rapid.IntRange(1, 8).Draw(t, "hidden") * 8)
	V := int64(rapid.IntRange(2, 50).Draw(t, "vocab"))
	ids := b.Input("ids", units.I64, B, S)
	labels := b.Input("labels", units.I64, B*S)
	emb := b.Param("emb", V, H)
	x := b.Embedding("x", emb, ids)
	live := []ir.TensorID{x}
	n := rapid.IntRange(1, 25).Draw(t, "ops")
	for i := 0; i < n; i++ {
		func() {
			defer b.Enter("layers." + string(rune('0'+i%10)))()
			x = live[rapid.IntRange(0, len(live)-1).Draw(t, "pick")]
			var y ir.TensorID
			switch rapid.IntRange(0, 9).Draw(t, "kind") {
			case 0:
				y = b.Linear("fc", x, b.Param("w", H, H), b.Param("b", H))
			case 1:
				y = b.Unary([]string{"gelu", "silu", "relu", "tanh"}[rapid.IntRange(0, 3).Draw(t, "act")], "act", x)
			case 2:
				y = b.LayerNorm("ln", x, b.Param("lnw", H), b.Param("lnb", H))
			case 3:
				y = b.RMSNorm("rms", x, b.Param("rw", H))
			case 4:
				y = b.Dropout("drop", x, 0.1)
			case 5:
				y = b.Binary("add", "res", x, live[rapid.IntRange(0, len(live)-1).Draw(t, "other")])
			case 6:
				y = b.Binary("mul", "gate", x, live[rapid.IntRange(0, len(live)-1).Draw(t, "other")])
			case 7:
				y = b.View("view", b.View("flat", x, B*S, H), B, S, H)
			case 8:
				y = b.Softmax("sm", x, false)
			case 9:
				q := b.Copy("q", x)
				k := b.Copy("kt", x, B, H, S)
				s := b.MatMul("scores", q, k)
				y = b.MatMul("ctx", b.Softmax("p", s, false), x)
			}
			live = append(live, y)
		}()
	}
	logits := b.Linear("head", live[len(live)-1], b.Param("head_w", V, H), ir.NoTensor)
	if training {
		b.CrossEntropy("loss", b.View("flat_logits", logits, B*S, V), labels)
	}
	return b.Graph(), prec
}

func genConfig(t *rapid.T, prec ops.Precision) TrainConfig {
	return TrainConfig{
		Optimizer: Optimizer(rapid.IntRange(0, 5).Draw(t, "optimizer")),
		Impl:      Impl(rapid.IntRange(0, 2).Draw(t, "impl")),
		Precision: prec,
		Accum:     rapid.IntRange(1, 3).Draw(t, "accum"),
		FirstStep: rapid.Bool().Draw(t, "first"),
	}
}

// Invariants of every simulated program: it verifies; category totals add
// up to the total at every event; every storage allocated during the
// iteration is freed exactly once unless it is state that persists; the
// iteration ends with only resident and persistent memory; the same program
// simulates to the same result.
func TestPropertyLedgerInvariants(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		g, prec := genGraph(t, true)
		c := genConfig(t, prec)
		p, err := Train(g, c)
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Verify(); err != nil {
			t.Fatal(err)
		}
		r, err := sim.Run(p)
		if err != nil {
			t.Fatal(err)
		}
		if err := sim.Check(p, r); err != nil {
			t.Fatal(err)
		}
		r2, _ := sim.Run(p)
		if !reflect.DeepEqual(r, r2) {
			t.Fatal("two simulations of one program differ")
		}
		p2, _ := Train(g, c)
		if !reflect.DeepEqual(p, p2) {
			t.Fatal("two lowerings of one graph differ")
		}
	})
}

// Inference programs free everything but the weights and inputs' buffers.
func TestPropertyInference(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		g, _ := genGraph(t, false)
		p, err := Infer(g)
		if err != nil {
			t.Fatal(err)
		}
		r, err := sim.Run(p)
		if err != nil {
			t.Fatal(err)
		}
		if r.Allocs != r.Frees {
			t.Fatalf("%d allocations, %d frees", r.Allocs, r.Frees)
		}
		if r.SavedTotal != 0 || r.ModelStates.Gradients != 0 {
			t.Fatal("inference saved activations or made gradients")
		}
	})
}
