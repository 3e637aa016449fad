package report

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/jedib0t/go-pretty/v6/table"
	"github.com/jedib0t/go-pretty/v6/text"

	"github.com/memplan/memplan/search"
	"github.com/memplan/memplan/units"
)

// FitPlanJSON is one plan of `memplan fit --json`: every choice the search
// makes, and the plan command that reproduces it.
type FitPlanJSON struct {
	Plan      string      `json:"plan"`
	PeakBytes units.Bytes `json:"peak_bytes"`
	// LimitBytes is the memory the plan must fit: one NCCL communicator
	// less for each of its parallel groups of more than one GPU.
	LimitBytes units.Bytes `json:"limit_bytes"`
	StepS      float64     `json:"step_s"`
	TokensPerS float64     `json:"tokens_per_s,omitempty"`
	MFU        float64     `json:"mfu,omitempty"`
	Verified   bool        `json:"verified"`
	// HostPerNodeBytes is the host memory one node pins (offloaded state
	// and activations of its GPUs): exact for verified plans, a lower
	// bound from shallow models for the others (search.Plan.HostPerNode).
	HostPerNodeBytes units.Bytes `json:"host_per_node_bytes"`
	MicroBatch       int         `json:"micro_batch"`
	Accum            int         `json:"accum"`
	ZeRO             int         `json:"zero"`
	TP               int         `json:"tp"`
	SP               bool        `json:"sp"`
	PP               int         `json:"pp"`
	DP               int         `json:"dp"`
	Checkpoint       string      `json:"checkpoint"`
	Offload          string      `json:"offload"`
	OptimizerImpl    string      `json:"optimizer_impl"`
	Command          string      `json:"command,omitempty"`
	Detail           *PlanJSON   `json:"detail,omitempty"`
}

// FitJSON is the machine form of `memplan fit`. LimitBytes is a plan's
// limit on one GPU, LimitPerGroupBytes what each parallel group of more
// than one GPU takes off it (absent when no plan has one, or under a
// budget); each plan's limit_bytes is its own.
type FitJSON struct {
	Schema             string        `json:"schema"`
	LimitBytes         units.Bytes   `json:"limit_bytes"`
	LimitPerGroupBytes units.Bytes   `json:"limit_per_group_bytes,omitempty"`
	Considered         int           `json:"considered"`
	Estimated          int           `json:"estimated"`
	Verified           int           `json:"verified"`
	Winner             FitPlanJSON   `json:"winner"`
	RunnersUp          []FitPlanJSON `json:"runners_up"`
	Front              []FitPlanJSON `json:"pareto_front"`
	// Pinned are the dimensions kept as given, Searched the others (field
	// keys: micro-batch, accum, tp, sp, pp, dp, zero, checkpoint, offload,
	// optimizer-impl).
	Pinned   []string `json:"pinned"`
	Searched []string `json:"searched"`
	Warnings []string `json:"warnings,omitempty"`
	// Emitted is the winner's framework config (fit --emit).
	Emitted *EmittedJSON `json:"emitted,omitempty"`
}

// EmittedJSON is the framework config fit --emit wrote for the winner: its
// text, or the file it went to.
type EmittedJSON struct {
	Framework string `json:"framework"`
	File      string `json:"file,omitempty"`
	Config    string `json:"config,omitempty"`
}

// FitOptions add what the CLI knows to fit's report.
type FitOptions struct {
	// Command, when set, is the `memplan plan` command line of a plan.
	Command func(*search.Plan) string
	// Warnings about the inputs (JSON only; the CLI prints them on stderr).
	Warnings []string
	// Emitted is the winner's framework config, when asked for.
	Emitted *EmittedJSON
}

func fitPlan(p *search.Plan, detail bool, o FitOptions) FitPlanJSON {
	s := &p.Spec
	j := FitPlanJSON{Plan: p.Describe(), PeakBytes: p.Peak(), LimitBytes: p.Limit, StepS: p.Step().Seconds(), Verified: p.Result != nil,
		MicroBatch: s.MicroBatch, Accum: s.Accum, ZeRO: s.ZeRO, TP: max(s.TP, 1), SP: s.SP, PP: max(s.PP, 1), DP: max(s.DP, 1),
		Checkpoint: s.Checkpoint.String(), Offload: s.Offload.String(), OptimizerImpl: s.Impl.String()}
	if j.Offload == "" {
		j.Offload = "none"
	}
	j.HostPerNodeBytes = p.HostPerNode()
	if p.Result != nil {
		j.TokensPerS, j.MFU = p.TokensPerSec(), p.MFU()
		if o.Command != nil {
			j.Command = o.Command(p)
		}
	}
	if detail && p.Result != nil {
		j.Detail = Build(p.Result, 0) // planned as plan plans it (search.Plan.Result)
	}
	return j
}

