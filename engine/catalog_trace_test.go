package engine

import (
	"fmt"
	"path/filepath"
	"testing"

	"github.com/memplan/memplan/importer/torchtrace"
	"github.com/memplan/memplan/ir"
	"github.com/memplan/memplan/lower"
	"github.com/memplan/memplan/models"
	"github.com/memplan/memplan/models/build"
	"github.com/memplan/memplan/ops"
	"github.com/memplan/memplan/sim"
)

// The catalog path and the trace path agree: a GPT-2 written in plain
// PyTorch with Hugging Face's module structure (memplan_torch.models:
// gpt2_tiny, traced on CPU) and the same config.json through memplan's
// catalog builder predict the same per-phase peaks within 2% (issue 4).
func TestCatalogMatchesTrace(t *testing.T) {
	tr, arch := traceAndConfig(t, "gpt2_tiny")
	for _, c := range []struct{ batch, seq int }{{2, 64}, {8, 64}, {8, 128}, {32, 32}} {
		p, err := tr.Program(torchtrace.Options{Batch: c.batch, Seq: c.seq, NoScratch: true})
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Verify(); err != nil {
			t.Fatal(err)
		}
		got, err := sim.Run(p)
		if err != nil {
			t.Fatal(err)
		}
		res, err := Plan(Spec{Job: Job{Model: arch, MicroBatch: c.batch, Seq: c.seq, Precision: ops.FP32, Device: ops.CPU, Attention: build.Eager, Optimizer: lower.AdamW, Impl: lower.Single}})
		if err != nil {
			t.Fatal(err)
		}
		phasesAgree(t, fmt.Sprintf("batch %2d seq %3d", c.batch, c.seq), res.Sim, got)
	}
}

// phasesAgree checks that each phase's peak of the catalog's plan is
// within 2% of the trace's.
func phasesAgree(t *testing.T, label string, catalog, trace *sim.Result) {
	t.Helper()
	for ph := ir.Phase(0); ph < ir.NumPhases; ph++ {
		cat := int64(catalog.PhasePeak[ph].Total)
		trc := int64(trace.PhasePeak[ph].Total)
		e := float64(cat-trc) / float64(trc)
		t.Logf("%s %-9s catalog %10d trace %10d  %+.2f%%", label, ph, cat, trc, 100*e)
		if e > 0.02 || e < -0.02 {
			t.Errorf("%s %s: catalog %d vs trace %d bytes (%+.2f%%), beyond 2%%", label, ph, cat, trc, 100*e)
		}
	}
}

const catalogTestdata = "../testdata/torch"

// traceAndConfig loads testdata/torch's trace of name and its config.json.
func traceAndConfig(t *testing.T, name string) (*torchtrace.Trace, *models.Arch) {
	t.Helper()
	tr, err := torchtrace.Load(filepath.Join(catalogTestdata, name+".trace.json"))
	if err != nil {
		t.Fatal(err)
	}
	arch, err := models.LoadFile(filepath.Join(catalogTestdata, name+".config.json"))
	if err != nil {
		t.Fatal(err)
	}
	return tr, arch
}

// The same agreement at GPT-2's real vocabulary (50,257 × 768), where the
// tied embedding's two gradients are as large as the rest of the model:
// autograd sums them out of place (torch/csrc/autograd/input_buffer.cpp,
// pytorch/pytorch@4537ef6c: the LM head's weight gradient is a t() view
// that keeps its base, so can_accumulate_inplace fails), three
// vocab × hidden buffers at once. gpt2_tiny's vocabulary of 256 hides a
// miss of it (13% of backward here). Trace: export-hf gpt2 --seq 64
// --batch 2 --precision fp32 --no-seq-fit --override n_layer=2
// (transformers 5.24.0, torch 2.14.1, fake tensors on CPU).
func TestCatalogMatchesTraceTiedVocab(t *testing.T) {
	tr, arch := traceAndConfig(t, "gpt2_2l_tied")
	p, err := tr.Program(torchtrace.Options{Batch: 2, NoScratch: true})
	if err != nil {
		t.Fatal(err)
	}
	got, err := sim.Run(p)
	if err != nil {
		t.Fatal(err)
	}
	res, err := Plan(Spec{Job: Job{Model: arch, MicroBatch: 2, Seq: 64, Precision: ops.FP32, Device: ops.CPU, Attention: build.SDPA, Optimizer: lower.AdamW, Impl: lower.Foreach}})
	if err != nil {
		t.Fatal(err)
	}
	phasesAgree(t, "gpt2 2 layers", res.Sim, got)
}

// The same model under --pp 2, stage by stage: the trace's sum of the tied
// embedding's two gradients is untied (strategy.UntieTraceGrads) into a
// gradient per stage, all-reduced between them, as the catalog lowers the
// copies apart (lower.TrainConfig.SeparateCopies), and its foreach
// optimizer's state goes with its parameters (assocByPosition). Cut as
// recorded, the head's gradient went to the first stage as an activation
// every micro-step and every stage held every parameter's exp_avg_sq:
// phases −4 % to −19 % against the catalog's.
func TestCatalogMatchesTracePipelineTied(t *testing.T) {
	tr, arch := traceAndConfig(t, "gpt2_2l_tied")
	for _, first := range []bool{false, true} {
		for st := 0; st < 2; st++ {
			pipe := Parallel{PP: 2}
			ts := Spec{Job: Job{Trace: tr, MicroBatch: 2, Accum: 4, Count: Counter{Measured: true}}, Parallel: pipe}
			ts.FirstStep = first
			trace, err := PlanWith(ts, Options{Stages: []int{st}})
			if err != nil {
				t.Fatal(err)
			}
			cs := Spec{Job: Job{Model: arch, MicroBatch: 2, Seq: 64, Accum: 4, Precision: ops.FP32, Device: ops.CPU, Attention: build.SDPA, Optimizer: lower.AdamW, Impl: lower.Foreach}, Parallel: pipe}
			cs.FirstStep = first
			cat, err := PlanWith(cs, Options{Stages: []int{st}})
			if err != nil {
				t.Fatal(err)
			}
			label := fmt.Sprintf("gpt2 2 layers --pp 2 stage %d", st)
			phasesAgree(t, label, cat.Sim, trace.Sim)
			if first {
				// Its forward holds 10 MB more in the trace, as without a
				// pipeline (the forward rows above): 2.6 % of the first
				// step's smaller forward, so the peak is compared.
				c, tr := float64(cat.First.Peak.Total), float64(trace.First.Peak.Total)
				if e := (c - tr) / c; e > 0.02 || e < -0.02 {
					t.Errorf("%s first step: peak %.0f catalog, %.0f trace (%+.2f%%)", label, c, tr, 100*e)
				}
			}
			for _, r := range []*Result{trace, cat} {
				n := 0
				for _, op := range r.Program.Ops {
					if op.Name == "pp.tied_grad_all_reduce" {
						n++
					}
					if op.Comm != nil && op.Comm.Kind == ir.SendRecv && op.Comm.Bytes > 1<<20 {
						t.Errorf("%s: %s sends %s (a gradient as an activation)", label, op.Name, op.Comm.Bytes)
					}
				}
				if n != 1 {
					t.Errorf("%s: %d tied-gradient all-reduces, want 1", label, n)
				}
			}
		}
	}
}
