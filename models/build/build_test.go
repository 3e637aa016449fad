package build

import (
	"strings"
	"testing"

	"github.com/memplan/memplan/ir"
	"github.com/memplan/memplan/models"
	"github.com/memplan/memplan/ops"
)

// graphParams counts parameter elements of g, leaving out a training head
// the checkpoint does not have.
func graphParams(a *models.Arch, g *ir.Graph) int64 {
	var n int64
	for _, id := range g.Params {
		t := &g.Tensors[id]
		if a.NumLabels == 0 && strings.HasPrefix(t.Name, "classifier.") {
			continue
		}
		n += t.Numel()
	}
	return n
}

// The graph registers exactly the parameters of the real checkpoint: the
// builder and models.Arch.ParamCount (checked against published counts in
// models/params_test.go) agree for every catalog model.
func TestGraphParamsMatchCheckpoint(t *testing.T) {
	for _, name := range models.Names() {
		t.Run(name, func(t *testing.T) {
			a, err := models.Lookup(name)
			if err != nil {
				t.Fatal(err)
			}
			for _, att := range []Attention{SDPA, Eager} {
				g, err := Graph(a, Options{MicroBatch: 1, Seq: 16, Precision: ops.BF16, Attention: att, Training: true})
				if err != nil {
					t.Fatal(err)
				}
				if got, want := graphParams(a, g), a.ParamCount(); got != want {
					t.Errorf("%s: graph has %d parameters, checkpoint %d (diff %d)", att, got, want, got-want)
				}
			}
		})
	}
}
