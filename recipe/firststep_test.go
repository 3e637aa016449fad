package recipe

import (
	"testing"

	"pgregory.net/rapid"

	"github.com/memplan/memplan/engine"
	"github.com/memplan/memplan/lower"
	"github.com/memplan/memplan/models/build"
	"github.com/memplan/memplan/ops"
)

// A first step runs the steady step's ops with no more storages live: the
// outputs and gradients a steady step carries in from the last one, its
// workspaces and its optimizer state are created during the first
// (lower.Train: optimizer.init_state), activation offload moves the same
// activations to the host and back in both, and offloaded or paged
// optimizer state is created on the host during the first where the
// steady one holds it throughout, so it never peaks higher, on the device
// in any phase or on the host, on the peak's stage. That is what lets a
// plan read for its numbers alone leave the first step out
// (engine.Options.NumbersOnly, PeakOnly). Every recipe, on models of one to
// six layers, with the precisions, optimizers and implementations,
// checkpointing, activation, optimizer and parameter offload, a paged
// optimizer, ZeRO, pipelines, tensor parallelism and adapters. (Drawn with
// the optimizer offloaded, it found the deepspeed and megatron recipes'
// LoRA pipelines losing their first stages' optimizer step: b9b843c.)
func TestPropertyFirstStepNoHigher(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		name, s := drawJob(t, rt, []string{"gpt2", "llama-3.2-1b", "mixtral-8x7b", "deepseek-v2-lite", "gemma-3-1b", "phi-2", "bert-base", "falcon-7b"},
			[]string{"h100", "a100-40gb", "rtx-4090"}, func(rt *rapid.T) int { return rapid.IntRange(1, 6).Draw(rt, "layers") }, 10)
		var err error
		if rapid.Bool().Draw(rt, "override the recipe") {
			s.Precision = rapid.SampledFrom([]ops.Precision{ops.AMPBF16, ops.BF16, ops.FP32, ops.PureBF16, ops.AMPFP16}).Draw(rt, "precision")
			s.Optimizer = lower.Optimizer(rapid.IntRange(int(lower.SGD), int(lower.AdamW4bitAO)).Draw(rt, "optimizer"))
			s.Impl = rapid.SampledFrom([]lower.Impl{lower.Foreach, lower.Single, lower.Fused}).Draw(rt, "impl")
		}
		s.Accum = rapid.IntRange(1, 6).Draw(rt, "accum")
		if s.Checkpoint, err = engine.ParseCheckpoint(rapid.SampledFrom([]string{"none", "full", "every=2", "selective-op", "modules=*mlp*"}).Draw(rt, "checkpoint")); err != nil {
			t.Fatal(err)
		}
		s.Offload = engine.Offload{Activations: rapid.Bool().Draw(rt, "offload activations"), Optimizer: rapid.Bool().Draw(rt, "offload optimizer")}
		s.Sem.PagedOptimizer = rapid.Bool().Draw(rt, "paged optimizer")
		if rapid.Bool().Draw(rt, "dp") {
			s.DP, s.ZeRO = 4, rapid.IntRange(0, 3).Draw(rt, "zero")
			s.Offload.Params = s.ZeRO == 3 && rapid.Bool().Draw(rt, "offload parameters") // shards only
		}
		if rapid.Bool().Draw(rt, "pp") {
			s.PP = rapid.IntRange(2, 3).Draw(rt, "stages")
			s.Model.Layers = s.PP * rapid.IntRange(1, 2).Draw(rt, "layers per stage")
		}
		if rapid.Bool().Draw(rt, "tp") {
			s.TP, s.SP = 2, rapid.Bool().Draw(rt, "sp")
		}
		if rapid.Bool().Draw(rt, "lora") {
			if s.LoRA, err = build.ParseLoRA(rapid.SampledFrom([]string{"r=8", "r=16,targets=all-linear"}).Draw(rt, "adapters")); err != nil {
				t.Fatal(err)
			}
			s.QLoRA = rapid.Bool().Draw(rt, "qlora")
		}
		s.FirstStep = true
		res, err := engine.PlanWith(s, engine.Options{NoTiming: true, NoTimeline: true})
		if err != nil {
			rt.Skip(err)
		}
		f, st := res.First, res.Sim
		if f.Peak.Total > st.Peak.Total || f.HostPeak > st.HostPeak {
			t.Fatalf("%s %s: first step %d (host %d) over its stage's steady %d (host %d)", name, s.JobName(), f.Peak.Total, f.HostPeak, st.Peak.Total, res.HostPeak)
		}
		for ph, pt := range f.PhasePeak {
			if sp := st.PhasePeak[ph]; pt.Op >= 0 && (sp.Op < 0 || pt.Total > sp.Total) {
				t.Fatalf("%s %s: the first step's phase %d peaks at %d, the steady step's at %d", name, s.JobName(), ph, pt.Total, sp.Total)
			}
		}
	})
}
