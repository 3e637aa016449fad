package engine

import (
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
	tr, err := torchtrace.Load(filepath.Join(catalogTestdata, "gpt2_tiny.trace.json"))
	if err != nil {
		t.Fatal(err)
	}
	arch, err := models.LoadFile(filepath.Join(catalogTestdata, "gpt2_tiny.config.json"))
	if err != nil {
		t.Fatal(err)
	}
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
		for ph := ir.Phase(0); ph < ir.NumPhases; ph++ {
			cat := int64(res.Sim.PhasePeak[ph].Total)
			trc := int64(got.PhasePeak[ph].Total)
			e := float64(cat-trc) / float64(trc)
			t.Logf("batch %2d seq %3d %-9s catalog %9d trace %9d  %+.2f%%", c.batch, c.seq, ph, cat, trc, 100*e)
			if e > 0.02 || e < -0.02 {
				t.Errorf("batch %d seq %d %s: catalog %d vs trace %d bytes (%+.2f%%), beyond 2%%", c.batch, c.seq, ph, cat, trc, 100*e)
			}
		}
	}
}

const catalogTestdata = "../testdata/torch"
