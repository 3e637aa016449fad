package engine

import (
	"math"
	"strings"
	"testing"

	"github.com/memplan/memplan/hw"
	"github.com/memplan/memplan/ir"
	"github.com/memplan/memplan/lower"
	"github.com/memplan/memplan/models/build"
	"github.com/memplan/memplan/ops"
	"github.com/memplan/memplan/units"
)

// loraSpec is llama-3.2-1b with LoRA on q_proj and v_proj, pure bf16.
func loraSpec(t *testing.T) Spec {
	return Spec{Job: Job{Model: catalog(t, "llama-3.2-1b"), Seq: 256, MicroBatch: 2, Precision: ops.PureBF16, Optimizer: lower.AdamW, LoRA: &build.LoRA{Rank: 8, Alpha: 16, Dropout: 0.05, Targets: []string{"q_proj", "v_proj"}}}}
}

// lit-gpt's attention keeps the whole fused qkv output alive: SDPA saves v,
// a view of it (lit_gpt/model.py @8641822 CausalSelfAttention.forward), where
// transformers' separate v_proj keeps only v. Per layer that is q and k's
// columns more: (heads + kv heads) x head_dim values per token.
func TestLitGPTCodeKeepsFusedQKV(t *testing.T) {
	hf := loraSpec(t)
	hf.LoRA = &build.LoRA{Rank: 8, Alpha: 16, Targets: []string{"o_proj"}}
	lit := hf
	lit.Sem.Code = build.CodeLitGPT
	a := hf.Model
	rh, rl := semPlan(t, hf), semPlan(t, lit)
	tokens := int64(hf.MicroBatch * hf.Seq)
	// The first layer's attention reads the frozen embedding's output and
	// saves nothing; the rest keep q and k's columns.
	qk := units.BF16.Size(tokens * int64((a.Heads+a.KVHeads)*a.HeadDim) * int64(a.Layers-1))
	// lit-gpt's RMSNorm saves a bfloat16 rsqrt where the fused kernel saves
	// a float32 rstd: two bytes less per token and norm (every norm but the
	// first layer's input norm).
	norms := units.Bytes(2 * tokens * int64(2*a.Layers))
	// transformers computes cos and sin [1, S, head_dim] in every forward
	// (the rotary products keep them); lit-gpt's rope cache is a buffer.
	rope := 2 * units.BF16.Size(int64(hf.Seq*a.HeadDim))
	if got := rl.Sim.SavedTotal - rh.Sim.SavedTotal; got != qk-norms-rope {
		t.Errorf("lit-gpt saves %v more than transformers, want %v (q and k columns) less %v (rstd) and %v (cos, sin)", got, qk, norms, rope)
	}
}

// PyTorch 2.1's MeanBackward1 keeps mean.dim's input (Functions.h in the
// 2.1.0 wheel), so lit-gpt's unfused RMSNorm saves x*x: one [tokens, hidden]
// bfloat16 tensor per norm whose input requires grad (not the first
// layer's, whose input comes from the frozen embedding).
func TestMeanSavesInput(t *testing.T) {
	s := loraSpec(t)
	s.LoRA = &build.LoRA{Rank: 8, Alpha: 16, Targets: []string{"qkv_proj"}}
	s.Sem.Code = build.CodeLitGPT
	with := s
	with.Sem.MeanSavesInput = true
	a := s.Model
	r0, r1 := semPlan(t, s), semPlan(t, with)
	norms := int64(2*a.Layers+1) - 1
	want := units.BF16.Size(norms * int64(s.MicroBatch*s.Seq) * int64(a.Hidden))
	if got := r1.Sim.SavedTotal - r0.Sim.SavedTotal; got != want {
		t.Errorf("mean keeping its input saves %v more, want %v (%d norms)", got, want, norms)
	}
}

