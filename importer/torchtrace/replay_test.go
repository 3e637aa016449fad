package torchtrace

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/memplan/memplan/ir"
	"github.com/memplan/memplan/sim"
)

const testdata = "../../testdata/torch"

type replayRef struct {
	Name        string `json:"name"`
	MicroBatch  int    `json:"micro_batch"`
	SeqLen      *int   `json:"seq_len"`
	Trace       string `json:"trace"`
	TraceReplay *struct {
		Phases            map[string]int64 `json:"phases"`
		PhasesWithScratch map[string]int64 `json:"phases_with_scratch"`
		FirstStepPhases   map[string]int64 `json:"first_step_phases"`
	} `json:"trace_replay"`
	Memory struct {
		Threshold int64 `json:"threshold_bytes"`
	} `json:"memory"`
}

func loadRefs(t *testing.T) []replayRef {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(testdata, "measured.json"))
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Cases []replayRef `json:"cases"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	return doc.Cases
}

func phasePeaks(t *testing.T, p *ir.Program) map[string]int64 {
	t.Helper()
	if err := p.Verify(); err != nil {
		t.Fatal(err)
	}
	r, err := sim.Run(p)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for ph := ir.Phase(0); ph < ir.NumPhases; ph++ {
		if r.PhasePeak[ph].Op >= 0 {
			out[ph.String()] = int64(r.PhasePeak[ph].Total)
		}
	}
	return out
}

// The Go replay and memplan_torch.replay implement the same semantics: at the
// measured batch their per-phase peaks agree to the byte.
func TestReplayMatchesPythonReference(t *testing.T) {
	for _, c := range loadRefs(t) {
		if c.TraceReplay == nil {
			continue
		}
		t.Run(c.Name, func(t *testing.T) {
			tr, err := Load(filepath.Join(testdata, c.Trace))
			if err != nil {
				t.Fatal(err)
			}
			o := Options{Batch: c.MicroBatch, MinBytes: c.Memory.Threshold, NoScratch: true}
			if tr.HasSeq() && c.SeqLen != nil {
				o.Seq = *c.SeqLen
			}
			check := func(what string, o Options, want map[string]int64) {
				p, err := tr.Program(o)
				if err != nil {
					t.Fatal(err)
				}
				got := phasePeaks(t, p)
				for ph, w := range want {
					if got[ph] != w {
						t.Errorf("%s %s: Go %d, Python %d (%+d bytes)", what, ph, got[ph], w, got[ph]-w)
					}
				}
			}
			check("steady", o, c.TraceReplay.Phases)
			o.FirstStep = true
			check("first step", o, c.TraceReplay.FirstStepPhases)
			if c.TraceReplay.PhasesWithScratch != nil {
				o.FirstStep, o.NoScratch = false, false
				check("with scratch", o, c.TraceReplay.PhasesWithScratch)
			}
		})
	}
}
