package torchtrace

import (
	"fmt"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/memplan/memplan/ir"
	"github.com/memplan/memplan/lower"
	"github.com/memplan/memplan/sim"
	"pgregory.net/rapid"
)

var suiteTraces = []string{"resnet18", "mobilenet_v2", "vit_tiny", "lm", "lm_sgd", "gru", "gpt2_tiny"}

func loadAll(t testing.TB) map[string]*Trace {
	out := map[string]*Trace{}
	for _, n := range suiteTraces {
		tr, err := Load(filepath.Join(testdata, n+".trace.json"))
		if err != nil {
			t.Fatal(err)
		}
		out[n] = tr
	}
	return out
}

// Properties of every replay: the program verifies, the ledger adds up at
// every point, every allocated storage is freed once unless kept, the
// steady step ends where it started, and the result is deterministic.
func TestReplayProperties(t *testing.T) {
	traces := loadAll(t)
	rapid.Check(t, func(rt *rapid.T) {
		name := rapid.SampledFrom(suiteTraces).Draw(rt, "trace")
		tr := traces[name]
		o := Options{
			Batch:           rapid.IntRange(1, 64).Draw(rt, "batch"),
			Accum:           rapid.IntRange(1, 3).Draw(rt, "accum"),
			FirstStep:       rapid.Bool().Draw(rt, "first"),
			NoScratch:       rapid.Bool().Draw(rt, "noscratch"),
			MinBytes:        rapid.SampledFrom([]int64{0, 1024}).Draw(rt, "min"),
			Granularity:     rapid.SampledFrom([]int64{0, 512}).Draw(rt, "gran"),
			FullBatchInputs: rapid.Bool().Draw(rt, "fullbatch"),
		}
		if tr.HasSeq() {
			o.Seq = rapid.IntRange(8, 128).Draw(rt, "seq")
		}
		if rapid.Bool().Draw(rt, "swap") {
			o.Optimizer = &lower.TrainConfig{Optimizer: rapid.SampledFrom([]lower.Optimizer{lower.SGD, lower.SGDMomentum, lower.AdamW}).Draw(rt, "opt"),
				Impl: rapid.SampledFrom([]lower.Impl{lower.Single, lower.Foreach}).Draw(rt, "impl"), WeightDecay: -1}
		}
		p, err := tr.Program(o)
		if err != nil {
			rt.Fatal(err)
		}
		if err := p.Verify(); err != nil {
			rt.Fatal(err)
		}
		r, err := sim.Run(p)
		if err != nil {
			rt.Fatal(err)
		}
		for _, pt := range r.Timeline {
			var s int64
			for _, b := range pt.Cat {
				if b < 0 {
					rt.Fatalf("negative ledger at op %d: %v", pt.Op, pt.Cat)
				}
				s += int64(b)
			}
			if s != int64(pt.Total) {
				rt.Fatalf("ledger does not add up at op %d", pt.Op)
			}
		}
		kept := 0
		for i := range p.Tensors {
			if p.Tensors[i].Keep {
				kept++
			}
		}
		if r.Allocs-r.Frees > kept {
			rt.Fatalf("%d allocations, %d frees, %d kept", r.Allocs, r.Frees, kept)
		}
		var start int64
		for i := range p.Tensors {
			if p.Tensors[i].Resident {
				start += int64(p.Tensors[i].Bytes)
			}
		}
		if !o.FirstStep && o.Optimizer == nil && int64(r.EndLive) != start {
			rt.Fatalf("steady step ends with %d bytes, started with %d", r.EndLive, start)
		}
		r2, _ := sim.Run(p)
		if !reflect.DeepEqual(r.PhasePeak, r2.PhasePeak) || r.Peak != r2.Peak {
			rt.Fatal("not deterministic")
		}
	})
}

// Accumulation keeps the model states and divides batch-scaled saved
// activations by k: k micro-steps of b/k peak below one step of b.
func TestAccumulationLowersActivationPeak(t *testing.T) {
	tr := loadAll(t)["lm"]
	one, err := tr.Program(Options{Batch: 16})
	if err != nil {
		t.Fatal(err)
	}
	four, err := tr.Program(Options{Batch: 4, Accum: 4})
	if err != nil {
		t.Fatal(err)
	}
	r1, _ := sim.Run(one)
	r4, _ := sim.Run(four)
	if r4.ModelStates != r1.ModelStates {
		t.Errorf("model states differ: %+v vs %+v", r4.ModelStates, r1.ModelStates)
	}
	if r4.Peak.Total >= r1.Peak.Total {
		t.Errorf("accumulation peak %d not below %d", r4.Peak.Total, r1.Peak.Total)
	}
	if got, want := r4.SavedTotal, r1.SavedTotal/4; got < want*9/10 || got > want*11/10 {
		t.Errorf("saved activations %d, want about %d", got, want)
	}
}

// Swapping the recorded optimizer for lower.OptimizerStep of the same
// optimizer and implementation reproduces the recorded optimizer phase
// (within the 4-byte step counters the plan does not model).
func TestOptimizerSwapMatchesRecorded(t *testing.T) {
	traces := loadAll(t)
	for _, c := range []struct {
		trace string
		opt   lower.Optimizer
	}{{"lm", lower.AdamW}, {"lm_sgd", lower.SGD}, {"resnet18", lower.SGDMomentum}, {"gpt2_tiny", lower.AdamW}} {
		for _, first := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/first=%v", c.trace, first), func(t *testing.T) {
				tr := traces[c.trace]
				rec, err := tr.Program(Options{Batch: 8, FirstStep: first, NoScratch: true})
				if err != nil {
					t.Fatal(err)
				}
				swp, err := tr.Program(Options{Batch: 8, FirstStep: first, NoScratch: true, Optimizer: &lower.TrainConfig{Optimizer: c.opt, Impl: lower.Single, WeightDecay: -1}})
				if err != nil {
					t.Fatal(err)
				}
				a, b := phasePeaks(t, rec), phasePeaks(t, swp)
				for _, ph := range []string{"forward", "backward", "optimizer"} {
					d := a[ph] - b[ph]
					if d < 0 {
						d = -d
					}
					if float64(d) > 0.001*float64(a[ph])+4096 {
						t.Errorf("%s: recorded %d, lower.OptimizerStep %d", ph, a[ph], b[ph])
					}
				}
			})
		}
	}
}

var _ = ir.Forward
