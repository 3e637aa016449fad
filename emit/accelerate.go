package emit

import (
	"fmt"
	"strings"

	"github.com/memplan/memplan/engine"
	"github.com/memplan/memplan/ops"
)

// accelerate's config file (what `accelerate config` writes and
// `accelerate launch --config_file` reads; huggingface/accelerate
// src/accelerate/commands/config/config_args.py ClusterConfig @v1.0.0):
//   - distributed_type NO / MULTI_GPU (DDP) / FSDP / DEEPSPEED, num_processes
//     (every rank), num_machines, mixed_precision no / bf16 / fp16.
//   - fsdp_config (examples/config_yaml_templates/fsdp.yaml @1a6af0bd):
//     fsdp_sharding_strategy FULL_SHARD (ZeRO-3) or SHARD_GRAD_OP (ZeRO-2),
//     fsdp_offload_params (FSDP's CPUOffload(offload_params=True): parameters
//     and gradients on the host and the optimizer step there, memplan's
//     --offload params,optimizer), fsdp_activation_checkpointing (every
//     transformer block).
//   - deepspeed_config (src/accelerate/utils/dataclasses.py DeepSpeedPlugin:
//     zero_stage, offload_optimizer_device, offload_param_device,
//     gradient_accumulation_steps, zero3_init_flag).
//
// The plan's recipe picks the engine: hf runs accelerate's own loop (DDP or
// FSDP, mixed_precision = torch.autocast over float32 parameters,
// memplan's amp-bf16/amp-fp16); deepspeed its DeepSpeed plugin (bf16 = 16-bit
// parameters with float32 master weights, memplan's bf16). The micro-batch,
// and outside DeepSpeed the accumulation and checkpointing, are the training
// script's (DataLoader batch_size, Accelerator(gradient_accumulation_steps=),
// gradient_checkpointing_enable()): a comment names them.

// mixed_precision's values; 'no' is quoted (a bare no is YAML 1.1's false).
var accMixed = map[ops.Precision]string{ops.AMPBF16: "bf16", ops.AMPFP16: "fp16", ops.FP32: "'no'"}
var accDSMixed = map[ops.Precision]string{ops.BF16: "bf16", ops.FP16: "fp16", ops.FP32: "'no'"}

func accelerate(s *engine.Spec) (string, error) {
	const name = "accelerate"
	dp := max(s.DP, 1)
	switch {
	case s.TP > 1 || s.SP:
		return "", refuse(name, engine.FieldTP, "accelerate's config has no tensor or sequence parallel degree for this loop")
	case s.PP > 1:
		return "", refuse(name, engine.FieldPP, "accelerate's config has no pipeline stages")
	case s.Offload.Activations:
		return "", refuse(name, engine.FieldOffload, "activation offload (save_on_cpu) is the training script's, not accelerate's config")
	}
	var b strings.Builder
	fmt.Fprintf(&b, "# accelerate launch --config_file THIS train.py: micro-batch %d per GPU (the DataLoader's batch_size) × %d accumulation steps", s.MicroBatch, s.Accum)
	if s.Sem.Recipe == "deepspeed" {
		b.WriteString("\n")
		return accelerateDS(&b, s, dp)
	}
	fmt.Fprintf(&b, " (Accelerator(gradient_accumulation_steps=%d)) in the training script\n", s.Accum)
	mixed, ok := accMixed[s.Precision]
	if !ok {
		return "", refuse(name, engine.FieldPrecision, "accelerate's mixed_precision is torch.autocast over float32 parameters (amp-bf16, amp-fp16 or fp32), not %s", s.Precision)
	}
	b.WriteString("compute_environment: LOCAL_MACHINE\n")
	switch {
	case s.ZeRO == 0 && s.Checkpoint.Kind != engine.NoCheckpoint:
		return "", refuse(name, engine.FieldCheckpoint, "outside FSDP, checkpointing is the script's gradient_checkpointing_enable(), not accelerate's config")
	case s.ZeRO == 0 && s.Offload.Any():
		return "", refuse(name, engine.FieldOffload, "offload needs FSDP (--zero 3) or the DeepSpeed plugin (--recipe deepspeed)")
	case s.ZeRO == 0 && dp == 1:
		// Quoted as accelerate's yaml.safe_dump writes it: a bare NO is
		// YAML 1.1's false.
		b.WriteString("distributed_type: 'NO'\n")
	case s.ZeRO == 0:
		b.WriteString("distributed_type: MULTI_GPU\n")
	case s.ZeRO == 1:
		return "", refuse(name, engine.FieldZeRO, "FSDP shards gradients with the optimizer state (SHARD_GRAD_OP is ZeRO-2); ZeRO-1 is the DeepSpeed plugin's (--recipe deepspeed)")
	default:
		if err := accelerateFSDP(&b, s); err != nil {
			return "", err
		}
	}
	fmt.Fprintf(&b, "mixed_precision: %s\nnum_machines: %d\nnum_processes: %d\n", mixed, machines(s), dp)
	return b.String(), nil
}

