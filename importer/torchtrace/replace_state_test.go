package torchtrace

import (
	"path/filepath"
	"testing"

	"github.com/memplan/memplan/ir"
	"github.com/memplan/memplan/lower"
	"github.com/memplan/memplan/sim"
)

// replace_state.trace.json (testdata/torch/replace_state.py): an optimizer
// that replaces its state each step (m = 0.9·m + g stored back into a dict).
// The steady step frees the initial state (ids 6-9, labelled optimizer_state)
// after allocating the new one; the first step creates the state under those
// initial ids. Peaks are memplan_torch.replay's (python/tests/test_replace_state.py;
// before, its first step counted ids 6-9 twice), by hand at batch 16 for the
// first step: params 49792 + inputs 4224 + grads 49792 + zeros_like, mul and
// add of the first layer's state (3·32768) = 202112. A trace exported before
// the exporter labelled the replaced state (category temporary, no
// first_step.optimizer_state) replays the same.
func TestReplaceStateOptimizer(t *testing.T) {
	tr, err := Load(filepath.Join(testdata, "replace_state.trace.json"))
	if err != nil {
		t.Fatal(err) // was: allocates storage 6, which is live
	}
	if got := tr.First.OptimizerState; len(got) != 4 {
		t.Fatalf("first_step.optimizer_state = %v, want the 4 replaced state storages", got)
	}
	old, err := Load(filepath.Join(testdata, "replace_state.trace.json"))
	if err != nil {
		t.Fatal(err)
	}
	unlabel(old)
	for _, tr := range []*Trace{tr, old} {
		checkReplaceState(t, tr)
	}
}

// unlabel rewrites tr as exporters before the fix wrote it: the replaced
// state's initial storages and the first step's allocations of them are
// temporaries, and first_step.optimizer_state is empty.
func unlabel(tr *Trace) {
	state := map[int]bool{}
	for _, id := range tr.First.OptimizerState {
		state[id] = true
	}
	tr.First.OptimizerState = nil
	for i := range tr.Initial {
		if state[tr.Initial[i].ID] {
			tr.Initial[i].Category = CatTemporary
		}
	}
	for i := range tr.First.OptimizerEvents {
		for j := range tr.First.OptimizerEvents[i].Alloc {
			if a := &tr.First.OptimizerEvents[i].Alloc[j]; state[a.ID] {
				a.Category = CatTemporary
			}
		}
	}
}

func checkReplaceState(t *testing.T, tr *Trace) {
	t.Helper()
	for _, c := range []struct {
		batch         int
		steady, first map[string]int64
	}{
		{4, map[string]int64{"forward": 104736, "backward": 152488, "optimizer": 215968}, map[string]int64{"forward": 54944, "backward": 102696, "optimizer": 198944}},
		{16, map[string]int64{"forward": 120192, "backward": 161800, "optimizer": 219136}, map[string]int64{"forward": 70400, "backward": 112008, "optimizer": 202112}},
		{64, map[string]int64{"forward": 182016, "backward": 231304, "optimizer": 231808}, map[string]int64{"forward": 132224, "backward": 181512, "optimizer": 214784}},
	} {
		for _, first := range []bool{false, true} {
			want := c.steady
			if first {
				want = c.first
			}
			p, err := tr.Program(Options{Batch: c.batch, FirstStep: first})
			if err != nil {
				t.Fatal(err)
			}
			got := phasePeaks(t, p)
			for ph, w := range want {
				if got[ph] != w {
					t.Errorf("batch %d first=%v %s: %d, want %d (%+d)", c.batch, first, ph, got[ph], w, got[ph]-w)
				}
			}
			r, err := sim.Run(p)
			if err != nil {
				t.Fatal(err)
			}
			// Both steps end with parameters, inputs and one copy of the
			// state (49792 bytes, in the optimizer-state ledger).
			end := int64(49792 + 49792 + c.batch*(64*4+8))
			if int64(r.EndLive) != end {
				t.Errorf("batch %d first=%v: ends with %d live, want %d", c.batch, first, r.EndLive, end)
			}
			if first {
				continue
			}
			var start int64
			for i := range p.Tensors {
				if tt := p.Tensors[i]; tt.Resident || (tt.Cat == ir.OptimizerState && containsID(p.Ops[0].Out, ir.TensorID(i))) {
					start += int64(tt.Bytes)
				}
			}
			if start != end {
				t.Errorf("batch %d: steady step starts with %d, ends with %d", c.batch, start, end)
			}
		}
	}
	// Accumulation and a swapped optimizer replay too; the swap drops the
	// recorded (replaced) state: SGD has none.
	for _, o := range []Options{{Batch: 8, Accum: 3}, {Batch: 8, Accum: 2, FirstStep: true},
		{Batch: 8, Optimizer: &lower.TrainConfig{Optimizer: lower.SGD, Impl: lower.Single, WeightDecay: -1}}} {
		p, err := tr.Program(o)
		if err != nil {
			t.Fatal(err)
		}
		phasePeaks(t, p)
		if o.Optimizer != nil {
			r, _ := sim.Run(p)
			if r.ModelStates.OptimizerState != 0 {
				t.Errorf("SGD replay keeps %d bytes of the recorded optimizer's state", r.ModelStates.OptimizerState)
			}
		}
	}
}

func containsID(ids []ir.TensorID, id ir.TensorID) bool {
	for _, x := range ids {
		if x == id {
			return true
		}
	}
	return false
}
