package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/memplan/memplan/allocator"
	"github.com/memplan/memplan/engine"
	"github.com/memplan/memplan/explain"
	"github.com/memplan/memplan/internal/boundedio"
	"github.com/memplan/memplan/internal/yamlerr"
	"github.com/memplan/memplan/report"
	"github.com/memplan/memplan/units"
)

// againstRow is one ledger category: the snapshot's bytes at its allocated
// peak and the plan's at its peak.
type againstRow struct {
	Category string `json:"category"`
	Snapshot int64  `json:"snapshot_bytes"`
	Plan     int64  `json:"plan_bytes"`
	Diff     int64  `json:"difference_bytes"`
}

type againstJSON struct {
	Plan     string       `json:"plan"`
	Snapshot int64        `json:"snapshot_peak_bytes"`
	Predict  int64        `json:"plan_peak_bytes"`
	RelError float64      `json:"rel_error"`
	Rows     []againstRow `json:"by_category"`
	Largest  string       `json:"largest_disagreement"`
	// The reserved peaks: the snapshot's (its segments) and the caching
	// allocator model's replay of the plan (absent from a plan JSON written
	// with --no-reserved).
	SnapshotReserved int64    `json:"snapshot_reserved_bytes"`
	PredictReserved  int64    `json:"plan_reserved_bytes,omitempty"`
	ReservedRelError *float64 `json:"reserved_rel_error,omitempty"`
}

// readPlanJSON reads what `memplan plan --json` wrote.
func readPlanJSON(path string) (*report.PlanJSON, error) {
	b, err := boundedio.ReadFile(path, boundedio.TraceFile)
	if err != nil {
		return nil, fmt.Errorf("--against: %v", err)
	}
	var pj report.PlanJSON
	if err := json.Unmarshal(boundedio.TrimBOM(b), &pj); err != nil {
		return nil, fmt.Errorf("--against %s: not a plan JSON (memplan plan --json): %s", path, yamlerr.Message(err))
	}
	if pj.Schema != report.Schema {
		return nil, fmt.Errorf("--against %s: schema %q, want %s (memplan plan --json)", path, truncate(pj.Schema, 80), report.Schema)
	}
	if err := planBytesOK(&pj); err != nil {
		return nil, fmt.Errorf("--against %s: %v", path, err)
	}
	return &pj, nil
}

// planBytesOK refuses a plan JSON whose sizes the comparison reads are
// negative or past 2^62 bytes (4 EiB, engine.MaxBytes: no plan that
// memplan writes holds more), or whose ledger sums past it: a peak of -5
// bytes was compared as "-5 B predicted", one of 2^63-1 as +66240832709.5%.
func planBytesOK(pj *report.PlanJSON) error {
	l := pj.Ledger
	fields := []struct {
		name string
		v    units.Bytes
	}{
		{"peak.bytes", pj.Peak.Bytes},
		{"ledger.parameters", l.Parameters}, {"ledger.gradients", l.Gradients}, {"ledger.optimizer_state", l.OptimizerState},
		{"ledger.activations", l.Activations}, {"ledger.temporaries", l.Temporaries}, {"ledger.kv_cache", l.KVCache}, {"ledger.other", l.Other},
	}
	if pj.Reserved != nil {
		fields = append(fields, struct {
			name string
			v    units.Bytes
		}{"reserved.peak_bytes", pj.Reserved.PeakBytes})
	}
	var ledger units.Bytes
	for _, f := range fields {
		if f.v < 0 || f.v > engine.MaxBytes {
			return fmt.Errorf("%s is %d: want 0 to 2^62 bytes (4 EiB), as memplan plan --json writes", f.name, int64(f.v))
		}
		if strings.HasPrefix(f.name, "ledger.") {
			if f.v > engine.MaxBytes-ledger { // both at most 2^62: no wrap
				return fmt.Errorf("the ledger's categories up to %s sum past 2^62 bytes (4 EiB)", f.name)
			}
			ledger += f.v
		}
	}
	return nil
}

// planAgainst is the plan to compare with: a plan JSON file, or the plan
// flags given to explain ("flags"), whose reserved peak is predicted with the
// allocator settings the snapshot recorded (cfg).
func planAgainst(against string, f *planFlags, cfg allocator.Config) (*report.PlanJSON, string, error) {
	if against != "flags" {
		pj, err := readPlanJSON(against)
		return pj, against, err
	}
	spec, err := f.spec()
	if err != nil {
		return nil, "", err
	}
	res, err := engine.Plan(spec)
	if err != nil {
		return nil, "", err
	}
	if _, err := res.PredictReserved(cfg, false, false); err != nil {
		return nil, "", err
	}
	return report.Build(res, 0), "plan " + spec.JobName(), nil
}

// compareAgainst puts the snapshot's live bytes at its allocated peak next to
// the plan's ledger at its peak, category by category.
func compareAgainst(rep *explain.Report, pj *report.PlanJSON, name string) *againstJSON {
	snap := map[string]int64{}
	for _, s := range rep.PeakAllocated.ByCategory {
		snap[s.Name] = s.Bytes
	}
	l := pj.Ledger
	plan := map[string]units.Bytes{"parameters": l.Parameters, "gradients": l.Gradients, "optimizer_state": l.OptimizerState,
		"activations": l.Activations, "temporaries": l.Temporaries, "kv_cache": l.KVCache, "other": l.Other}
	a := &againstJSON{Plan: name, Snapshot: rep.PeakAllocated.Bytes, Predict: int64(pj.Peak.Bytes), SnapshotReserved: rep.PeakReserved.Reserved}
	if a.Snapshot > 0 {
		a.RelError = float64(a.Predict-a.Snapshot) / float64(a.Snapshot)
	}
	if pj.Reserved != nil && a.SnapshotReserved > 0 {
		a.PredictReserved = int64(pj.Reserved.PeakBytes)
		e := float64(a.PredictReserved-a.SnapshotReserved) / float64(a.SnapshotReserved)
		a.ReservedRelError = &e
	}
	var worst int64 = -1
	for _, c := range []string{"parameters", "gradients", "optimizer_state", "activations", "temporaries", "kv_cache", "other", "unknown"} {
		r := againstRow{Category: c, Snapshot: snap[c], Plan: int64(plan[c])}
		r.Diff = r.Plan - r.Snapshot
		if r.Snapshot == 0 && r.Plan == 0 {
			continue
		}
		a.Rows = append(a.Rows, r)
		if d := max(r.Diff, -r.Diff); d > worst {
			worst, a.Largest = d, c
		}
	}
	return a
}

func writeAgainst(w io.Writer, a *againstJSON) error {
	fmt.Fprintf(w, "\nagainst %s: allocated peak %s predicted, %s in the snapshot (%+.1f%%)\n", a.Plan, units.Bytes(a.Predict), units.Bytes(a.Snapshot), 100*a.RelError)
	if a.ReservedRelError != nil {
		fmt.Fprintf(w, "reserved peak %s predicted, %s in the snapshot (%+.1f%%)\n", units.Bytes(a.PredictReserved), units.Bytes(a.SnapshotReserved), 100**a.ReservedRelError)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "  category\tsnapshot\tplan\tplan − snapshot\t")
	for _, r := range a.Rows {
		d := units.Bytes(max(r.Diff, -r.Diff)).String()
		if r.Diff < 0 {
			d = "−" + d
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t\n", r.Category, units.Bytes(r.Snapshot), units.Bytes(r.Plan), d)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "largest disagreement: %s\n", a.Largest)
	return nil
}