// peft keeps adapters over a 16-bit model in float32 and casts their input
// (peft tuners_utils.py @v0.13.0 _cast_adapter_dtype); litgpt and torchtune
// keep them in the model's dtype. One dropout per input instead of per
// target (litgpt's LoRAQKVLinear) saves one mask and output per shared
// input.
func TestLoRASemantics(t *testing.T) {
	peft := loraSpec(t)
	model := peft
	model.Sem.LoRAModelDType = true
	shared := model
	shared.Sem.LoRASharedDropout = true
	rp, rm, rs := semPlan(t, peft), semPlan(t, model), semPlan(t, shared)
	a := peft.Model
	adapters := int64(a.Layers) * 8 * int64(2*a.Hidden+a.Heads*a.HeadDim+a.KVHeads*a.HeadDim)
	if d := rp.Sim.ModelStates.Parameters - rm.Sim.ModelStates.Parameters; d != units.Bytes(2*adapters) {
		t.Errorf("float32 adapters hold %v more than bfloat16 ones, want %v", d, 2*adapters)
	}
	if rm.Sim.SavedTotal >= rp.Sim.SavedTotal {
		t.Errorf("model-dtype adapters save %v, float32 ones %v: want less", rm.Sim.SavedTotal, rp.Sim.SavedTotal)
	}
	tokens := int64(peft.MicroBatch * peft.Seq)
	// q_proj and v_proj read the same input: one dropout (bf16 output and
	// bool mask) less per layer; the first layer's mask is never kept (its
	// input does not require grad).
	want := units.Bytes(int64(a.Layers)*tokens*int64(a.Hidden)*3 - tokens*int64(a.Hidden))
	if d := rm.Sim.SavedTotal - rs.Sim.SavedTotal; d != want {
		t.Errorf("a shared dropout saves %v less, want %v", d, want)
	}
}

// Lightning's bitsandbytes plugin swaps every torch.nn.Linear, the head
// too (fabric/plugins/precision/bitsandbytes.py @71aed751 L119-134), and
// quantises from a float16 copy, so each dequantisation makes a float16 and
// a compute-dtype copy (L205-229; bitsandbytes _functions.py @0.41.1
// MatMul4Bit.forward).
func TestQuantizedHeadAndFloat16State(t *testing.T) {
	s := loraSpec(t)
	s.QLoRA = true
	head := s
	head.Sem.Quant.Head = true
	a := s.Model
	r0, rh := semPlan(t, s), semPlan(t, head)
	if a.TieEmbeddings {
		if r0.Sim.ModelStates.Parameters != rh.Sim.ModelStates.Parameters {
			t.Errorf("a tied head is the embedding and stays as it is")
		}
	}
	untied := catalog(t, "llama-2-7b")
	s.Model, head.Model = untied, untied
	r0, rh = semPlan(t, s), semPlan(t, head)
	vh := int64(untied.Vocab) * int64(untied.Hidden)
	// bfloat16 (2 bytes) -> NF4 with double quantisation (0.5 + 1/64 + 4/16384).
	want := units.Bytes(2*vh) - units.Bytes(vh/2+vh/64+(vh/64+255)/256*4)
	if d := r0.Sim.ModelStates.Parameters - rh.Sim.ModelStates.Parameters; d < want-64 || d > want+64 {
		t.Errorf("a 4-bit head holds %v less, want about %v", d, want)
	}
	f16 := head
	f16.Sem.Quant.DequantCopy = true
	g0, err := build.Graph(untied, build.Options{MicroBatch: 1, Seq: 64, Precision: ops.PureBF16, Training: true, LoRA: s.LoRA, QLoRA: true, Quant: head.Sem.Quant})
	if err != nil {
		t.Fatal(err)
	}
	g1, err := build.Graph(untied, build.Options{MicroBatch: 1, Seq: 64, Precision: ops.PureBF16, Training: true, LoRA: s.LoRA, QLoRA: true, Quant: f16.Sem.Quant})
	if err != nil {
		t.Fatal(err)
	}
	for i := range g0.Nodes {
		if k := g0.Nodes[i].Kind; k == "linear_4bit" && g1.Nodes[i].Workspace != 2*g0.Nodes[i].Workspace {
			t.Errorf("%s: dequantisation through float16 holds %v, want twice %v", g0.Nodes[i].Module, g1.Nodes[i].Workspace, g0.Nodes[i].Workspace)
		}
	}
}

