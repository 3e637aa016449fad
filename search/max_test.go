package search

import (
	"errors"
	"strings"
	"testing"

	"pgregory.net/rapid"

	"github.com/memplan/memplan/engine"
	"github.com/memplan/memplan/hw"
	"github.com/memplan/memplan/importer/torchtrace"
	"github.com/memplan/memplan/ir"
	"github.com/memplan/memplan/lower"
	"github.com/memplan/memplan/models"
	"github.com/memplan/memplan/models/build"
	"github.com/memplan/memplan/models/modeltest"
	"github.com/memplan/memplan/ops"
	"github.com/memplan/memplan/units"
)

// drawMaxJob is a random job of a generated architecture: training (with
// accumulation, checkpointing, sharding, offload, LoRA) or inference.
func drawMaxJob(rt *rapid.T) engine.Spec {
	a := modeltest.Arch(rt)
	s := engine.Spec{Job: engine.Job{Model: a, MicroBatch: 1, Seq: 8,
		Precision: rapid.SampledFrom([]ops.Precision{ops.FP32, ops.AMPBF16, ops.BF16, ops.PureBF16}).Draw(rt, "precision"),
		Optimizer: rapid.SampledFrom([]lower.Optimizer{lower.AdamW, lower.SGD, lower.Adam8bit}).Draw(rt, "optimizer"),
		Impl:      rapid.SampledFrom([]lower.Impl{lower.Foreach, lower.Single, lower.Fused}).Draw(rt, "impl"),
		Attention: build.Attention(rapid.IntRange(0, 1).Draw(rt, "attention"))}}
	s.FirstStep = rapid.Bool().Draw(rt, "first")
	if !a.Encoder && rapid.IntRange(0, 3).Draw(rt, "infer") == 0 {
		s.Mode = engine.Infer
		s.GenTokens = rapid.IntRange(0, 8).Draw(rt, "gen")
		return s
	}
	s.Accum = rapid.IntRange(1, 3).Draw(rt, "accum")
	s.Checkpoint = rapid.SampledFrom([]engine.CheckpointPolicy{{}, {Kind: engine.CheckpointFull}, {Kind: engine.CheckpointEvery, Every: 2}}).Draw(rt, "ckpt")
	s.DP = rapid.SampledFrom([]int{1, 2, 4}).Draw(rt, "dp")
	if s.DP > 1 {
		s.ZeRO = rapid.IntRange(0, 3).Draw(rt, "zero")
	}
	s.Offload.Activations = rapid.Bool().Draw(rt, "offact")
	s.Offload.Optimizer = rapid.Bool().Draw(rt, "offopt")
	if rapid.IntRange(0, 3).Draw(rt, "lora") == 0 {
		s.LoRA = &build.LoRA{Rank: 4, Alpha: 8, Targets: []string{build.AllLinear}}
	}
	return s
}

// at is s with dimension d set to v.
func at(s engine.Spec, d Dim, v int) engine.Spec {
	m := maxSolver{base: s, r: &MaxResult{Dim: d}}
	return m.spec(v)
}

func peakAt(t interface{ Fatalf(string, ...any) }, s engine.Spec, d Dim, v int) units.Bytes {
	r, err := engine.PlanWith(at(s, d, v), engine.Options{NoTimeline: true})
	if err != nil {
		t.Fatalf("%s %d: %v", d, v, err)
	}
	return r.PeakBytes()
}

// The monotonicity Max relies on: with everything else fixed, the peak
// (steady and first step) never falls as the micro-batch, the sequence or
// the generated tokens grow.
func TestPropertyPeakMonotone(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		s := drawMaxJob(rt)
		d := DimMicroBatch
		if s.Model.Family != models.FamilyViT {
			d = rapid.SampledFrom([]Dim{DimMicroBatch, DimSeq}).Draw(rt, "dim")
		}
		if s.Mode == engine.Infer && !s.Model.Encoder && rapid.Bool().Draw(rt, "gen dim") {
			d = DimGenTokens
		}
		v := rapid.IntRange(1, 12).Draw(rt, "v")
		w := v + rapid.IntRange(1, 4).Draw(rt, "dv")
		if pv, pw := peakAt(rt, s, d, v), peakAt(rt, s, d, w); pw < pv {
			rt.Fatalf("%s %d peaks at %d bytes, %d at %d bytes: the peak fell", d, v, pv, w, pw)
		}
	})
}

