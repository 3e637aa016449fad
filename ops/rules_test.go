package ops

import (
	"testing"

	"github.com/memplan/memplan/ir"
	"github.com/memplan/memplan/units"
)

// derivatives.yaml mm/bmm: self is saved only for mat2's gradient and mat2
// only for self's; convolution's single formula saves both.
func TestSavedFollowsRequiresGrad(t *testing.T) {
	b := NewBuilder(Config{Precision: BF16, Training: true})
	ids := b.Input("ids", units.I64, 2, 8)
	emb := b.FrozenParam("emb", 100, 16)
	x := b.Embedding("x", emb, ids) // frozen table: x needs no grad
	if b.Tensor(x).RequiresGrad {
		t.Fatal("embedding of a frozen table requires grad")
	}
	frozen := b.FrozenParam("w0", 16, 16)
	trained := b.Param("w1", 16, 16)
	saved := func() []ir.TensorID { return b.Graph().Nodes[len(b.Graph().Nodes)-1].Saved }

	y0 := b.Linear("y0", x, frozen, ir.NoTensor) // nothing requires grad
	if len(saved()) != 0 || b.Tensor(y0).RequiresGrad {
		t.Errorf("frozen linear of a constant input saves %v", saved())
	}
	y1 := b.Linear("y1", x, trained, ir.NoTensor) // weight needs grad: save input only
	if s := saved(); len(s) != 1 || s[0] != x {
		t.Errorf("trainable weight over a constant input saves %v, want the input only", s)
	}
	b.Linear("y2", y1, frozen, ir.NoTensor) // input needs grad: save weight only
	if s := saved(); len(s) != 1 || s[0] != frozen {
		t.Errorf("frozen weight over a grad input saves %v, want the weight only", s)
	}
	b.Linear("y3", y1, trained, b.Param("bias", 16))
	if s := saved(); len(s) != 2 {
		t.Errorf("trainable linear saves %v, want input and weight", s)
	}
	q := b.View("q", y1, 2, 1, 8, 16)
	k := b.Copy("k", b.View("k", x, 2, 1, 16, 8))
	b.MatMul("s", q, k)
	if s := saved(); len(s) != 1 || s[0] != k {
		t.Errorf("bmm with a constant mat2 saves %v, want mat2 only", s)
	}
	img := b.Input("img", units.BF16, 1, 3, 8, 8)
	b.Conv2d("c", img, b.Param("cw", 4, 3, 2, 2), ir.NoTensor, 2)
	if s := saved(); len(s) != 2 {
		t.Errorf("conv2d saves %v, want input and weight (one formula)", s)
	}
}

func TestCollectivesSaveNothing(t *testing.T) {
	b := NewBuilder(Config{Precision: BF16, Training: true})
	w := b.Param("w", 8, 8)
	x := b.Linear("x", b.Input("in", units.BF16, 2, 4, 8), w, ir.NoTensor)
	c := &ir.Comm{Kind: ir.AllReduce, Bytes: b.Tensor(x).Bytes, Group: "tp", Ranks: 2}
	f := b.Collective("tp_copy", "f", x, nil, nil, c)
	g := b.Collective("tp_all_reduce", "g", x, nil, c, nil)
	ag := b.Collective("sp_all_gather", "ag", x, []int64{2, 8, 8}, c, c)
	for _, y := range []ir.TensorID{f, g} {
		if b.Tensor(y).Base != x || b.Tensor(y).Bytes != 0 {
			t.Errorf("%s does not alias its input", b.Tensor(y).Name)
		}
	}
	if b.Tensor(ag).Bytes != 2*b.Tensor(x).Bytes {
		t.Errorf("all-gather output %d bytes, want %d", b.Tensor(ag).Bytes, 2*b.Tensor(x).Bytes)
	}
	for _, n := range b.Graph().Nodes[1:] {
		if len(n.Saved) != 0 {
			t.Errorf("%s saves %v", n.Kind, n.Saved)
		}
	}
}
