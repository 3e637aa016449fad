// Package emit writes the configuration file a training framework reads
// for a plan memplan found (fit's winner): DeepSpeed's JSON, accelerate's
// config YAML, a torchtune recipe config and a litgpt finetune config. Each
// key is the framework's own, cited where it is written; a plan the
// framework cannot express (a dimension it has no key for, or sets
// otherwise) is refused with one error naming the dimension, never written
// as a near neighbour.
//
// Each config describes the same job the plan does: planned with the
// recipe the framework implies (memplan plan --recipe X), the emitted run
// has the plan's peak; Parse reads an emitted config back into those
// dimensions, and the tests check that every one round-trips.
package emit

import (
	"fmt"
	"slices"
	"strings"

	"github.com/memplan/memplan/engine"
	"github.com/memplan/memplan/lower"
	"github.com/memplan/memplan/ops"
)

// framework is one target: its name, the memplan recipe that plans a job
// the way it runs it, and its writer.
type framework struct {
	name    string
	recipes []string
	write   func(s *engine.Spec) (string, error)
}

var frameworks = []framework{
	{"deepspeed", []string{"deepspeed"}, deepSpeed},
	{"accelerate", []string{"hf", "deepspeed"}, accelerate},
	{"torchtune", []string{"torchtune"}, torchtune},
	{"litgpt", []string{"litgpt"}, litGPT},
}

// Names lists the frameworks Config writes.
func Names() []string {
	var out []string
	for _, f := range frameworks {
		out = append(out, f.name)
	}
	return out
}

// Recipes are the memplan recipes that plan a job as the framework runs it.
func Recipes(name string) []string {
	for _, f := range frameworks {
		if f.name == name {
			return f.recipes
		}
	}
	return nil
}

// Config writes framework name's configuration for the plan s (a
// validated training spec: every dimension set).
func Config(name string, s *engine.Spec) (string, error) {
	i := slices.IndexFunc(frameworks, func(f framework) bool { return f.name == name })
	if i < 0 {
		return "", engine.FieldErrorf(engine.FieldEmit, "{emit} %q: want %s", name, strings.Join(Names(), ", "))
	}
	f := frameworks[i]
	if !slices.Contains(f.recipes, s.Sem.Recipe) {
		return "", engine.FieldErrorf(engine.FieldEmit, "{emit} %s writes a run that memplan plans with the %s recipe, but this plan was made with the %q recipe: search with --recipe %s",
			name, strings.Join(f.recipes, " or "), s.Sem.Recipe, f.recipes[0])
	}
	if s.Mode != engine.Train || s.Model == nil {
		return "", engine.FieldErrorf(engine.FieldEmit, "{emit} writes training configs for a catalog or config.json model")
	}
	if s.LoRA != nil {
		return "", refuse(name, engine.FieldLoRA, "LoRA and QLoRA runs are not written yet (their adapter keys differ per framework)")
	}
	if s.EP > 1 {
		return "", refuse(name, engine.FieldEP, "no expert parallelism")
	}
	return f.write(s)
}

// refuse is the error for a plan dimension framework cannot express.
// FieldEmit stands for what no flag of fit's search chooses (the
// optimizer the job keeps): the framework cannot express the plan at all.
func refuse(framework string, f engine.Field, why string, a ...any) error {
	if f == engine.FieldEmit {
		return engine.FieldErrorf(f, "{emit} %s cannot express this plan, as %s", framework, fmt.Sprintf(why, a...))
	}
	return engine.FieldErrorf(f, "{emit} %s cannot express this plan's {%s}: %s", framework, f.Key(), fmt.Sprintf(why, a...))
}

// Plan is what a config says about the dimensions fit chooses: Parse's
// answer, compared with the plan's own in the tests.
type Plan struct {
	MicroBatch, Accum, DP, ZeRO, TP, PP int
	Checkpoint                          engine.CheckpointPolicy
	Offload                             engine.Offload
	Precision                           ops.Precision
	Optimizer                           lower.Optimizer
	Impl                                lower.Impl
	InBackward                          bool
	// Known says which of the fields the config states (accelerate leaves
	// the micro-batch to the training script).
	Known map[string]bool
}

// PlanOf is s's values of the dimensions a config carries.
func PlanOf(s *engine.Spec) Plan {
	return Plan{MicroBatch: s.MicroBatch, Accum: s.Accum, DP: max(s.DP, 1), ZeRO: s.ZeRO, TP: max(s.TP, 1), PP: max(s.PP, 1),
		Checkpoint: s.Checkpoint, Offload: s.Offload, Precision: s.Precision, Optimizer: s.Optimizer, Impl: s.Impl, InBackward: s.Sem.OptimizerInBackward}
}
