package emit

import (
	"encoding/json"

	"github.com/memplan/memplan/engine"
	"github.com/memplan/memplan/lower"
	"github.com/memplan/memplan/ops"
	"github.com/memplan/memplan/strategy"
)

// DeepSpeed's JSON config (microsoft/DeepSpeed @v0.15.0, the version of
// recipe/recipes/deepspeed.yaml):
//   - train_micro_batch_size_per_gpu, gradient_accumulation_steps,
//     train_batch_size (= micro × accumulation × data-parallel ranks, which
//     DeepSpeed checks): deepspeed/runtime/constants.py and
//     deepspeed/runtime/config.py _batch_assertion.
//   - bf16.enabled / fp16.enabled: 16-bit parameters with float32 master
//     weights in the optimizer (deepspeed/runtime/bf16_optimizer.py,
//     fp16/fused_optimizer.py): memplan's --precision bf16 / fp16.
//   - optimizer.type AdamW / Adam: DeepSpeed's FusedAdam
//     (deepspeed/ops/adam/fused_adam.py, adam_w_mode), memplan's fused
//     implementation; DeepSpeedCPUAdam when the optimizer is offloaded.
//   - zero_optimization.stage, reduce_bucket_size (stage 2's buckets,
//     5e8 elements by default), offload_optimizer.{device, pin_memory},
//     offload_param.{device, pin_memory} (stage 3 only; memplan's
//     --offload params also moves the optimizer step, so it writes both):
//     deepspeed/runtime/zero/config.py DeepSpeedZeroConfig and
//     zero/offload_config.py.
//   - activation_checkpointing: configures deepspeed.checkpointing.checkpoint,
//     which the model's code calls per block (Megatron-DeepSpeed's models do;
//     a transformers model under the Trainer checkpoints with
//     gradient_checkpointing instead): deepspeed/runtime/activation_checkpointing/config.py.
//     memplan's full checkpointing keeps each block's input.
//
// Tensor, sequence and pipeline parallelism are the model's code in
// DeepSpeed (PipelineModule; Megatron's mpu), not fields of this file.

type dsConfig struct {
	TrainBatchSize            int              `json:"train_batch_size"`
	MicroBatchPerGPU          int              `json:"train_micro_batch_size_per_gpu"`
	GradientAccumulationSteps int              `json:"gradient_accumulation_steps"`
	BF16                      *dsEnabled       `json:"bf16,omitempty"`
	FP16                      *dsEnabled       `json:"fp16,omitempty"`
	Optimizer                 dsOptimizer      `json:"optimizer"`
	ZeRO                      dsZeRO           `json:"zero_optimization"`
	ActivationCheckpointing   *dsCheckpointing `json:"activation_checkpointing,omitempty"`
}

type dsEnabled struct {
	Enabled bool `json:"enabled"`
}

type dsOptimizer struct {
	Type string `json:"type"`
}

type dsZeRO struct {
	Stage            int        `json:"stage"`
	ReduceBucketSize int64      `json:"reduce_bucket_size,omitempty"`
	OffloadOptimizer *dsOffload `json:"offload_optimizer,omitempty"`
	OffloadParam     *dsOffload `json:"offload_param,omitempty"`
}

type dsOffload struct {
	Device    string `json:"device"`
	PinMemory bool   `json:"pin_memory"`
}

type dsCheckpointing struct {
	PartitionActivations bool `json:"partition_activations"`
	CPUCheckpointing     bool `json:"cpu_checkpointing"`
}

var dsOptimizers = map[lower.Optimizer]string{lower.AdamW: "AdamW", lower.Adam: "Adam"}

func deepSpeed(s *engine.Spec) (string, error) {
	const name = "deepspeed"
	switch {
	case s.TP > 1 || s.SP:
		return "", refuse(name, engine.FieldTP, "tensor and sequence parallelism are the model's code in DeepSpeed, not its config")
	case s.PP > 1:
		return "", refuse(name, engine.FieldPP, "pipeline parallelism is DeepSpeed's PipelineModule in the model's code, not its config")
	case s.Offload.Activations:
		return "", refuse(name, engine.FieldOffload, "DeepSpeed's cpu_checkpointing moves only checkpointed block inputs, not every saved activation (save_on_cpu)")
	case s.Offload.Optimizer && s.ZeRO == 0:
		return "", refuse(name, engine.FieldOffload, "ZeRO-Offload needs a ZeRO stage of 1 or more")
	case s.Checkpoint.Kind != engine.NoCheckpoint && s.Checkpoint.Kind != engine.CheckpointFull:
		return "", refuse(name, engine.FieldCheckpoint, "deepspeed.checkpointing checkpoints the blocks the model calls it on; only every block (full) is a config")
	}
	c := dsConfig{MicroBatchPerGPU: s.MicroBatch, GradientAccumulationSteps: s.Accum, TrainBatchSize: s.MicroBatch * s.Accum * max(s.DP, 1)}
	switch s.Precision {
	case ops.BF16:
		c.BF16 = &dsEnabled{true}
	case ops.FP16:
		c.FP16 = &dsEnabled{true}
	case ops.FP32:
	default:
		return "", refuse(name, engine.FieldPrecision, "DeepSpeed's bf16 and fp16 keep 16-bit parameters with float32 master weights (--precision bf16, fp16) or run in fp32; %s is not one of them", s.Precision)
	}
	t, ok := dsOptimizers[s.Optimizer]
	if !ok || s.Impl != lower.Fused {
		return "", refuse(name, engine.FieldEmit, "DeepSpeed's Adam and AdamW are its fused kernels (fused adam or adamw here, not %s %s)", s.Impl, s.Optimizer)
	}
	c.Optimizer.Type = t
	c.ZeRO.Stage = s.ZeRO
	if s.ZeRO == 2 {
		c.ZeRO.ReduceBucketSize = s.ZeROBucketElems
		if c.ZeRO.ReduceBucketSize == 0 {
			c.ZeRO.ReduceBucketSize = strategy.DefaultReduceBucketElems
		}
	}
	// memplan's parameter offload moves the optimizer step to the host
	// with the parameters (engine: "offload params already offloads the
	// optimizer"): both sections.
	if s.Offload.Optimizer || s.Offload.Params {
		c.ZeRO.OffloadOptimizer = &dsOffload{"cpu", true}
	}
	if s.Offload.Params {
		c.ZeRO.OffloadParam = &dsOffload{"cpu", true}
	}
	if s.Checkpoint.Kind == engine.CheckpointFull {
		c.ActivationCheckpointing = &dsCheckpointing{}
	}
	b, err := json.MarshalIndent(c, "", "  ")
	return string(b) + "\n", err
}
