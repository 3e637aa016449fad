package search

import (
	"errors"
	"strings"
	"testing"

	"pgregory.net/rapid"

	"github.com/memplan/memplan/engine"
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
// program); the peaks of every probe stay for the secant.
func TestMaxKeepsTheBracketEnds(t *testing.T) {
	m := &maxSolver{peaks: map[int]float64{}, plans: map[int]*engine.Result{}}
	for u := 1; u <= 8; u++ {
		m.peaks[u], m.plans[u] = float64(u), &engine.Result{}
	}
	m.keep(5, 6)
	if len(m.plans) != 2 || m.plans[5] == nil || m.plans[6] == nil || len(m.peaks) != 8 {
		t.Errorf("kept plans %v and %d peaks, want the plans of 5 and 6 and all 8 peaks", m.plans, len(m.peaks))
	}
}
