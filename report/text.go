package report

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/jedib0t/go-pretty/v6/table"
	"github.com/jedib0t/go-pretty/v6/text"

	"github.com/memplan/memplan/engine"
	"github.com/memplan/memplan/ir"
	"github.com/memplan/memplan/models"
	"github.com/memplan/memplan/units"
)

// TextOptions control the human report.
type TextOptions struct {
	// Chart draws the timeline in the terminal.
	Chart bool
	// Width and Height of the chart in cells (defaults 72 × 14).
	Width, Height int
	// TopModules is how many blocks of saved activations to list (default 6).
	TopModules int
	// NextStep, when set, is the largest lever of compare, printed under
	// the verdict of a job that does not fit.
	NextStep *engine.Row
}

func pct(a, b units.Bytes) string {
	if b == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f%%", 100*float64(a)/float64(b))
}

func where(name, module string) string {
	if module == "" {
		return name
	}
	return name + " (" + module + ")"
}

// WriteText writes the report a person reads: the header, the peak and the verdict, the ledger at the peak,
// each phase's peak, model states, step time, what forward saved, and the chart.
func WriteText(w io.Writer, res *engine.Result, o TextOptions) error {
	t, err := PrepareText(res, o)
	if err != nil {
		return err
	}
	return t.Write(w, o.NextStep)
}

// Text is WriteText's report drawn from a result, but for the next step:
// what reads the result's programs and timelines is done, so the result may
// be compacted (engine.Result.Compact) before the next step is planned and
// the report written (plan: deepseek-v3's first-step program and timelines
// were live beside the next step's programs).
type Text struct {
	head, body string
}

// PrepareText draws res's report as WriteText does, o.NextStep aside.
func PrepareText(res *engine.Result, o TextOptions) (*Text, error) {
	if o.Width == 0 {
		o.Width = 72
	}
	if o.Height == 0 {
		o.Height = 14
	}
	if o.TopModules == 0 {
		o.TopModules = 6
	}
	var h, b strings.Builder
	fmt.Fprintln(&h, textHeader(res))
	writePeakLines(&h, res)
	writeReservedLine(&h, res)
	fmt.Fprintln(&b)
	fmt.Fprintln(&b, ledgerTable(res).Render())
	fmt.Fprintln(&b, phaseTable(res).Render())
	writeModelStates(&b, res)
	writeTiming(&b, res)
	writeSaved(&b, res, o.TopModules)
	if o.Chart {
		fmt.Fprintln(&b)
		if err := TerminalChart(&b, res, o.Width, o.Height); err != nil {
			return nil, err
		}
	}
	return &Text{head: h.String(), body: b.String()}, nil
}

// Write writes the report with next (nil: none) under the verdict.
func (t *Text) Write(w io.Writer, next *engine.Row) error {
	var n strings.Builder
	writeNextStep(&n, next)
	_, err := io.WriteString(w, t.head+n.String()+t.body)
	return err
}

// optimizerStep names the optimizer step planned: "adamw (foreach)"; for
// a trace replaying its own, what it recorded and no more ("sgd (single)
// as recorded", "sgd as recorded" where it does not record the
// implementation, "optimizer step as recorded" where it names none).
func optimizerStep(s *engine.Spec) string {
	name, impl := s.OptimizerName(), s.ImplName()
	if name == "" {
		name = "optimizer step"
	}
	if impl != "" {
		name += " (" + impl + ")"
	}
	if s.Trace != nil && !s.TraceOptimizer {
		name += " as recorded"
	}
	return name
}

// chartOptimizer is the optimizer a title names: a model's, and a trace's
// step as optimizerStep names it (what it recorded, or its replacement).
func chartOptimizer(s *engine.Spec) string {
	if s.Trace == nil {
		return s.Optimizer.String()
	}
	return optimizerStep(s)
}

