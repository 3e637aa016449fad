package engine_test

import (
	"errors"
	"regexp"
	"testing"

	"github.com/memplan/memplan/engine"
	"github.com/memplan/memplan/hw"
	"github.com/memplan/memplan/importer/torchtrace"
	"github.com/memplan/memplan/internal/msgcheck"
	"github.com/memplan/memplan/models"
	"github.com/memplan/memplan/models/build"
	"github.com/memplan/memplan/ops"
)

// Every validation error of a job names the field it is about
// (engine.FieldError) in words: no flag (package cli alone turns a field
// into one), no Go identifier or package prefix.
func TestValidationMessagesNameFieldsInWords(t *testing.T) {
	gpt2, err := models.Lookup("gpt2")
	if err != nil {
		t.Fatal(err)
	}
	bert, err := models.Lookup("bert-base")
	if err != nil {
		t.Fatal(err)
	}
	t4, err := hw.Lookup("t4")
	if err != nil {
		t.Fatal(err)
	}
	lm, err := torchtrace.Load("../testdata/torch/lm.trace.json")
	if err != nil {
		t.Fatal(err)
	}
	resnet, err := torchtrace.Load("../testdata/torch/resnet18.trace.json")
	if err != nil {
		t.Fatal(err)
	}
	job := func(j engine.Job) engine.Spec {
		if j.Model == nil && j.Trace == nil {
			j.Model = gpt2
		}
		return engine.Spec{Job: j}
	}
	with := func(s engine.Spec, f func(*engine.Spec)) engine.Spec { f(&s); return s }
	lora := &build.LoRA{Rank: 8, Alpha: 16}
	specs := []engine.Spec{
		{},
		job(engine.Job{MicroBatch: -1}),
		job(engine.Job{Seq: -5}),
		job(engine.Job{Seq: 4096}),
		job(engine.Job{Accum: -2}),
		job(engine.Job{GenTokens: -1, Mode: engine.Infer}),
		job(engine.Job{Mode: engine.Infer, Accum: 2}),
		job(engine.Job{Model: bert, Mode: engine.Infer, Seq: 128, GenTokens: 8}),
		job(engine.Job{QLoRA: true}),
		with(job(engine.Job{}), func(s *engine.Spec) { s.Capacity = -1 }),
		with(job(engine.Job{}), func(s *engine.Spec) { s.TP = -1 }),
		with(job(engine.Job{Mode: engine.Infer}), func(s *engine.Spec) { s.Checkpoint.Kind = engine.CheckpointFull }),
		with(job(engine.Job{Seq: 128, Precision: ops.AMPBF16}), func(s *engine.Spec) { s.GPU = t4 }),
		with(job(engine.Job{}), func(s *engine.Spec) { s.DP = -1 }),
		with(job(engine.Job{}), func(s *engine.Spec) { s.DP, s.ZeRO = 4, 5 }),
		with(job(engine.Job{}), func(s *engine.Spec) { s.ZeRO = 2 }),
		with(job(engine.Job{}), func(s *engine.Spec) { s.DP, s.ZeROBucketElems = 2, -1 }),
		with(job(engine.Job{}), func(s *engine.Spec) { s.DP, s.Offload.Params = 4, true }),
		with(job(engine.Job{}), func(s *engine.Spec) { s.DP, s.ZeRO, s.Offload.Params, s.Offload.Optimizer = 4, 3, true, true }),
		with(job(engine.Job{Mode: engine.Infer}), func(s *engine.Spec) { s.DP = 2 }),
		with(job(engine.Job{}), func(s *engine.Spec) { s.Sem.Overhead = -1 }),
		job(engine.Job{Model: gpt2, Trace: lm}),
		job(engine.Job{Trace: lm, Mode: engine.Infer}),
		job(engine.Job{Trace: lm, LoRA: lora}),
		job(engine.Job{Trace: lm, MicroBatch: -1}),
		job(engine.Job{Trace: resnet, Seq: 99}),
		with(job(engine.Job{Seq: 128}), func(s *engine.Spec) { s.Checkpoint.Kind = engine.CheckpointAuto }),
	}
	var errs []error
	for _, s := range specs {
		_, err := engine.Plan(s)
		if err == nil {
			t.Errorf("%+v: no error", s)
			continue
		}
		errs = append(errs, err)
	}
	_, err = engine.PlanWith(job(engine.Job{Seq: 128}), engine.Options{Stages: []int{3}})
	errs = append(errs, err)
	for _, parse := range []func() error{
		func() error { _, err := engine.ParseCheckpoint("every=0"); return err },
		func() error { _, err := engine.ParseCheckpoint("modules="); return err },
		func() error { _, err := engine.ParseCheckpoint("sometimes"); return err },
		func() error { _, err := engine.ParseOffload("disk"); return err },
		func() error { _, err := engine.ParseAllow("everything"); return err },
		func() error { _, err := engine.ParseMode("serve"); return err },
	} {
		errs = append(errs, parse())
	}
	for _, err := range errs {
		if err == nil {
			t.Error("no error")
			continue
		}
		msg := err.Error()
		var fe *engine.FieldError
		if !errors.As(err, &fe) || fe.Field == engine.FieldNone {
			t.Errorf("%q names no field", msg)
		}
		for _, f := range engine.Fields() {
			if regexp.MustCompile(`--` + regexp.QuoteMeta(f.Key()) + `($|[^a-z-])`).MatchString(msg) {
				t.Errorf("%q names the flag of %s", msg, f)
			}
		}
		if p := msgcheck.Problems(msg); p != nil {
			t.Errorf("%q: %v", msg, p)
		}
	}
}
