package ops

import (
	"testing"

	"github.com/memplan/memplan/ir"
	"github.com/memplan/memplan/units"
)

// TestAutocastCachedCasts checks which casts the builder marks as autocast's
// cached weight copies (aten/src/ATen/autocast_mode.cpp cached_cast: a cast
// to the lower dtype of a float32 leaf that requires grad): a trainable
// parameter's, not a frozen one's, an activation's, a cast to float32 or a
// cast written in model code.
func TestAutocastCachedCasts(t *testing.T) {
	cached := func(b *Builder, id ir.TensorID) bool { return b.Tensor(id).AutocastCached }
	b := NewBuilder(Config{Precision: AMPBF16, Training: true})
	x := b.Input("x", units.F32, 2, 4)
	w := b.Param("w", 8, 4)
	bias := b.Param("b", 8)
	frozen := b.FrozenParam("frozen", 8, 8)
	h := b.Linear("h", x, w, bias)
	lin := b.Graph().Nodes[len(b.Graph().Nodes)-1]
	// inputs of the linear: x, w and bias cast to bfloat16
	if got := []bool{cached(b, lin.In[0]), cached(b, lin.In[1]), cached(b, lin.In[2])}; got[0] || !got[1] || !got[2] {
		t.Errorf("cached (x, w, bias) = %v, want [false true true]", got)
	}
	y := b.Linear("y", h, frozen, ir.NoTensor)
	fl := b.Graph().Nodes[len(b.Graph().Nodes)-1]
	if b.Tensor(fl.In[1]).DType != units.BF16 || cached(b, fl.In[1]) {
		t.Errorf("frozen weight's cast: dtype %v cached %v, want bfloat16, not cached", b.Tensor(fl.In[1]).DType, cached(b, fl.In[1]))
	}
	// an explicit .to(bfloat16) of a trainable parameter in model code is not autocast's
	if c := b.To(b.Param("v", 8), units.BF16); cached(b, c) {
		t.Errorf("To's cast of a parameter is marked cached")
	}
	// a second use of w reuses the one cached copy
	_ = b.Linear("z", y, w, ir.NoTensor)
	zl := b.Graph().Nodes[len(b.Graph().Nodes)-1]
	if zl.In[1] != lin.In[1] {
		t.Errorf("second use of w cast again (%d, first %d)", zl.In[1], lin.In[1])
	}
	// inference: the builder's parameters do not require grad, nothing is marked
	bi := NewBuilder(Config{Precision: AMPFP16})
	xi := bi.Input("x", units.F32, 2, 4)
	_ = bi.Linear("h", xi, bi.Param("w", 8, 4), ir.NoTensor)
	for i := range bi.Graph().Tensors {
		if bi.Graph().Tensors[i].AutocastCached {
			t.Errorf("inference graph marks %s cached", bi.Graph().Tensors[i].Name)
		}
	}
}
