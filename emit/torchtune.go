package emit

import (
	"fmt"
	"strings"

	"github.com/memplan/memplan/engine"
	"github.com/memplan/memplan/lower"
	"github.com/memplan/memplan/ops"
)

// torchtune's recipe configs (pytorch/torchtune @v0.4.0, the version of
// recipe/recipes/torchtune.yaml): one GPU runs full_finetune_single_device,
// several full_finetune_distributed, which shards every model with FSDP2
// (recipes/full_finetune_distributed.py, class docstring: "DDP is
// currently not supported"). Keys read by both (cfg.batch_size,
// cfg.gradient_accumulation_steps, cfg.dtype, optimizer_in_bwd,
// enable_activation_checkpointing, enable_activation_offloading), and by
// the distributed one:
//   - fsdp_reshard_after_forward: True is FULL_SHARD (ZeRO-3), False
//     SHARD_GRAD_OP (ZeRO-2) (the same docstring);
//   - fsdp_cpu_offload: FSDP2's CPUOffloadPolicy, parameters, gradients and
//     optimizer state on the host (torchtune/training/_distributed.py
//     shard_model): memplan's --offload params (which moves the optimizer
//     step too, as FSDP's CPUOffload does);
//   - ac_mode: selective with ac_option K checkpoints every K-th layer
//     (torchtune/training/activations.py checkpoint_wrapper: "2 ==
//     checkpoint every 2nd one"), used when enable_activation_checkpointing
//     is False.
// dtype is bf16 or fp32 ("Mixed precision training and fp16 precision are
// currently not supported"); enable_activation_offloading needs
// enable_activation_checkpointing (its RuntimeError); optimizer_in_bwd
// refuses gradient accumulation.

func torchtune(s *engine.Spec) (string, error) {
	const name = "torchtune"
	dp := max(s.DP, 1)
	switch {
	case s.TP > 1 || s.SP:
		return "", refuse(name, engine.FieldTP, "torchtune 0.4's recipes have no tensor parallelism")
	case s.PP > 1:
		return "", refuse(name, engine.FieldPP, "torchtune's recipes have no pipeline parallelism")
	case dp > 1 && s.ZeRO < 2:
		return "", refuse(name, engine.FieldZeRO, "full_finetune_distributed shards with FSDP2 (ZeRO-2 or ZeRO-3; DDP is not supported), not ZeRO %d", s.ZeRO)
	case (s.Offload.Params || s.Offload.Optimizer) && !(s.Offload.Params && dp > 1 && s.ZeRO == 3):
		return "", refuse(name, engine.FieldOffload, "fsdp_cpu_offload moves parameters, gradients and optimizer state together (--zero 3 --offload params over several GPUs), not %s", s.Offload)
	case s.Offload.Activations && s.Checkpoint.Kind != engine.CheckpointFull:
		return "", refuse(name, engine.FieldOffload, "enable_activation_offloading needs enable_activation_checkpointing (--checkpoint full)")
	case s.Sem.OptimizerInBackward && s.Accum > 1:
		return "", refuse(name, engine.FieldAccum, "optimizer_in_bwd refuses gradient accumulation")
	}
	dtype := map[ops.Precision]string{ops.PureBF16: "bf16", ops.FP32: "fp32"}[s.Precision]
	if dtype == "" {
		return "", refuse(name, engine.FieldPrecision, "dtype is bf16 (all state in bfloat16, --precision pure-bf16) or fp32; mixed precision and fp16 are not supported")
	}
	if s.Optimizer != lower.AdamW {
		return "", refuse(name, engine.FieldEmit, "the configs written here use torch.optim.AdamW, not %s", s.Optimizer)
	}
	var b strings.Builder
	recipe := "full_finetune_single_device"
	if dp > 1 {
		recipe = "full_finetune_distributed"
	}
	fmt.Fprintf(&b, "# tune run --nproc_per_node %d %s --config THIS (model, tokenizer, checkpointer and dataset from the model's own config)\n", dp, recipe)
	fmt.Fprintf(&b, "batch_size: %d\ngradient_accumulation_steps: %d\ndtype: %s\n", s.MicroBatch, s.Accum, dtype)
	b.WriteString("optimizer:\n  _component_: torch.optim.AdamW\n")
	switch s.Impl {
	case lower.Fused:
		b.WriteString("  fused: True\n")
	case lower.Single:
		b.WriteString("  foreach: False\n")
	}
	fmt.Fprintf(&b, "optimizer_in_bwd: %s\n", pyBool(s.Sem.OptimizerInBackward))
	switch k := s.Checkpoint.Kind; k {
	case engine.NoCheckpoint:
		b.WriteString("enable_activation_checkpointing: False\n")
	case engine.CheckpointFull:
		b.WriteString("enable_activation_checkpointing: True\n")
	case engine.CheckpointEvery:
		fmt.Fprintf(&b, "enable_activation_checkpointing: False\nac_mode: selective\nac_option: %d\n", s.Checkpoint.Every)
	default:
		return "", refuse(name, engine.FieldCheckpoint, "torchtune checkpoints every layer or every K-th layer, not %s", s.Checkpoint)
	}
	fmt.Fprintf(&b, "enable_activation_offloading: %s\n", pyBool(s.Offload.Activations))
	if dp > 1 {
		fmt.Fprintf(&b, "fsdp_reshard_after_forward: %s\nfsdp_cpu_offload: %s\n", pyBool(s.ZeRO == 3), pyBool(s.Offload.Params))
	}
	return b.String(), nil
}

func pyBool(v bool) string {
	if v {
		return "True"
	}
	return "False"
}
