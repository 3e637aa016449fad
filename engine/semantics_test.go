package engine

import (
	"strings"
	"testing"

	"pgregory.net/rapid"

	"github.com/memplan/memplan/ir"
	"github.com/memplan/memplan/lower"
	"github.com/memplan/memplan/models"
	"github.com/memplan/memplan/models/build"
	"github.com/memplan/memplan/ops"
	"github.com/memplan/memplan/units"
)

func semPlan(t *testing.T, s Spec) *Result {
	t.Helper()
	r, err := Plan(s)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func catalog(t *testing.T, name string) *models.Arch {
	t.Helper()
	a, err := models.Lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// Pure bf16 with AdamW holds 8 bytes per parameter of model state:
// parameters, gradients, exp_avg and exp_avg_sq all bfloat16 (litgpt
// bf16-true: lightning fabric/plugins/precision/half.py @71aed751 converts
// the module to bfloat16 and torch.optim.AdamW creates its state with
// torch.zeros_like(p), torch/optim/adamw.py @v2.1.0 L112-127). Megatron's
// bf16 with float32 main weights holds 16.
func TestPureBF16HoldsEightBytesPerParam(t *testing.T) {
	for _, c := range []struct {
		p    ops.Precision
		want float64
	}{{ops.PureBF16, 8}, {ops.BF16, 16}} {
		r := semPlan(t, Spec{Job: Job{Model: catalog(t, "gpt2"), Seq: 128, Precision: c.p, Optimizer: lower.AdamW, Impl: lower.Fused}})
		ms := r.Sim.ModelStates
		got := float64(ms.Parameters+ms.Gradients+ms.OptimizerState) / float64(r.Sim.Params)
		if got != c.want {
			t.Errorf("%v: %.3f bytes/param of model state, want %g", c.p, got, c.want)
		}
	}
}

// Optimizer-in-backward never holds every gradient at once: torchtune's
// optimizer_in_bwd steps each parameter from its post-accumulate-grad hook
// and zeroes its gradient (torchtune/training/memory.py @v0.4.0
// register_optim_in_bwd_hooks), so at most the gradients of the parameters
// whose backward is running are alive.
func TestOptimizerInBackwardNeverHoldsAllGradients(t *testing.T) {
	a := catalog(t, "llama-3.2-1b")
	base := Spec{Job: Job{Model: a, Seq: 256, Precision: ops.PureBF16, Optimizer: lower.AdamW}}
	all := semPlan(t, base)
	inb := base
	inb.Sem.OptimizerInBackward = true
	r := semPlan(t, inb)
	var maxGrad units.Bytes
	for _, p := range r.Sim.Timeline {
		maxGrad = max(maxGrad, p.Cat[ir.Gradient])
	}
	total := all.Sim.ModelStates.Gradients
	// The tied embedding's gradient (128k x 2048) is made by the head's
	// backward and completed by the embedding's, so it lives through the
	// whole backward; besides it, at most one layer's gradients exist.
	embedding := units.BF16.Size(int64(a.Vocab) * int64(a.Hidden))
	layer := units.BF16.Size((int64(total)/2 - int64(a.Vocab)*int64(a.Hidden)) / int64(a.Layers))
	if maxGrad > embedding+layer || maxGrad >= total/2 {
		t.Errorf("gradients alive at once %v (all gradients %v, embedding %v, one layer %v)", maxGrad, total, embedding, layer)
	}
	if r.Sim.Peak.Total >= all.Sim.Peak.Total {
		t.Errorf("peak %v not below the step after backward's %v", r.Sim.Peak.Total, all.Sim.Peak.Total)
	}
	acc := inb
	acc.Accum = 2
	if _, err := Plan(acc); err == nil || !strings.Contains(err.Error(), "cannot accumulate") {
		t.Errorf("optimizer in backward with accumulation: %v", err)
	}
}

// bitsandbytes up to 0.43.2 keeps every 4-bit linear's input for backward
// (bitsandbytes/autograd/_functions.py @0.41.1 L522-525: ctx.tensors = (A, B)
// whenever an input needs grad; #1270 stopped it in 0.43.3). Every 4-bit
// linear whose input requires grad then saves that input, and the saved
// activations grow.
func TestOldBitsandbytesKeepsFourBitInputs(t *testing.T) {
	a := catalog(t, "llama-3.2-1b")
	s := Spec{Job: Job{Model: a, Seq: 256, Precision: ops.PureBF16, LoRA: &build.LoRA{Rank: 8, Alpha: 16, Targets: []string{"q_proj", "v_proj"}}, QLoRA: true}}
	s.Sem.Quant.SavesInput = true
	g, err := build.Graph(a, build.Options{MicroBatch: 1, Seq: 256, Precision: ops.PureBF16, Training: true, LoRA: s.LoRA, QLoRA: true, Quant: s.Sem.Quant})
	if err != nil {
		t.Fatal(err)
	}
	n4 := 0
	for _, n := range g.Nodes {
		if n.Kind != "linear_4bit_saves_input" {
			continue
		}
		n4++
		if g.Tensors[n.In[0]].RequiresGrad && (len(n.Saved) == 0 || n.Saved[0] != n.In[0]) {
			t.Errorf("%s: a 4-bit linear whose input requires grad does not save it", n.Module)
		}
	}
	if n4 != 7*a.Layers {
		t.Errorf("%d 4-bit linears, want %d", n4, 7*a.Layers)
	}
	newer := s
	newer.Sem.Quant.SavesInput = false
	rOld, rNew := semPlan(t, s), semPlan(t, newer)
	if rOld.Sim.SavedTotal <= rNew.Sim.SavedTotal {
		t.Errorf("saved %v with bitsandbytes 0.41, %v with 0.43.3: want more", rOld.Sim.SavedTotal, rNew.Sim.SavedTotal)
	}
}

// A chunked cross-entropy that upcasts each chunk in the loss never holds
// more than one chunk's float32 logits (torchtune
// torchtune/modules/loss/ce_chunked_output_loss.py @v0.4.0:
// compute_cross_entropy(logits.float(), ...) chunk by chunk): each float32
// copy dies at its chunk's log_softmax, before the next chunk's is made.
func TestChunkedLossHoldsOneFloat32Chunk(t *testing.T) {
	a := catalog(t, "llama-3.2-1b")
	s := Spec{Job: Job{Model: a, Seq: 1024, MicroBatch: 2, Precision: ops.PureBF16, Optimizer: lower.AdamW}}
	s.Sem.Loss = build.Loss{Kind: build.LossChunked, Chunks: 8, Upcast: build.UpcastChunk}
	if err := s.Validate(); err != nil {
		t.Fatal(err)
	}
	p, err := Program(&s, false)
	if err != nil {
		t.Fatal(err)
	}
	first, last := map[ir.TensorID]int{}, map[ir.TensorID]int{}
	for i, op := range p.Ops {
		for _, x := range op.Out {
			if _, ok := first[x]; !ok {
				first[x] = i
			}
		}
		for _, x := range append(append([]ir.TensorID(nil), op.In...), op.Out...) {
			last[x] = i
		}
	}
	var f32 []ir.TensorID
	for id, t := range p.Tensors {
		if t.DType == units.F32 && t.Base == ir.NoTensor && len(t.Shape) == 2 && t.Shape[1] == int64(a.Vocab) && p.Ops[first[ir.TensorID(id)]].Name == "to_copy" {
			f32 = append(f32, ir.TensorID(id))
		}
	}
	if len(f32) != 8 {
		t.Fatalf("%d float32 logit chunks, want 8", len(f32))
	}
	for i := range f32 {
		for j := range f32 {
			if i != j && first[f32[j]] > first[f32[i]] && first[f32[j]] <= last[f32[i]] {
				t.Errorf("float32 chunks %s and %s are alive together", p.Tensors[f32[i]].Name, p.Tensors[f32[j]].Name)
			}
		}
	}
	full := s
	full.Sem.Loss = build.Loss{}
	if rc, rf := semPlan(t, s), semPlan(t, full); rc.Sim.Peak.Total >= rf.Sim.Peak.Total {
		t.Errorf("chunked loss peak %v, float32 logits %v: want lower", rc.Sim.Peak.Total, rf.Sim.Peak.Total)
	}
}

// litgpt 0.5's full fine-tuning runs the head whole and chunks only the
// cross-entropy, by 128 rows of the flattened, shifted logits
// (finetune/full.py and utils.py chunked_cross_entropy @v0.5.13): one head
// linear, ceil(B·(S−1)/128) log_softmax, and a backward that handles one
// row chunk's gradients at a time, below the same loss in one piece (the
// framework suite measures it within 0.4%).
func TestChunkedRowsLoss(t *testing.T) {
	a := catalog(t, "llama-3.2-1b")
	// Sequences long enough that the loss sets the backward peak, not the
	// tied embedding's gradients summed out of place (three 0.5 GB
	// buffers).
	s := Spec{Job: Job{Model: a, Seq: 2048, MicroBatch: 2, Precision: ops.PureBF16, Optimizer: lower.AdamW}}
	s.Sem.Code = build.CodeLitGPT
	s.Sem.Loss = build.Loss{Kind: build.LossChunked, Rows: 128, Upcast: build.UpcastOutputs}
	if err := s.Validate(); err != nil {
		t.Fatal(err)
	}
	p, err := Program(&s, false)
	if err != nil {
		t.Fatal(err)
	}
	heads, ces := 0, 0
	for _, op := range p.Ops {
		if op.Phase != ir.Forward {
			continue
		}
		if op.Name == "linear" && strings.HasPrefix(op.Module, "lm_head") {
			heads++
		}
		if op.Name == "log_softmax" {
			ces++
		}
	}
	if want := (2*2047 + 127) / 128; heads != 1 || ces != want {
		t.Errorf("%d head linears and %d cross-entropies, want 1 and %d", heads, ces, want)
	}
	whole := s
	whole.Sem.Loss = build.Loss{Kind: build.LossChunked, ChunkTokens: 2048, Upcast: build.UpcastOutputs}
	rr, rw := semPlan(t, s), semPlan(t, whole)
	if rr.Sim.PhasePeak[ir.Backward].Total >= rw.Sim.PhasePeak[ir.Backward].Total {
		t.Errorf("row-chunked cross-entropy backward peak %v, whole %v: want lower", rr.Sim.PhasePeak[ir.Backward].Total, rw.Sim.PhasePeak[ir.Backward].Total)
	}
}

// bitsandbytes' paged optimizers page only state of at least 1e5 values
// (bitsandbytes/optim/optimizer.py @0.41.1 get_state_buffer): smaller state
// is an ordinary allocation and counts on the device.
func TestPagedOptimizerThreshold(t *testing.T) {
	a := catalog(t, "llama-3.2-1b")
	s := Spec{Job: Job{Model: a, Seq: 128, Precision: ops.PureBF16, Optimizer: lower.AdamW, LoRA: &build.LoRA{Rank: 8, Alpha: 16, Targets: []string{"q_proj", "v_proj"}}}}
	s.Sem.PagedOptimizer = true
	r := semPlan(t, s)
	// lora_A of q_proj: 8 x 2048 = 16,384 values; every adapter is under 1e5.
	if r.Sim.ModelStates.OptimizerState == 0 {
		t.Error("small LoRA state was paged out of the device")
	}
	full := Spec{Job: Job{Model: a, Seq: 128, Precision: ops.PureBF16, Optimizer: lower.AdamW}}
	full.Sem.PagedOptimizer = true
	rf := semPlan(t, full)
	// Two norms per layer and the final norm, two bfloat16 states each.
	if rf.Sim.ModelStates.OptimizerState > units.BF16.Size(int64(2*a.Layers+1)*2*int64(a.Hidden)) {
		t.Errorf("paged full fine-tune keeps %v of optimizer state on the device; want only the norms'", rf.Sim.ModelStates.OptimizerState)
	}
}

// Loop habits move real peaks: gradients zeroed in place (PyTorch < 2.0's
// zero_grad default, torch/optim/optimizer.py @v1.13.0 set_to_none=False)
// are alive through the next forward, as are gradients cleared only after
// the forward; logits kept in the loop's variable are alive through the
// optimizer step and into the next forward.
func TestLoopHabits(t *testing.T) {
	base := Spec{Job: Job{Model: catalog(t, "gpt2"), Seq: 512, MicroBatch: 2, Precision: ops.FP32, Optimizer: lower.AdamW}, Target: Target{FirstStep: true}}
	r0 := semPlan(t, base)
	grads := r0.Sim.ModelStates.Gradients
	fwd := func(r *Result) units.Bytes { return r.Sim.PhasePeak[ir.Forward].Total }
	opt := func(r *Result) units.Bytes { return r.Sim.PhasePeak[ir.Optimizer].Total }
	for _, z := range []lower.ZeroGrad{lower.ZeroInPlace, lower.ZeroAfterForward} {
		s := base
		s.Sem.ZeroGrad = z
		r := semPlan(t, s)
		if fwd(r) < fwd(r0)+grads {
			t.Errorf("zero-grad %d: forward peak %v, want at least %v + gradients %v", z, fwd(r), fwd(r0), grads)
		}
		if fp := r.First.PhasePeak[ir.Forward].Total; fp != r0.First.PhasePeak[ir.Forward].Total {
			t.Errorf("zero-grad %d: the first step's forward has no gradients yet, peak %v vs %v", z, fp, r0.First.PhasePeak[ir.Forward].Total)
		}
	}
	s := base
	s.Sem.Hold = lower.HoldNextForward
	r := semPlan(t, s)
	logits := units.F32.Size(2 * 512 * int64(base.Model.Vocab))
	if opt(r) < opt(r0)+logits {
		t.Errorf("held logits: optimizer peak %v, want at least %v + logits %v", opt(r), opt(r0), logits)
	}
	s.Sem.Hold = lower.HoldBackward
	if rb := semPlan(t, s); opt(rb) != opt(r0) || rb.Sim.PhasePeak[ir.Backward].Total <= r0.Sim.PhasePeak[ir.Backward].Total {
		t.Errorf("logits held through backward only: optimizer %v (want %v), backward %v (want above %v)", opt(rb), opt(r0), rb.Sim.PhasePeak[ir.Backward].Total, r0.Sim.PhasePeak[ir.Backward].Total)
	}
}

// A fused linear cross-entropy never holds the logits of the batch: Liger's
// kernel makes them a chunk of about N·H values at a time and keeps only
// grad_input [N, H] and grad_weight [V, H] (Liger-Kernel
// src/liger_kernel/ops/fused_linear_cross_entropy.py).
func TestFusedLinearLossNeverHoldsLogits(t *testing.T) {
	a := catalog(t, "llama-3.2-1b")
	s := Spec{Job: Job{Model: a, Seq: 2048, MicroBatch: 2, Precision: ops.PureBF16, Optimizer: lower.AdamW}}
	s.Sem.Loss = build.Loss{Kind: build.LossFusedLinear}
	if err := s.Validate(); err != nil {
		t.Fatal(err)
	}
	p, err := Program(&s, false)
	if err != nil {
		t.Fatal(err)
	}
	logits := int64(2) * 2047 * int64(a.Vocab)
	for _, x := range p.Tensors {
		if x.Base == ir.NoTensor && len(x.Shape) > 0 && x.Shape[len(x.Shape)-1] == int64(a.Vocab) && x.Numel() >= logits/8 {
			t.Errorf("%s holds %d values (logits of the batch: %d)", x.Name, x.Numel(), logits)
		}
	}
	full := s
	full.Sem.Loss = build.Loss{}
	if rf, rc := semPlan(t, full), semPlan(t, s); rc.Sim.Peak.Total >= rf.Sim.Peak.Total {
		t.Errorf("fused loss peak %v, float32 logits %v", rc.Sim.Peak.Total, rf.Sim.Peak.Total)
	}
}

// Paged optimizer state is the state of the rank's shard under ZeRO: each
// rank's optimizer pages what it steps (DeepSpeed's stage 1/2 optimizer over
// its flat partition, FSDP's over sharded parameters, each allocating its
// own bitsandbytes state: optimizer.py @0.41.1 get_state_buffer), so dp
// ranks page the unsharded state between them, as --offload optimizer's
// host state is divided. Per tensor a shard rounds up to ceil(numel/dp)
// elements (zero.go), so dp shards exceed the whole by under dp elements a
// tensor.
func TestPropertyPagedStateSharded(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		arch := lookup(t, "gpt2").Clone()
		arch.Hidden = 64 * rapid.IntRange(4, 8).Draw(rt, "hidden64")
		arch.Heads, arch.KVHeads = 4, 4
		arch.HeadDim, arch.Intermediate = arch.Hidden/4, 4*arch.Hidden
		arch.Layers = rapid.IntRange(1, 3).Draw(rt, "layers")
		opt := rapid.SampledFrom([]lower.Optimizer{lower.AdamW, lower.Adam8bit, lower.SGDMomentum, lower.Lion}).Draw(rt, "optimizer")
		prec := rapid.SampledFrom([]ops.Precision{ops.AMPBF16, ops.PureBF16, ops.BF16}).Draw(rt, "precision")
		stage := rapid.IntRange(1, 3).Draw(rt, "zero")
		s := Spec{Job: Job{Model: arch, Seq: 32, Precision: prec, Optimizer: opt}}
		s.Sem.PagedOptimizer = true
		whole, err := Plan(s)
		if err != nil {
			rt.Fatal(err)
		}
		var paged int64 // paged tensors and the widest element among them
		var elem units.Bytes
		for _, tt := range whole.Program.Tensors {
			if tt.Host && tt.Cat == ir.OptimizerState {
				paged++
				elem = max(elem, tt.DType.Size(1))
			}
		}
		if paged == 0 || whole.HostPeak == 0 {
			rt.Fatalf("%s %s: nothing paged", opt, prec)
		}
		for _, dp := range []int{1, 2, 4, 8} {
			sh := s
			sh.DP, sh.ZeRO = dp, stage
			if dp == 1 {
				sh.ZeRO = 0
			}
			r, err := Plan(sh)
			if err != nil {
				rt.Fatal(err)
			}
			over := r.HostPeak*units.Bytes(dp) - whole.HostPeak
			if over < 0 || over > units.Bytes(int64(dp)*paged)*elem {
				rt.Errorf("%s %s ZeRO-%d dp %d: %v paged per rank, × dp = %v; unsharded %v (%d paged tensors)",
					opt, prec, sh.ZeRO, dp, r.HostPeak, r.HostPeak*units.Bytes(dp), whole.HostPeak, paged)
			}
		}
	})
}