// accelerateFSDP writes distributed_type FSDP and its fsdp_config.
func accelerateFSDP(b *strings.Builder, s *engine.Spec) error {
	const name = "accelerate"
	strategy := map[int]string{2: "SHARD_GRAD_OP", 3: "FULL_SHARD"}[s.ZeRO]
	if s.Offload.Any() && !s.Offload.Params {
		return refuse(name, engine.FieldOffload, "FSDP's fsdp_offload_params moves parameters, gradients and the optimizer step to the host together (--offload params), not %s alone", s.Offload)
	}
	if k := s.Checkpoint.Kind; k != engine.NoCheckpoint && k != engine.CheckpointFull {
		return refuse(name, engine.FieldCheckpoint, "fsdp_activation_checkpointing checkpoints every transformer block (full), not %s", s.Checkpoint)
	}
	fmt.Fprintf(b, "distributed_type: FSDP\nfsdp_config:\n  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n")
	fmt.Fprintf(b, "  fsdp_sharding_strategy: %s\n  fsdp_offload_params: %t\n  fsdp_activation_checkpointing: %t\n  fsdp_use_orig_params: true\n",
		strategy, s.Offload.Params, s.Checkpoint.Kind == engine.CheckpointFull)
	return nil
}

// accelerateDS writes the DeepSpeed plugin: the checks of DeepSpeed's own
// config, in accelerate's keys.
func accelerateDS(b *strings.Builder, s *engine.Spec, dp int) (string, error) {
	const name = "accelerate"
	mixed, ok := accDSMixed[s.Precision]
	if !ok {
		return "", refuse(name, engine.FieldPrecision, "the DeepSpeed plugin's bf16/fp16 keep 16-bit parameters with float32 master weights (--precision bf16, fp16) or run in fp32, not %s", s.Precision)
	}
	if _, err := deepSpeed(s); err != nil {
		return "", err
	}
	if s.Checkpoint.Kind != engine.NoCheckpoint {
		return "", refuse(name, engine.FieldCheckpoint, "the DeepSpeed plugin's keys have no activation checkpointing (the script's gradient_checkpointing_enable())")
	}
	device := func(on bool) string {
		if on {
			return "cpu"
		}
		return "none"
	}
	b.WriteString("compute_environment: LOCAL_MACHINE\ndistributed_type: DEEPSPEED\ndeepspeed_config:\n")
	fmt.Fprintf(b, "  gradient_accumulation_steps: %d\n  zero_stage: %d\n  offload_optimizer_device: %s\n  offload_param_device: %s\n  zero3_init_flag: %t\n",
		s.Accum, s.ZeRO, device(s.Offload.Optimizer || s.Offload.Params), device(s.Offload.Params), s.ZeRO == 3)
	fmt.Fprintf(b, "mixed_precision: %s\nnum_machines: %d\nnum_processes: %d\n", mixed, machines(s), dp)
	return b.String(), nil
}

// machines is the nodes dp ranks take at the spec's GPUs per node.
func machines(s *engine.Spec) int {
	n := s.GPUsOnNode()
	return (max(s.DP, 1) + n - 1) / n
}
