package search

import (
	"reflect"
	"testing"

	"github.com/memplan/memplan/engine"
	"github.com/memplan/memplan/internal/fieldpath"
)

// Every key of the search is a Spec with some fields zeroed: it must
// change with every other field of Spec (a field added to Spec splits the
// groups until a key says it ignores it) and ignore exactly these.
func TestKeysIgnoreOnlyWhatTheySay(t *testing.T) {
	batch := []string{"Job.MicroBatch", "Job.Accum"}
	variant := []string{"Savings.Checkpoint.Kind", "Savings.Checkpoint.Every", "Savings.Checkpoint.Modules", "Savings.Offload.Activations", "Job.Impl"}
	modelStateOffload := []string{"Savings.Offload.Optimizer", "Savings.Offload.Params"}
	cat := func(parts ...[]string) []string {
		var out []string
		for _, p := range parts {
			out = append(out, p...)
		}
		return out
	}
	for _, k := range []struct {
		name    string
		key     func(*engine.Spec) engine.Spec
		ignores []string
	}{
		{"groupKey", groupKey, batch},
		{"stateKey", stateKey, cat(batch, variant)},
		{"bundleKey", bundleKey, cat(batch, variant, modelStateOffload, []string{"Parallel.Sharding.ZeRO"})},
		{"overKey", overKey, cat(batch, modelStateOffload)},
		{"hintKey", hintKey, cat(batch, []string{"Parallel.Sharding.ZeRO"})},
		{"stepKey", stepKey, cat(batch, []string{"Parallel.Sharding.ZeRO", "Job.Impl"})},
	} {
		ignored := map[string]bool{}
		for _, p := range k.ignores {
			ignored[p] = true
		}
		for _, l := range fieldpath.Leaves(reflect.TypeOf(engine.Spec{})) {
			var s engine.Spec
			base := k.key(&s)
			fieldpath.Change(&s, l)
			changed := k.key(&s) != base
			if changed == ignored[l.Path] {
				t.Errorf("%s: Spec.%s changes the key: %t, want %t", k.name, l.Path, changed, !ignored[l.Path])
			}
		}
	}
}
