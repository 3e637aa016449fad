package engine

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/memplan/memplan/cost"
	"github.com/memplan/memplan/hw"
	"github.com/memplan/memplan/importer/torchtrace"
	"github.com/memplan/memplan/lower"
	"github.com/memplan/memplan/ops"
	"github.com/memplan/memplan/units"
)

// accumJobs are plans without pipelining over several models and
// strategies: plain, ZeRO 1–3 over data parallelism, full and every-2
// checkpointing, activation and optimizer offload, the first step.
func accumJobs(t *testing.T) []Spec {
	gpu, err := hw.Lookup("h100")
	if err != nil {
		t.Fatal(err)
	}
	var out []Spec
	for _, m := range []string{"gpt2", "llama-3.2-1b"} {
		base := Spec{Job: Job{Model: lookup(t, m), MicroBatch: 2, Seq: 256, Precision: ops.AMPBF16, Optimizer: lower.AdamW}, Target: Target{GPU: gpu}}
		out = append(out, base)
		for z := 0; z <= 3; z++ {
			s := base
			s.DP, s.ZeRO = 4, z
			out = append(out, s)
		}
		s := base
		s.Checkpoint = CheckpointPolicy{Kind: CheckpointFull}
		out = append(out, s)
		s = base
		s.Checkpoint = CheckpointPolicy{Kind: CheckpointEvery, Every: 2}
		s.DP, s.ZeRO = 2, 2
		out = append(out, s)
		s = base
		s.Offload = Offload{Activations: true, Optimizer: true}
		out = append(out, s)
		s = base
		s.FirstStep = true
		s.Impl = lower.Fused
		out = append(out, s)
	}
	// Traces: a language model and a CNN, replayed with their recorded
	// optimizer and with AdamW.
	for _, f := range []string{"lm.trace.json", "mobilenet_v2.trace.json"} {
		tr, err := torchtrace.Load("../testdata/torch/" + f)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, Spec{Job: Job{Trace: tr}, Target: Target{GPU: gpu}})
		out = append(out, Spec{Job: Job{Trace: tr, Optimizer: lower.AdamW, TraceOptimizer: true}, Target: Target{GPU: gpu}})
	}
	return out
}

func name(s Spec) string {
	return fmt.Sprintf("%s/dp%d-zero%d/ckpt%v/off%v/first%v/opt%v", s.JobName(), s.DP, s.ZeRO, s.Checkpoint, s.Offload, s.FirstStep, s.TraceOptimizer)
}

// A plan of k micro-steps without pipelining peaks as one of three does
// (shortAccum): accum 3, 4, 7 and 1000 report the same device, host and
// first-step peaks, and the plan of 1000 simulates three micro-steps.
func TestShortAccumShowsPeak(t *testing.T) {
	for _, base := range accumJobs(t) {
		t.Run(name(base), func(t *testing.T) {
			var want *Result
			for _, k := range []int{3, 4, 7, 1000} {
				s := base
				s.Accum = k
				r := mustPlan(t, s)
				if r.Spec.Accum != k {
					t.Fatalf("accum %d reported as %d", k, r.Spec.Accum)
				}
				if k > 3 && r.SimAccum != 3 {
					t.Fatalf("accum %d simulated %d micro-steps", k, r.SimAccum)
				}
				if want == nil {
					want = r
					continue
				}
				if r.Sim.Peak.Total != want.Sim.Peak.Total || r.HostPeak != want.HostPeak {
					t.Errorf("accum %d peaks at %s (host %s), accum 3 at %s (host %s)", k, r.Sim.Peak.Total, r.HostPeak, want.Sim.Peak.Total, want.HostPeak)
				}
				if (r.First == nil) != (want.First == nil) || r.First != nil && r.First.Peak.Total != want.First.Peak.Total {
					t.Errorf("accum %d: first step differs from accum 3's", k)
				}
			}
		})
	}
}