// sumModels are the gradient-sum tests' models: gpt2 (tied embedding and
// head) and tinyllama (untied) at 2 layers, and torchtune's head over 4
// output chunks.
func sumModels(t *testing.T) (tied, untied *models.Arch, chunked build.Loss) {
	tied = catalog(t, "gpt2").Clone()
	tied.Layers = 2
	untied = catalog(t, "tinyllama-1.1b").Clone()
	untied.Layers = 2
	return tied, untied, build.Loss{Kind: build.LossChunked, Chunks: 4, Upcast: build.UpcastChunk}
}

// A parameter several nodes read has its gradients summed before its one
// AccumulateGrad, as PyTorch 2's autograd engine does
// (torch/csrc/autograd/input_buffer.cpp, accumulate): the first is kept,
// a later one added out of place when the kept one cannot be stolen
// (linear's weight gradient, a t() view that keeps its base), in place
// otherwise (autocast's cast backward makes a fresh one; so is a sum); from
// the second micro-step on, AccumulateGrad adds the sum into .grad. The
// counts are PyTorch's own (torch.profiler, profile_memory: one aten::add
// allocating a parameter-sized buffer per out-of-place sum):
// python/tests/test_tied_grads.py measures the same cases on CPU with
// torch 2.14.1.
func TestGradientSumsFollowAutograd(t *testing.T) {
	tied, untied, chunked := sumModels(t)
	for _, c := range []struct {
		name  string
		model *models.Arch
		prec  ops.Precision
		loss  build.Loss
		sums  int // per micro-step, out of place
		pp    int
	}{
		{"tied fp32", tied, ops.FP32, build.Loss{}, 1, 1},
		{"tied pure-bf16", tied, ops.PureBF16, build.Loss{}, 1, 1},
		{"tied amp-bf16", tied, ops.AMPBF16, build.Loss{}, 0, 1},
		{"head over 4 chunks fp32", untied, ops.FP32, chunked, 1, 1},
		{"head over 4 chunks pure-bf16", untied, ops.PureBF16, chunked, 1, 1},
		{"untied fp32", untied, ops.FP32, build.Loss{}, 0, 1},
		// A pipeline holds the embedding and the head on different stages,
		// each its own copy (Megatron): nothing is summed on either.
		{"tied fp32 pp 2", tied, ops.FP32, build.Loss{}, 0, 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := Spec{Job: Job{Model: c.model, Seq: 64, MicroBatch: 1, Accum: 3, Precision: c.prec, Optimizer: lower.AdamW}}
			s.Sem.Loss = c.loss
			s.PP = c.pp
			if err := s.Validate(); err != nil {
				t.Fatal(err)
			}
			sums := map[int]int{}
			accumulates := 0
			for st := 0; st < c.pp; st++ {
				r, err := PlanWith(s, Options{Stages: []int{st}})
				if err != nil {
					t.Fatal(err)
				}
				p := r.Program
				for _, op := range p.Ops {
					switch op.Name {
					case "add (autograd sums gradients)":
						sums[op.Micro]++
						in := p.Tensors[op.In[0]]
						if out := p.Tensors[op.Out[0]]; out.Bytes != in.Bytes || out.Bytes == 0 {
							t.Errorf("micro-step %d: the sum is %d bytes from %d", op.Micro, out.Bytes, in.Bytes)
						}
					case "accumulate_grad":
						accumulates++
					}
				}
			}
			for m := 0; m < 3; m++ {
				if sums[m] != c.sums {
					t.Errorf("micro-step %d: %d sums out of place, want %d", m, sums[m], c.sums)
				}
			}
			// Micro-steps 1 and 2 add the summed buffer into .grad (one
			// per parameter several nodes read).
			want := 0
			if c.pp == 1 && (c.model == tied || c.loss.Chunks > 0) {
				want = 2
			}
			if accumulates != want {
				t.Errorf("%d accumulate_grad ops, want %d", accumulates, want)
			}
		})
	}
}

