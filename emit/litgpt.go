package emit

import (
	"fmt"
	"strings"

	"github.com/memplan/memplan/engine"
	"github.com/memplan/memplan/lower"
	"github.com/memplan/memplan/ops"
)

// litgpt's finetune_full config (Lightning-AI/litgpt @v0.5.13,
// litgpt/finetune/full.py setup and litgpt/args.py TrainArgs; the keys of
// config_hub/finetune/*/full.yaml): precision, devices, num_nodes,
// train.micro_batch_size, train.global_batch_size (gradient accumulation
// is global_batch_size // (devices × num_nodes) // micro_batch_size,
// TrainArgs.gradient_accumulation_iters), optimizer (class_path and
// init_args, litgpt/utils.py instantiate_torch_optimizer). The strategy is
// not a key: one GPU runs "auto" (no sharding, no checkpointing); several
// run FSDPStrategy(auto_wrap_policy={Block},
// activation_checkpointing_policy={Block}, cpu_offload=False), FULL_SHARD
// with every Block checkpointed (full.py setup).

var litPrecision = map[ops.Precision]string{ops.PureBF16: "bf16-true", ops.AMPBF16: "bf16-mixed", ops.FP32: "32-true", ops.AMPFP16: "16-mixed", ops.PureFP16: "16-true"}

func litGPT(s *engine.Spec) (string, error) {
	const name = "litgpt"
	dp := max(s.DP, 1)
	switch {
	case s.TP > 1 || s.SP:
		return "", refuse(name, engine.FieldTP, "litgpt's finetune scripts have no tensor parallelism")
	case s.PP > 1:
		return "", refuse(name, engine.FieldPP, "litgpt's finetune scripts have no pipeline parallelism")
	case s.Offload.Any():
		return "", refuse(name, engine.FieldOffload, "finetune_full runs FSDP with cpu_offload=False and no activation offload")
	case dp == 1 && s.Checkpoint.Kind != engine.NoCheckpoint:
		return "", refuse(name, engine.FieldCheckpoint, "on one GPU finetune_full runs without checkpointing")
	case dp > 1 && s.ZeRO != 3:
		return "", refuse(name, engine.FieldZeRO, "on several GPUs finetune_full shards with FSDP FULL_SHARD (--zero 3), not ZeRO %d", s.ZeRO)
	case dp > 1 && s.Checkpoint.Kind != engine.CheckpointFull:
		return "", refuse(name, engine.FieldCheckpoint, "on several GPUs finetune_full checkpoints every Block (--checkpoint full), not %s", s.Checkpoint)
	}
	prec, ok := litPrecision[s.Precision]
	if !ok {
		return "", refuse(name, engine.FieldPrecision, "Lightning's precisions are bf16-true, bf16-mixed, 16-true, 16-mixed and 32-true, not %s", s.Precision)
	}
	if s.Optimizer != lower.AdamW {
		return "", refuse(name, engine.FieldEmit, "the configs written here use torch.optim.AdamW, not %s", s.Optimizer)
	}
	devices := min(dp, s.GPUsOnNode())
	if dp%devices != 0 {
		return "", refuse(name, engine.FieldDP, "{dp} %d does not split into nodes of %d GPUs", dp, devices)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "# litgpt finetune_full CHECKPOINT_DIR --config THIS\nprecision: %s\ndevices: %d\nnum_nodes: %d\n", prec, devices, dp/devices)
	fmt.Fprintf(&b, "train:\n  micro_batch_size: %d\n  global_batch_size: %d\n", s.MicroBatch, s.MicroBatch*s.Accum*dp)
	b.WriteString("optimizer:\n  class_path: torch.optim.AdamW\n")
	switch s.Impl {
	case lower.Fused:
		b.WriteString("  init_args:\n    fused: true\n")
	case lower.Single:
		b.WriteString("  init_args:\n    foreach: false\n")
	}
	return b.String(), nil
}