// Max agrees with a brute-force scan of plan: on generated jobs and a budget
// drawn between the peaks at the ends of a range, the largest value whose
// plan fits (every value scanned, none assumed) is Max's answer, and the
// value one step beyond does not fit.
func TestPropertyMaxMatchesScan(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		s := drawMaxJob(rt)
		d, n := DimMicroBatch, 10
		if s.Model.Family != models.FamilyViT && rapid.Bool().Draw(rt, "seq") {
			d, n = DimSeq, 24
		}
		peaks := make([]units.Bytes, n+1)
		for v := 1; v <= n; v++ {
			peaks[v] = peakAt(rt, s, d, v)
		}
		if peaks[n] == peaks[1] {
			rt.Skip("the peak does not move over the range")
		}
		lo, hi := int64(peaks[1])*9/10, int64(peaks[n])-1
		s.Capacity = units.Bytes(rapid.Int64Range(lo, hi).Draw(rt, "budget"))
		want := 0
		for v := 1; v <= n; v++ {
			if peaks[v] <= s.Capacity {
				want = v
			}
		}
		r, err := Max(s, d)
		if want == 0 {
			if !errors.Is(err, ErrNothingFits) {
				rt.Fatalf("nothing fits %s in [1, %d] by the scan; Max: %v", d, n, err)
			}
			return
		}
		if err != nil {
			rt.Fatal(err)
		}
		if r.Value != want {
			rt.Fatalf("Max %s = %d, the scan says %d (budget %d, peaks %v)", d, r.Value, want, s.Capacity, peaks[1:])
		}
		if !r.At.Fits || r.At.PeakBytes() != peaks[want] {
			rt.Fatalf("the plan at %d: fits %v, peak %d, want %d", want, r.At.Fits, r.At.PeakBytes(), peaks[want])
		}
		if r.Beyond == nil || r.Beyond.Fits || r.Beyond.PeakBytes() != peaks[want+1] {
			rt.Fatalf("the plan one step beyond %d does not show the overflow: %+v", want, r.Beyond)
		}
	})
}

// Max's bounds: the model's positions cap a sequence, sequence parallelism
// makes it a multiple of TP, an image model has no sequence, a budget is
// needed.
func TestMaxBounds(t *testing.T) {
	s := baseSpec(t, "gpt2", "h100", 2)
	r, err := Max(s, DimSeq)
	if err != nil {
		t.Fatal(err)
	}
	if !r.AtCap() || r.Value != 1024 || r.Beyond != nil {
		t.Errorf("gpt2 on an H100: seq %d (cap %d, %s), want its 1024 positions", r.Value, r.Cap, r.CapWhy)
	}
	sp := baseSpec(t, "llama-3.2-1b", "rtx-4090", 2)
	sp.TP, sp.SP = 4, true
	if r, err = Max(sp, DimSeq); err != nil {
		t.Fatal(err)
	}
	if r.Value%4 != 0 || r.Step != 4 || (r.Beyond != nil && r.Beyond.Spec.Seq != r.Value+4) {
		t.Errorf("sequence parallel over 4: seq %d step %d", r.Value, r.Step)
	}
	vit := baseSpec(t, "vit-base", "h100", 0)
	vit.Seq = 0
	if _, err := Max(vit, DimSeq); err == nil {
		t.Error("vit: solved a sequence length")
	}
	noGPU := baseSpec(t, "gpt2", "h100", 2)
	noGPU.GPU = nil
	if _, err := Max(noGPU, DimMicroBatch); err == nil {
		t.Error("no GPU and no budget: solved")
	}
	if _, err := Max(s, DimGenTokens); err == nil {
		t.Error("training: solved generated tokens")
	}
	// The cap is the 2^31 tokens a model's graph is built for, not a
	// refusal of a probe past it (sweep H, round 25).
	big := baseSpec(t, "llama-3-8b", "h100", 2)
	big.Seq, big.Capacity = 8192, units.Bytes(1)<<60
	if r, err = Max(big, DimMicroBatch); err != nil {
		t.Fatal(err)
	}
	if !r.AtCap() || r.Value != 1<<31/8192 || !strings.Contains(r.CapWhy, "2^31 tokens") {
		t.Errorf("llama-3-8b at 8,192 tokens on 1 EiB: micro-batch %d (cap %d, %s), want the 2^18 the graph's tokens allow", r.Value, r.Cap, r.CapWhy)
	}
}

