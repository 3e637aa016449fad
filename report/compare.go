package report

import (
	"fmt"
	"io"
	"strings"

	"github.com/jedib0t/go-pretty/v6/table"
	"github.com/jedib0t/go-pretty/v6/text"

	"github.com/memplan/memplan/engine"
	"github.com/memplan/memplan/units"
)

// CompareRowJSON is one strategy of `memplan compare --json`.
type CompareRowJSON struct {
	Strategy       string      `json:"strategy"`
	Applies        bool        `json:"applies"`
	Reason         string      `json:"reason,omitempty"`
	Changes        string      `json:"changes"`
	Keeps          string      `json:"keeps"`
	PeakBytes      units.Bytes `json:"peak_bytes,omitempty"`
	PeakDeltaBytes units.Bytes `json:"peak_delta_bytes,omitempty"`
	PeakPhase      string      `json:"peak_phase,omitempty"`
	Fits           bool        `json:"fits"`
	// HostPerNodeBytes is the host memory one node pins (offload).
	HostPerNodeBytes units.Bytes `json:"host_per_node_bytes"`
	ExtraFLOPs       float64     `json:"extra_flops"`
	ExtraFLOPsRatio  float64     `json:"extra_flops_ratio"`
	StepS            float64     `json:"step_s,omitempty"`
	TokensPerS       float64     `json:"tokens_per_s,omitempty"`
	ThroughputRatio  float64     `json:"throughput_ratio,omitempty"`
	Plan             *PlanJSON   `json:"plan,omitempty"`
}

// CompareJSON is the machine form of `memplan compare`.
type CompareJSON struct {
	Schema        string           `json:"schema"`
	CapacityBytes units.Bytes      `json:"capacity_bytes"`
	Rows          []CompareRowJSON `json:"strategies"`
	// Warnings name inputs ignored or implausible (set by the CLI).
	Warnings []string `json:"warnings,omitempty"`
}

// Compare builds compare's report a row at a time (the baseline first), so
// that a row's plan can be dropped (engine.Result.Compact) once added: what
// the report says of a row is read when it is added, and of the baseline
// only what a compacted result keeps.
type Compare struct {
	full      bool
	j         CompareJSON
	base      *engine.Result
	baseFLOPs float64
}

// NewCompare starts a report; full adds each row's plan (no timeline) to
// the JSON form.
func NewCompare(full bool) *Compare {
	return &Compare{full: full, j: CompareJSON{Schema: "memplan.compare/v1"}}
}

// Add reads row into the report; the first row added is the baseline.
func (c *Compare) Add(r engine.Row) {
	if c.base == nil {
		c.base = r.Result
		c.j.CapacityBytes = r.Result.Capacity
		c.baseFLOPs = stepFLOPs(r.Result)
	}
	base := c.base
	j := CompareRowJSON{Strategy: r.Name, Changes: r.Changes, Keeps: r.Keeps, Applies: r.Err == nil}
	if r.Err != nil {
		j.Reason = r.Err.Error()
		c.j.Rows = append(c.j.Rows, j)
		return
	}
	res := r.Result
	if res.AutoNoneFits && base.Spec.Checkpoint.Kind != engine.CheckpointAuto {
		// compare's auto row: no blocks the DP picks fit, so it planned them all.
		j.Changes = "none fits: every block checkpointed"
	}
	j.PeakBytes = res.PeakBytes()
	j.PeakDeltaBytes = j.PeakBytes - base.PeakBytes()
	j.PeakPhase = res.Sim.Peak.Phase.String()
	j.Fits, j.HostPerNodeBytes = res.Fits, res.HostPerNode
	j.ExtraFLOPs = stepFLOPs(res) - c.baseFLOPs
	if c.baseFLOPs > 0 {
		j.ExtraFLOPsRatio = j.ExtraFLOPs / c.baseFLOPs
	}
	if t := res.Timing; t != nil {
		j.StepS, j.TokensPerS = t.Step.Seconds(), t.TokensPerSec
		if bt := base.Timing; bt != nil && bt.TokensPerSec > 0 {
			j.ThroughputRatio = t.TokensPerSec / bt.TokensPerSec
		}
	}
	if c.full {
		j.Plan = Build(res, 0)
	}
	c.j.Rows = append(c.j.Rows, j)
}