// PyTorch 1.x's engine sums every later gradient out of place
// (autograd.inplace-sums=false): the counts measured on 1.13 (torch.profiler,
// python/tests/test_tied_grads.py's skip reason): every later contribution
// of a parameter (a head over 4 chunks: 3; a tied embedding under
// autocast: 1), and every activation several nodes read (residual
// streams), which PyTorch 2 adds in place; never a lower peak.
func TestOutOfPlaceSumsOfPyTorch1(t *testing.T) {
	tied, untied, chunked := sumModels(t)
	for _, c := range []struct {
		name       string
		model      *models.Arch
		prec       ops.Precision
		loss       build.Loss
		paramSums  int // per micro-step
		paramSums2 int // the same under PyTorch 2
	}{
		{"tied amp-bf16", tied, ops.AMPBF16, build.Loss{}, 1, 0},
		{"tied fp32", tied, ops.FP32, build.Loss{}, 1, 1},
		{"head over 4 chunks", untied, ops.FP32, chunked, 3, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			count := func(outOfPlace bool) (params, acts int, peak units.Bytes) {
				s := Spec{Job: Job{Model: c.model, Seq: 64, MicroBatch: 1, Precision: c.prec, Optimizer: lower.AdamW}}
				s.Sem.Loss, s.Sem.OutOfPlaceSums = c.loss, outOfPlace
				r := semPlan(t, s)
				for _, op := range r.Program.Ops {
					if op.Name != "add (autograd sums gradients)" {
						continue
					}
					if strings.HasPrefix(r.Program.Tensors[op.Out[0]].Name, "grad(") {
						acts++
					} else {
						params++
					}
				}
				return params, acts, r.PeakBytes()
			}
			p1, a1, peak1 := count(true)
			p2, a2, peak2 := count(false)
			if p1 != c.paramSums || p2 != c.paramSums2 {
				t.Errorf("parameter sums out of place: %d under PyTorch 1, %d under 2; want %d and %d", p1, p2, c.paramSums, c.paramSums2)
			}
			if a2 != 0 || a1 < 2*2 { // two residual streams a block
				t.Errorf("activation sums out of place: %d under PyTorch 1, %d under 2", a1, a2)
			}
			if peak1 < peak2 {
				t.Errorf("PyTorch 1's peak %s under PyTorch 2's %s", peak1, peak2)
			}
		})
	}
}