// textHeader is the first line: the job, its size, mode and settings.
func textHeader(res *engine.Result) string {
	s, r := &res.Spec, res.Sim
	per := ""
	if s.TP > 1 || s.EP > 1 || s.PP > 1 {
		per = " on this GPU" // a stage's, not the model's (sweep F, round 25: a trace's said the model's)
	}
	if s.Trace != nil {
		head := fmt.Sprintf("memplan · %s (trace, %s params%s) · train · micro-batch %d", s.JobName(), models.HumanCount(r.Params), per, s.MicroBatch)
		if s.Trace.HasSeq() {
			head += fmt.Sprintf(" × seq %d", s.Seq)
		}
		head += fmt.Sprintf(" · accum %d%s · %s · %s", s.Accum, simulated(res), s.PrecisionName(), optimizerStep(s)) + parallelism(s)
		if s.Checkpoint.Kind != engine.NoCheckpoint {
			head += " · checkpoint " + s.Checkpoint.String()
		}
		return head
	}
	head := fmt.Sprintf("memplan · %s (%s params%s) · %s · micro-batch %d × seq %d", s.JobName(), models.HumanCount(r.Params), per, s.Mode, s.MicroBatch, s.Seq)
	if s.Mode != engine.Train {
		return head + fmt.Sprintf(" · +%d generated · %s · %s attention", s.GenTokens, s.Precision, s.Attention)
	}
	head += fmt.Sprintf(" · accum %d%s · %s · %s (%s) · %s attention", s.Accum, simulated(res), s.Precision, s.Optimizer, s.Impl, s.Attention)
	head += parallelism(s)
	if s.Sem.Recipe != "" {
		head += " · recipe " + s.Sem.Recipe
	}
	if s.Checkpoint.Kind != engine.NoCheckpoint {
		head += " · checkpoint " + s.Checkpoint.String()
		switch auto := res.AutoCheckpointed; {
		case s.Checkpoint.Kind != engine.CheckpointAuto:
		case res.AutoNoneFits:
			head += fmt.Sprintf(" (none fits: all %d blocks)", len(auto))
		default:
			head += fmt.Sprintf(" (%d blocks)", len(auto))
		}
	}
	return head
}

// simulated says how many of the micro-steps were simulated when fewer
// than all were (engine.Result.SimAccum).
func simulated(res *engine.Result) string {
	if res.SimAccum == 0 {
		return ""
	}
	return fmt.Sprintf(" (%d simulated: the micro-steps between the first and the last hold the same memory)", res.SimAccum)
}

// microStep names micro-step m (0-based) of the simulated program in the
// plan's micro-steps: with fewer simulated, the last simulated is the
// plan's last and the ones between stand for every micro-step between.
func microStep(res *engine.Result, m int) string {
	k := res.SimAccum
	switch {
	case k == 0 || m == 0:
		return fmt.Sprint(m + 1)
	case m == k-1:
		return fmt.Sprint(res.Spec.Accum)
	default:
		return fmt.Sprintf("2–%d", res.Spec.Accum-1)
	}
}

// opNumber is op i (from 0) of a program of n ops as the text names it:
// "op 439 of 875 (op_index 438)". The text counts ops as it counts
// micro-steps and stages, from 1 ("micro-step 2 of 2"); the JSON's indexes
// count from 0, and the text said "op 439" for the JSON's op_index 438
// without saying so.
func opNumber(i, n int) string { return fmt.Sprintf("op %d of %d (op_index %d)", i+1, n, i) }

// writePeakLines writes where the peak is, the host peak, whether it fits, and a higher first step.
func writePeakLines(b *strings.Builder, res *engine.Result) {
	s, p, r := &res.Spec, res.Program, res.Sim
	name, module := res.PeakOp()
	fmt.Fprintf(b, "\nPeak %s in %s at %s, %s", r.Peak.Total, r.Peak.Phase, where(name, module), opNumber(r.Peak.Op, len(p.Ops)))
	switch {
	case p.MicroBatches > 1 && r.Peak.Phase == ir.Optimizer:
		// The optimizer steps once, after every micro-step (its ops carry
		// micro-step 0: "micro-step 1 of 2" was wrong).
		fmt.Fprintf(b, ", after the last of %d micro-steps", max(p.MicroBatches, s.Accum))
	case p.MicroBatches > 1:
		fmt.Fprintf(b, ", micro-step %s of %d", microStep(res, r.Peak.Micro), max(p.MicroBatches, s.Accum))
	}
	if len(res.StagePeaks) > 1 {
		var sp []string
		for _, v := range res.StagePeaks {
			sp = append(sp, v.String())
		}
		fmt.Fprintf(b, ", pipeline stage %d of %d (stage peaks %s)", res.Stage+1, len(res.StagePeaks), strings.Join(sp, ", "))
	}
	fmt.Fprintln(b)
	if res.HostPeak > 0 {
		fmt.Fprintf(b, "Host memory peak %s per GPU, %s per node of %d GPUs (offloaded state and activations, pinned)\n", res.HostPeak, res.HostPerNode, s.GPUsOnNode())
	}
	if res.HostShortfall > 0 {
		fmt.Fprintf(b, "DOES NOT FIT in host memory: %s per node, %s over --host-memory %s\n", res.HostPerNode, res.HostShortfall, s.HostMemory)
	}
	if res.Capacity > 0 {
		gpu := "the budget"
		if s.GPU != nil && s.Capacity == 0 {
			gpu = s.GPU.Name
		}
		if res.Shortfall == 0 {
			fmt.Fprintf(b, "Fits on %s (%s usable): %s to spare (%s of capacity used)\n", gpu, res.Capacity, res.Headroom, pct(res.Capacity-res.Headroom, res.Capacity))
		} else {
			fmt.Fprintf(b, "DOES NOT FIT on %s (%s usable): needs %s more\n", gpu, res.Capacity, res.Shortfall)
		}
	}
	if res.First != nil && res.First.Peak.Total > r.Peak.Total {
		fp := res.First.Peak
		op := &res.FirstProgram.Ops[fp.Op]
		fmt.Fprintf(b, "First step peaks higher: %s in %s at %s (optimizer state created lazily)\n", fp.Total, fp.Phase, where(op.Name, op.Module))
	}
}