// PyTorch 2.x's cuBLAS handle takes its workspace from the caching
// allocator, one per handle and stream, and backward runs on autograd's own
// thread (aten/src/ATen/cuda/CublasHandlePool.cpp; PyTorch #83461/#86645,
// #91564): a training step holds two, inference one; 32 MiB each on
// compute capability 9.0, else 8,519,680 bytes.
func TestCublasWorkspace(t *testing.T) {
	for _, c := range []struct {
		gpu  string
		each units.Bytes
	}{{"a100-40gb", 8519680}, {"h100-sxm", 32 << 20}} {
		g, err := hw.Lookup(c.gpu)
		if err != nil {
			t.Fatal(err)
		}
		s := Spec{Job: Job{Model: catalog(t, "gpt2"), Seq: 128}, Target: Target{GPU: g, FirstStep: true}}
		s.Sem.Workspace = AutoWorkspace
		r := semPlan(t, s)
		if got := r.Sim.Peak.Cat[ir.Other] - semPlan(t, Spec{Job: Job{Model: s.Model, Seq: 128}, Target: Target{GPU: g}}).Sim.Peak.Cat[ir.Other]; got != 2*c.each {
			t.Errorf("%s training: workspaces %v, want 2 x %v", c.gpu, got, c.each)
		}
		if fw := r.First.PhasePeak[ir.Forward].Cat[ir.Other] - semPlan(t, Spec{Job: Job{Model: s.Model, Seq: 128}, Target: Target{GPU: g, FirstStep: true}}).First.PhasePeak[ir.Forward].Cat[ir.Other]; fw != c.each {
			t.Errorf("%s first forward: %v, want one workspace %v (autograd's thread has not run yet)", c.gpu, fw, c.each)
		}
		inf := s
		inf.Mode = Infer
		base := inf
		base.Sem.Workspace = 0
		if got := semPlan(t, inf).Sim.Peak.Cat[ir.Other] - semPlan(t, base).Sim.Peak.Cat[ir.Other]; got != c.each {
			t.Errorf("%s inference: workspaces %v, want one %v", c.gpu, got, c.each)
		}
	}
}

// Each parallel group of more than one GPU costs one NCCL communicator's
// device memory (NVIDIA/nccl #964).
func TestCommOverhead(t *testing.T) {
	g, _ := hw.Lookup("h100-sxm")
	s := Spec{Job: Job{Model: catalog(t, "gpt2")}, Parallel: Parallel{TP: 2, Sharding: Sharding{DP: 8}}, Target: Target{GPU: g}}
	s.Sem.Overhead, s.Sem.CommOverhead = 400e6, 544e6
	if got, want := s.CapacityBytes(), g.Capacity()-400e6-2*544e6; got != want {
		t.Errorf("usable %v, want %v", got, want)
	}
}

// torchao's low-bit AdamW keeps each moment in 8 or 4 bits with a float32
// scale per block (torchao/prototype/low_bit_optim, v0.5.0): 2 + 8/256 and
// 1 + 8/128 bytes per parameter of state for 4096-value tensors.
func TestTorchaoLowBitAdam(t *testing.T) {
	for _, c := range []struct {
		o    lower.Optimizer
		want float64
	}{{lower.AdamW8bitAO, 2 + 8.0/256}, {lower.AdamW4bitAO, 1 + 8.0/128}} {
		r := semPlan(t, Spec{Job: Job{Model: catalog(t, "llama-3.2-1b"), Seq: 128, Precision: ops.PureBF16, Optimizer: c.o}})
		got := float64(r.Sim.ModelStates.OptimizerState) / float64(r.Sim.Params)
		if got < c.want || got > c.want*1.001 {
			t.Errorf("%v: %.4f bytes of state per parameter, want %.4f", c.o, got, c.want)
		}
	}
}

