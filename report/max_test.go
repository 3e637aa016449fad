package report

import (
	"strings"
	"testing"

	"github.com/memplan/memplan/engine"
	"github.com/memplan/memplan/hw"
	"github.com/memplan/memplan/models"
	"github.com/memplan/memplan/ops"
	"github.com/memplan/memplan/search"
)

// TestMaxTextClosingLine: max's closing line agrees with its dimension
// (issue 15's sweep: max --mode infer --gen-tokens ? said "as the generated
// tokens grows").
func TestMaxTextClosingLine(t *testing.T) {
	a, err := models.Lookup("gpt2")
	if err != nil {
		t.Fatal(err)
	}
	gpu, err := hw.Lookup("t4")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		d    search.Dim
		want string
	}{
		{search.DimGenTokens, "the peak never falls as the generated tokens grow,"},
		{search.DimMicroBatch, "the peak never falls as the micro-batch grows,"},
	} {
		s := engine.Spec{Job: engine.Job{Model: a, Mode: engine.Infer, MicroBatch: 1, Seq: 128, Precision: ops.AMPFP16}, Target: engine.Target{GPU: gpu}}
		r, err := search.Max(s, c.d)
		if err != nil {
			t.Fatal(err)
		}
		var b strings.Builder
		if err := WriteMaxText(&b, r, nil); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(b.String(), c.want) {
			t.Errorf("%s: want %q in\n%s", c.d, c.want, b.String())
		}
	}
}
