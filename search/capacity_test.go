package search

import (
	"errors"
	"strings"
	"testing"

	"pgregory.net/rapid"

	"github.com/memplan/memplan/engine"
	"github.com/memplan/memplan/models/build"
	"github.com/memplan/memplan/recipe"
	"github.com/memplan/memplan/units"
)

// recipeSpec is baseSpec as the command line builds it: recipe applied
// (its cuda.overhead and nccl.overhead among the rest), then sets.
func recipeSpec(t testing.TB, model, gpu, rec string, sets ...string) engine.Spec {
	t.Helper()
	s := baseSpec(t, model, gpu, 0)
	r, err := recipe.Load(rec)
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range sets {
		if err := r.Set(kv); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.Apply(&s, nil); err != nil {
		t.Fatal(err)
	}
	if err := s.Validate(); err != nil {
		t.Fatal(err)
	}
	return s
}

// reproduce plans p's spec as the plan command fit prints for it does (the
// budget given to fit, if any, and no other capacity) and says why it does
// not fit ("" when it does).
func reproduce(base *engine.Spec, p *Plan) string {
	s := p.Spec
	s.Capacity = base.Capacity
	r, err := engine.Plan(s)
	switch {
	case err != nil:
		return err.Error()
	case !r.Fits:
		return "peak " + r.PeakBytes().String() + " over its " + r.Capacity.String() + " usable"
	case r.PeakBytes() > p.Result.PeakBytes():
		return "peak " + r.PeakBytes().String() + " over the verified " + p.Result.PeakBytes().String()
	}
	return ""
}

// Every plan fit verifies fits on its own, as plan decides: in the GPU's
// memory less the CUDA context and one NCCL communicator for each of its
// parallel groups of more than one GPU, not the one communicator a
// search's base spec (with no groups yet) counts. The round-21 cases on
// A100-40GB: a tp 2 × dp 4 runner-up at 38.50 GiB in a search limited to
// 38.51 GiB, and a winner of the same layout at 38.28 GiB, where plan
// leaves 38.01 GiB; and the same with a 4 GB communicator.
func TestFitPlansFitTheirOwnCapacity(t *testing.T) {
	for _, c := range []struct {
		name        string
		global, seq int
		eager       bool
		sets        []string
	}{
		{"runner-up", 64, 3072, false, nil},
		{"winner", 32, 2048, true, nil},
		{"nccl 4GB", 64, 3072, false, []string{"nccl.overhead=4GB"}},
	} {
		base := recipeSpec(t, "llama-3-8b", "a100-40gb", "hf", c.sets...)
		base.Seq = c.seq
		if c.eager {
			base.Attention = build.Eager
		}
		r, err := Fit(base, Options{GPUs: 8, GlobalBatch: c.global})
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		for _, p := range append([]*Plan{r.Winner}, r.RunnersUp...) {
			if why := reproduce(&base, p); why != "" {
				t.Errorf("%s: fit verified %s at %s; planned alone: %s", c.name, p.Describe(), p.Peak(), why)
			}
		}
	}
}

// The same on random searches: small models on a GPU cut down to a few GiB
// (so that plans land near the limit) with a communicator of up to a GiB.
func TestPropertyFitPlansFitTheirOwnCapacity(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		name := rapid.SampledFrom([]string{"gpt2", "pythia-160m", "qwen2.5-0.5b"}).Draw(rt, "model")
		base := recipeSpec(t, name, "a100-40gb", "hf")
		base.Model = base.Model.Clone()
		base.Model.Layers = rapid.IntRange(2, 6).Draw(rt, "layers")
		g := *base.GPU
		g.TotalMemory = units.Bytes(rapid.IntRange(3, 12).Draw(rt, "GiB")) << 29 // halves of a GiB
		base.GPU = &g
		base.Sem.CommOverhead = units.Bytes(rapid.IntRange(0, 4).Draw(rt, "comm")) << 28
		base.Seq = rapid.SampledFrom([]int{256, 512, 1024}).Draw(rt, "seq")
		gpus := rapid.SampledFrom([]int{1, 2, 4, 8}).Draw(rt, "gpus")
		o := Options{GPUs: gpus, GlobalBatch: gpus * rapid.SampledFrom([]int{1, 2, 4, 8}).Draw(rt, "per GPU"), Keep: 3,
			Headroom: rapid.SampledFrom([]float64{0, 0.1}).Draw(rt, "headroom")}
		r, err := Fit(base, o)
		if errors.Is(err, ErrNothingFits) {
			return
		}
		if err != nil {
			rt.Fatal(err)
		}
		for _, p := range append([]*Plan{r.Winner}, r.RunnersUp...) {
			if why := reproduce(&base, p); why != "" {
				rt.Fatalf("fit verified %s at %s; planned alone: %s", p.Describe(), p.Peak(), why)
			}
			s := p.Spec
			s.Capacity = base.Capacity
			if limit := units.Bytes(float64(s.CapacityBytes()) * (1 - o.Headroom)); p.Peak() > limit || p.Limit != limit {
				rt.Fatalf("fit verified %s at %s, judged against %s; its limit is %s with %.0f%% headroom", p.Describe(), p.Peak(), p.Limit, limit, 100*o.Headroom)
			}
		}
	})
}