// JSON is the report's machine form.
func (c *Compare) JSON() *CompareJSON { return &c.j }

// WriteText writes the side-by-side table.
func (c *Compare) WriteText(w io.Writer) error {
	j, base := &c.j, c.base
	s := &base.Spec
	fmt.Fprintf(w, "memplan compare · %s · %s · micro-batch %d × seq %d · accum %d · %s · %s\n", s.JobName(), s.Mode, s.MicroBatch, s.Seq, s.Accum, s.PrecisionName(), chartOptimizer(s))
	if base.Capacity > 0 {
		where := "budget"
		if s.GPU != nil && s.Capacity == 0 {
			where = s.GPU.Name
		}
		fmt.Fprintf(w, "capacity %s (%s)\n", base.Capacity, where)
	}
	t := newTable()
	t.AppendHeader(table.Row{"strategy", "peak", "vs baseline", "host/node", "fits", "extra FLOPs", "step", "tokens/s", "throughput", "changes", "keeps"})
	for _, r := range j.Rows {
		if !r.Applies {
			t.AppendRow(table.Row{r.Strategy, "-", "-", "-", "-", "-", "-", "-", "-", "n/a: " + r.Reason, ""})
			continue
		}
		fits := "-"
		if base.Capacity > 0 {
			fits = "no"
			if r.Fits {
				fits = "yes"
			}
		}
		delta := "-"
		if r.Strategy != "baseline" {
			delta = fmt.Sprintf("%+.1f%%", 100*float64(r.PeakDeltaBytes)/float64(base.PeakBytes()))
		}
		step, tps, thr := "-", "-", "-"
		if r.StepS > 0 {
			step = fmt.Sprintf("%.1f ms", 1000*r.StepS)
			tps = fmt.Sprintf("%.0f", r.TokensPerS)
			if r.ThroughputRatio > 0 {
				thr = fmt.Sprintf("%.2f×", r.ThroughputRatio)
			}
		}
		host := "-"
		if r.HostPerNodeBytes > 0 {
			host = r.HostPerNodeBytes.String()
		}
		t.AppendRow(table.Row{r.Strategy, r.PeakBytes.String(), delta, host, fits, fmt.Sprintf("%+.1f%%", 100*r.ExtraFLOPsRatio), step, tps, thr, r.Changes, r.Keeps})
	}
	t.SetColumnConfigs([]table.ColumnConfig{{Number: 2, Align: text.AlignRight}, {Number: 3, Align: text.AlignRight}, {Number: 4, Align: text.AlignRight},
		{Number: 6, Align: text.AlignRight}, {Number: 7, Align: text.AlignRight}, {Number: 8, Align: text.AlignRight}, {Number: 9, Align: text.AlignRight},
		{Number: 10, WidthMax: 44, WidthMaxEnforcer: text.WrapSoft}, {Number: 11, WidthMax: 36, WidthMaxEnforcer: text.WrapSoft}})
	fmt.Fprintln(w, t.Render())
	if base.Timing != nil {
		fmt.Fprintln(w, strings.TrimSpace(`Times are a roofline upper bound on speed (ideal efficiency) on `+s.GPU.Name+`; compare them with each other, not with a stopwatch.`))
	}
	return nil
}

// stepFLOPs is the FLOPs of r's optimizer step: its timing's when priced,
// since a plan of more than three micro-steps simulates three and
// extrapolates the rest (engine.planShortAccum), so its program holds 3/k of
// them (probe: compare's "accumulate ×8" row had extra FLOPs of -62.5%);
// every pipeline stage's, not the slowest's (engine.Result.StepFLOPs).
func stepFLOPs(r *engine.Result) float64 {
	if r.Timing != nil {
		return r.StepFLOPs // every stage's: a strategy may change which is the slowest
	}
	return engine.TotalFLOPs(r.Program)
}