// torchtitan's op-level selective checkpointing keeps SDPA's outputs and
// every other matmul's and recomputes the rest of each block
// (torchtitan/models/llama/parallelize_llama.py _save_list): its saved
// activations lie between full checkpointing's and none's, and no SDPA is
// replayed.
func TestSelectiveOpCheckpoint(t *testing.T) {
	base := Spec{Job: Job{Model: catalog(t, "llama-3.2-1b"), MicroBatch: 2, Seq: 512, Precision: ops.BF16, Optimizer: lower.AdamW}}
	full, sac := base, base
	full.Checkpoint = CheckpointPolicy{Kind: CheckpointFull}
	sac.Checkpoint = CheckpointPolicy{Kind: CheckpointSelectiveOp}
	r0, rf, rs := semPlan(t, base), semPlan(t, full), semPlan(t, sac)
	if !(rf.Sim.SavedTotal < rs.Sim.SavedTotal && rs.Sim.SavedTotal < r0.Sim.SavedTotal) {
		t.Errorf("saved: full %v, selective-op %v, none %v", rf.Sim.SavedTotal, rs.Sim.SavedTotal, r0.Sim.SavedTotal)
	}
	var sdpa, linear, linearAll int
	for _, op := range rs.Program.Ops {
		switch {
		case op.Recompute && op.Name == "sdpa_flash":
			sdpa++
		case op.Recompute && op.Name == "linear":
			linear++
		case op.Phase == ir.Forward && op.Name == "linear" && op.Micro == 0:
			linearAll++
		}
	}
	// Seven matmuls per layer, the head outside any block: a block keeps
	// the 1st, 3rd, 5th and 7th and replays at most the other three.
	if sdpa != 0 || linear == 0 || linear > 3*base.Model.Layers {
		t.Errorf("replayed %d SDPA and %d of %d matmuls", sdpa, linear, linearAll)
	}
}

// LoRA can adapt the LM head when a target names it (peft target_modules
// ["lm_head"]; all-linear leaves it out): r·(hidden + vocab) more trainable
// values.
func TestLoRAOnHead(t *testing.T) {
	a := catalog(t, "llama-2-7b")
	s := Spec{Job: Job{Model: a, Seq: 256, Precision: ops.PureBF16, Optimizer: lower.AdamW, LoRA: &build.LoRA{Rank: 8, Targets: []string{"q_proj"}}}}
	h := s
	h.LoRA = &build.LoRA{Rank: 8, Targets: []string{"q_proj", "lm_head"}}
	r0, rh := semPlan(t, s), semPlan(t, h)
	if d, want := rh.Sim.ModelStates.Gradients-r0.Sim.ModelStates.Gradients, units.F32.Size(8*int64(a.Hidden+a.Vocab)); d != want {
		t.Errorf("a LoRA head adds %v of gradients, want %v", d, want)
	}
	all := s
	all.LoRA = &build.LoRA{Rank: 8, Targets: []string{"all-linear"}}
	withHead := s
	withHead.LoRA = &build.LoRA{Rank: 8, Targets: []string{"all-linear", "lm_head"}}
	if semPlan(t, all).Sim.ModelStates.Gradients >= semPlan(t, withHead).Sim.ModelStates.Gradients {
		t.Error("all-linear must leave the head out")
	}
	chunked := h
	chunked.Sem.Loss = build.Loss{Kind: build.LossChunked, ChunkTokens: 128}
	if _, err := Plan(chunked); err == nil {
		t.Error("LoRA on a chunked head is not modelled and must be refused")
	}
}

