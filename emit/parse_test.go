package emit

import (
	"encoding/json"
	"fmt"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/memplan/memplan/engine"
	"github.com/memplan/memplan/lower"
	"github.com/memplan/memplan/ops"
)

// parse reads an emitted config back into the dimensions it states, as
// the framework reads them (the keys and meanings cited in each writer).
func parse(framework, text string) (Plan, error) {
	var m map[string]any
	if framework == "deepspeed" {
		if err := json.Unmarshal([]byte(text), &m); err != nil {
			return Plan{}, err
		}
	} else if err := yaml.Unmarshal([]byte(text), &m); err != nil {
		return Plan{}, err
	}
	p := Plan{TP: 1, PP: 1, Known: map[string]bool{}}
	known := func(names ...string) {
		for _, n := range names {
			p.Known[n] = true
		}
	}
	switch framework {
	case "deepspeed":
		return parseDeepSpeed(m, p, known)
	case "accelerate":
		return parseAccelerate(m, p, known)
	case "torchtune":
		// The ranks are the launcher's: tune run --nproc_per_node N.
		if _, err := fmt.Sscanf(strings.TrimPrefix(text, "# tune run --nproc_per_node "), "%d", &p.DP); err != nil {
			return p, fmt.Errorf("no --nproc_per_node: %v", err)
		}
		known("dp")
		return parseTorchtune(m, p, known)
	case "litgpt":
		return parseLitGPT(m, p, known)
	}
	return p, fmt.Errorf("no parser for %s", framework)
}

func num(v any) int {
	f, _ := v.(float64)
	return int(f)
}

func sub(m map[string]any, k string) map[string]any {
	v, _ := m[k].(map[string]any)
	return v
}

func enabled(m map[string]any, k string) bool {
	e, _ := sub(m, k)["enabled"].(bool)
	return e
}

func parseDeepSpeed(m map[string]any, p Plan, known func(...string)) (Plan, error) {
	known("micro-batch", "accum", "dp", "zero", "checkpoint", "offload", "precision", "optimizer", "impl")
	p.MicroBatch, p.Accum = num(m["train_micro_batch_size_per_gpu"]), num(m["gradient_accumulation_steps"])
	p.DP = num(m["train_batch_size"]) / (p.MicroBatch * p.Accum)
	p.Precision = ops.FP32
	switch {
	case enabled(m, "bf16"):
		p.Precision = ops.BF16
	case enabled(m, "fp16"):
		p.Precision = ops.FP16
	}
	switch sub(m, "optimizer")["type"] {
	case "AdamW":
		p.Optimizer = lower.AdamW
	case "Adam":
		p.Optimizer = lower.Adam
	}
	p.Impl = lower.Fused
	z := sub(m, "zero_optimization")
	p.ZeRO = num(z["stage"])
	p.Offload.Params = sub(z, "offload_param")["device"] == "cpu"
	// memplan's parameter offload is both sections.
	p.Offload.Optimizer = !p.Offload.Params && sub(z, "offload_optimizer")["device"] == "cpu"
	if _, ok := m["activation_checkpointing"]; ok {
		p.Checkpoint = engine.CheckpointPolicy{Kind: engine.CheckpointFull}
	}
	return p, nil
}