// WriteFitJSON writes the JSON form.
func WriteFitJSON(w io.Writer, r *search.Result, o FitOptions) error {
	j := FitJSON{Schema: "memplan.fit/v1", LimitBytes: r.Limit, LimitPerGroupBytes: r.LimitPerGroup, Considered: r.Considered, Estimated: r.Estimated, Verified: r.Verified,
		Winner: fitPlan(r.Winner, true, o), Pinned: r.Pinned.Names(), Searched: (search.AllPins &^ r.Pinned).Names(), Warnings: o.Warnings, Emitted: o.Emitted}
	if j.Pinned == nil {
		j.Pinned = []string{}
	}
	for _, p := range r.RunnersUp {
		j.RunnersUp = append(j.RunnersUp, fitPlan(p, false, o))
	}
	for _, p := range r.Front {
		j.Front = append(j.Front, fitPlan(p, false, o))
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(j)
}

// WriteFitText writes the search result for a person.
func WriteFitText(w io.Writer, r *search.Result, elapsed time.Duration, o FitOptions) error {
	win := r.Winner
	s := &win.Spec
	gpus := s.DP * s.TP * s.PP
	limit := r.Limit.String()
	if r.LimitPerGroup > 0 {
		limit += " on one GPU, less " + r.LimitPerGroup.String() + " per parallel group"
	}
	fmt.Fprintf(w, "memplan fit · %s · %d × %s · global batch %d · limit %s\n", s.JobName(), gpus, s.GPU.Name, s.MicroBatch*s.Accum*s.DP, limit)
	fmt.Fprintf(w, "searched %d plans: %d estimated on shallow models, %d verified on the full model (%s)\n\n",
		r.Considered, r.Estimated, r.Verified, elapsed.Round(time.Millisecond))
	pinned := "none"
	if names := r.Pinned.Names(); len(names) > 0 {
		pinned = strings.Join(names, ", ")
	}
	fmt.Fprintf(w, "pinned: %s; searched: %s\n\n", pinned, strings.Join((search.AllPins&^r.Pinned).Names(), ", "))
	fmt.Fprintf(w, "Fastest plan that fits: %s\n", win.Describe())
	res := win.Result
	fmt.Fprintf(w, "  peak %s in %s; step %s, %.0f tokens/s over the job, MFU %.1f%% (roofline upper bound)\n",
		res.PeakBytes(), res.Sim.Peak.Phase, win.Step().Round(time.Millisecond), win.TokensPerSec(), 100*win.MFU())
	fmt.Fprintf(w, "  host memory %s per node of %d GPUs%s\n", res.HostPerNode, res.Spec.GPUsOnNode(), hostLimit(res.Spec.HostMemory))
	if sim := res.SimAccum; sim > 0 {
		fmt.Fprintf(w, "  (simulated with %d micro-steps, whose peak equals that of %d; step time extrapolated)\n", sim, s.Accum)
	}
	if o.Command != nil {
		fmt.Fprintf(w, "  reproduce: %s\n", o.Command(win))
	}
	if len(r.RunnersUp) > 0 {
		t := newTable()
		t.SetTitle("Runners-up (verified)")
		t.AppendHeader(table.Row{"plan", "peak", "host/node", "step", "vs winner"})
		for _, p := range r.RunnersUp {
			t.AppendRow(table.Row{p.Describe(), p.Peak().String(), p.Result.HostPerNode.String(), p.Step().Round(time.Millisecond).String(),
				fmt.Sprintf("%+.1f%%", 100*(p.Step().Seconds()/win.Step().Seconds()-1))})
		}
		t.SetColumnConfigs([]table.ColumnConfig{{Number: 1, WidthMax: 90, WidthMaxEnforcer: text.WrapSoft}, {Number: 2, Align: text.AlignRight}, {Number: 3, Align: text.AlignRight}, {Number: 4, Align: text.AlignRight}, {Number: 5, Align: text.AlignRight}})
		fmt.Fprintln(w, t.Render())
		if o.Command != nil {
			for i, p := range r.RunnersUp {
				fmt.Fprintf(w, "  runner-up %d: %s\n", i+1, o.Command(p))
			}
		}
	}
	if len(r.Front) > 0 {
		t := newTable()
		t.SetTitle("Memory/time Pareto front (fastest first; estimates unless verified)")
		t.AppendHeader(table.Row{"plan", "peak", "host/node", "step", ""})
		for i, p := range r.Front {
			if i == 12 {
				t.AppendRow(table.Row{fmt.Sprintf("... %d more (see --json)", len(r.Front)-12), "", "", "", ""})
				break
			}
			peak, host, step, how := "≥ "+p.Peak().String(), "≥ "+p.HostPerNode().String(), "≈ "+p.Step().Round(time.Millisecond).String(), "estimated"
			if p.Result != nil {
				peak, host, step, how = p.Peak().String(), p.HostPerNode().String(), p.Step().Round(time.Millisecond).String(), "verified"
			}
			t.AppendRow(table.Row{p.Describe(), peak, host, step, how})
		}
		t.SetColumnConfigs([]table.ColumnConfig{{Number: 1, WidthMax: 90, WidthMaxEnforcer: text.WrapSoft}, {Number: 2, Align: text.AlignRight}, {Number: 3, Align: text.AlignRight}, {Number: 4, Align: text.AlignRight}})
		fmt.Fprintln(w, t.Render())
	}
	fmt.Fprintln(w, "Step times are a roofline upper bound on speed; peaks and host memory of verified plans are exact simulations, estimated ones lower bounds from shallow models.")
	if e := o.Emitted; e != nil {
		if e.File != "" {
			fmt.Fprintf(w, "\nThe winner's %s config: %s\n", e.Framework, e.File)
		} else {
			fmt.Fprintf(w, "\nThe winner's %s config (--emit-out FILE writes it to a file):\n%s", e.Framework, e.Config)
		}
	}
	return nil
}

// hostLimit says the host limit a plan was held to, if any.
func hostLimit(limit units.Bytes) string {
	if limit <= 0 {
		return ""
	}
	return " (limit " + limit.String() + ")"
}