// optimizer.state-dtype: float32 moments over bfloat16 parameters without a
// master copy hold 2 + 2 + 8 bytes per parameter.
func TestOptimizerStateDType(t *testing.T) {
	s := Spec{Job: Job{Model: catalog(t, "gpt2"), Seq: 128, Precision: ops.PureBF16, Optimizer: lower.AdamW, Impl: lower.Fused}}
	s.Sem.StateDType = units.F32
	r := semPlan(t, s)
	ms := r.Sim.ModelStates
	if got := float64(ms.Parameters+ms.Gradients+ms.OptimizerState) / float64(r.Sim.Params); got != 12 {
		t.Errorf("%.3f bytes/param, want 12", got)
	}
}

// CPU kernels have no cuBLAS handle: the workspace switch adds nothing.
func TestNoWorkspaceOnCPU(t *testing.T) {
	s := Spec{Job: Job{Model: catalog(t, "gpt2"), Seq: 128, Device: ops.CPU}}
	base := semPlan(t, s)
	s.Sem.Workspace = AutoWorkspace
	if r := semPlan(t, s); r.Sim.Peak.Total != base.Sim.Peak.Total {
		t.Errorf("CPU peak %v with a cuBLAS workspace, %v without", r.Sim.Peak.Total, base.Sim.Peak.Total)
	}
}

// transformers (before 4.54, and with a mask after) copies grouped k and v
// to every query head before SDPA (modeling_llama.py @v4.46.0 repeat_kv),
// and SDPA saves the copies: (heads - kv heads) x head_dim more per token,
// for k and for v, in every layer.
func TestRepeatKV(t *testing.T) {
	s := Spec{Job: Job{Model: catalog(t, "llama-3.2-1b"), Seq: 256, MicroBatch: 2, Precision: ops.PureBF16, Optimizer: lower.AdamW}}
	r := s
	r.Sem.RepeatKV = true
	a := s.Model
	want := units.BF16.Size(int64(a.Layers) * 2 * int64((a.Heads-a.KVHeads)*a.HeadDim) * int64(s.MicroBatch*s.Seq))
	if got := semPlan(t, r).Sim.SavedTotal - semPlan(t, s).Sim.SavedTotal; got != want {
		t.Errorf("repeat_kv saves %v more, want %v", got, want)
	}
}

// peft's prepare_model_for_kbit_training casts every parameter that is not
// 4-bit to float32 (peft src/peft/utils/other.py @v0.13.0): the embedding
// and the unquantised head double in size.
func TestPrepareKbitFloat32(t *testing.T) {
	a := catalog(t, "llama-2-7b")
	s := Spec{Job: Job{Model: a, Seq: 128, Precision: ops.PureBF16, Optimizer: lower.AdamW, LoRA: &build.LoRA{Rank: 8, Targets: []string{"q_proj"}}, QLoRA: true}}
	p := s
	p.Sem.Quant.FP32Rest = true
	norms := int64(2*a.Layers+1) * int64(a.Hidden)
	want := units.BF16.Size(2*int64(a.Vocab)*int64(a.Hidden) + norms)
	if d := semPlan(t, p).Sim.ModelStates.Parameters - semPlan(t, s).Sim.ModelStates.Parameters; d != want {
		t.Errorf("float32 non-4-bit parameters add %v, want %v", d, want)
	}
}

// Liger's SwiGLU keeps only gate and up for backward and recomputes silu
// (Liger-Kernel src/liger_kernel/ops/swiglu.py): one intermediate-sized
// tensor less per layer than silu then mul.
func TestFusedSwiGLU(t *testing.T) {
	s := Spec{Job: Job{Model: catalog(t, "llama-3.2-1b"), Seq: 256, MicroBatch: 2, Precision: ops.PureBF16, Optimizer: lower.AdamW}}
	f := s
	f.Sem.FusedSwiGLU = true
	a := s.Model
	want := units.BF16.Size(int64(a.Layers) * int64(a.Intermediate) * int64(s.MicroBatch*s.Seq))
	if got := semPlan(t, s).Sim.SavedTotal - semPlan(t, f).Sim.SavedTotal; got != want {
		t.Errorf("fused SwiGLU saves %v less, want %v", got, want)
	}
}