// torchtune's optimizer step inside backward cannot accumulate gradients:
// the search tries no plan that accumulates (each would be refused, and the
// refusal of a state's thriftiest probe dropped the state whole), and finds
// the micro-batch of the whole replica's batch.
func TestFitInBackwardDoesNotAccumulate(t *testing.T) {
	base := recipeSpec(t, "llama-3.2-1b", "a100-40gb", "torchtune", "optimizer.in-backward=true")
	base.Seq = 2048
	o := Options{GlobalBatch: 4}
	r, err := Fit(base, o)
	if err != nil {
		t.Fatal(err)
	}
	if s := r.Winner.Spec; s.MicroBatch != 4 || s.Accum != 1 {
		t.Errorf("winner %s, want micro-batch 4 × accum 1", r.Winner.Describe())
	}
	b, oo := base, Options{GPUs: 8, GlobalBatch: 64}
	if err := fitDefaults(&b, &oo); err != nil {
		t.Fatal(err)
	}
	cands := enumerate(b, oo)
	if len(cands) == 0 {
		t.Fatal("no candidates on 8 GPUs")
	}
	for _, c := range cands {
		if c.Spec.Accum != 1 {
			t.Fatalf("candidate %s accumulates", c.Describe())
		}
	}
	// A pinned micro-batch that would need accumulation leaves no plan,
	// and the refusal says why rather than a smallest peak of 0 B.
	base.MicroBatch = 1
	_, err = Fit(base, Options{GlobalBatch: 4, Pinned: PinMicroBatch})
	if err == nil || strings.Contains(err.Error(), " 0 B") || !strings.Contains(err.Error(), "accumulate") {
		t.Errorf("in-backward at micro-batch 1 of 4: %v", err)
	}
}

// The memo carries a bound found in one state of a bundle to the others
// (memo.over) and judges it against their limits: sound only when the
// plans it bounds share the limit it was found under. Every plan of a
// bundle, and of an overKey, has one limit: they share the layout, the
// GPU and the overheads a limit depends on.
func TestMemoKeysShareLimit(t *testing.T) {
	for _, c := range []struct {
		model, gpu string
		o          Options
	}{
		{"llama-3.2-1b", "h100", Options{GPUs: 8, GlobalBatch: 64, Headroom: 0.1, Allow: engine.Allow{LoRA: true, QLoRA: true, EightBit: true, LowerPrecision: true}}},
		{"mixtral-8x7b", "a100-40gb", Options{GPUs: 16, GlobalBatch: 32}},
	} {
		base := recipeSpec(t, c.model, c.gpu, "hf")
		o := c.o
		if err := fitDefaults(&base, &o); err != nil {
			t.Fatal(err)
		}
		cands := enumerate(base, o)
		limits := map[units.Bytes]bool{}
		over := map[engine.Spec]units.Bytes{}
		for _, b := range bundleStates(groupByState(groupByAllButBatch(cands))) {
			want := b[0][0][0].Limit
			for _, st := range b {
				for _, g := range st {
					for _, p := range g {
						limits[p.Limit] = true
						if p.Limit != want {
							t.Fatalf("%s: a bundle's plans have limits %s and %s (%s)", c.model, want, p.Limit, p.Describe())
						}
						k := overKey(&p.Spec)
						if l, ok := over[k]; ok && l != p.Limit {
							t.Fatalf("%s: an overKey's plans have limits %s and %s (%s)", c.model, l, p.Limit, p.Describe())
						}
						over[k] = p.Limit
					}
				}
			}
		}
		if len(limits) < 2 {
			t.Errorf("%s: %d candidates share one limit: the case does not exercise it", c.model, len(cands))
		}
	}
}

// A search where no plan was estimated (every one refused) says the
// refusal, never a smallest estimated peak of 0 B.
func TestNothingFitsSaysTheRefusal(t *testing.T) {
	base := recipeSpec(t, "gpt2", "a100", "hf")
	o := Options{GPUs: 2, GlobalBatch: 4}
	if err := fitDefaults(&base, &o); err != nil {
		t.Fatal(err)
	}
	f := &fitter{o: o, cands: enumerate(base, o), est: newEstimator(base.Model), res: &Result{}}
	f.setLimits(base)
	for _, c := range f.cands {
		c.Dropped = "refused"
	}
	err := f.nothingFits()
	if !errors.Is(err, ErrNothingFits) || strings.Contains(err.Error(), " 0 B") || !strings.Contains(err.Error(), "refused") ||
		!strings.Contains(err.Error(), "less 518.80 MiB for each parallel group") {
		t.Errorf("every plan refused: %v", err)
	}
}