// Max that nothing fits says what runs out: the GPU or budget (how much more
// it needs), --host-memory (how far over it) or both; never "needs 0 B more"
// of a GPU the job fits.
func TestMaxNothingFitsNamesTheLimit(t *testing.T) {
	device := baseSpec(t, "gpt2", "h100", 2)
	device.Capacity = 1 << 20
	host := baseSpec(t, "gpt2", "h100", 2)
	host.Offload.Activations, host.HostMemory = true, 1<<20
	both := host
	both.Capacity = 1 << 20
	for _, c := range []struct {
		name        string
		s           engine.Spec
		want, lacks []string
	}{
		{"the budget", device, []string{"even micro-batch 1 does not fit: needs ", " more"}, []string{"host memory", "needs 0 B"}},
		{"host memory", host, []string{"even micro-batch 1 does not fit: is ", " over host memory per node 1.00 MiB"}, []string{"needs"}},
		{"both", both, []string{"even micro-batch 1 does not fit: needs ", " more and is ", " over host memory per node 1.00 MiB"}, []string{"needs 0 B"}},
	} {
		_, err := Max(c.s, DimMicroBatch)
		if !errors.Is(err, ErrNothingFits) {
			t.Errorf("%s: %v, want ErrNothingFits", c.name, err)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %q lacks %q", c.name, err, w)
			}
		}
		for _, w := range c.lacks {
			if strings.Contains(err.Error(), w) {
				t.Errorf("%s: %q says %q", c.name, err, w)
			}
		}
	}
}

// keep leaves the plans of the bracket's ends only (each holds its
// program); the margins of every probe stay for the prediction.
func TestMaxKeepsTheBracketEnds(t *testing.T) {
	m := &maxSolver{margins: map[int]curves{}, plans: map[int]*engine.Result{}}
	for u := 1; u <= 8; u++ {
		m.margins[u], m.plans[u] = curves{}, &engine.Result{}
	}
	m.keep(5, 6)
	if len(m.plans) != 2 || m.plans[5] == nil || m.plans[6] == nil || len(m.margins) != 8 {
		t.Errorf("kept plans %v and %d margins, want the plans of 5 and 6 and all 8 margins", m.plans, len(m.margins))
	}
}

// Max's probes on catalog jobs and a trace, each against the count the
// secant-and-bisection search of round 23 took (in the comment): the
// curves' prediction lands beside the answer in a few plans, where a
// sequence's peak flat in the optimizer step had made the secant gallop
// from 1 by doubling, and a convex one had made it creep from one side.
// The answer is the bracket both probed whatever the count.
func TestMaxProbesFew(t *testing.T) {
	trace, err := torchtrace.Load("../testdata/torch/gpt2_tiny.trace.json")
	if err != nil {
		t.Fatal(err)
	}
	g, _ := hw.Lookup("h100")
	traced := engine.Spec{Job: engine.Job{Trace: trace, MicroBatch: 1}, Target: engine.Target{GPU: g}}
	traced.Capacity = 2 << 30
	one := baseSpec(t, "llama-3.2-1b", "h100", 0)
	eager, full, auto := one, one, one
	eager.Attention = build.Eager
	full.Checkpoint.Kind = engine.CheckpointFull
	auto.Checkpoint.Kind = engine.CheckpointAuto
	batch := one
	batch.Seq = 4096
	for _, c := range []struct {
		name string
		s    engine.Spec
		d    Dim
		most int
	}{
		{"llama-3.2-1b seq", one, DimSeq, 7},                      // 17
		{"llama-3.2-1b seq, eager attention", eager, DimSeq, 7},   // 22
		{"llama-3.2-1b seq, full checkpointing", full, DimSeq, 7}, // 18
		{"llama-3.2-1b seq, checkpoint auto", auto, DimSeq, 12},   // 24
		{"llama-3.2-1b micro-batch", batch, DimMicroBatch, 4},     // 4
		{"gpt2_tiny trace seq on 2 GiB", traced, DimSeq, 6},       // 27
	} {
		r, err := Max(c.s, c.d)
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if r.Plans > c.most {
			t.Errorf("%s: %d plans, want at most %d", c.name, r.Plans, c.most)
		}
		if !r.At.Fits || r.Beyond == nil || r.Beyond.Fits {
			t.Errorf("%s: %d is not where it stops fitting", c.name, r.Value)
		}
	}
}

