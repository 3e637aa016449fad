package cli

import (
	"fmt"
	"strings"

	"github.com/memplan/memplan/engine"
	"github.com/memplan/memplan/hw"
	"github.com/memplan/memplan/models"
	"github.com/memplan/memplan/ops"
	"github.com/memplan/memplan/recipe"
	"github.com/memplan/memplan/units"
)

// warnings lists the inputs of s (as the flags gave it) that are ignored or
// implausible, one sentence each, in terms of flags; an ignored input is
// dropped from s, so the plan is the one the warning describes. They go to
// stderr and into the JSON's warnings.
func (f *planFlags) warnings(s *engine.Spec) []string {
	var ws []string
	add := func(format string, a ...any) { ws = append(ws, fmt.Sprintf(format, a...)) }
	ws = append(ws, f.sizeWarnings(s)...)
	if f.budget != "" {
		if strings.TrimLeft(strings.TrimSpace(f.budget), "0123456789.") == "" {
			add("--budget %s has no unit: read as %d bytes; give one, e.g. --budget %sGiB", f.budget, int64(s.Capacity), f.budget)
		}
		if g := s.GPU; g != nil {
			if w := overGPU("--budget", s.Capacity, g); w != "" {
				add("%s", w)
			} else {
				add("--budget %s replaces the %s's usable memory; the GPU only prices the step", s.Capacity, g.Name)
			}
		}
	}
	if s.Mode == engine.Infer {
		for _, fl := range []string{"optimizer", "optimizer-impl", "first-step"} {
			if f.changed(fl) {
				add("--%s applies to training; ignored with --mode infer", fl)
			}
		}
		// The recipe's table says which switches only training has;
		// Recipe.Apply did not apply them.
		warned := map[string]bool{}
		for _, kv := range f.sets {
			key, _, _ := strings.Cut(kv, "=")
			if key = strings.TrimSpace(key); recipe.TrainingOnly(key) && !warned[key] {
				warned[key] = true
				add("--set %s applies to training; ignored with --mode infer", key)
			}
		}
	}
	if s.PP <= 1 {
		for _, fl := range []string{"pp-schedule", "pp-interleave"} {
			if f.changed(fl) {
				add("--%s applies to pipeline parallelism (--pp 2 or more); ignored", fl)
			}
		}
	}
	if _, ok := s.InterNodeLink(); !ok && s.GPU != nil && s.Nodes() > 1 {
		add("the job's %d GPUs fill %d nodes of %d, but the GPU catalog has no inter-node network for the %s: collectives across nodes are priced as inside one node; give --cluster FILE", s.JobGPUs(), s.Nodes(), s.NodeGPUs(), s.GPU.Name)
	}
	if s.Trace != nil && s.Trace.ParamGrads == nil && s.DP > 1 {
		add("trace %s is %s, which does not record which gradient belongs to which parameter: --dp matches them by dtype and size (the same memory and traffic; --zero 3 needs the record: re-export it)", s.JobName(), s.Trace.Schema)
	}
	if s.Trace != nil && s.GPU != nil {
		if rec, priced := s.TracePriceDType(); rec != priced {
			add("the %s has no %s tensor cores: the trace's %s matmuls are priced at its %s rate (PyTorch runs them there, emulated)", s.GPU.Name, rec, rec, priced)
		}
	}
	if s.Device == ops.CPU && s.GPU != nil {
		add("--kernels cpu plans CPU kernels' memory (dropout masks in the input dtype) on the %s, which runs CUDA kernels", s.GPU.Name)
	}
	return ws
}

// sizeWarnings are the warnings about the shape of a step: a sequence an
// image model ignores, one past a rotary model's positions, generated tokens
// in training.
func (f *planFlags) sizeWarnings(s *engine.Spec) []string {
	var ws []string
	if s.Mode == engine.Train && s.GenTokens > 0 {
		ws = append(ws, "--gen-tokens applies to inference (--mode infer); ignored in training")
		s.GenTokens = 0
	}
	a := s.Model
	if a == nil || !f.changed("seq") {
		return ws
	}
	if a.Family == models.FamilyViT {
		ws = append(ws, fmt.Sprintf("--seq is ignored: %s takes %d×%d images, %d tokens (patches and the class token)", a.Name, a.ImageSize, a.ImageSize, a.NumPatches()+1))
		s.Seq = 0
		return ws
	}
	if n := s.Seq + s.GenTokens; a.PosEmbedding != models.PosLearned && a.MaxPositions > 0 && n > a.MaxPositions {
		what := fmt.Sprintf("--seq %d", s.Seq)
		if s.GenTokens > 0 {
			what += fmt.Sprintf(" + --gen-tokens %d", s.GenTokens)
		}
		ws = append(ws, fmt.Sprintf("%s is beyond %s's %d positions (max_position_embeddings); planned as given, though the model was not trained that long", what, a.Name, a.MaxPositions))
	}
	return ws
}

// overGPU warns of a memory flag (--budget, --total-memory) given more
// than g's memory: the total CUDA reports (totalGlobalMem, what plan
// reports usable before overheads), not the datasheet's marketing figure
// (80 GB, 74.51 GiB, under the 79.19 GiB an H100 reports). "" when within it.
func overGPU(flag string, b units.Bytes, g *hw.GPU) string {
	if b <= g.Capacity() {
		return ""
	}
	return fmt.Sprintf("%s %s is more than the %s's %s of memory", flag, b, g.Name, g.Capacity())
}
