package search

import (
	"errors"
	"testing"

	"github.com/memplan/memplan/engine"
	"github.com/memplan/memplan/importer/torchtrace"
	"github.com/memplan/memplan/internal/msgcheck"
)

// Fit's refusals name the field they are about in words (package cli
// turns it into a flag), never a flag or a Go identifier.
func TestFitErrorsNameFields(t *testing.T) {
	tr, err := torchtrace.Load("../testdata/torch/lm.trace.json")
	if err != nil {
		t.Fatal(err)
	}
	base := baseSpec(t, "gpt2", "h100", 2)
	trace := engine.Spec{Job: engine.Job{Trace: tr}}
	infer := base
	infer.Mode = engine.Infer
	noGPU := base
	noGPU.GPU = nil
	for _, c := range []struct {
		s engine.Spec
		o Options
	}{
		{trace, Options{}},
		{infer, Options{}},
		{noGPU, Options{}},
		{base, Options{Headroom: 2}},
		{base, Options{GPUs: -1}},
		{base, Options{GPUs: 3, GlobalBatch: 2}},
	} {
		_, err := Fit(c.s, c.o)
		if err == nil {
			t.Errorf("%+v: no error", c.o)
			continue
		}
		var fe *engine.FieldError
		if !errors.As(err, &fe) || fe.Field == engine.FieldNone {
			t.Errorf("%q names no field", err)
		}
		if p := msgcheck.Problems(err.Error()); p != nil {
			t.Errorf("%q: %v", err, p)
		}
	}
}