func parseAccelerate(m map[string]any, p Plan, known func(...string)) (Plan, error) {
	known("dp", "zero", "offload", "precision")
	p.DP = num(m["num_processes"])
	mixed := map[string]ops.Precision{"bf16": ops.AMPBF16, "fp16": ops.AMPFP16, "no": ops.FP32}
	switch m["distributed_type"] {
	case "NO", "MULTI_GPU":
		known("checkpoint")
	case "FSDP":
		known("checkpoint")
		f := sub(m, "fsdp_config")
		p.ZeRO = map[any]int{"FULL_SHARD": 3, "SHARD_GRAD_OP": 2}[f["fsdp_sharding_strategy"]]
		if on, _ := f["fsdp_offload_params"].(bool); on {
			p.Offload = engine.Offload{Params: true}
		}
		if on, _ := f["fsdp_activation_checkpointing"].(bool); on {
			p.Checkpoint = engine.CheckpointPolicy{Kind: engine.CheckpointFull}
		}
	case "DEEPSPEED":
		known("accum")
		mixed = map[string]ops.Precision{"bf16": ops.BF16, "fp16": ops.FP16, "no": ops.FP32}
		d := sub(m, "deepspeed_config")
		p.Accum, p.ZeRO = num(d["gradient_accumulation_steps"]), num(d["zero_stage"])
		p.Offload.Params = d["offload_param_device"] == "cpu"
		p.Offload.Optimizer = !p.Offload.Params && d["offload_optimizer_device"] == "cpu"
	default:
		return p, fmt.Errorf("distributed_type %v", m["distributed_type"])
	}
	s, _ := m["mixed_precision"].(string)
	p.Precision = mixed[s]
	return p, nil
}

func parseTorchtune(m map[string]any, p Plan, known func(...string)) (Plan, error) {
	known("micro-batch", "accum", "checkpoint", "offload", "precision", "optimizer", "impl", "in-backward")
	p.MicroBatch, p.Accum = num(m["batch_size"]), num(m["gradient_accumulation_steps"])
	p.Precision = map[any]ops.Precision{"bf16": ops.PureBF16, "fp32": ops.FP32}[m["dtype"]]
	o := sub(m, "optimizer")
	if o["_component_"] == "torch.optim.AdamW" {
		p.Optimizer = lower.AdamW
	}
	p.Impl = lower.Foreach
	if f, _ := o["fused"].(bool); f {
		p.Impl = lower.Fused
	}
	if f, ok := o["foreach"].(bool); ok && !f {
		p.Impl = lower.Single
	}
	p.InBackward, _ = m["optimizer_in_bwd"].(bool)
	if on, _ := m["enable_activation_checkpointing"].(bool); on {
		p.Checkpoint = engine.CheckpointPolicy{Kind: engine.CheckpointFull}
	} else if m["ac_mode"] == "selective" {
		p.Checkpoint = engine.CheckpointPolicy{Kind: engine.CheckpointEvery, Every: num(m["ac_option"])}
	}
	p.Offload.Activations, _ = m["enable_activation_offloading"].(bool)
	if r, ok := m["fsdp_reshard_after_forward"].(bool); ok {
		// The distributed recipe; its ranks are the launcher's.
		p.ZeRO = 2
		if r {
			p.ZeRO = 3
		}
		if off, _ := m["fsdp_cpu_offload"].(bool); off {
			p.Offload.Params = true
		}
	}
	known("zero")
	return p, nil
}

func parseLitGPT(m map[string]any, p Plan, known func(...string)) (Plan, error) {
	known("micro-batch", "accum", "dp", "zero", "checkpoint", "offload", "precision", "optimizer", "impl")
	p.DP = num(m["devices"]) * num(m["num_nodes"])
	t := sub(m, "train")
	p.MicroBatch = num(t["micro_batch_size"])
	p.Accum = num(t["global_batch_size"]) / p.DP / p.MicroBatch
	for prec, name := range litPrecision {
		if m["precision"] == name {
			p.Precision = prec
		}
	}
	o := sub(m, "optimizer")
	if o["class_path"] == "torch.optim.AdamW" {
		p.Optimizer = lower.AdamW
	}
	p.Impl = lower.Foreach
	ia := sub(o, "init_args")
	if f, _ := ia["fused"].(bool); f {
		p.Impl = lower.Fused
	}
	if f, ok := ia["foreach"].(bool); ok && !f {
		p.Impl = lower.Single
	}
	if p.DP > 1 {
		// FSDPStrategy(activation_checkpointing_policy={Block}), FULL_SHARD.
		p.ZeRO, p.Checkpoint = 3, engine.CheckpointPolicy{Kind: engine.CheckpointFull}
	}
	return p, nil
}
