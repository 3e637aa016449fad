package engine

import (
	"strings"

	"github.com/memplan/memplan/ir"
	"github.com/memplan/memplan/strategy"
	"github.com/memplan/memplan/units"
)

// Offload is what --offload moves to host memory.
type Offload struct {
	Activations, Optimizer, Params bool
}

// ParseOffload reads a comma list of activations, optimizer, params.
func ParseOffload(s string) (Offload, error) {
	var o Offload
	parts := strings.Split(s, ",")
	if len(parts) == 1 && (strings.TrimSpace(s) == "" || strings.TrimSpace(s) == "none") {
		return o, nil
	}
	for _, f := range parts {
		var p *bool
		name := strings.TrimSpace(f)
		switch name {
		case "activations":
			p = &o.Activations
		case "optimizer":
			p = &o.Optimizer
		case "params", "parameters":
			p, name = &o.Params, "params"
		case "none":
			return o, fieldErr(FieldOffload, "{offload} %q: none offloads nothing and stands alone", s)
		case "":
			return o, fieldErr(FieldOffload, "{offload} %q: an empty item; want activations, optimizer or params, separated by commas", s)
		default:
			return o, fieldErr(FieldOffload, "{offload} %q: want activations, optimizer or params", f)
		}
		if *p {
			return o, fieldErr(FieldOffload, "{offload} %q: %s given twice", s, name)
		}
		*p = true
	}
	return o, nil
}

func (o Offload) String() string {
	var parts []string
	if o.Activations {
		parts = append(parts, "activations")
	}
	if o.Optimizer {
		parts = append(parts, "optimizer")
	}
	if o.Params {
		parts = append(parts, "params")
	}
	return strings.Join(parts, ",")
}

// Any reports whether anything is offloaded.
func (o Offload) Any() bool { return o.Activations || o.Optimizer || o.Params }

// validateParallel checks the data/pipeline-parallel and offload options.
func (s *Spec) validateParallel() error {
	if s.DP == 0 {
		s.DP = 1
	}
	if s.PP == 0 {
		s.PP = 1
	}
	switch {
	case s.DP < 0 || s.PP < 0:
		return invalid(FieldDP, "{dp} and {pp} must be positive")
	case s.ZeROBucketElems < 0:
		return invalid(FieldZeRO, "ZeRO reduce bucket of %d elements must not be negative", s.ZeROBucketElems)
	case s.ZeRO < 0 || s.ZeRO > 3:
		return invalid(FieldZeRO, "{zero} %d: want 0, 1, 2 or 3", s.ZeRO)
	case s.EP > 1 && s.DP%s.EP != 0 && s.Model != nil && s.Model.NumExperts > 0 && s.Model.NumExperts%s.EP == 0:
		// Megatron-LM carves the expert-parallel groups out of the
		// data-parallel ranks (megatron/core/parallel_state.py,
		// initialize_model_parallel: "data_parallel_size is not
		// divisible by expert_model_parallel_size"): a GPU holds 1/ep of
		// the experts only when ep other ranks hold the rest. A job of
		// fewer ranks had 7/8 of mixtral's experts on no GPU and fitted.
		// (A dense model, or experts ep does not divide, are refused
		// by the builder, which says so.)
		return invalid(FieldEP, "{ep} %d splits the experts over data-parallel ranks: it needs {dp} a multiple of %d, not %d", s.EP, s.EP, s.DP)
	case s.ZeRO > 0 && s.DP < 2:
		return invalid(FieldZeRO, "ZeRO-%d shards over data-parallel ranks: it needs {dp} of at least 2; with {dp} 1 it changes nothing", s.ZeRO)
	case s.Offload.Params && s.ZeRO != 3:
		return invalid(FieldOffload, "{offload} params offloads ZeRO-3/FSDP parameter shards: add {zero} 3 and {dp} N")
	case s.Offload.Params && s.Offload.Optimizer:
		return invalid(FieldOffload, "{offload} params already offloads the optimizer (as FSDP CPUOffload does); drop optimizer")
	case s.Mode == Infer && (s.DP > 1 || s.PP > 1 || s.ZeRO > 0 || s.Offload.Any()):
		return invalid(FieldMode, "{dp}, {pp}, {zero} and {offload} apply to training only")
	}
	return nil
}

// The data/pipeline-parallel and offload transforms of s for pipeline stage
// stage compose in this order: pipeline (so the rest sees only this rank's
// state; checkpointing comes before it), sharding, then offload.

// preTransforms is the pipeline transform (none without pipelining).
func (s *Spec) preTransforms(stage int, sl slice) []strategy.Transform {
	if s.PP < 2 {
		return nil
	}
	return []strategy.Transform{&strategy.Pipeline{Stages: s.PP, Stage: stage, Schedule: s.PPSchedule, Interleave: s.PPInterleave, Layout: sl.layout}}
}

// postTransforms are the sharding and offload transforms.
func (s *Spec) postTransforms() []strategy.Transform {
	return append(s.shardTransforms(), s.offloadTransforms()...)
}

// shardTransforms is ZeRO or DDP (none for one replica).
func (s *Spec) shardTransforms() []strategy.Transform {
	switch {
	case s.ZeRO > 0:
		return []strategy.Transform{&strategy.ZeRO{Stage: s.ZeRO, DP: s.DP, BucketElems: s.ZeROBucketElems, Flat: s.flatParams()}}
	case s.DP > 1:
		return []strategy.Transform{&strategy.DDP{DP: s.DP}}
	}
	return nil
}

// flatParams reports whether the job shards with FSDP1 FlatParameters
// (Sem.FSDPFlat under ZeRO-3 training): then the graph is built with the
// frozen weights of adapted layers read through views that require grad
// (build.Options.FSDPFlat) and ZeRO-3 runs in its Flat mode.
func (s *Spec) flatParams() bool {
	return s.Sem.FSDPFlat && s.ZeRO == 3 && s.Mode == Train
}

// offloadTransforms are the offload transforms, then autocast's cache
// (strategy.AutocastCache), which ends each autocast region on the final
// op order and so comes last in every chain.
func (s *Spec) offloadTransforms() []strategy.Transform {
	var ts []strategy.Transform
	if s.Offload.Optimizer {
		ts = append(ts, &strategy.OptimizerOffload{})
	}
	if s.Offload.Params {
		ts = append(ts, &strategy.ParamOffload{})
	}
	if s.Offload.Activations {
		ts = append(ts, &strategy.ActivationOffload{})
	}
	if s.autocastCache() {
		ts = append(ts, &strategy.AutocastCache{})
	}
	return ts
}

// autocastCache reports whether autocast caches weight casts in this job:
// under an amp precision, except with FSDP1's FlatParameters, whose
// modules compute with views of the flat parameter
// (torch/distributed/fsdp/_flat_param.py at 2.14.1, _use_unsharded_views
// with as_params=False in forward), which autocast never caches
// (cached_cast's !arg.is_view()). A trace's program holds no marked casts.
func (s *Spec) autocastCache() bool {
	return s.Precision.AutocastDType() != units.Invalid && !s.flatParams()
}

// paramCount is the parameter elements of p (before any sharding).
func paramCount(p *ir.Program) int64 {
	var n int64
	for _, id := range p.Params {
		n += p.Tensors[id].Numel()
	}
	return n
}