// Two, three and four micro-steps step by the same time, phase by phase,
// on accumJobs and on two-layer models of other shapes (experts, tensor and
// sequence parallelism, every offload): the second micro-step on is affine,
// which planShortAccum extrapolates from two and three.
func TestShortAccumIncrement(t *testing.T) {
	gpu, err := hw.Lookup("h100")
	if err != nil {
		t.Fatal(err)
	}
	jobs := accumJobs(t)
	for _, m := range []string{"mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v2-lite", "llama-3-8b"} {
		a := *lookup(t, m)
		a.Layers = 2
		base := Spec{Job: Job{Model: &a, MicroBatch: 1, Seq: 128, Precision: ops.AMPBF16, Optimizer: lower.AdamW}, Target: Target{GPU: gpu}}
		tp, params, acts, opt := base, base, base, base
		tp.TP, tp.SP = 2, a.NumExperts == 0
		params.DP, params.ZeRO, params.Offload = 2, 3, Offload{Params: true}
		acts.Offload = Offload{Activations: true}
		opt.DP, opt.Offload = 4, Offload{Optimizer: true}
		jobs = append(jobs, base, tp, params, acts, opt)
	}
	for _, base := range jobs {
		var ts [5]*cost.Timing
		for k := 2; k <= 4; k++ {
			s := base
			s.Accum = k
			r, err := PlanWith(s, Options{AllAccum: true})
			if err != nil {
				t.Fatalf("%s accum %d: %v", name(base), k, err)
			}
			ts[k] = r.Timing
		}
		if !incrementsEqual(ts[2], ts[3], ts[4]) {
			t.Errorf("%s: steps of 2, 3, 4 micro-steps %v, %v, %v are not affine", name(base), ts[2].Step, ts[3].Step, ts[4].Step)
		}
	}
}

// A job whose ops all run on the compute stream steps by what its second
// micro-step's ops take where they run (middleStep): the timings of three
// micro-steps less two, in every total and phase, exactly in time and to
// rounding in FLOPs. planShortAccum extrapolates by it in place of
// pricing the program of two.
func TestMiddleStepIsTwoToThree(t *testing.T) {
	if mid, err := middleStep(&Spec{}, nil); mid != nil || err != nil {
		t.Fatalf("no program: middle step %v, %v; want none, falling back to two micro-steps", mid, err)
	}
	rapid.Check(t, func(rt *rapid.T) {
		s := leverSpec(t, rt)
		s.DP = 0
		switch rapid.IntRange(0, 3).Draw(rt, "checkpoint") {
		case 1:
			s.Checkpoint = CheckpointPolicy{Kind: CheckpointFull}
		case 2:
			s.Checkpoint = CheckpointPolicy{Kind: CheckpointEvery, Every: 2}
		case 3:
			s.Checkpoint = CheckpointPolicy{Kind: CheckpointAuto}
			s.Capacity = units.Bytes(rapid.Int64Range(1<<28, 1<<36).Draw(rt, "capacity"))
		}
		if !s.computeStreamOnly() {
			t.Fatalf("%s: not on the compute stream alone", s.JobName())
		}
		var ts [4]*cost.Timing
		var three *Result // its program is micro-step 1's
		for k := 2; k <= 3; k++ {
			q := s
			q.Accum = k
			r, err := PlanWith(q, Options{AllAccum: true})
			if err != nil {
				rt.Skip(err)
			}
			ts[k], three = r.Timing, r
		}
		mid, err := middleStep(&s, three.Program)
		if err != nil || mid == nil {
			t.Fatalf("%s: middle step %v, %v", s.JobName(), mid, err)
		}
		if d := stepsBy(ts[2], ts[3], mid); d != "" {
			t.Fatalf("%s ckpt %v first %v: from two micro-steps to three, %s", s.JobName(), s.Checkpoint, s.FirstStep, d)
		}
	})
}

