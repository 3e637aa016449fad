package sim

import (
	"testing"

	"github.com/memplan/memplan/ir"
	"github.com/memplan/memplan/units"
)

// A hand-built program whose ledger is known op by op: a resident
// parameter, an activation produced in forward and read in backward, a view
// of it (no bytes), a temporary, a workspace, and a gradient freed at the end.
func TestRunHandBuilt(t *testing.T) {
	n := ir.NoTensor
	p := &ir.Program{
		Tensors: []ir.Tensor{
			{Name: "w", Shape: []int64{25}, DType: units.F32, Bytes: 100, Base: n, Cat: ir.Parameter, Resident: true}, // 0
			{Name: "a", Bytes: 40, Base: n, Cat: ir.Activation},                                                       // 1
			{Name: "a.view", Base: 1, Cat: ir.Activation},                                                             // 2
			{Name: "tmp", Bytes: 8, Base: n, Cat: ir.Temporary},                                                       // 3
			{Name: "w.grad", Bytes: 100, Base: n, Cat: ir.Gradient},                                                   // 4
		},
		Ops: []ir.Op{
			{Name: "fwd1", Phase: ir.Forward, In: []ir.TensorID{0}, Out: []ir.TensorID{1}, Node: -1},
			{Name: "fwd2", Phase: ir.Forward, In: []ir.TensorID{1}, Out: []ir.TensorID{2, 3}, Workspace: 16, Node: -1},
			{Name: "bwd", Phase: ir.Backward, In: []ir.TensorID{2}, Out: []ir.TensorID{4}, Node: -1},
			{Name: "step", Phase: ir.Optimizer, In: []ir.TensorID{0, 4}, Node: -1},
		},
		Params: []ir.TensorID{0},
	}
	if err := p.Verify(); err != nil {
		t.Fatal(err)
	}
	r, err := Run(p)
	if err != nil {
		t.Fatal(err)
	}
	want := []units.Bytes{140, 100 + 40 + 8 + 16, 100 + 40 + 100, 200}
	for i, w := range want {
		if got := r.Timeline[i].Total; got != w {
			t.Errorf("op %d (%s): %d bytes, want %d", i, p.Ops[i].Name, got, w)
		}
	}
	// Totals alone: the same heights, no timeline, the same peak.
	rt, err := RunWith(p, Options{NoTimeline: true, Totals: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(rt.Timeline) != 0 || len(rt.Totals) != len(want) || rt.Peak != r.Peak {
		t.Errorf("totals only: %d points, %d totals, peak %+v; want 0, %d, %+v", len(rt.Timeline), len(rt.Totals), rt.Peak, len(want), r.Peak)
	}
	for i, w := range want {
		if i < len(rt.Totals) && rt.Totals[i] != w {
			t.Errorf("total of op %d (%s): %d bytes, want %d", i, p.Ops[i].Name, rt.Totals[i], w)
		}
	}
	if len(r.Totals) != 0 {
		t.Errorf("Run fills %d totals; only Options.Totals asks for them", len(r.Totals))
	}
	if r.Peak.Op != 2 || r.Peak.Phase != ir.Backward || r.Peak.Total != 240 {
		t.Errorf("peak %+v, want 240 bytes at op 2 in backward", r.Peak)
	}
	// The activation lives until the backward reads its view; the temporary
	// dies after fwd2.
	if got := r.Timeline[2].Cat[ir.Activation]; got != 40 {
		t.Errorf("activation at backward: %d, want 40", got)
	}
	if got := r.Timeline[2].Cat[ir.Temporary]; got != 0 {
		t.Errorf("temporary at backward: %d, want 0", got)
	}
	if r.SavedTotal != 40 || r.SavedByModule[""] != 40 {
		t.Errorf("saved %d (%v), want 40", r.SavedTotal, r.SavedByModule)
	}
	if r.Allocs != 3 || r.Frees != 3 || r.EndLive != 100 {
		t.Errorf("allocs %d frees %d end %d, want 3, 3, 100", r.Allocs, r.Frees, r.EndLive)
	}
	if r.ModelStates.Parameters != 100 || r.ModelStates.Gradients != 100 || r.Params != 25 {
		t.Errorf("model states %+v params %d", r.ModelStates, r.Params)
	}
	// Check accepts the simulation and refuses each broken invariant.
	if err := Check(p, r); err != nil {
		t.Errorf("Check: %v", err)
	}
	for name, breakIt := range map[string]func(r *Result){
		"categories":  func(r *Result) { r.Timeline[1].Total++ },
		"negative":    func(r *Result) { r.Timeline[1].Cat[ir.Gradient] = -1; r.Timeline[1].Total-- },
		"host":        func(r *Result) { r.Timeline[0].Host = -1 },
		"frees":       func(r *Result) { r.Frees-- },
		"end of step": func(r *Result) { r.EndLive += 8 },
	} {
		b, _ := Run(p)
		breakIt(b)
		if err := Check(p, b); err == nil {
			t.Errorf("Check accepts a result with broken %s", name)
		}
	}
}

func TestRunRejectsBadPrograms(t *testing.T) {
	n := ir.NoTensor
	for name, p := range map[string]*ir.Program{
		"base after view": {Tensors: []ir.Tensor{{Name: "v", Base: 1}, {Name: "x", Bytes: 4, Base: n}}},
		"input out of range": {Tensors: []ir.Tensor{{Name: "x", Bytes: 4, Base: n}},
			Ops: []ir.Op{{Name: "op", In: []ir.TensorID{7}}}},
	} {
		if _, err := Run(p); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}
