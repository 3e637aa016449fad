package engine

import (
	"testing"

	"github.com/memplan/memplan/lower"
	"github.com/memplan/memplan/ops"
)

// `memplan models` lists a BERT checkpoint's BertModel; plan trains it with
// a classification head of two labels (BertForSequenceClassification's
// default), so plan's parameter count is the catalog's plus hidden × 2 + 2,
// as `models --help` says.
func TestEncoderPlanAddsClassifierToCatalogCount(t *testing.T) {
	for _, name := range []string{"bert-base", "bert-large"} {
		a := lookup(t, name)
		r, err := Plan(Spec{Job: Job{Model: a, MicroBatch: 1, Seq: 16, Precision: ops.FP32, Optimizer: lower.SGD}})
		if err != nil {
			t.Fatal(err)
		}
		if got, want := r.Sim.Params-a.ParamCount(), int64(2*a.Hidden+2); got != want {
			t.Errorf("%s: plan counts %d parameters more than the catalog, want %d (a 2-label head)", name, got, want)
		}
	}
}