// stepsBy says how hi − lo differs from d in a total or phase time (exactly)
// or FLOP count (to rounding); "" when it does not.
func stepsBy(lo, hi, d *cost.Timing) string {
	durs := []struct {
		what     string
		l, h, by time.Duration
	}{{"step", lo.Step, hi.Step, d.Step}, {"idle", lo.Idle, hi.Idle, d.Idle}, {"compute", lo.Compute, hi.Compute, d.Compute},
		{"comm", lo.Comm, hi.Comm, d.Comm}, {"transfer", lo.Transfer, hi.Transfer, d.Transfer}, {"exposed comm", lo.ExposedComm, hi.ExposedComm, d.ExposedComm},
		{"exposed transfer", lo.ExposedTransfer, hi.ExposedTransfer, d.ExposedTransfer}, {"recompute", lo.Recompute, hi.Recompute, d.Recompute}}
	for i := range d.Phases {
		l, h, by := lo.Phases[i], hi.Phases[i], d.Phases[i]
		durs = append(durs, []struct {
			what     string
			l, h, by time.Duration
		}{{fmt.Sprintf("phase %d wall", i), l.Wall, h.Wall, by.Wall}, {fmt.Sprintf("phase %d compute", i), l.Compute, h.Compute, by.Compute},
			{fmt.Sprintf("phase %d comm", i), l.Comm, h.Comm, by.Comm}, {fmt.Sprintf("phase %d transfer", i), l.Transfer, h.Transfer, by.Transfer}}...)
		if !near(h.FLOPs-l.FLOPs, by.FLOPs) {
			return fmt.Sprintf("phase %d FLOPs %g → %g, not by %g", i, l.FLOPs, h.FLOPs, by.FLOPs)
		}
	}
	for _, x := range durs {
		if x.h-x.l != x.by {
			return fmt.Sprintf("%s %v → %v, not by %v", x.what, x.l, x.h, x.by)
		}
	}
	for _, f := range [][3]float64{{lo.FLOPs, hi.FLOPs, d.FLOPs}, {lo.ModelFLOPs, hi.ModelFLOPs, d.ModelFLOPs}, {lo.RecomputeFLOPs, hi.RecomputeFLOPs, d.RecomputeFLOPs}} {
		if !near(f[1]-f[0], f[2]) {
			return fmt.Sprintf("FLOPs %g → %g, not by %g", f[0], f[1], f[2])
		}
	}
	return ""
}

// incrementsEqual says whether b − a = c − b for every total and phase time.
func incrementsEqual(a, b, c *cost.Timing) bool {
	same := func(x, y, z time.Duration) bool { return y-x == z-y }
	for i := range a.Phases {
		p, q, r := a.Phases[i], b.Phases[i], c.Phases[i]
		if !same(p.Wall, q.Wall, r.Wall) || !same(p.Compute, q.Compute, r.Compute) || !same(p.Comm, q.Comm, r.Comm) || !same(p.Transfer, q.Transfer, r.Transfer) || !near(q.FLOPs-p.FLOPs, r.FLOPs-q.FLOPs) {
			return false
		}
	}
	return same(a.Step, b.Step, c.Step) && same(a.Idle, b.Idle, c.Idle) && same(a.ExposedComm, b.ExposedComm, c.ExposedComm) &&
		same(a.ExposedTransfer, b.ExposedTransfer, c.ExposedTransfer) && same(a.Recompute, b.Recompute, c.Recompute) && near(b.FLOPs-a.FLOPs, c.FLOPs-b.FLOPs)
}