// litgpt 0.5's RMSNorm (litgpt/model.py @v0.5.13) upcasts: x.float(),
// x * rsqrt(mean(x * x)), times weight.float(), cast back. It keeps the
// float32 input and float32 normalised states (and a float32 rsqrt and copy
// of the weight) where lit-gpt 8641822's keeps them in bfloat16: per norm
// over T tokens of width H, 4·T·H + 2·T + 4·H bytes more. The framework
// suite measures it (python/memplan_torch/frameworks.py, litgpt 0.5.13).
func TestLitGPTFP32WeightRMSNorm(t *testing.T) {
	s := Spec{Job: Job{Model: catalog(t, "llama-3.2-1b"), Seq: 256, MicroBatch: 2, Precision: ops.PureBF16, Optimizer: lower.AdamW}}
	s.Sem.Code = build.CodeLitGPT
	up := s
	up.Sem.EagerRMSNorm, up.Sem.RMSNormFP32Weight = true, true
	a := s.Model
	r0, r1 := semPlan(t, s), semPlan(t, up)
	T, H := int64(s.MicroBatch*s.Seq), int64(a.Hidden)
	norms := int64(2*a.Layers + 1)
	want := units.Bytes(norms * (4*T*H + 2*T + 4*H))
	if got := r1.Sim.SavedTotal - r0.Sim.SavedTotal; got != want {
		t.Errorf("litgpt 0.5's RMSNorm saves %v more, want %v (%d norms)", got, want, norms)
	}
}

// transformers 5.x runs a mixture's experts as two grouped matmuls over
// 3-D parameters (integrations/moe.py grouped_mm_experts_forward @v5.24.0):
// the same parameters as 4.x's per-expert linears (E·3·I·H per layer), and
// the same activations but for the bookkeeping — three int64 indices over
// the S = T·K routed rows (the permutation, perm // top_k, the inverse
// permutation) and int32 offsets per expert, where the loop keeps one int64
// index per expert's rows: 16·S + 4·E bytes more per layer when the rows
// split evenly. peft's all-linear adapts nn.Linear modules only, so the
// experts get no adapters, and neither does 5.x's router (a parameter
// applied with F.linear): 3·E·r·(H + I) + r·(H + E) float32 adapter
// gradients fewer per layer.
func TestGroupedExperts(t *testing.T) {
	a := catalog(t, "mixtral-8x7b").Clone()
	a.Layers = 2
	s := Spec{Job: Job{Model: a, Seq: 256, MicroBatch: 2, Precision: ops.PureBF16, Optimizer: lower.AdamW}}
	g := s
	g.Sem.GroupedExperts = true
	T, K, E := int64(s.MicroBatch*s.Seq), int64(a.ExpertsPerToken), int64(a.NumExperts)
	if T*K%E != 0 {
		t.Fatalf("rows %d do not split evenly among %d experts", T*K, E)
	}
	loop, grouped := semPlan(t, s), semPlan(t, g)
	if loop.Sim.ModelStates.Parameters != grouped.Sim.ModelStates.Parameters || loop.Sim.Params != grouped.Sim.Params {
		t.Errorf("parameters: loop %v (%d), grouped %v (%d), want equal", loop.Sim.ModelStates.Parameters, loop.Sim.Params,
			grouped.Sim.ModelStates.Parameters, grouped.Sim.Params)
	}
	want := units.Bytes(int64(a.Layers) * (16*T*K + 4*E))
	if got := grouped.Sim.SavedTotal - loop.Sim.SavedTotal; got != want {
		t.Errorf("grouped experts save %v more, want %v", got, want)
	}
	r := int64(16)
	s.LoRA = &build.LoRA{Rank: int(r), Alpha: 32, Targets: []string{"all-linear"}}
	g.LoRA = s.LoRA
	loop, grouped = semPlan(t, s), semPlan(t, g)
	H, I := int64(a.Hidden), int64(a.Intermediate)
	want = units.F32.Size(int64(a.Layers) * (3*E*r*(H+I) + r*(H+E)))
	if got := loop.Sim.ModelStates.Gradients - grouped.Sim.ModelStates.Gradients; got != want {
		t.Errorf("LoRA all-linear: grouped experts hold %v fewer gradients, want %v (no adapters on the experts or the router)", got, want)
	}
	ep := g
	ep.EP, ep.DP, ep.Model = 2, 2, a
	if err := ep.Validate(); err == nil || !strings.Contains(err.Error(), "moe.experts=loop") {
		t.Errorf("--ep 2 with grouped experts: %v, want a refusal naming moe.experts=loop", err)
	}
	lit := g
	lit.Sem.Code = build.CodeLitGPT
	if err := lit.Validate(); err == nil || !strings.Contains(err.Error(), "model.code litgpt") {
		t.Errorf("lit-gpt's code with grouped experts: %v, want a refusal naming model.code", err)
	}
}