// writeNextStep names the largest lever of compare and what it leaves.
func writeNextStep(b *strings.Builder, row *engine.Row) {
	if row == nil {
		return
	}
	r := row.Result
	verdict := "fits"
	switch {
	case r.Shortfall > 0:
		verdict = fmt.Sprintf("still %s short; memplan fit searches combinations", r.Shortfall)
	case !r.Fits:
		verdict = fmt.Sprintf("but %s over --host-memory; memplan fit searches combinations", r.HostShortfall)
	}
	fmt.Fprintf(b, "Next step: %s lowers the peak most, to %s (%s): %s\n", row.Name, r.PeakBytes(), verdict, row.Changes)
}

// ledgerTable is the ledger at the peak, by category.
func ledgerTable(res *engine.Result) table.Writer {
	r := res.Sim
	t := newTable()
	t.SetTitle("Ledger at the peak")
	t.AppendHeader(table.Row{"category", "bytes", "share"})
	for c := ir.Category(0); c < ir.NumCategories; c++ {
		if v := r.Peak.Cat[c]; v != 0 {
			t.AppendRow(table.Row{c.String(), v.String(), pct(v, r.Peak.Total)})
		}
	}
	t.AppendFooter(table.Row{"total", r.Peak.Total.String(), ""})
	t.SetColumnConfigs([]table.ColumnConfig{{Number: 2, Align: text.AlignRight, AlignFooter: text.AlignRight}, {Number: 3, Align: text.AlignRight}})
	return t
}

// phaseTable is each phase's peak and the op it is at.
func phaseTable(res *engine.Result) table.Writer {
	pt := newTable()
	pt.SetTitle("Peak of each phase")
	pt.AppendHeader(table.Row{"phase", "peak", "at op"})
	for ph := ir.Phase(0); ph < ir.NumPhases; ph++ {
		pp := res.Sim.PhasePeak[ph]
		if pp.Op < 0 {
			continue
		}
		op := &res.Program.Ops[pp.Op]
		pt.AppendRow(table.Row{ph.String(), pp.Total.String(), where(op.Name, op.Module)})
	}
	pt.SetColumnConfigs([]table.ColumnConfig{{Number: 2, Align: text.AlignRight}})
	return pt
}

// writeModelStates writes the model states of a training job, or the weights and KV cache of inference.
func writeModelStates(b *strings.Builder, res *engine.Result) {
	r := res.Sim
	ms := r.ModelStates
	if res.Spec.Mode == engine.Train && r.Params > 0 {
		tot := ms.Parameters + ms.Gradients + ms.OptimizerState
		fmt.Fprintf(b, "Model states: parameters %s + gradients %s + optimizer state %s = %s (%.2f bytes/param)\n",
			ms.Parameters, ms.Gradients, ms.OptimizerState, tot, float64(tot)/float64(r.Params))
		return
	}
	fmt.Fprintf(b, "Weights %s", ms.Parameters)
	if kv := r.Peak.Cat[ir.KVCache]; kv > 0 {
		fmt.Fprintf(b, " · KV cache %s", kv)
	}
	fmt.Fprintf(b, " · peak working set %s\n", r.Peak.Total-ms.Parameters-r.Peak.Cat[ir.KVCache])
}

