package ir_test

import (
	"strings"
	"testing"

	"github.com/memplan/memplan/ir"
)

// TestVerifyRejects feeds Program.Verify one bad program per message it has, and a good one.
func TestVerifyRejects(t *testing.T) {
	// good: a resident weight, an input, an output and a view of it, read in order.
	good := func() *ir.Program {
		return &ir.Program{
			Tensors: []ir.Tensor{
				{Name: "w", Bytes: 64, Resident: true, Base: ir.NoTensor},
				{Name: "x", Bytes: 16, Base: ir.NoTensor},
				{Name: "y", Bytes: 16, Base: ir.NoTensor},
				{Name: "y.view", Base: 2},
			},
			Ops: []ir.Op{
				{Name: "load", Out: []ir.TensorID{1}, Node: -1},
				{Name: "matmul", In: []ir.TensorID{0, 1}, Out: []ir.TensorID{2, 3}, Node: -1},
				{Name: "sum", In: []ir.TensorID{3}, Node: -1},
			},
		}
	}
	if err := good().Verify(); err != nil {
		t.Fatalf("good program: %v", err)
	}
	for _, tc := range []struct {
		name string
		bad  func(p *ir.Program)
		want string
	}{
		{"base past the end", func(p *ir.Program) { p.Tensors[3].Base = 9 }, "tensor 3 (y.view): base 9 out of range"},
		{"negative base", func(p *ir.Program) { p.Tensors[3].Base = -7 }, "tensor 3 (y.view): base -7 out of range"},
		{"base not earlier", func(p *ir.Program) {
			p.Tensors = append(p.Tensors, ir.Tensor{Name: "late", Bytes: 4, Base: ir.NoTensor})
			p.Tensors[3].Base = 4
		}, "tensor 3 (y.view): base 4 is not earlier"},
		{"view with bytes", func(p *ir.Program) { p.Tensors[3].Bytes = 8 }, "view 3 (y.view) has 8 bytes"},
		{"negative size", func(p *ir.Program) { p.Tensors[1].Bytes = -1 }, "tensor 1 (x) has negative size"},
		{"negative workspace", func(p *ir.Program) { p.Ops[1].Workspace = -5 }, "op 1 (matmul): negative workspace"},
		{"input out of range", func(p *ir.Program) { p.Ops[2].In = []ir.TensorID{4} }, "op 2 (sum): input 4 out of range"},
		{"negative input", func(p *ir.Program) { p.Ops[2].In = []ir.TensorID{-1} }, "op 2 (sum): input -1 out of range"},
		{"read before write", func(p *ir.Program) { p.Ops[0], p.Ops[1] = p.Ops[1], p.Ops[0] }, "op 0 (matmul) reads x before it is written"},
		{"output out of range", func(p *ir.Program) { p.Ops[0].Out = []ir.TensorID{12} }, "op 0 (load): output 12 out of range"},
		{"storage written twice", func(p *ir.Program) { p.Ops[2].Out = []ir.TensorID{1} }, "op 2 (sum) writes x a second time"},
	} {
		p := good()
		tc.bad(p)
		err := p.Verify()
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: got %v, want one line containing %q", tc.name, err, tc.want)
		}
	}
	// A resident storage may be written again (the optimizer step updates parameters in place), and so may a
	// view of a written storage.
	p := good()
	p.Ops = append(p.Ops, ir.Op{Name: "step", In: []ir.TensorID{0}, Out: []ir.TensorID{0, 3}, Node: -1})
	if err := p.Verify(); err != nil {
		t.Errorf("in-place writes: %v", err)
	}
}
