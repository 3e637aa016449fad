package strategy_test

import (
	"fmt"
	"math"
	"reflect"
	"strings"
	"testing"

	"github.com/memplan/memplan/engine"
	"github.com/memplan/memplan/ir"
	"github.com/memplan/memplan/lower"
	"github.com/memplan/memplan/models"
	"github.com/memplan/memplan/models/build"
	"github.com/memplan/memplan/ops"
	"github.com/memplan/memplan/sim"
	"github.com/memplan/memplan/strategy"
	"github.com/memplan/memplan/units"
)

// ppLlama is a small uniform Llama (untied embeddings) with the given layers.
func ppLlama(t testing.TB, layers int) *models.Arch {
	t.Helper()
	a, err := models.Lookup("tinyllama-1.1b")
	if err != nil {
		t.Fatal(err)
	}
	a = a.Clone()
	a.Layers = layers
	a.Hidden, a.Heads, a.KVHeads, a.HeadDim, a.Intermediate = 512, 8, 8, 64, 1408
	return a
}

// pipelineInput is engine.PipelineInput of s (validated).
func pipelineInput(t testing.TB, s engine.Spec) *ir.Program {
	t.Helper()
	if err := s.Validate(); err != nil {
		t.Fatal(err)
	}
	p, err := engine.PipelineInput(&s, false)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func ppStage(t testing.TB, p *ir.Program, pl strategy.Pipeline) (*ir.Program, *sim.Result) {
	t.Helper()
	q, err := strategy.Chain(p, &pl)
	if err != nil {
		t.Fatalf("%+v: %v", pl, err)
	}
	r, err := sim.Run(q)
	if err != nil {
		t.Fatalf("%+v: %v", pl, err)
	}
	keep := 0
	for i := range q.Tensors {
		if q.Tensors[i].Keep && q.Tensors[i].Base == ir.NoTensor {
			keep++
		}
	}
	if r.Allocs-r.Frees != keep {
		t.Fatalf("%+v: %d allocations, %d frees, %d storages kept", pl, r.Allocs, r.Frees, keep)
	}
	return q, r
}

// peakActivation is the highest activation-category total of the timeline.
func peakActivation(r *sim.Result) units.Bytes {
	var m units.Bytes
	for _, pt := range r.Timeline {
		m = max(m, pt.Cat[ir.Activation])
	}
	return m
}

// nonBatchSaved is the saved activations of one micro-step that do not
// scale with the micro-batch (none for Llama; kept for other families).
func nonBatchSaved(q *ir.Program) units.Bytes {
	var b units.Bytes
	for i := range q.Tensors {
		t := &q.Tensors[i]
		if t.Cat == ir.Activation && t.Base == ir.NoTensor && !t.Batch && t.Name == strings.TrimSuffix(t.Name, "@1") && !strings.Contains(t.Name, "@") {
			b += t.Bytes
		}
	}
	return b
}

// Korthikanti et al. 2023 §2 / Narayanan et al. SC'21: under 1F1B, stage s
// of p holds min(p−s, m) micro-batches in flight, so the first stage holds
// p × L/p = L layers' activations, the last one micro-batch's; GPipe holds
// all m everywhere; the interleaved schedule multiplies the first stage's by
// 1 + (p−1)/(pv).
func TestPipelineInFlightActivations(t *testing.T) {
	const L, m = 8, 8
	s := engine.Spec{Job: engine.Job{Model: ppLlama(t, L), Seq: 256, MicroBatch: 2, Accum: m, Precision: ops.BF16, Optimizer: lower.AdamW}}
	p := program(t, s)
	whole, err := sim.Run(p)
	if err != nil {
		t.Fatal(err)
	}
	layer := float64(whole.SavedByModule["model.layers.3"])
	if layer == 0 {
		t.Fatal("no saved activations for model.layers.3")
	}
	for _, tc := range []struct {
		p, v  int
		sched strategy.Schedule
	}{{4, 1, strategy.OneFOneB}, {2, 1, strategy.OneFOneB}, {8, 1, strategy.OneFOneB}, {4, 1, strategy.GPipe}, {2, 2, strategy.OneFOneB}, {2, 4, strategy.OneFOneB}, {4, 2, strategy.OneFOneB}} {
		for st := 0; st < tc.p; st++ {
			pl := strategy.Pipeline{Stages: tc.p, Stage: st, Schedule: tc.sched, Interleave: tc.v}
			q, r := ppStage(t, p, pl)
			peak := float64(peakActivation(r))
			var want float64 // micro-batches (chunks of L/p layers) in flight
			switch {
			case tc.sched == strategy.GPipe:
				want = m
			case tc.v > 1:
				warm := min((tc.p-st-1)*2+(tc.v-1)*tc.p, m*tc.v)
				if warm < m*tc.v {
					warm++ // the first steady-state forward runs before the first backward
				}
				want = float64(warm) / float64(tc.v)
			default:
				want = float64(min(tc.p-st, m))
			}
			inflight := peak / float64(r.SavedTotal)
			// In layers (stages before the last, whose head and loss are not layers).
			layers := (peak - want*float64(nonBatchSaved(q))) / layer
			wantLayers := want * float64(L) / float64(tc.p)
			if st < tc.p-1 {
				t.Logf("%-5s p=%d v=%d stage %d: peak activations %s = %.3f× one micro-batch of its first chunk = %.3f layers' worth (want %.3f)",
					tc.sched, tc.p, tc.v, st, units.Bytes(peak), inflight, layers, wantLayers)
			} else {
				t.Logf("%-5s p=%d v=%d stage %d: peak activations %s = %.3f× one micro-batch of its first chunk (with head and loss)",
					tc.sched, tc.p, tc.v, st, units.Bytes(peak), inflight)
			}
			if tc.v == 1 && math.Abs(inflight-want)/want > 0.02 {
				t.Errorf("%s p=%d stage %d: %.3f micro-batches in flight, want %.0f", tc.sched, tc.p, st, inflight, want)
			}
			if st < tc.p-1 && math.Abs(layers-wantLayers)/wantLayers > 0.02 {
				t.Errorf("%s p=%d v=%d stage %d: holds %.3f layers' activations, want %.3f", tc.sched, tc.p, tc.v, st, layers, wantLayers)
			}
			if st == 0 && tc.sched == strategy.OneFOneB {
				// Korthikanti: the first stage holds L layers (× (1+(p−1)/(pv)) interleaved).
				ref := float64(L) * (1 + float64(tc.p-1)/float64(tc.p*tc.v))
				if tc.v == 1 {
					ref = L
				}
				if math.Abs(layers-ref)/ref > 0.02 {
					t.Errorf("p=%d v=%d: first stage holds %.3f layers, Korthikanti gives %.3f", tc.p, tc.v, layers, ref)
				}
			}
		}
	}
}

func unitSeq(q *ir.Program) string {
	var b []string
	last := ""
	for i := range q.Ops {
		op := &q.Ops[i]
		if op.Phase == ir.Optimizer {
			continue
		}
		u := fmt.Sprintf("%c%d", strings.ToUpper(op.Phase.String())[0], op.Micro)
		if u != last {
			b = append(b, u)
			last = u
		}
	}
	return strings.Join(b, " ")
}

func TestPipelineScheduleOrder(t *testing.T) {
	p := program(t, engine.Spec{Job: engine.Job{Model: ppLlama(t, 4), Seq: 32, Accum: 6, Optimizer: lower.AdamW}})
	for _, tc := range []struct {
		pl   strategy.Pipeline
		want string
	}{
		{strategy.Pipeline{Stages: 4, Stage: 0}, "F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5"},
		{strategy.Pipeline{Stages: 4, Stage: 1}, "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 B4 B5"},
		{strategy.Pipeline{Stages: 4, Stage: 3}, "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5"},
		{strategy.Pipeline{Stages: 2, Stage: 0, Schedule: strategy.GPipe}, "F0 F1 F2 F3 F4 F5 B0 B1 B2 B3 B4 B5"},
		// Interleaved, p=2 v=2 (chunks 0 and 2 on rank 0): 4 warm-up virtual
		// micro-batches: (mb0,c0) (mb1,c0) (mb0,c2) (mb1,c2).
		{strategy.Pipeline{Stages: 2, Stage: 0, Interleave: 2}, "F0 F1 F0 F1 F2 B0 F3 B1 F2 B0 F3 B1 F4 B2 F5 B3 F4 B2 F5 B3 B4 B5 B4 B5"},
	} {
		q, _ := ppStage(t, p, tc.pl)
		if got := unitSeq(q); got != tc.want {
			t.Errorf("%+v:\n got %s\nwant %s", tc.pl, got, tc.want)
		}
	}
	// m < p is allowed (a bigger bubble): every forward first on stage 0.
	p2 := program(t, engine.Spec{Job: engine.Job{Model: ppLlama(t, 4), Seq: 32, Accum: 2, Optimizer: lower.AdamW}})
	q, _ := ppStage(t, p2, strategy.Pipeline{Stages: 4, Stage: 0})
	if got, want := unitSeq(q), "F0 F1 B0 B1"; got != want {
		t.Errorf("m=2 p=4: got %s, want %s", got, want)
	}
}

func countOps(q *ir.Program, pred func(*ir.Op) bool) int {
	n := 0
	for i := range q.Ops {
		if pred(&q.Ops[i]) {
			n++
		}
	}
	return n
}

func TestPipelineBoundaries(t *testing.T) {
	const m, P = 3, 3
	p := program(t, engine.Spec{Job: engine.Job{Model: ppLlama(t, 6), Seq: 64, Accum: m, Precision: ops.BF16, Optimizer: lower.AdamW}})
	for st := 0; st < P; st++ {
		q, _ := ppStage(t, p, strategy.Pipeline{Stages: P, Stage: st})
		named := func(n string) int {
			return countOps(q, func(op *ir.Op) bool {
				if op.Name == n && (op.Comm == nil || op.Comm.Kind != ir.SendRecv || op.Comm.Group != "pp") {
					t.Errorf("stage %d: %s is not a pp send/recv", st, n)
				}
				return op.Name == n
			})
		}
		first, last := st == 0, st == P-1
		want := func(b bool) int {
			if b {
				return m
			}
			return 0
		}
		if got := named("pp.recv_forward"); got != want(!first) {
			t.Errorf("stage %d: %d recv_forward, want %d", st, got, want(!first))
		}
		if got := named("pp.send_forward"); got != want(!last) {
			t.Errorf("stage %d: %d send_forward, want %d", st, got, want(!last))
		}
		if got := named("pp.recv_backward"); got != want(!last) {
			t.Errorf("stage %d: %d recv_backward, want %d", st, got, want(!last))
		}
		if got := named("pp.send_backward"); got != want(!first) {
			t.Errorf("stage %d: %d send_backward, want %d", st, got, want(!first))
		}
		if got := countOps(q, func(op *ir.Op) bool { return op.Name == "loss.backward" || op.Module == "loss" }); (got > 0) != last {
			t.Errorf("stage %d: %d loss ops", st, got)
		}
		if got := countOps(q, func(op *ir.Op) bool { return op.Module == "model.embed_tokens" }); (got > 0) != first {
			t.Errorf("stage %d: %d embedding ops", st, got)
		}
		if got := countOps(q, func(op *ir.Op) bool { return op.Module == "lm_head" || op.Module == "model.norm" }); (got > 0) != last {
			t.Errorf("stage %d: %d head ops", st, got)
		}
		// Every backward starts from the loss seed (last stage) or the
		// received output gradient (the others).
		for i := range q.Ops {
			op := &q.Ops[i]
			if op.Phase == ir.Backward && (i == 0 || q.Ops[i-1].Phase != ir.Backward || q.Ops[i-1].Micro != op.Micro) {
				want := "pp.recv_backward"
				if last {
					want = "loss.backward"
				}
				if op.Name != want {
					t.Errorf("stage %d: micro-step %d's backward starts with %s, want %s", st, op.Micro, op.Name, want)
				}
			}
		}
		// The stage's layers and no others.
		for i := range q.Ops {
			mod := q.Ops[i].Module
			if b := ir.BlockOf(mod); strings.HasPrefix(b, "model.layers.") {
				var k int
				fmt.Sscanf(b, "model.layers.%d", &k)
				if k/2 != st {
					t.Errorf("stage %d runs %s (%s)", st, q.Ops[i].Name, mod)
				}
			}
		}
	}
}

// Per-stage model states add up to the whole model's.
func TestPipelineModelStatesSum(t *testing.T) {
	for _, tc := range []struct {
		prec ops.Precision
		opt  lower.Optimizer
		impl lower.Impl
	}{{ops.BF16, lower.AdamW, lower.Foreach}, {ops.FP32, lower.AdamW, lower.Single}, {ops.BF16, lower.SGDMomentum, lower.Fused}, {ops.FP32, lower.Adafactor, lower.Foreach}} {
		p := program(t, engine.Spec{Job: engine.Job{Model: ppLlama(t, 6), Seq: 32, Accum: 2, Precision: tc.prec, Optimizer: tc.opt, Impl: tc.impl}})
		whole, err := sim.Run(p)
		if err != nil {
			t.Fatal(err)
		}
		for _, P := range []int{2, 3, 6} {
			var params int64
			var par, grad, opt, tmp units.Bytes
			for st := 0; st < P; st++ {
				q, r := ppStage(t, p, strategy.Pipeline{Stages: P, Stage: st})
				params += r.Params
				par += r.ModelStates.Parameters
				grad += r.ModelStates.Gradients
				opt += r.ModelStates.OptimizerState
				for i := range q.Tensors {
					if q.Tensors[i].Name == "grads.float32" || q.Tensors[i].Name == "exp_avg_sq_sqrt" {
						tmp += q.Tensors[i].Bytes
					}
				}
			}
			var wtmp units.Bytes
			for i := range p.Tensors {
				if p.Tensors[i].Name == "grads.float32" || p.Tensors[i].Name == "exp_avg_sq_sqrt" {
					wtmp += p.Tensors[i].Bytes
				}
			}
			if params != whole.Params || par != whole.ModelStates.Parameters || grad != whole.ModelStates.Gradients || opt != whole.ModelStates.OptimizerState {
				t.Errorf("%v/%v p=%d: stages sum to %d params (%s, grads %s, opt %s), model has %d (%s, %s, %s)", tc.opt, tc.impl, P,
					params, par, grad, opt, whole.Params, whole.ModelStates.Parameters, whole.ModelStates.Gradients, whole.ModelStates.OptimizerState)
			}
			if d := math.Abs(float64(tmp - wtmp)); d > 16*float64(P) {
				t.Errorf("%v/%v p=%d: optimizer temporaries sum to %s, model's %s", tc.opt, tc.impl, P, tmp, wtmp)
			}
		}
	}
}

// Tied embeddings are duplicated on the first and last stages and their
// gradient all-reduced; an accumulating op there creates the gradient.
func TestPipelineTiedEmbeddings(t *testing.T) {
	a, err := models.Lookup("gpt2")
	if err != nil {
		t.Fatal(err)
	}
	for _, att := range []build.Attention{build.SDPA, build.Eager} {
		p := pipelineInput(t, engine.Spec{Job: engine.Job{Model: a, Seq: 64, Accum: 3, Precision: ops.FP16, Attention: att, Optimizer: lower.AdamW}})
		whole, _ := sim.Run(p)
		var wte int64
		for _, id := range p.Params {
			if p.Tensors[id].Name == "transformer.wte.weight" {
				wte = p.Tensors[id].Numel()
			}
		}
		var params int64
		const P = 3
		for st := 0; st < P; st++ {
			q, r := ppStage(t, p, strategy.Pipeline{Stages: P, Stage: st})
			params += r.Params
			n := countOps(q, func(op *ir.Op) bool {
				return op.Name == "pp.tied_grad_all_reduce" && op.Comm != nil && op.Comm.Kind == ir.AllReduce && op.Comm.Ranks == 2
			})
			if want := map[bool]int{true: 1, false: 0}[st == 0 || st == P-1]; n != want {
				t.Errorf("%s stage %d: %d tied-gradient all-reduces, want %d", att, st, n, want)
			}
		}
		if params != whole.Params+wte {
			t.Errorf("%s: stages hold %d params, want the model's %d plus the duplicated wte %d", att, params, whole.Params, wte)
		}
	}
}

// Every catalog family, first-step and steady programs, and chains with
// checkpointing give valid stage programs.
func TestPipelineVerifiesEverywhere(t *testing.T) {
	for _, name := range models.Names() {
		a, err := models.Lookup(name)
		if err != nil {
			t.Fatal(err)
		}
		a = a.Clone()
		a.Layers = min(a.Layers, 4)
		s := engine.Spec{Job: engine.Job{Model: a, Seq: 16, Accum: 2, Precision: ops.BF16, Optimizer: lower.AdamW, Attention: build.Eager}}
		if err := s.Validate(); err != nil {
			t.Fatal(err)
		}
		for _, first := range []bool{false, true} {
			p, err := engine.PipelineInput(&s, first)
			if err != nil {
				t.Fatal(err)
			}
			for st := 0; st < 2; st++ {
				ppStage(t, p, strategy.Pipeline{Stages: 2, Stage: st})
				ppStage(t, p, strategy.Pipeline{Stages: 2, Stage: st, Interleave: 2})
			}
		}
	}
	p := program(t, engine.Spec{Job: engine.Job{Model: ppLlama(t, 4), Seq: 64, Accum: 4, Precision: ops.BF16, Optimizer: lower.AdamW}})
	ck := &strategy.Checkpoint{Patterns: []string{"model.layers.*"}}
	for st := 0; st < 2; st++ {
		pl := &strategy.Pipeline{Stages: 2, Stage: st}
		a, err := strategy.Chain(p, ck, pl)
		if err != nil {
			t.Fatal(err)
		}
		b, err := strategy.Chain(p, pl, ck)
		if err != nil {
			t.Fatal(err)
		}
		ra, _ := sim.Run(a)
		rb, _ := sim.Run(b)
		_, plain := ppStage(t, p, *pl)
		if pa, pb, pp := peakActivation(ra), peakActivation(rb), peakActivation(plain); pa != pb || pa >= pp || (st == 0 && pa >= pp/2) {
			t.Errorf("stage %d: checkpointed peak activations %s (before pipeline), %s (after) vs %s without", st, pa, pb, pp)
		}
	}
}

func TestPipelineDeterministicAndPure(t *testing.T) {
	p := program(t, engine.Spec{Job: engine.Job{Model: ppLlama(t, 4), Seq: 32, Accum: 4, Precision: ops.BF16, Optimizer: lower.AdamW}})
	before := strategy.Clone(p)
	pl := &strategy.Pipeline{Stages: 2, Stage: 1, Interleave: 2}
	a, err := pl.Apply(p)
	if err != nil {
		t.Fatal(err)
	}
	b, err := pl.Apply(p)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(a, b) {
		t.Error("two applications differ")
	}
	if !reflect.DeepEqual(strategy.Clone(p), before) {
		t.Error("Apply modified its input")
	}
}

func TestPipelineRefuses(t *testing.T) {
	p := program(t, engine.Spec{Job: engine.Job{Model: ppLlama(t, 4), Seq: 32, Accum: 3, Optimizer: lower.AdamW}})
	p4 := program(t, engine.Spec{Job: engine.Job{Model: ppLlama(t, 4), Seq: 32, Accum: 4, Optimizer: lower.AdamW}})
	s := engine.Spec{Job: engine.Job{Model: ppLlama(t, 4), Seq: 32, Mode: engine.Infer}}
	inf := program(t, s)
	for _, tc := range []struct {
		pl   strategy.Pipeline
		prog *ir.Program
		want string
	}{
		{strategy.Pipeline{Stages: 1}, p, "at least 2 stages"},
		{strategy.Pipeline{Stages: 5}, p, "exceed the model's 4 blocks"},
		{strategy.Pipeline{Stages: 2, Interleave: 3}, p4, "chunks exceed"},
		{strategy.Pipeline{Stages: 2, Stage: 2}, p, "out of range"},
		{strategy.Pipeline{Stages: 2, Stage: -1}, p, "out of range"},
		{strategy.Pipeline{Stages: 2, Schedule: strategy.Schedule(9)}, p, "unknown pipeline schedule"},
		{strategy.Pipeline{Stages: 2, Interleave: 2}, p, "multiple of stages"},
		{strategy.Pipeline{Stages: 2, Interleave: 2, Schedule: strategy.GPipe}, p, "needs the 1f1b schedule"},
		{strategy.Pipeline{Stages: 2, Interleave: -1}, p, "interleave must be positive"},
		{strategy.Pipeline{Stages: 2}, inf, "training program"},
	} {
		_, err := tc.pl.Apply(tc.prog)
		if err == nil || !strings.HasPrefix(err.Error(), "") || strings.Contains(err.Error(), "\n") || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: error %v, want one line with %q", tc.pl, err, tc.want)
		}
	}
}
