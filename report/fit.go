package report

import (
	"encoding/json"
	"fmt"
	"io"
	"time"

	"github.com/jedib0t/go-pretty/v6/table"
	"github.com/jedib0t/go-pretty/v6/text"

	"github.com/memplan/memplan/search"
	"github.com/memplan/memplan/units"
)

// FitPlanJSON is one plan of `memplan fit --json`.
type FitPlanJSON struct {
	Plan       string      `json:"plan"`
	PeakBytes  units.Bytes `json:"peak_bytes"`
	StepS      float64     `json:"step_s"`
	TokensPerS float64     `json:"tokens_per_s,omitempty"`
	MFU        float64     `json:"mfu,omitempty"`
	Verified   bool        `json:"verified"`
	Detail     *PlanJSON   `json:"detail,omitempty"`
}

// FitJSON is the machine form of `memplan fit`.
type FitJSON struct {
	Schema     string        `json:"schema"`
	LimitBytes units.Bytes   `json:"limit_bytes"`
	Considered int           `json:"considered"`
	Estimated  int           `json:"estimated"`
	Verified   int           `json:"verified"`
	Winner     FitPlanJSON   `json:"winner"`
	RunnersUp  []FitPlanJSON `json:"runners_up"`
	Front      []FitPlanJSON `json:"pareto_front"`
}

func fitPlan(p *search.Plan, detail bool) FitPlanJSON {
	j := FitPlanJSON{Plan: p.Describe(), PeakBytes: p.Peak(), StepS: p.Step().Seconds(), Verified: p.Result != nil}
	if p.Result != nil {
		j.TokensPerS, j.MFU = p.TokensPerSec(), p.MFU()
	}
	if detail && p.Result != nil {
		j.Detail = Build(p.Result, false)
	}
	return j
}

// WriteFitJSON writes the JSON form.
func WriteFitJSON(w io.Writer, r *search.Result) error {
	j := FitJSON{Schema: "memplan.fit/v1", LimitBytes: r.Limit, Considered: r.Considered, Estimated: r.Estimated, Verified: r.Verified,
		Winner: fitPlan(r.Winner, true)}
	for _, p := range r.RunnersUp {
		j.RunnersUp = append(j.RunnersUp, fitPlan(p, false))
	}
	for _, p := range r.Front {
		j.Front = append(j.Front, fitPlan(p, false))
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(j)
}

// WriteFitText writes the search result for a person.
func WriteFitText(w io.Writer, r *search.Result, elapsed time.Duration) error {
	win := r.Winner
	s := &win.Spec
	gpus := s.DP * s.TP * s.PP
	fmt.Fprintf(w, "memplan fit · %s · %d × %s · global batch %d · limit %s\n", s.JobName(), gpus, s.GPU.Name, s.MicroBatch*s.Accum*s.DP, r.Limit)
	fmt.Fprintf(w, "searched %d plans: %d estimated on shallow models, %d verified on the full model (%s)\n\n",
		r.Considered, r.Estimated, r.Verified, elapsed.Round(time.Millisecond))
	fmt.Fprintf(w, "Fastest plan that fits: %s\n", win.Describe())
	res := win.Result
	fmt.Fprintf(w, "  peak %s in %s; step %s, %.0f tokens/s over the job, MFU %.1f%% (roofline upper bound)\n",
		res.PeakBytes(), res.Sim.Peak.Phase, win.Step().Round(time.Millisecond), win.TokensPerSec(), 100*win.MFU())
	if sim := res.Spec.Accum; sim < s.Accum {
		fmt.Fprintf(w, "  (simulated with %d micro-steps, whose peak equals that of %d; step time extrapolated)\n", sim, s.Accum)
	}
	if len(r.RunnersUp) > 0 {
		t := newTable()
		t.SetTitle("Runners-up (verified)")
		t.AppendHeader(table.Row{"plan", "peak", "step", "vs winner"})
		for _, p := range r.RunnersUp {
			t.AppendRow(table.Row{p.Describe(), p.Peak().String(), p.Step().Round(time.Millisecond).String(),
				fmt.Sprintf("%+.1f%%", 100*(p.Step().Seconds()/win.Step().Seconds()-1))})
		}
		t.SetColumnConfigs([]table.ColumnConfig{{Number: 1, WidthMax: 90, WidthMaxEnforcer: text.WrapSoft}, {Number: 2, Align: text.AlignRight}, {Number: 3, Align: text.AlignRight}, {Number: 4, Align: text.AlignRight}})
		fmt.Fprintln(w, t.Render())
	}
	if len(r.Front) > 0 {
		t := newTable()
		t.SetTitle("Memory/time Pareto front (estimates; fastest first)")
		t.AppendHeader(table.Row{"plan", "peak ≥", "step ≈"})
		for i, p := range r.Front {
			if i == 12 {
				t.AppendRow(table.Row{fmt.Sprintf("... %d more (see --json)", len(r.Front)-12), "", ""})
				break
			}
			t.AppendRow(table.Row{p.Describe(), p.EstPeak.String(), p.EstStep.Round(time.Millisecond).String()})
		}
		t.SetColumnConfigs([]table.ColumnConfig{{Number: 1, WidthMax: 90, WidthMaxEnforcer: text.WrapSoft}, {Number: 2, Align: text.AlignRight}, {Number: 3, Align: text.AlignRight}})
		fmt.Fprintln(w, t.Render())
	}
	fmt.Fprintln(w, "Step times are a roofline upper bound on speed; peaks of verified plans are exact simulations, front peaks are lower bounds from shallow models.")
	return nil
}