// The step of k micro-steps extrapolated from two and three equals the
// step of all k simulated (to a nanosecond per micro-step of rounding),
// with the same FLOPs, throughput and MFU.
func TestShortAccumTiming(t *testing.T) {
	for _, base := range accumJobs(t) {
		for _, k := range []int{5, 9} {
			s := base
			s.Accum = k
			short := mustPlan(t, s)
			full, err := PlanWith(s, Options{AllAccum: true})
			if err != nil {
				t.Fatal(err)
			}
			if short.SimAccum != 3 || full.SimAccum != 0 {
				t.Fatalf("simulated %d and %d micro-steps", short.SimAccum, full.SimAccum)
			}
			if short.Sim.Peak.Total != full.Sim.Peak.Total {
				t.Errorf("%s accum %d: peak %s short, %s in full", name(base), k, short.Sim.Peak.Total, full.Sim.Peak.Total)
			}
			a, b := short.Timing, full.Timing
			tol := time.Duration(k)
			if d := a.Step - b.Step; d < -tol || d > tol {
				t.Errorf("%s accum %d: step %v short, %v in full", name(base), k, a.Step, b.Step)
			}
			for i := range a.Phases {
				if d := a.Phases[i].Wall - b.Phases[i].Wall; d < -tol || d > tol {
					t.Errorf("%s accum %d: phase %d wall %v short, %v in full", name(base), k, i, a.Phases[i].Wall, b.Phases[i].Wall)
				}
			}
			if !near(a.FLOPs, b.FLOPs) || !near(a.ModelFLOPs, b.ModelFLOPs) || !near(a.MFU, b.MFU) || !near(a.TokensPerSec, b.TokensPerSec) || !near(a.SamplesPerSec, b.SamplesPerSec) {
				t.Errorf("%s accum %d: FLOPs %g/%g, MFU %g/%g, tokens/s %g/%g short/full", name(base), k, a.FLOPs, b.FLOPs, a.MFU, b.MFU, a.TokensPerSec, b.TokensPerSec)
			}
		}
	}
}

func near(a, b float64) bool {
	d := a - b
	if d < 0 {
		d = -d
	}
	return d <= 1e-9*max(a, b, -a, -b)+1e-12
}

// A pipeline simulates every micro-step: its accumulation is bounded.
func TestPipelineAccumLimit(t *testing.T) {
	s := Spec{Job: Job{Model: lookup(t, "gpt2"), Seq: 128, Accum: MaxPipelineAccum + 1}, Parallel: Parallel{PP: 2}}
	_, err := Plan(s)
	if err == nil {
		t.Fatal("no error")
	}
	t.Log(err)
}

// BenchmarkPlanAccumMillion plans llama-3.2-1b (seq 512) with a million
// micro-steps: three are simulated, so it costs about a plan of four
// (the issue: 10,000 micro-steps took 131 s and 12.6 GB).
func BenchmarkPlanAccumMillion(b *testing.B) {
	gpu, _ := hw.Lookup("h100")
	s := Spec{Job: Job{Model: lookup(b, "llama-3.2-1b"), MicroBatch: 1, Seq: 512, Precision: ops.AMPBF16, Optimizer: lower.AdamW, Accum: 1_000_000}, Target: Target{GPU: gpu}}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Plan(s); err != nil {
			b.Fatal(err)
		}
	}
}

// An unpriced 1F1B pipeline of k > p+1 micro-steps simulates p+1
// (pipelineShortAccum) and peaks as all k do: on every stage (StagePeaks),
// in the first step of the stage at the peak, and on the host, under
// checkpointing, ZeRO and every offload.
func TestPropertyPipelineShortAccumShowsPeak(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		s := pipelineSpec(t, rt, 8, func(pp int) (int, int) { return pp + 2, pp + 5 })
		all, err := PlanWith(s, Options{NoTiming: true, AllAccum: true})
		if err != nil {
			rt.Skip(err)
		}
		short, err := PlanWith(s, Options{NoTiming: true})
		if err != nil {
			t.Fatalf("all %d micro-steps planned, %d did not: %v", s.Accum, s.PP+1, err)
		}
		if short.SimAccum != s.PP+1 || short.Spec.Accum != s.Accum || all.SimAccum != 0 {
			t.Fatalf("simulated %d of %d micro-steps (want %d), all of them: %d", short.SimAccum, short.Spec.Accum, s.PP+1, all.SimAccum)
		}
		if d := peaksDiffer(short, all); d != "" {
			t.Fatalf("%d micro-steps against all %d: %s", s.PP+1, s.Accum, d)
		}
	})
}

