package cost_test

import (
	"errors"
	"math"
	"reflect"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/memplan/memplan/cost"
	"github.com/memplan/memplan/engine"
	"github.com/memplan/memplan/hw"
	"github.com/memplan/memplan/ir"
	"github.com/memplan/memplan/lower"
	"github.com/memplan/memplan/models"
	"github.com/memplan/memplan/models/build"
	"github.com/memplan/memplan/ops"
	"github.com/memplan/memplan/units"
)

const ms = time.Millisecond

// toyGPU has round numbers so that every duration below is exact: 1 PFLOP/s
// bf16, 1 TB/s DRAM, 10 GB/s PCIe per direction, 200 GB/s NVLink
// (100 GB/s per direction).
func toyGPU() *hw.GPU {
	return &hw.GPU{Name: "toy", FP32: 1e14, BF16: 1e15, FP16: 1e15, MemBandwidth: 1e12,
		HostLink: hw.Link{Kind: "pcie", PerDirection: 1e10}, NVLink: 2e11}
}

// progBuilder writes small programs by hand.
type progBuilder struct{ p ir.Program }

func (b *progBuilder) tensor(name string, bytes units.Bytes, resident, host bool) ir.TensorID {
	b.p.Tensors = append(b.p.Tensors, ir.Tensor{Name: name, DType: units.BF16, Bytes: bytes, Base: ir.NoTensor, Resident: resident, Host: host})
	return ir.TensorID(len(b.p.Tensors) - 1)
}

func (b *progBuilder) view(name string, of ir.TensorID) ir.TensorID {
	b.p.Tensors = append(b.p.Tensors, ir.Tensor{Name: name, DType: units.BF16, Base: of})
	return ir.TensorID(len(b.p.Tensors) - 1)
}

func (b *progBuilder) op(op ir.Op) int {
	op.Node = -1
	b.p.Ops = append(b.p.Ops, op)
	return len(b.p.Ops) - 1
}

func ids(xs ...ir.TensorID) []ir.TensorID { return xs }

// tinyProgram: three matmuls, an offload/reload pair around them, a
// data-parallel all-reduce of a gradient and an optimizer op that reads it.
func tinyProgram() *ir.Program {
	var b progBuilder
	x := b.tensor("x", 1e6, true, false)
	w := b.tensor("w", 1e9, true, false)
	h := b.tensor("h", 1e8, false, false)
	hx := b.tensor("h.cpu", 1e8, false, true)
	y := b.tensor("grad", 1e9, false, false)
	h2 := b.tensor("h.reloaded", 1e8, false, false)
	z := b.tensor("z", 1e6, false, false)
	b.op(ir.Op{Name: "mm1", Phase: ir.Forward, In: ids(x, w), Out: ids(h), FLOPs: 2e12, MemBytes: 1e9})
	b.op(ir.Op{Name: "offload", Phase: ir.Forward, In: ids(h), Out: ids(hx), Transfer: &ir.Transfer{Bytes: 1e8, ToHost: true}})
	b.op(ir.Op{Name: "mm2", Phase: ir.Forward, In: ids(h, w), Out: ids(y), FLOPs: 1e12, MemBytes: 4e9})
	b.op(ir.Op{Name: "all_reduce", Phase: ir.Backward, In: ids(y), Comm: &ir.Comm{Kind: ir.AllReduce, Bytes: 2e9, Group: "dp", Ranks: 4}})
	b.op(ir.Op{Name: "reload", Phase: ir.Backward, In: ids(hx), Out: ids(h2), Transfer: &ir.Transfer{Bytes: 1e8}})
	b.op(ir.Op{Name: "mm3", Phase: ir.Backward, In: ids(h2, w), Out: ids(z), FLOPs: 3e12})
	b.op(ir.Op{Name: "adam.step", Phase: ir.Optimizer, In: ids(w, y)})
	return &b.p
}

