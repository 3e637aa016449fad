package recipe

import (
	"testing"

	"pgregory.net/rapid"

	"github.com/memplan/memplan/engine"
	"github.com/memplan/memplan/hw"
	"github.com/memplan/memplan/models"
)

// drawJob draws a recipe by name, and a job of a copy of one of
// modelNames with layers(rt) layers (its own with layers nil) on one of gpus, its
// micro-batch 1 to 4 and its sequence 32 to 2^maxLog2Seq tokens, with the
// recipe applied (rt skips a job the recipe refuses). The properties the
// recipes must keep start from it.
func drawJob(t *testing.T, rt *rapid.T, modelNames, gpus []string, layers func(rt *rapid.T) int, maxLog2Seq int) (string, engine.Spec) {
	name := rapid.SampledFrom(Names()).Draw(rt, "recipe")
	r, err := Load(name)
	if err != nil {
		t.Fatal(err)
	}
	m, err := models.Lookup(rapid.SampledFrom(modelNames).Draw(rt, "model"))
	if err != nil {
		t.Fatal(err)
	}
	a := m.Clone()
	if layers != nil {
		a.Layers = layers(rt)
	}
	g, err := hw.Lookup(rapid.SampledFrom(gpus).Draw(rt, "gpu"))
	if err != nil {
		t.Fatal(err)
	}
	s := engine.Spec{Job: engine.Job{Model: a, MicroBatch: 1 << rapid.IntRange(0, 2).Draw(rt, "log2 micro-batch"), Seq: 1 << rapid.IntRange(5, maxLog2Seq).Draw(rt, "log2 seq")},
		Target: engine.Target{GPU: g}}
	if err := r.Apply(&s, nil); err != nil {
		rt.Skip(err)
	}
	return name, s
}