// peaksDiffer says how a plan of fewer micro-steps peaks otherwise than all
// of them ("" when it does not): the peak, every stage's, the first step's,
// the host's, the stage at the peak and whether and by how much it fits.
func peaksDiffer(short, all *Result) string {
	first := func(r *Result) units.Bytes {
		if r.First == nil {
			return -1
		}
		return r.First.Peak.Total
	}
	fs := first(short)
	if short.First == nil && firstNoHigher(&short.Spec) {
		fs = first(all) // left out of a plan for its numbers alone: its peak is all's all the same
	}
	if short.PeakBytes() != all.PeakBytes() || !slices.Equal(short.StagePeaks, all.StagePeaks) || fs != first(all) ||
		short.HostPeak != all.HostPeak || short.Stage != all.Stage || short.Fits != all.Fits || short.Shortfall != all.Shortfall {
		return fmt.Sprintf("peak %d, stages %v, first step %d, host %d, stage %d against %d, %v, %d, %d, %d",
			short.PeakBytes(), short.StagePeaks, first(short), short.HostPeak, short.Stage, all.PeakBytes(), all.StagePeaks, first(all), all.HostPeak, all.Stage)
	}
	return ""
}

// A numbers-only plan of an unpriced 1F1B pipeline of k > p+1 micro-steps
// (the lever's) plans each stage with the micro-steps that show its own
// peak (planner.stageAccum: p−i+1, at least three) and peaks as all k do:
// on every stage, in the first step, on the host, and with the same stage
// at the peak. With a cache that holds a stage's program of p+1, the stage
// keeps p+1, and the numbers are the same.
func TestPropertyStageAccumShowsPeak(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		s := pipelineSpec(t, rt, 8, func(pp int) (int, int) { return pp + 2, pp + 5 })
		all, err := PlanWith(s, Options{NoTiming: true, AllAccum: true})
		if err != nil {
			rt.Skip(err)
		}
		o := Options{NoTiming: true, NoTimeline: true, NumbersOnly: true}
		for st := range s.PP {
			o.Stages = append(o.Stages, st) // each stage named: none left out as like another (likeEarlier)
		}
		if rapid.Bool().Draw(rt, "cached p+1") {
			// A plan of p+1 through the cache first: the stages it
			// cached are planned with p+1 again.
			o.Cache = &Cache{}
			if _, err := PlanWith(s, Options{NoTiming: true, Cache: o.Cache}); err != nil {
				t.Fatal(err)
			}
		}
		short, err := PlanWith(s, o)
		if err != nil {
			t.Fatalf("all %d micro-steps planned, each stage's few did not: %v", s.Accum, err)
		}
		if d := peaksDiffer(short, all); d != "" {
			t.Fatalf("each stage's few against all %d: %s", s.Accum, d)
		}
		if short.SimAccum != s.PP+1 || short.Spec.Accum != s.Accum {
			t.Fatalf("simulated %d of %d micro-steps (want %d)", short.SimAccum, short.Spec.Accum, s.PP+1)
		}
	})
}

// TestStageAccum pins the micro-steps each stage is planned with: p−i+1,
// at least three, at most the plan's, and the plan's where the cache holds
// the stage's program of them.
func TestStageAccum(t *testing.T) {
	s := Spec{Job: Job{Model: lookup(t, "gpt2"), MicroBatch: 1, Seq: 128, Precision: ops.AMPBF16, Optimizer: lower.AdamW, Accum: 5},
		Parallel: Parallel{PP: 4}}
	pl := &planner{s: &s}
	var got []int
	for stage := range 4 {
		got = append(got, pl.stageAccum(5, stage))
	}
	if want := []int{5, 4, 3, 3}; !slices.Equal(got, want) {
		t.Fatalf("stages of a 4-stage pipeline planned with %v micro-steps, want %v", got, want)
	}
	if n := pl.stageAccum(2, 3); n != 2 {
		t.Fatalf("a plan of 2 planned stage 3 with %d", n)
	}
	c := &Cache{}
	s.Accum = 5
	if _, err := PlanWith(s, Options{NoTiming: true, Cache: c, Stages: []int{2}}); err != nil {
		t.Fatal(err)
	}
	pl = &planner{s: &s, o: Options{Cache: c}}
	if n := pl.stageAccum(5, 2); n != 5 {
		t.Fatalf("stage 2, cached with 5 micro-steps, planned with %d", n)
	}
	if n := pl.stageAccum(5, 3); n != 3 {
		t.Fatalf("stage 3, not cached, planned with %d", n)
	}
}

