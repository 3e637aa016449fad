package recipe

import (
	"slices"
	"strings"
	"testing"

	"github.com/memplan/memplan/engine"
	"github.com/memplan/memplan/models"
	"github.com/memplan/memplan/models/build"
)

// The training switches (Switch.Training) are the ones an inference plan
// does not read: set to a value other than the default, each leaves the
// inference program of a QLoRA model (adapters, 4-bit linears) op for op
// as it was, or is refused as training's (checkpointing). Recipe.Apply
// skips them in inference, so a recipe's training step (torchtitan's
// checkpointing) does not stop an inference plan.
func TestTrainingSwitchesLeaveInferenceAlone(t *testing.T) {
	values := map[string]string{
		"optimizer": "sgd", "optimizer.impl": "single", "optimizer.state-dtype": "bfloat16", "optimizer.paged": "true",
		"autograd.mean-saves-input": "true", "autograd.inplace-sums": "false", "optimizer.in-backward": "true", "loss": "chunked:tokens=8,fp32-outputs",
		"lora.dropout": "shared", "bitsandbytes": "0.41.1", "fsdp.flat-params": "true", "loop.hold-outputs": "true",
		"loop.zero-grad": "in-place", "checkpoint": "full",
	}
	a, err := models.Lookup("llama-3.2-1b")
	if err != nil {
		t.Fatal(err)
	}
	base := engine.Spec{Job: engine.Job{Model: a, Mode: engine.Infer, Seq: 32, QLoRA: true,
		LoRA: &build.LoRA{Rank: 8, Alpha: 16, Dropout: 0.1, Targets: []string{"q_proj", "k_proj", "v_proj"}}}}
	want, err := engine.Plan(base)
	if err != nil {
		t.Fatal(err)
	}
	var training []string
	for _, sw := range Switches() {
		if !sw.Training {
			continue
		}
		training = append(training, sw.Key)
		v, ok := values[sw.Key]
		if !ok {
			t.Errorf("%s: give it a value here to check that inference ignores it", sw.Key)
			continue
		}
		s := base
		if err := lookupApply(t, &s, sw.Key, v); err != nil {
			t.Fatalf("%s=%s: %v", sw.Key, v, err)
		}
		got, err := engine.Plan(s)
		switch {
		case err != nil && strings.Contains(err.Error(), "training only"):
		case err != nil:
			t.Errorf("%s=%s in inference: %v", sw.Key, v, err)
		case len(got.Program.Ops) != len(want.Program.Ops) || got.Sim.Peak.Total != want.Sim.Peak.Total:
			t.Errorf("%s=%s changes inference: %d ops, peak %v; %d, %v without it", sw.Key, v, len(got.Program.Ops), got.Sim.Peak.Total, len(want.Program.Ops), want.Sim.Peak.Total)
		}
		if !TrainingOnly(sw.Key) {
			t.Errorf("%s: TrainingOnly says no", sw.Key)
		}
	}
	if !slices.Contains(training, "loss") || TrainingOnly("precision") || TrainingOnly("nonsense") {
		t.Errorf("training switches %v", training)
	}
	r, err := Load("torchtitan")
	if err != nil {
		t.Fatal(err)
	}
	s := base
	if err := r.Apply(&s, nil); err != nil || s.Checkpoint.Kind != engine.NoCheckpoint {
		t.Errorf("torchtitan in inference: %v, checkpoint %v", err, s.Checkpoint)
	}
}