// Expert parallelism takes its ranks from the data-parallel ones
// (Megatron-LM's initialize_model_parallel refuses a data-parallel size
// it does not divide): a job of one GPU with --ep 8 held 1/8 of
// mixtral's experts, the rest on no GPU, and fitted an H200 (physical
// sweep, round 24).
func TestExpertParallelNeedsDataParallelRanks(t *testing.T) {
	a := catalog(t, "mixtral-8x7b")
	for _, c := range []struct {
		ep, dp int
		ok     bool
	}{{8, 1, false}, {8, 2, false}, {2, 1, false}, {2, 2, true}, {8, 8, true}, {4, 8, true}, {8, 16, true}} {
		s := Spec{Job: Job{Model: a, MicroBatch: 1, Seq: 64, Precision: ops.AMPBF16, Optimizer: lower.AdamW}}
		s.EP, s.DP = c.ep, c.dp
		err := s.Validate()
		if (err == nil) != c.ok || err != nil && !strings.Contains(err.Error(), "splits the experts over data-parallel ranks") {
			t.Errorf("ep %d, dp %d: %v, want ok %v", c.ep, c.dp, err, c.ok)
		}
	}
}

// A pipeline's MFU is the model's FLOPs over its pp GPUs' peak for the step
// (PaLM), not the slowest stage's over one GPU: the model FLOPs per step it
// implies (MFU × step × pp × peak) are the same job's without pipelining,
// with or without the short accumulation's extrapolated timing. The last
// stage holds the head: llama-3.2-1b under --pp 4 said 0.2297 where 0.1411
// is right (physical sweep, round 24).
func TestPipelineMFUIsTheModels(t *testing.T) {
	g, err := hw.Lookup("h100")
	if err != nil {
		t.Fatal(err)
	}
	for _, accum := range []int{4, 8} {
		s := Spec{Job: Job{Model: catalog(t, "llama-3.2-1b"), MicroBatch: 2, Seq: 512, Accum: accum, Precision: ops.AMPBF16, Optimizer: lower.AdamW}, Target: Target{GPU: g}}
		flat, err := PlanWith(s, Options{NoTimeline: true})
		if err != nil {
			t.Fatal(err)
		}
		s.PP = 4
		pp, err := PlanWith(s, Options{NoTimeline: true})
		if err != nil {
			t.Fatal(err)
		}
		implied := func(r *Result, gpus int) float64 {
			return r.Timing.MFU * r.Timing.Step.Seconds() * float64(gpus) * r.Timing.PeakFLOPs
		}
		if a, b := implied(pp, 4), implied(flat, 1); math.Abs(a/b-1) > 1e-6 {
			t.Errorf("accum %d: pp 4's MFU %.4f implies %.6g model FLOPs a step, the job's are %.6g", accum, pp.Timing.MFU, a, b)
		}
	}
}