// A priced 1F1B pipeline of more than 2p+3 micro-steps simulates p+1 and
// prices each stage's step from its programs of p+1 and p+2
// (planPipelineShortAccum): its peaks, its step time, phase walls, FLOPs
// and throughput equal those of all its micro-steps planned and priced
// (times to the nanosecond per micro-step, from rounding).
func TestPipelineShortAccumTiming(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		s := pipelineSpec(t, rt, 4, func(pp int) (int, int) { return 2*pp + 4, 2*pp + 8 })
		all, err := PlanWith(s, Options{AllAccum: true})
		if err != nil {
			rt.Skip(err)
		}
		short, err := PlanWith(s, Options{})
		if err != nil {
			t.Fatalf("all %d micro-steps planned, %d did not: %v", s.Accum, s.PP+1, err)
		}
		if short.SimAccum != s.PP+1 || short.Spec.Accum != s.Accum || all.SimAccum != 0 {
			t.Fatalf("simulated %d of %d micro-steps (want %d), all of them: %d", short.SimAccum, short.Spec.Accum, s.PP+1, all.SimAccum)
		}
		if short.PeakBytes() != all.PeakBytes() || !slices.Equal(short.StagePeaks, all.StagePeaks) || short.Fits != all.Fits {
			t.Fatalf("peaks %d %v short, %d %v in full", short.PeakBytes(), short.StagePeaks, all.PeakBytes(), all.StagePeaks)
		}
		timingsEqual(t, s.Accum, short, all)
	})
}

// pipelineSpec draws a 1F1B pipeline of 2 to maxPP stages, one or two
// layers each and up to pp−1 more (stages of unequal sizes), accumulating
// over accum(pp) micro-steps (a range), with or without checkpointing
// (every block or every other), ZeRO (under data parallelism) and each offload.
func pipelineSpec(t *testing.T, rt *rapid.T, maxPP int, accum func(pp int) (lo, hi int)) Spec {
	s := leverSpec(t, rt)
	s.PP = rapid.IntRange(2, maxPP).Draw(rt, "pp")
	s.Model.Layers = s.PP*rapid.IntRange(1, 2).Draw(rt, "layers per stage") + rapid.IntRange(0, s.PP-1).Draw(rt, "layers past whole stages")
	lo, hi := accum(s.PP)
	s.Accum = rapid.IntRange(lo, hi).Draw(rt, "accum")
	switch rapid.IntRange(0, 2).Draw(rt, "checkpoint") {
	case 1:
		s.Checkpoint = CheckpointPolicy{Kind: CheckpointFull}
	case 2:
		s.Checkpoint = CheckpointPolicy{Kind: CheckpointEvery, Every: 2}
	}
	if s.DP > 1 {
		s.ZeRO = rapid.IntRange(0, 3).Draw(rt, "zero")
	}
	s.Offload.Activations = rapid.Bool().Draw(rt, "offload activations")
	s.Offload.Optimizer = rapid.Bool().Draw(rt, "offload optimizer")
	return s
}