// writeTiming writes the step time by phase and the throughput, when the job was priced.
func writeTiming(b *strings.Builder, res *engine.Result) {
	t := res.Timing
	if t == nil {
		return
	}
	fmt.Fprintf(b, "Step time %s on %s at the roofline (ideal efficiency: an upper bound on speed): forward %s, backward %s, optimizer %s",
		t.Step.Round(10*time.Microsecond), res.Spec.GPU.Name, t.Phases[ir.Forward].Wall.Round(10*time.Microsecond),
		t.Phases[ir.Backward].Wall.Round(10*time.Microsecond), t.Phases[ir.Optimizer].Wall.Round(10*time.Microsecond))
	if t.Recompute > 0 {
		fmt.Fprintf(b, ", recompute %s", t.Recompute.Round(10*time.Microsecond))
	}
	if t.FLOPs == 0 && res.Spec.Trace != nil {
		// A trace exported on PyTorch 1.13 (or before FLOPs were recorded)
		// has none (docs/trace-format.md): its ops are priced on their
		// bytes, and no utilization can be given; "MFU 0.0%" read as a
		// measurement (trace sweep, round 24).
		fmt.Fprintf(b, "; %.0f tokens/s, MFU n/a (this trace records no FLOPs: its ops are priced on the bytes they move; memplan_torch on PyTorch 2.1 or later records them)\n", t.TokensPerSec)
		return
	}
	fmt.Fprintf(b, "; %.0f tokens/s, MFU %.1f%%\n", t.TokensPerSec, 100*t.MFU)
}

// writeSaved writes what forward saved for backward and the top modules that saved it.
func writeSaved(b *strings.Builder, res *engine.Result, top int) {
	r := res.Sim
	if r.SavedTotal <= 0 {
		return
	}
	rows := r.SortedSaved(res.Program)
	fmt.Fprintf(b, "Saved for backward at the end of forward: %s in %d modules", r.SavedTotal, len(rows))
	sort.SliceStable(rows, func(i, j int) bool { return rows[i].Bytes > rows[j].Bytes })
	if len(rows) > top {
		rows = rows[:top]
	}
	var parts []string
	for _, m := range rows {
		name := m.Module
		if name == "" {
			name = "(top level)"
		}
		parts = append(parts, fmt.Sprintf("%s %s", name, m.Bytes))
	}
	fmt.Fprintf(b, "; largest: %s\n", strings.Join(parts, ", "))
}

// newTable is a light-style table whose header and footer keep their case.
func newTable() table.Writer {
	t := table.NewWriter()
	t.SetStyle(table.StyleLight)
	t.Style().Format.Header = text.FormatDefault
	t.Style().Format.Footer = text.FormatDefault
	return t
}

// parallelism describes the sharding and adapter options of s for the
// header line ("" when none).
func parallelism(s *engine.Spec) string {
	var parts []string
	if s.TP > 1 {
		t := fmt.Sprintf("tp %d", s.TP)
		if s.SP {
			t += " + sp"
		}
		parts = append(parts, t)
	}
	if s.EP > 1 {
		parts = append(parts, fmt.Sprintf("ep %d", s.EP))
	}
	if s.PP > 1 {
		parts = append(parts, fmt.Sprintf("pp %d (%s)", s.PP, ppSchedule(s)))
	}
	if s.DP > 1 {
		d := fmt.Sprintf("dp %d", s.DP)
		if s.ZeRO > 0 {
			d += fmt.Sprintf(" ZeRO-%d", s.ZeRO)
		}
		parts = append(parts, d)
	}
	if s.Offload.Any() {
		parts = append(parts, "offload "+s.Offload.String())
	}
	if s.LoRA != nil {
		l := fmt.Sprintf("lora r=%d", s.LoRA.Rank)
		if s.QLoRA {
			l = "q" + l
		}
		parts = append(parts, l)
	}
	if len(parts) == 0 {
		return ""
	}
	return " · " + strings.Join(parts, " · ")
}

func ppSchedule(s *engine.Spec) string {
	sched := s.PPSchedule.String()
	if s.PPInterleave > 1 {
		sched += fmt.Sprintf(", %d virtual", s.PPInterleave)
	}
	return sched
}