func TestPriceTinyProgram(t *testing.T) {
	p := tinyProgram()
	if err := p.Verify(); err != nil {
		t.Fatal(err)
	}
	g := toyGPU()
	// Default: dp overlaps, copies overlap.
	//   mm1      2e12 FLOPs / 1e15 = 2 ms (compute-bound)           0–2
	//   offload  1e8 B / 1e10 B/s = 10 ms on the D2H stream         2–12
	//   mm2      max(1 ms, 4e9 B / 1e12 B/s = 4 ms)                 2–6
	//   all-reduce 2·3/4 · 2e9 B / 1e11 B/s = 30 ms (comm stream)  6–36
	//   reload   10 ms, waits for the offload that wrote h.cpu      12–22
	//   mm3      3 ms, stalls 16 ms for the reload                  22–25
	//   adam     no FLOPs, no MemBytes: (1e9 + 1e9) B / 1e12 = 2 ms,
	//            stalls 11 ms for the all-reduce of grad            36–38
	tm, err := cost.Price(p, g, cost.PriceOptions{TokensPerStep: 4096, SamplesPerStep: 2})
	if err != nil {
		t.Fatal(err)
	}
	want := []cost.OpTime{
		{Compute: 2 * ms, Start: 0, End: 2 * ms},
		{Transfer: 10 * ms, Start: 2 * ms, End: 12 * ms, Async: true},
		{Compute: 4 * ms, Start: 2 * ms, End: 6 * ms},
		{Comm: 30 * ms, Start: 6 * ms, End: 36 * ms, Async: true},
		{Transfer: 10 * ms, Start: 12 * ms, End: 22 * ms, Async: true},
		{Compute: 3 * ms, Start: 22 * ms, End: 25 * ms, Stall: 16 * ms},
		{Compute: 2 * ms, Start: 36 * ms, End: 38 * ms, Stall: 11 * ms},
	}
	if !reflect.DeepEqual(tm.Ops, want) {
		t.Errorf("ops:\n got %+v\nwant %+v", tm.Ops, want)
	}
	check := func(name string, got, want time.Duration) {
		t.Helper()
		if got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	check("step", tm.Step, 38*ms)
	check("compute", tm.Compute, 11*ms)
	check("comm", tm.Comm, 30*ms)
	check("transfer", tm.Transfer, 20*ms)
	check("exposed comm", tm.ExposedComm, 11*ms)
	check("exposed transfer", tm.ExposedTransfer, 16*ms)
	check("forward wall", tm.Phases[ir.Forward].Wall, 6*ms)
	check("backward wall", tm.Phases[ir.Backward].Wall, 19*ms)
	check("optimizer wall", tm.Phases[ir.Optimizer].Wall, 13*ms)
	check("backward comm", tm.Phases[ir.Backward].Comm, 30*ms)
	if tm.ModelFLOPs != 6e12 || tm.FLOPs != 6e12 {
		t.Errorf("FLOPs = %v, model %v; want 6e12", tm.FLOPs, tm.ModelFLOPs)
	}
	approx(t, "MFU", tm.MFU, 6e12/(0.038*1e15))
	approx(t, "tokens/s", tm.TokensPerSec, 4096/0.038)
	approx(t, "samples/s", tm.SamplesPerSec, 2/0.038)
	if tm.DType != units.BF16 || tm.PeakFLOPs != 1e15 || tm.Efficiency != cost.DefaultEfficiency() {
		t.Errorf("settings = %v %v %v", tm.DType, tm.PeakFLOPs, tm.Efficiency)
	}

	// Exposed data parallelism: the all-reduce blocks the compute stream
	// from 6 to 36 ms; the reload is issued after it (36–46) and mm3 waits
	// 10 ms for it (46–49); adam runs 49–51.
	tm, err = cost.Price(p, g, cost.PriceOptions{Overlap: map[ir.Group]bool{"dp": false}})
	if err != nil {
		t.Fatal(err)
	}
	check("sync step", tm.Step, 51*ms)
	check("sync exposed comm", tm.ExposedComm, 30*ms)
	check("sync exposed transfer", tm.ExposedTransfer, 10*ms)
	check("sync reload start", tm.Ops[4].Start, 36*ms)
	check("sync adam start", tm.Ops[6].Start, 49*ms)

	// A slower, latency-bound dp network: 2·3/4 · 2e9 / 1e10 + 6 · 1 ms =
	// 306 ms; only the end of the step (adam) waits for it.
	tm, err = cost.Price(p, g, cost.PriceOptions{Networks: map[ir.Group]cost.Link{"dp": {Bandwidth: 1e10, Latency: ms}}})
	if err != nil {
		t.Fatal(err)
	}
	check("slow dp all-reduce", tm.Ops[3].Comm, 306*ms)
	check("slow dp step", tm.Step, (6+306+2)*ms)
}

func approx(t *testing.T, what string, got, want float64) {
	t.Helper()
	if math.Abs(got-want) > 1e-9*math.Abs(want) {
		t.Errorf("%s = %v, want %v", what, got, want)
	}
}

// Views and zero_grad(set_to_none=True) launch no kernel; an op without
// FLOPs or MemBytes is charged the distinct device storages it touches.
func TestPriceNoKernelAndEstimates(t *testing.T) {
	var b progBuilder
	x := b.tensor("x", 1e9, true, false)
	v := b.view("x.view", x)
	v2 := b.view("x.view.view", v)
	host := b.tensor("x.cpu", 5e9, true, true)
	out := b.tensor("out", 3e9, false, false)
	b.op(ir.Op{Name: "view", In: ids(x), Out: ids(v), MemBytes: 2e9})
	b.op(ir.Op{Name: "view_backward", Phase: ir.Backward, In: ids(v), Out: ids(v2)})
	// x, its views twice and a host tensor: 1e9 + 3e9 bytes.
	b.op(ir.Op{Name: "_foreach_copy_", Phase: ir.Optimizer, In: ids(x, v, v2, host, x), Out: ids(out)})
	b.op(ir.Op{Name: "zero_grad(set_to_none=True)", Phase: ir.Optimizer, In: ids(out)})
	tm, err := cost.Price(&b.p, toyGPU(), cost.PriceOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got := []time.Duration{tm.Ops[0].Duration(), tm.Ops[1].Duration(), tm.Ops[2].Duration(), tm.Ops[3].Duration()}
	if want := []time.Duration{0, 0, 4 * ms, 0}; !reflect.DeepEqual(got, want) {
		t.Errorf("durations = %v, want %v", got, want)
	}
	if tm.Step != 4*ms || tm.MFU != 0 {
		t.Errorf("step %v, MFU %v; want 4ms, 0", tm.Step, tm.MFU)
	}
}

func TestPriceDefaults(t *testing.T) {
	for _, tc := range []struct {
		gpu  string
		want float64
	}{
		{"h100-sxm", 450e9}, // NVLink 900 GB/s both directions
		{"l4", 0},           // no NVLink: PCIe Gen4 x16 per direction
	} {
		g, err := hw.Lookup(tc.gpu)
		if err != nil {
			t.Fatal(err)
		}
		want := tc.want
		if want == 0 {
			want = g.HostLink.PerDirection
		}
		if got := cost.DefaultNetwork(g); got != (cost.Link{Bandwidth: want}) {
			t.Errorf("%s: default network %+v, want %v B/s", tc.gpu, got, want)
		}
	}
	var o cost.PriceOptions
	for group, want := range map[ir.Group]bool{"dp": true, "tp": false, "pp": false, "ep": false, "cp": false, "": false} {
		if o.Overlaps(group) != want {
			t.Errorf("default overlap of %q = %v", group, !want)
		}
	}
	o.Overlap = map[ir.Group]bool{"tp": true, "dp": false}
	if !o.Overlaps("tp") || o.Overlaps("dp") || o.Overlaps("pp") {
		t.Error("overlap entries must override the defaults")
	}

	// The dtype is inferred from the ops with the most FLOPs.
	var b progBuilder
	x := b.tensor("x", 4, true, false)
	y := b.tensor("y", 4, false, false)
	b.p.Tensors[y].DType = units.F32
	b.op(ir.Op{Name: "mm", In: ids(x), Out: ids(y), FLOPs: 1e14})
	tm, err := cost.Price(&b.p, toyGPU(), cost.PriceOptions{})
	if err != nil || tm.DType != units.F32 || tm.PeakFLOPs != 1e14 || tm.Step != time.Second {
		t.Errorf("fp32 program: %v %v %v, %v", tm.DType, tm.PeakFLOPs, tm.Step, err)
	}
	// Explicit TF32 peak and efficiency.
	tm, err = cost.Price(&b.p, toyGPU(), cost.PriceOptions{PeakFLOPs: 4e14, Efficiency: cost.Efficiency{Compute: 0.5, Memory: 1}})
	if err != nil || tm.Step != 500*ms || tm.MFU != 0.5 {
		t.Errorf("tf32 at 50%%: step %v MFU %v, %v", tm.Step, tm.MFU, err)
	}
	// Priced in bfloat16 (an amp-bf16 program), a float32 matmul runs at
	// float32's peak (1 s), a bfloat16 one at bfloat16's (0.1 s); MFU stays
	// against the priced dtype's peak. A given peak applies to both.
	z := b.tensor("z", 4, false, false)
	b.op(ir.Op{Name: "mm16", In: ids(x), Out: ids(z), FLOPs: 1e14})
	tm, err = cost.Price(&b.p, toyGPU(), cost.PriceOptions{DType: units.BF16})
	if err != nil || tm.Ops[0].Compute != time.Second || tm.Ops[1].Compute != 100*ms || tm.PeakFLOPs != 1e15 {
		t.Errorf("bf16 program with a float32 matmul: %+v, peak %v, %v", tm.Ops, tm.PeakFLOPs, err)
	}
	tm, err = cost.Price(&b.p, toyGPU(), cost.PriceOptions{DType: units.BF16, PeakFLOPs: 1e15})
	if err != nil || tm.Ops[0].Compute != 100*ms {
		t.Errorf("a given peak prices every op: %+v, %v", tm.Ops, err)
	}
}

func TestPriceErrors(t *testing.T) {
	p := tinyProgram()
	g := toyGPU()
	v100, err := hw.Lookup("v100-32gb")
	if err != nil {
		t.Fatal(err)
	}
	bad := func(f func(p *ir.Program)) *ir.Program {
		q := tinyProgram()
		f(q)
		return q
	}
	for name, f := range map[string]func() error{
		"nil gpu": func() error { _, err := cost.Price(p, nil, cost.PriceOptions{}); return err },
		"partial eff": func() error {
			_, err := cost.Price(p, g, cost.PriceOptions{Efficiency: cost.Efficiency{Compute: 0.5}})
			return err
		},
		"no bf16":    func() error { _, err := cost.Price(p, v100, cost.PriceOptions{DType: units.BF16}); return err },
		"neg tokens": func() error { _, err := cost.Price(p, g, cost.PriceOptions{TokensPerStep: -1}); return err },
		"nan model":  func() error { _, err := cost.Price(p, g, cost.PriceOptions{ModelFLOPs: math.NaN()}); return err },
		"zero bandwidth": func() error {
			_, err := cost.Price(p, g, cost.PriceOptions{Networks: map[ir.Group]cost.Link{"dp": {}}})
			return err
		},
		"zero ranks": func() error {
			_, err := cost.Price(bad(func(p *ir.Program) { p.Ops[3].Comm.Ranks = 0 }), g, cost.PriceOptions{})
			return err
		},
		"neg flops": func() error {
			_, err := cost.Price(bad(func(p *ir.Program) { p.Ops[0].FLOPs = -1 }), g, cost.PriceOptions{})
			return err
		},
		"tensor range": func() error {
			_, err := cost.Price(bad(func(p *ir.Program) { p.Ops[6].In[0] = 99 }), g, cost.PriceOptions{})
			return err
		},
		"late base": func() error {
			_, err := cost.Price(bad(func(p *ir.Program) { p.Tensors[0].Base = 3 }), g, cost.PriceOptions{})
			return err
		},
		"comm and copy": func() error {
			_, err := cost.Price(bad(func(p *ir.Program) { p.Ops[1].Comm = &ir.Comm{Ranks: 2} }), g, cost.PriceOptions{})
			return err
		},
	} {
		if err := f(); !errors.Is(err, cost.ErrInvalid) {
			t.Errorf("%s: err = %v, want ErrInvalid", name, err)
		}
	}
}

func llamaProgram(t testing.TB, name string, seq int) (*ir.Program, *models.Arch) {
	t.Helper()
	a, err := models.Lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	s := engine.Spec{Job: engine.Job{Model: a, MicroBatch: 1, Seq: seq, Precision: ops.BF16, Optimizer: lower.AdamW}}
	if err := s.Validate(); err != nil {
		t.Fatal(err)
	}
	p, err := engine.Program(&s, false)
	if err != nil {
		t.Fatal(err)
	}
	return p, a
}

// withRecompute inserts, before the first backward op, a recomputed copy of
// every forward op of block "model.layers.0" with fresh outputs, as
// checkpointing does. It returns the new program and the inserted ops.
func withRecompute(p *ir.Program) (*ir.Program, []ir.Op) {
	q := &ir.Program{Tensors: append([]ir.Tensor(nil), p.Tensors...), MicroBatches: p.MicroBatches, Params: p.Params}
	var re []ir.Op
	for _, op := range p.Ops {
		if op.Phase == ir.Forward && ir.BlockOf(op.Module) == "model.layers.0" {
			op.Recompute = true
			op.Phase = ir.Backward
			out := make([]ir.TensorID, len(op.Out))
			for i, o := range op.Out {
				tt := q.Tensors[o]
				tt.Name += ".recompute"
				q.Tensors = append(q.Tensors, tt)
				out[i] = ir.TensorID(len(q.Tensors) - 1)
			}
			op.Out = out
			re = append(re, op)
		}
	}
	for i, op := range p.Ops {
		if op.Phase == ir.Backward && (i == 0 || p.Ops[i-1].Phase == ir.Forward) {
			q.Ops = append(q.Ops, re...)
		}
		q.Ops = append(q.Ops, op)
	}
	return q, re
}

// Recompute ops lengthen the step by exactly their roofline time and leave
// the model FLOPs alone (REFERENCE.md "Compute": full recompute adds one
// forward).
func TestPriceRecompute(t *testing.T) {
	p, _ := llamaProgram(t, "llama-3.2-1b", 512)
	q, re := withRecompute(p)
	g, err := hw.Lookup("h100-sxm")
	if err != nil {
		t.Fatal(err)
	}
	base, err := cost.Price(p, g, cost.PriceOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rec, err := cost.Price(q, g, cost.PriceOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var want time.Duration
	var flops float64
	for _, op := range re {
		if op.Name == "view" { // no kernel
			continue
		}
		d, err := cost.Roofline(op.FLOPs, op.MemBytes, g.BF16, g.MemBandwidth, cost.DefaultEfficiency())
		if err != nil {
			t.Fatal(err)
		}
		want += d
		flops += op.FLOPs
	}
	// Price rounds each op up to the nanosecond where Roofline rounds to
	// the nearest: allow 1 ns per op (views cost nothing in Price).
	diff := rec.Step - base.Step
	if diff < want-time.Duration(len(re)) || diff > want+time.Duration(len(re)) || rec.Recompute != diff {
		t.Errorf("recompute of %d ops: step +%v, Recompute %v; want %v", len(re), diff, rec.Recompute, want)
	}
	if rec.RecomputeFLOPs != flops || rec.ModelFLOPs != base.ModelFLOPs || rec.FLOPs != base.FLOPs+flops {
		t.Errorf("FLOPs: recompute %v (want %v), model %v vs %v", rec.RecomputeFLOPs, flops, rec.ModelFLOPs, base.ModelFLOPs)
	}
	if !(rec.MFU < base.MFU) || !(rec.HFU > rec.MFU) {
		t.Errorf("MFU %v → %v, HFU %v", base.MFU, rec.MFU, rec.HFU)
	}
	t.Logf("llama-3.2-1b s=512 on h100-sxm: step %v → %v with layer 0 recomputed (+%v, %d ops); MFU %.3f → %.3f, HFU %.3f",
		base.Step, rec.Step, diff, len(re), base.MFU, rec.MFU, rec.HFU)
}

// Kaplan et al. 2020 / REFERENCE.md "Compute": a training step of a dense
// transformer is ≈ 3F with F ≈ 2·params·tokens, plus attention 4·b·s²·h per
// layer in the forward (halved by the causal mask on the flash path).
func TestLlamaFLOPs(t *testing.T) {
	const seq = 2048
	p, a := llamaProgram(t, "llama-3.2-1b", seq)
	n, tokens := float64(a.ParamCount()), float64(seq)
	attnFwd := float64(a.Layers) * 4 * float64(seq) * float64(seq) * float64(a.Heads*a.HeadDim) / 2

	var fwdBwd, linear float64
	norms := 0.0
	for _, op := range p.Ops {
		if op.Phase != ir.Optimizer && !op.Recompute {
			fwdBwd += op.FLOPs
		}
		if op.Name == "linear" || op.Name == "linear_backward" {
			linear += op.FLOPs
		}
	}
	for _, id := range p.Params {
		if len(p.Tensors[id].Shape) == 1 {
			norms += float64(p.Tensors[id].Numel())
		}
	}
	// Every weight matrix takes part in exactly one matmul per token (the
	// embedding is tied to the LM head; its lookup is free), so the linears
	// are exactly 6·(params − norm weights)·tokens.
	if want := 6 * (n - norms) * tokens; linear != want {
		t.Errorf("linear FLOPs %.6e, want 6·(N−norms)·T = %.6e", linear, want)
	}
	want := 6*n*tokens + 3*attnFwd
	t.Logf("llama-3.2-1b, 1×%d tokens: N = %.0f, 6NT = %.4e, attention 3×%.4e, 6NT + attention = %.4e; program fwd+bwd = %.4e (%.2f%% over; %.2f%% over 6NT alone)",
		seq, n, 6*n*tokens, attnFwd, want, fwdBwd, 100*(fwdBwd/want-1), 100*(fwdBwd/(6*n*tokens)-1))
	if r := fwdBwd / want; r < 0.9 || r > 1.1 {
		t.Errorf("fwd+bwd FLOPs %.4e is %.3f× 6NT + attention %.4e", fwdBwd, r, want)
	}
	// The residual is the flash-attention backward's recomputation of the
	// scores (2.5× the forward, not 2×) plus elementwise work (norms, SiLU,
	// rotary, the loss's log-softmax) less 6·T per norm weight.
	if r := fwdBwd - want; r < 0 || r > 0.5*attnFwd+0.02*want {
		t.Errorf("residual %.4e outside [0, 0.5·attention + 2%%]", r)
	}
	g, _ := hw.Lookup("h100-sxm")
	tm, err := cost.Price(p, g, cost.PriceOptions{TokensPerStep: tokens})
	if err != nil {
		t.Fatal(err)
	}
	if tm.ModelFLOPs != fwdBwd {
		t.Errorf("default ModelFLOPs %v, want %v", tm.ModelFLOPs, fwdBwd)
	}
	t.Logf("h100-sxm, ideal roofline: step %v (fwd %v, bwd %v, optimizer %v), %.0f tokens/s, MFU %.3f",
		tm.Step, tm.Phases[ir.Forward].Wall, tm.Phases[ir.Backward].Wall, tm.Phases[ir.Optimizer].Wall, tm.TokensPerSec, tm.MFU)
}

// The builder's FLOPs, op by op, against the shapes in the program:
// linear 2·rows·in·out, SDPA 4·b·a·s·s_kv·d (halved when causal), and the
// backward factors (2 for matmuls, 2.5 for flash attention's backward).
func TestBuilderFLOPs(t *testing.T) {
	seen := map[string]int{}
	for _, name := range []string{"llama-3.2-1b", "gpt2"} {
		a, err := models.Lookup(name)
		if err != nil {
			t.Fatal(err)
		}
		for _, att := range []build.Attention{build.SDPA, build.Eager} {
			s := engine.Spec{Job: engine.Job{Model: a, MicroBatch: 2, Seq: 128, Precision: ops.BF16, Attention: att}}
			if err := s.Validate(); err != nil {
				t.Fatal(err)
			}
			p, err := engine.Program(&s, false)
			if err != nil {
				t.Fatal(err)
			}
			fwd := map[int32]float64{}
			for i, op := range p.Ops {
				shape := func(k int) []int64 { return p.Tensors[op.In[k]].Shape }
				numel := func(sh []int64) float64 {
					n := 1.0
					for _, d := range sh {
						n *= float64(d)
					}
					return n
				}
				var want float64
				switch op.Name {
				case "linear":
					x, w := shape(0), shape(1)
					want = 2 * numel(x) / float64(x[len(x)-1]) * float64(w[0]*w[1])
				case "matmul":
					x, c := shape(0), shape(1)
					m, k, n := x[len(x)-2], x[len(x)-1], c[len(c)-1]
					want = 2 * numel(x) / float64(m*k) * float64(m*k*n)
				case "sdpa_flash":
					q, k := shape(0), shape(1)
					want = 4 * float64(q[0]*q[1]*q[2]*k[2]*q[3])
					if !a.Encoder {
						want /= 2
					}
				case "linear_backward", "matmul_backward":
					want = 2 * fwd[op.Node]
				case "sdpa_flash_backward":
					want = 2.5 * fwd[op.Node]
				default:
					continue
				}
				if op.Phase == ir.Forward {
					fwd[op.Node] = op.FLOPs
				}
				seen[op.Name]++
				if op.FLOPs != want {
					t.Errorf("%s %v: op %d %s (%s) has %v FLOPs, want %v", name, att, i, op.Name, op.Module, op.FLOPs, want)
				}
			}
		}
	}
	for _, k := range []string{"linear", "matmul", "sdpa_flash", "linear_backward", "matmul_backward", "sdpa_flash_backward"} {
		if seen[k] == 0 {
			t.Errorf("no %s op checked", k)
		}
	}
}

// genProgram draws a random program of compute ops, collectives and
// offload/reload pairs.
func genProgram(t *rapid.T) *ir.Program {
	var b progBuilder
	live := []ir.TensorID{b.tensor("param", units.Bytes(rapid.Int64Range(0, 1e9).Draw(t, "param")), true, false)}
	var offloaded []ir.TensorID
	phase := ir.Forward
	n := rapid.IntRange(0, 40).Draw(t, "ops")
	for i := 0; i < n; i++ {
		if rapid.IntRange(0, 9).Draw(t, "next phase") == 0 && phase < ir.Optimizer {
			phase++
		}
		in := ids(rapid.SampledFrom(live).Draw(t, "in"))
		if rapid.Bool().Draw(t, "two inputs") {
			in = append(in, rapid.SampledFrom(live).Draw(t, "in2"))
		}
		out := b.tensor("t", units.Bytes(rapid.Int64Range(0, 1e9).Draw(t, "bytes")), false, false)
		op := ir.Op{Name: "op", Phase: phase, In: in, Out: ids(out)}
		switch rapid.IntRange(0, 5).Draw(t, "kind") {
		case 0:
			op.Comm = &ir.Comm{Kind: ir.CommKind(rapid.IntRange(0, 4).Draw(t, "comm")), Bytes: units.Bytes(rapid.Int64Range(0, 1e9).Draw(t, "comm bytes")),
				Group: rapid.SampledFrom([]ir.Group{ir.DataGroup, ir.TensorGroup, ir.PipelineGroup, ir.ExpertGroup}).Draw(t, "group"), Ranks: rapid.IntRange(1, 16).Draw(t, "ranks")}
			if rapid.Bool().Draw(t, "comm with compute") {
				op.FLOPs = rapid.Float64Range(0, 1e13).Draw(t, "flops")
			}
		case 1:
			host := b.tensor("host", 0, false, true)
			op.Out = ids(host)
			op.Transfer = &ir.Transfer{Bytes: units.Bytes(rapid.Int64Range(0, 1e9).Draw(t, "copy")), ToHost: true}
			offloaded = append(offloaded, host)
		case 2:
			if len(offloaded) > 0 {
				op.In = ids(rapid.SampledFrom(offloaded).Draw(t, "reload"))
				op.Transfer = &ir.Transfer{Bytes: units.Bytes(rapid.Int64Range(0, 1e9).Draw(t, "copy")), ToHost: false}
			}
		default:
			op.FLOPs = rapid.SampledFrom([]float64{0, 1, 7, 1e6, 3e9, 1e13}).Draw(t, "flops")
			op.MemBytes = rapid.SampledFrom([]float64{0, 3, 1e3, 1e9}).Draw(t, "membytes")
			op.Recompute = phase == ir.Backward && rapid.Bool().Draw(t, "recompute")
		}
		b.op(op)
		live = append(live, out)
	}
	return &b.p
}

func genOptions(t *rapid.T) cost.PriceOptions {
	return cost.PriceOptions{
		Efficiency:       cost.Efficiency{Compute: rapid.Float64Range(0.01, 1).Draw(t, "ec"), Memory: rapid.Float64Range(0.01, 1).Draw(t, "em")},
		Overlap:          map[ir.Group]bool{"tp": rapid.Bool().Draw(t, "tp overlap"), "dp": rapid.Bool().Draw(t, "dp overlap")},
		Networks:         map[ir.Group]cost.Link{"pp": {Bandwidth: 25e9, Latency: time.Duration(rapid.IntRange(0, 10000).Draw(t, "pp latency"))}},
		SharedCopyStream: rapid.Bool().Draw(t, "shared copy stream"),
		TokensPerStep:    1024,
	}
}

func TestPriceProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		p := genProgram(t)
		o := genOptions(t)
		g := toyGPU()
		tm, err := cost.Price(p, g, o)
		if err != nil {
			t.Fatal(err)
		}
		again, err := cost.Price(p, g, o)
		if err != nil || !reflect.DeepEqual(tm, again) {
			t.Fatal("Price is not deterministic")
		}
		// NoOps keeps no op's times and changes no total.
		no := o
		no.NoOps = true
		totals, err := cost.Price(p, g, no)
		if err != nil {
			t.Fatal(err)
		}
		withOps := *tm
		withOps.Ops = nil
		if totals.Ops != nil || !reflect.DeepEqual(*totals, withOps) {
			t.Fatalf("NoOps: %+v, want %+v without ops", *totals, withOps)
		}
		if len(tm.Ops) != len(p.Ops) {
			t.Fatalf("%d op times for %d ops", len(tm.Ops), len(p.Ops))
		}
		var compute, comm, transfer, wall time.Duration
		for i, ot := range tm.Ops {
			if ot.Compute < 0 || ot.Comm < 0 || ot.Transfer < 0 || ot.Stall < 0 || ot.Start < 0 || ot.End < ot.Start || ot.End > tm.Step {
				t.Fatalf("op %d: %+v (step %v)", i, ot, tm.Step)
			}
			compute += ot.Compute
			comm += ot.Comm
			transfer += ot.Transfer
		}
		for _, ph := range tm.Phases {
			wall += ph.Wall
		}
		if compute != tm.Compute || comm != tm.Comm || transfer != tm.Transfer {
			t.Fatalf("totals %v %v %v, ops sum to %v %v %v", tm.Compute, tm.Comm, tm.Transfer, compute, comm, transfer)
		}
		if tm.Step != tm.Compute+tm.ExposedComm+tm.ExposedTransfer || wall != tm.Step {
			t.Fatalf("step %v ≠ compute %v + exposed comm %v + exposed transfer %v, or phase walls %v",
				tm.Step, tm.Compute, tm.ExposedComm, tm.ExposedTransfer, wall)
		}
		// At every instant before the end one stream is busy.
		if tm.Step > tm.Compute+tm.Comm+tm.Transfer || tm.ExposedComm > tm.Comm || tm.ExposedTransfer > tm.Transfer {
			t.Fatalf("step %v exceeds the serial sum %v + %v + %v", tm.Step, tm.Compute, tm.Comm, tm.Transfer)
		}
		const slack = 1 + 1e-12 // float rounding of FLOPs / (ns × FLOP/s)
		if tm.MFU < 0 || tm.MFU > tm.HFU*slack || tm.HFU > slack {
			t.Fatalf("MFU %v, HFU %v", tm.MFU, tm.HFU)
		}
		if tm.ModelFLOPs+tm.RecomputeFLOPs > tm.FLOPs*slack {
			t.Fatalf("model %v + recompute %v > all %v", tm.ModelFLOPs, tm.RecomputeFLOPs, tm.FLOPs)
		}
	})
}

// With copies only, on one shared copy stream, Price's schedule is Overlap's:
// each copy is issued after the compute ops before it and needed by the
// first compute op that reads what it wrote.
func TestPriceMatchesOverlap(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		var b progBuilder
		live := []ir.TensorID{b.tensor("param", 1e8, true, false)}
		var copies []ir.TensorID // outputs of copies, not yet read by a copy
		n := rapid.IntRange(0, 30).Draw(t, "ops")
		for i := 0; i < n; i++ {
			out := b.tensor("t", 1e6, false, false)
			switch {
			case rapid.IntRange(0, 2).Draw(t, "kind") == 0:
				toHost := rapid.Bool().Draw(t, "to host")
				b.op(ir.Op{Name: "copy", In: ids(rapid.SampledFrom(live).Draw(t, "src")), Out: ids(out),
					Transfer: &ir.Transfer{Bytes: units.Bytes(rapid.Int64Range(0, 1e9).Draw(t, "bytes")), ToHost: toHost}})
				copies = append(copies, out)
			default:
				in := ids(rapid.SampledFrom(live).Draw(t, "in"))
				if len(copies) > 0 && rapid.Bool().Draw(t, "reads a copy") {
					in = append(in, rapid.SampledFrom(copies).Draw(t, "copy in"))
				}
				b.op(ir.Op{Name: "op", In: in, Out: ids(out), FLOPs: rapid.Float64Range(0, 1e13).Draw(t, "flops"), MemBytes: 1})
				live = append(live, out)
			}
		}
		tm, err := cost.Price(&b.p, toyGPU(), cost.PriceOptions{SharedCopyStream: true})
		if err != nil {
			t.Fatal(err)
		}
		var compute []time.Duration
		var cs []cost.Copy
		readers := map[ir.TensorID]int{} // copy output → first compute item reading it
		for i, op := range b.p.Ops {
			if op.Transfer == nil {
				for _, x := range op.In {
					if _, ok := readers[x]; !ok {
						readers[x] = len(compute)
					}
				}
				compute = append(compute, tm.Ops[i].Compute)
			}
		}
		nc := 0
		for i, op := range b.p.Ops {
			if op.Transfer == nil {
				nc++
				continue
			}
			need, ok := readers[op.Out[0]]
			if !ok {
				need = len(compute)
			}
			cs = append(cs, cost.Copy{Duration: tm.Ops[i].Transfer, IssueAt: nc, NeededBy: need})
		}
		s, err := cost.Overlap(compute, cs)
		if err != nil {
			t.Fatal(err)
		}
		if s.Total != tm.Step || s.Exposed != tm.ExposedTransfer || s.Transfer != tm.Transfer {
			t.Fatalf("Price step %v exposed %v; Overlap %v exposed %v", tm.Step, tm.ExposedTransfer, s.Total, s.Exposed)
		}
	})
}

// BenchmarkPriceLlama3_70B prices one training iteration of llama-3-70b at
// sequence 8192. Target: well under 5 ms.
func BenchmarkPriceLlama3_70B(b *testing.B) {
	p, _ := llamaProgram(b, "llama-3-70b", 8192)
	g, err := hw.Lookup("h100-sxm")
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := cost.Price(p, g, cost.PriceOptions{TokensPerStep: 8192}); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(len(p.Ops)), "ops")
}
