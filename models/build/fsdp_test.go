package build

import (
	"github.com/memplan/memplan/models/modeltest"
	"reflect"
	"strings"
	"testing"

	"github.com/memplan/memplan/ir"
	"github.com/memplan/memplan/ops"
	"github.com/memplan/memplan/units"
)

// The flat build keeps what the frozen weights' gradients need and nothing
// else changes: the same parameters, all base weights frozen, the adapters
// alone trainable; without LoRA (or without training) it builds the same
// graph as without the option.
func TestFSDPFlatGraph(t *testing.T) {
	a := modeltest.SmallLlama(t)
	lora := &LoRA{Rank: 8, Alpha: 16, Targets: []string{"q_proj", "v_proj"}}
	o := Options{MicroBatch: 1, Seq: 32, Precision: ops.PureBF16, Training: true, LoRA: lora}
	g0, err := Graph(a, o)
	if err != nil {
		t.Fatal(err)
	}
	o.FSDPFlat = true
	g1, err := Graph(a, o)
	if err != nil {
		t.Fatal(err)
	}
	if len(g0.Params) != len(g1.Params) {
		t.Fatalf("%d parameters, %d under FSDPFlat", len(g0.Params), len(g1.Params))
	}
	for i, id := range g0.Params {
		p0, p1 := g0.Tensors[id], g1.Tensors[g1.Params[i]]
		if p0.Name != p1.Name || p0.Bytes != p1.Bytes || p0.RequiresGrad != p1.RequiresGrad {
			t.Errorf("parameter %s (grad %v) is %s (grad %v) under FSDPFlat", p0.Name, p0.RequiresGrad, p1.Name, p1.RequiresGrad)
		}
	}
	saved := func(g *ir.Graph) (b units.Bytes) {
		for _, n := range g.Nodes {
			for _, s := range n.Saved {
				b += g.Tensors[s].Bytes
			}
		}
		return b
	}
	if saved(g1) <= saved(g0) {
		t.Errorf("FSDPFlat saves %d bytes, plain LoRA %d: frozen linears should keep their inputs", saved(g1), saved(g0))
	}
	for _, oo := range []Options{{MicroBatch: 1, Seq: 32, Precision: ops.PureBF16, Training: true},
		{MicroBatch: 1, Seq: 32, Precision: ops.PureBF16, LoRA: lora}} {
		x, err := Graph(a, oo)
		if err != nil {
			t.Fatal(err)
		}
		oo.FSDPFlat = true
		y, err := Graph(a, oo)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(x, y) {
			t.Errorf("FSDPFlat changed the graph of %+v", oo)
		}
	}
	// A target in one layer: only that layer's weights are flat views.
	o.LoRA = &LoRA{Rank: 8, Alpha: 16, Targets: []string{"model.layers.1.self_attn.q_proj"}}
	o.FSDPFlat = false
	h0, err := Graph(a, o)
	if err != nil {
		t.Fatal(err)
	}
	o.FSDPFlat = true
	h1, err := Graph(a, o)
	if err != nil {
		t.Fatal(err)
	}
	if len(h0.Nodes) != len(h1.Nodes) {
		t.Fatalf("%d nodes, %d under FSDPFlat", len(h0.Nodes), len(h1.Nodes))
	}
	more := false
	for i := range h0.Nodes {
		n0, n1 := &h0.Nodes[i], &h1.Nodes[i]
		same := reflect.DeepEqual(n0.Saved, n1.Saved)
		if strings.HasPrefix(n0.Module, "model.layers.1.") {
			more = more || len(n1.Saved) > len(n0.Saved)
		} else if !same {
			t.Errorf("%s (%s) saves differently under FSDPFlat though its layer has no adapter", n0.Kind, n0.Module)
		}
	}
	if !more {
		t.Error("the adapted layer's frozen linears keep nothing more under FSDPFlat")
	}
}