// A priced 1F1B pipeline of k > p+1 micro-steps planned a stage at a time
// (planStagewise: stage i with p−i+1, at least three, priced with one
// more, or all k where those are no fewer and the stage's k hold no more
// than maxStageBlocks, drawn at 0 too) peaks as all k planned do, on
// every stage, in each stage's phases, in the first step and on the host,
// and its step, phase walls, idle time, FLOPs and throughput equal all k
// priced (to a nanosecond per micro-step of rounding).
func TestPropertyStagewiseMatchesFull(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		s := pipelineSpec(t, rt, 6, func(pp int) (int, int) { return pp + 2, 3*pp + 6 })
		// Every stage with its few, as a stage over maxStageBlocks is.
		if rapid.Bool().Draw(rt, "every stage its few") {
			defer func(m int64) { maxStageBlocks = m }(maxStageBlocks)
			maxStageBlocks = 0
		}
		all, err := PlanWith(s, Options{AllAccum: true})
		if err != nil {
			rt.Skip(err)
		}
		short, err := PlanWith(s, Options{stagewise: true})
		if err != nil {
			t.Fatalf("all %d micro-steps planned, each stage's few did not: %v", s.Accum, err)
		}
		if d := peaksDiffer(short, all); d != "" {
			t.Fatalf("each stage's few against all %d: %s", s.Accum, d)
		}
		if !slices.Equal(short.StagePhasePeaks, all.StagePhasePeaks) {
			t.Fatalf("phase peaks %v, all %d: %v", short.StagePhasePeaks, s.Accum, all.StagePhasePeaks)
		}
		steps := stagewiseSteps(&short.Spec)
		if n := steps[short.Stage]; short.Spec.Accum != s.Accum || (n < s.Accum) != (short.SimAccum == n) || n == s.Accum && short.SimAccum != 0 {
			t.Fatalf("stage %d simulated %d of %d micro-steps (steps %v)", short.Stage, short.SimAccum, short.Spec.Accum, steps)
		}
		timingsEqual(t, s.Accum, short, all)
	})
}

// timingsEqual fails t unless short's step, phase walls, idle time, FLOPs
// and throughput equal all's (to a nanosecond per micro-step of accum).
func timingsEqual(t *testing.T, accum int, short, all *Result) {
	t.Helper()
	a, b := short.Timing, all.Timing
	if a == nil || b == nil {
		t.Fatalf("timing %v short, %v in full", a, b)
	}
	tol := time.Duration(accum)
	if d := a.Step - b.Step; d < -tol || d > tol {
		t.Fatalf("step %v short, %v in full", a.Step, b.Step)
	}
	for i := range a.Phases {
		if d := a.Phases[i].Wall - b.Phases[i].Wall; d < -tol || d > tol {
			t.Fatalf("phase %d wall %v short, %v in full", i, a.Phases[i].Wall, b.Phases[i].Wall)
		}
	}
	if d := a.Idle - b.Idle; d < -tol || d > tol {
		t.Fatalf("idle %v short, %v in full", a.Idle, b.Idle)
	}
	if !near(a.FLOPs, b.FLOPs) || !near(short.StepFLOPs, all.StepFLOPs) || !near(a.MFU, b.MFU) || !near(a.TokensPerSec, b.TokensPerSec) {
		t.Fatalf("FLOPs %g/%g, step FLOPs %g/%g, MFU %g/%g, tokens/s %g/%g short/full", a.FLOPs, b.FLOPs, short.StepFLOPs, all.StepFLOPs, a.MFU, b.MFU, a.TokensPerSec, b.TokensPerSec)
	}
}

// A stage of more than maxStageBlocks block-steps is planned with its few
// although they and one more are more micro-steps to build: deepseek-v3
// --pp 8 --accum 16's stage 1 (8 layers of 257 blocks over 16
// micro-steps), not its stage 0 (3 dense layers and 4 of experts).
func TestStagewiseStepsBoundStageBlocks(t *testing.T) {
	s := Spec{Job: Job{Model: lookup(t, "deepseek-v3"), MicroBatch: 1, Seq: 2048, Accum: 16}, Parallel: Parallel{PP: 8}}
	if got, want := stagewiseSteps(&s), []int{16, 8, 7, 6, 5, 4, 3, 3}; !slices.Equal(got, want) {
		t.Errorf("deepseek-v3 pp 8 accum 16: stages planned with %v micro-steps, want %v", got, want)
	}
	if b := stageBlocks(&s, 0); b != 3+4*257 {
		t.Errorf("stage 0 holds %d blocks, want %d", b, 3+4*257)
	}
	s.Model = lookup(t, "llama-3-70b")
	if got, want := stagewiseSteps(&s), []int{16, 16, 7, 6, 5, 4, 3, 3}; !slices.Equal(got, want) {
		t.Errorf("llama-3-70b pp 8 accum 16: stages planned with %v micro-steps, want %v", got, want)
	}
}