// The search on curves of its own, monotone but otherwise anything: sums
// of affine and quadratic terms with steps up anywhere, flat stretches,
// several curves taking over from one another. Its answer is the largest
// fitting value (found by bisection of the known curve), and its probes
// stay within the gallop's and the bisection's bound whatever the
// prediction does.
func TestPropertyMaxSolverOnCurves(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		capU := rapid.IntRange(1, 1<<20).Draw(rt, "cap")
		type term struct{ a, b, c float64 }
		type step struct {
			at int
			up float64
		}
		n := rapid.IntRange(1, 4).Draw(rt, "curves")
		terms := make([]term, n)
		steps := make([][]step, n)
		for i := range terms {
			terms[i] = term{rapid.Float64Range(0, 1e10).Draw(rt, "a"), rapid.SampledFrom([]float64{0, 1, 1e3, 1e6}).Draw(rt, "b"), rapid.SampledFrom([]float64{0, 1e-3, 1, 100}).Draw(rt, "c")}
			for range rapid.IntRange(0, 3).Draw(rt, "steps") {
				steps[i] = append(steps[i], step{rapid.IntRange(1, capU).Draw(rt, "at"), rapid.Float64Range(0, 1e10).Draw(rt, "up")})
			}
		}
		curve := func(i, u int) units.Bytes {
			x := float64(u)
			y := terms[i].a + terms[i].b*x + terms[i].c*x*x
			for _, s := range steps[i] {
				if u >= s.at {
					y += s.up
				}
			}
			return units.Bytes(y)
		}
		peak := func(u int) units.Bytes {
			var p units.Bytes
			for i := range n {
				p = max(p, curve(i, u))
			}
			return p
		}
		capacity := units.Bytes(rapid.Int64Range(int64(peak(1))*9/10, int64(peak(capU))+1<<20).Draw(rt, "capacity"))
		// The truth, by bisection of the monotone peak.
		want := 0
		for lo, hi := 1, capU; lo <= hi; {
			mid := (lo + hi) / 2
			if peak(mid) <= capacity {
				want, lo = mid, mid+1
			} else {
				hi = mid - 1
			}
		}
		r := &MaxResult{Step: 1, Cap: capU}
		m := &maxSolver{r: r, planFn: func(v int) (*engine.Result, error) {
			if v < 1 || v > capU {
				rt.Fatalf("probed %d outside [1, %d]", v, capU)
			}
			res := &engine.Result{Capacity: capacity, Fits: peak(v) <= capacity}
			k := int(ir.NumPhases)
			res.StagePhasePeaks = make([][ir.NumPhases]units.Bytes, (n+k-1)/k)
			for i := range n {
				res.StagePhasePeaks[i/k][i%k] = max(curve(i, v), 1)
			}
			return res, nil
		}}
		lo, hi, err := m.solve()
		if err != nil {
			rt.Fatal(err)
		}
		if lo != want || hi != want+1 {
			rt.Fatalf("bracket [%d, %d], want [%d, %d]", lo, hi, want, want+1)
		}
		bits := 0
		for x := capU; x > 0; x >>= 1 {
			bits++
		}
		if most := 5 * (bits + 1); r.Plans > most {
			rt.Fatalf("%d probes over cap %d, want at most %d", r.Plans, capU, most)
		}
	})
}
