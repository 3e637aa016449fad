package serve

import (
	"testing"

	"github.com/memplan/memplan/hw"
	"github.com/memplan/memplan/models"
	"github.com/memplan/memplan/units"
	"pgregory.net/rapid"
)

// MaxContext agrees with a scan of every context: the answer holds the
// requests, nothing above it (up to the cap) does. Models of at most 2048
// positions keep the scan exhaustive; TotalMemory is drawn so the answer
// lands anywhere in the range, and max_model_len is given or follows the
// context. Each draw scans up to 2048 deployments (about 0.2 ms each), so
// the number of draws is capped (rapid's default of 100 would take minutes).
func TestPropertyMaxContextMatchesScan(t *testing.T) {
	draws := 0
	rapid.Check(t, func(rt *rapid.T) {
		draws++
		if draws > 24 {
			return
		}
		name := rapid.SampledFrom([]string{"gpt2", "pythia-160m", "tinyllama-1.1b"}).Draw(rt, "model")
		s := Spec{Model: mustModelT(rt, name)}
		s.TotalMemory = units.Bytes(rapid.Int64Range(1<<30, 12<<30).Draw(rt, "total"))
		s.BlockSize = rapid.SampledFrom([]int{8, 16, 32}).Draw(rt, "block")
		s.KVDType = rapid.SampledFrom([]units.DType{units.Invalid, units.FP8}).Draw(rt, "kv")
		s.MaxNumSeqs = rapid.SampledFrom([]int{1, 16, 256}).Draw(rt, "seqs")
		if rapid.Bool().Draw(rt, "fixed-len") {
			s.MaxModelLen = rapid.IntRange(256, s.Model.MaxPositions).Draw(rt, "max-model-len")
		}
		n := int64(1) << rapid.IntRange(0, 10).Draw(rt, "log2-requests")
		r, err := MaxContext(s, n)
		if err != nil {
			rt.Fatal(err)
		}
		m := &ctxSolver{base: s, n: n, res: &ContextResult{FollowsModelLen: s.MaxModelLen == 0}}
		want := 0
		for c := 1; c <= r.Cap; c++ {
			ok, err := m.holdsAt(c)
			if err != nil {
				rt.Fatalf("context %d: %v", c, err)
			}
			if ok {
				want = c
			}
			if inGap := c >= r.Gap[0] && c <= r.Gap[1] && r.Gap[0] > 0; c <= r.Context && ok == inGap {
				rt.Fatalf("context %d holds the requests: %v, but the answer %d with gap %v says otherwise", c, ok, r.Context, r.Gap)
			}
		}
		if r.Context != want {
			rt.Fatalf("MaxContext %d, scan %d (cap %d)", r.Context, want, r.Cap)
		}
		if r.At != nil && !holds(r.At, n) || r.Beyond != nil && holds(r.Beyond, n) {
			rt.Fatalf("the answer does not hold or the value beyond does")
		}
	})
}

// Across vLLM's chunked-prefill switch (on by default above 32K tokens of
// max_model_len) the cache grows: the search looks on both sides.
func TestMaxContextAcrossChunkedSwitch(t *testing.T) {
	s := Spec{Model: mustModel(t, "llama-3.1-8b"), GPU: mustGPU(t, "rtx-3090")}
	r, err := MaxContext(s, 1)
	if err != nil {
		t.Fatal(err)
	}
	if r.Context <= chunkedPrefillAbove {
		t.Fatalf("one request: %d tokens; chunked prefill above 32K should admit more", r.Context)
	}
	if !holds(r.At, 1) || !*r.At.Spec.ChunkedPrefill || r.Beyond != nil && holds(r.Beyond, 1) {
		t.Errorf("answer %d: holds %v, chunked %v", r.Context, holds(r.At, 1), *r.At.Spec.ChunkedPrefill)
	}
	// The same deployment without chunked prefill stops below the switch.
	off := false
	s.ChunkedPrefill = &off
	r2, err := MaxContext(s, 1)
	if err != nil {
		t.Fatal(err)
	}
	if r2.Context >= r.Context {
		t.Errorf("without chunked prefill %d tokens, with %d", r2.Context, r.Context)
	}
}

// Five requests on an A100-40GB hold a context of 32,800 tokens, above the
// chunked-prefill switch, but not one of 32,768 below it: the answer names
// the shorter contexts that do not hold them (`max --context '?'` used to
// say every shorter context did).
func TestMaxContextGapBelowChunkedSwitch(t *testing.T) {
	s := Spec{Model: mustModel(t, "llama-3.1-8b"), GPU: mustGPU(t, "a100-40gb")}
	r, err := MaxContext(s, 5)
	if err != nil {
		t.Fatal(err)
	}
	if r.Context <= chunkedPrefillAbove || r.Gap[0] < 1 || r.Gap[1] != chunkedPrefillAbove {
		t.Fatalf("answer %d, gap %v: want an answer above %d and a gap ending there", r.Context, r.Gap, chunkedPrefillAbove)
	}
	m := &ctxSolver{base: s, n: 5, res: &ContextResult{FollowsModelLen: true}}
	for _, c := range []struct {
		context int
		holds   bool
	}{{r.Gap[0] - 1, true}, {r.Gap[0], false}, {r.Gap[1], false}, {r.Gap[1] + 1, true}, {r.Context, true}} {
		if c.context < 1 {
			continue
		}
		if ok, err := m.holdsAt(c.context); err != nil || ok != c.holds {
			t.Errorf("context %d: holds %v (err %v), want %v", c.context, ok, err, c.holds)
		}
	}
}

func TestMaxContextBadInput(t *testing.T) {
	s := Spec{Model: mustModel(t, "llama-3-8b"), GPU: mustGPU(t, "h100")}
	for _, c := range []struct {
		s    Spec
		n    int64
		want Field
	}{
		{s, 0, FieldRequests},
		{Spec{Model: s.Model, GPU: s.GPU, Context: 100}, 1, FieldContext},
		{Spec{Model: s.Model, GPU: s.GPU, TP: 3}, 1, FieldTP},
	} {
		_, err := MaxContext(c.s, c.n)
		fe, ok := err.(*FieldError)
		if !ok || fe.Field != c.want {
			t.Errorf("%+v: %v, want an error about %s", c.s, err, c.want)
		}
	}
}

func mustModelT(rt *rapid.T, name string) *modelsArch {
	m, err := resolveModel(name)
	if err != nil {
		rt.Fatal(err)
	}
	return m
}

type modelsArch = models.Arch

var resolveModel = models.Resolve

// BenchmarkMaxContextLlama3_70B: max --context '?' for 64 requests of
// llama-3-70b over tp 8 H100s (target: under 1 s, as max's others).
func BenchmarkMaxContextLlama3_70B(b *testing.B) {
	m, err := models.Resolve("llama-3-70b")
	if err != nil {
		b.Fatal(err)
	}
	g, err := hw.Lookup("h100")
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if _, err := MaxContext(Spec{Model: m, GPU: g, TP: 8}, 64); err != nil {
			b.Fatal(err)
		}
	}
}
