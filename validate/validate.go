// Package validate checks memplan's predictions against real runs: it
// predicts each measured workload (memplan.measured/v1, written by
// python/memplan_torch) from its recorded trace, at the measured micro-batch,
// accumulation and strategy, and compares per-phase peaks of the steady step
// and of the first step. It does no I/O beyond loading the measured file.
package validate

import (
	"bytes"
	"fmt"
	"math"
	"sort"
	"strings"

	"github.com/memplan/memplan/importer/torchtrace"
	"github.com/memplan/memplan/ir"
	"github.com/memplan/memplan/plan"
	"github.com/memplan/memplan/sim"
	"github.com/memplan/memplan/strategy"
	"github.com/memplan/memplan/workload"
)

func bytesReader(b []byte) *bytes.Reader { return bytes.NewReader(b) }

// Counter says what the measurement counted, so the prediction counts the
// same: the CPU tracker ignores allocations under its threshold and sees
// oneDNN scratch; the CUDA caching allocator rounds to 512-byte blocks.
type Counter struct {
	MinBytes    int64
	Granularity int64
	Scratch     bool // include the trace's recorded in-kernel scratch
}

// CounterFor is the counter of a measured case, for a trace.
func CounterFor(m Memory, tr *torchtrace.Trace) Counter {
	switch m.Kind {
	case "cuda_caching_allocator":
		return Counter{Granularity: 512}
	default:
		thr := m.Threshold
		if thr == 0 {
			thr = 1024
		}
		return Counter{MinBytes: thr, Scratch: tr.TraceDevice == "cpu" && tr.ScratchKind == "measured"}
	}
}

// Prediction is what memplan predicts for one workload.
type Prediction struct {
	Case string
	// Pending is set when the case cannot be predicted yet (a strategy
	// memplan does not apply to traces); Steady and First are then zero.
	Pending string
	Steady  Phases
	First   Phases
}

// Predict predicts w from its trace with the counter of w's device (CPU:
// the tracker's 1024-byte threshold and recorded scratch; CUDA: 512-byte
// blocks).
func Predict(w *workload.Workload, tr *torchtrace.Trace) (Prediction, error) {
	kind := "memtrack"
	if w.Device == "cuda" {
		kind = "cuda_caching_allocator"
	}
	return PredictWith(w, tr, CounterFor(Memory{Kind: kind}, tr))
}

// PredictWith predicts w from its trace, counting as c does.
func PredictWith(w *workload.Workload, tr *torchtrace.Trace, c Counter) (Prediction, error) {
	pr := Prediction{Case: w.Name}
	if w.Strategy.Offload != "none" {
		// On a CPU the "host" is the same memory: offload cases are
		// measured for their time only and not compared here.
		pr.Pending = "activation offload moves nothing off a CPU device"
		return pr, nil
	}
	var ckpt strategy.Transform
	if w.Checkpointed() {
		blocks := ""
		if w.Strategy.CheckpointBlocks != nil {
			blocks = *w.Strategy.CheckpointBlocks
		} else {
			blocks = BlockList(tr)
		}
		if blocks == "" {
			return pr, fmt.Errorf("validate: %s: strategy.checkpoint blocks: the trace has no indexed module list (name one with checkpoint_blocks)", w.Name)
		}
		// Non-reentrant torch.utils.checkpoint on each block, as measured.
		ckpt = &strategy.Checkpoint{Patterns: []string{blocks + ".*"}}
	}
	o := torchtrace.Options{Batch: w.MicroBatch(), Accum: w.Strategy.Accumulation, NoScratch: !c.Scratch,
		MinBytes: c.MinBytes, Granularity: c.Granularity, FullBatchInputs: true}
	if w.SeqLen != nil && tr.HasSeq() {
		o.Seq = *w.SeqLen
	} else if w.SeqLen != nil && int64(*w.SeqLen) != tr.TraceSeq && tr.TraceSeq != 0 {
		return pr, fmt.Errorf("validate: %s: seq_len %d differs from the trace's %d, which has no sequence size model", w.Name, *w.SeqLen, tr.TraceSeq)
	}
	opt, err := optimizerFor(w, tr)
	if err != nil {
		return pr, err
	}
	o.Optimizer = opt
	for _, first := range []bool{false, true} {
		o.FirstStep = first
		p, err := tr.Program(o)
		if err != nil {
			return pr, err
		}
		if ckpt != nil {
			if p, err = strategy.Chain(p, ckpt); err != nil {
				return pr, err
			}
		}
		r, err := sim.Run(p)
		if err != nil {
			return pr, err
		}
		ph := Phases{Forward: peakOf(r, ir.Forward), Backward: peakOf(r, ir.Backward), Optimizer: peakOf(r, ir.Optimizer)}
		if first {
			pr.First = ph
		} else {
			pr.Steady = ph
		}
	}
	return pr, nil
}

func peakOf(r *sim.Result, ph ir.Phase) int64 {
	if r.PhasePeak[ph].Op < 0 {
		return 0
	}
	return int64(r.PhasePeak[ph].Total)
}

// optimizerFor keeps the recorded optimizer when the workload runs the same
// one, else swaps in plan.OptimizerStep.
func optimizerFor(w *workload.Workload, tr *torchtrace.Trace) (*plan.TrainConfig, error) {
	foreach := w.Foreach != nil && *w.Foreach
	traced := tr.Foreach != nil && *tr.Foreach
	if w.Optimizer == tr.Optimizer && foreach == traced {
		return nil, nil
	}
	o, err := plan.ParseOptimizer(w.Optimizer)
	if err != nil {
		return nil, fmt.Errorf("validate: %s: %w", w.Name, err)
	}
	impl := plan.Single
	if foreach {
		impl = plan.Foreach
	}
	return &plan.TrainConfig{Optimizer: o, Impl: impl, WeightDecay: -1}, nil
}

// BlockList guesses the module list a "blocks" checkpoint wraps, as
// memplan_torch does without checkpoint_blocks: the module path with the
// most indexed children ("layers" for layers.0 … layers.3).
func BlockList(tr *torchtrace.Trace) string {
	kids := map[string]map[string]bool{}
	for _, e := range tr.Events {
		parts := strings.Split(e.Module, ".")
		for i := 1; i < len(parts); i++ {
			if parts[i] != "" && strings.Trim(parts[i], "0123456789") == "" {
				parent := strings.Join(parts[:i], ".")
				if kids[parent] == nil {
					kids[parent] = map[string]bool{}
				}
				kids[parent][parts[i]] = true
			}
		}
	}
	best, n := "", 1
	names := make([]string, 0, len(kids))
	for k := range kids {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		if len(kids[k]) > n {
			best, n = k, len(kids[k])
		}
	}
	return best
}

// Row is one compared phase peak.
type Row struct {
	Case      string  `json:"case"`
	Step      string  `json:"step"` // steady | first
	Phase     string  `json:"phase"`
	Predicted int64   `json:"predicted_bytes"`
	Measured  int64   `json:"measured_bytes"`
	Error     float64 `json:"error"` // (predicted − measured) / measured
	Pending   string  `json:"pending,omitempty"`
}

// CaseResult sums up one case.
type CaseResult struct {
	Case string `json:"case"`
	// Peak phase of the steady step, predicted and measured, and of the first
	// step; PeakRight when both agree.
	PredictedPeakPhase      string  `json:"predicted_peak_phase"`
	MeasuredPeakPhase       string  `json:"measured_peak_phase"`
	FirstPredictedPeakPhase string  `json:"first_predicted_peak_phase"`
	FirstMeasuredPeakPhase  string  `json:"first_measured_peak_phase"`
	PeakRight               bool    `json:"peak_phase_right"`
	PeakError               float64 `json:"peak_error"` // steady step's peak
	WorstError              float64 `json:"worst_error"`
	Pending                 string  `json:"pending,omitempty"`
}

// Report is the comparison of a measured file with its predictions.
type Report struct {
	Schema    string       `json:"schema"`
	Rows      []Row        `json:"rows"`
	Cases     []CaseResult `json:"cases"`
	Compared  int          `json:"compared_cases"`
	Peaks     int          `json:"phase_peaks"`
	Median    float64      `json:"median_abs_error"`
	Worst     float64      `json:"worst_abs_error"`
	WorstAt   string       `json:"worst_at"`
	PeakRight int          `json:"peak_phase_right"`
	Pending   int          `json:"pending_cases"`
	Tolerance float64      `json:"tolerance"`
	Pass      bool         `json:"pass"`
}

// ReportSchema versions the JSON form of a Report.
const ReportSchema = "memplan.validation/v1"

// Compare compares predictions (matched to cases by name) with a measured
// file. A case passes when every phase peak of both steps is within
// tolerance (relative) and the peak phase is right; pending cases are
// listed and neither pass nor fail.
func Compare(m *Measured, preds []Prediction, tolerance float64) Report {
	rep := Report{Schema: ReportSchema, Tolerance: tolerance, Pass: true}
	byName := map[string]Prediction{}
	for _, p := range preds {
		byName[p.Case] = p
	}
	var errs []float64
	for _, c := range m.Cases {
		p, ok := byName[c.Name]
		cr := CaseResult{Case: c.Name}
		if !ok {
			p.Pending = "no prediction"
			rep.Pass = false
		}
		if p.Pending != "" {
			cr.Pending = p.Pending
			rep.Pending++
			rep.Cases = append(rep.Cases, cr)
			for _, ph := range PhaseNames {
				rep.Rows = append(rep.Rows, Row{Case: c.Name, Step: "steady", Phase: ph, Measured: c.Phases.Get(ph), Pending: p.Pending})
			}
			continue
		}
		rep.Compared++
		for _, step := range []struct {
			name      string
			pred, mea Phases
		}{{"steady", p.Steady, c.Phases}, {"first", p.First, c.First}} {
			for _, ph := range PhaseNames {
				r := Row{Case: c.Name, Step: step.name, Phase: ph, Predicted: step.pred.Get(ph), Measured: step.mea.Get(ph)}
				r.Error = relErr(r.Predicted, r.Measured)
				rep.Rows = append(rep.Rows, r)
				rep.Peaks++
				a := math.Abs(r.Error)
				errs = append(errs, a)
				if a > cr.WorstError {
					cr.WorstError = a
				}
				if a > rep.Worst || rep.WorstAt == "" {
					if a >= rep.Worst {
						rep.Worst = a
						rep.WorstAt = fmt.Sprintf("%s %s %s", c.Name, step.name, ph)
					}
				}
				if a > tolerance {
					rep.Pass = false
				}
			}
		}
		var pp, mp int64
		cr.PredictedPeakPhase, pp = p.Steady.Peak()
		cr.MeasuredPeakPhase, mp = c.Phases.Peak()
		cr.FirstPredictedPeakPhase, _ = p.First.Peak()
		cr.FirstMeasuredPeakPhase, _ = c.First.Peak()
		cr.PeakError = relErr(pp, mp)
		cr.PeakRight = cr.PredictedPeakPhase == cr.MeasuredPeakPhase && cr.FirstPredictedPeakPhase == cr.FirstMeasuredPeakPhase
		if cr.PeakRight {
			rep.PeakRight++
		} else {
			rep.Pass = false
		}
		rep.Cases = append(rep.Cases, cr)
	}
	if len(errs) > 0 {
		sort.Float64s(errs)
		n := len(errs)
		if n%2 == 1 {
			rep.Median = errs[n/2]
		} else {
			rep.Median = (errs[n/2-1] + errs[n/2]) / 2
		}
	}
	if rep.Compared == 0 {
		rep.Pass = false
	}
	return rep
}

func relErr(pred, meas int64) float64 {
	if meas == 0 {
		if pred == 0 {
			return 0
		}
		return math.Inf(1)
	}
	return float64(pred-meas) / float64(meas)
}

// Summary is the one-line verdict: "8 cases, 48 phase peaks: median 0.4%,
// worst 2.1%, peak phase right in 8/8".
func (r *Report) Summary() string {
	s := fmt.Sprintf("%d cases, %d phase peaks: median %s, worst %s", r.Compared, r.Peaks, Pct(r.Median), Pct(r.Worst))
	if r.WorstAt != "" {
		s += " (" + r.WorstAt + ")"
	}
	s += fmt.Sprintf(", peak phase right in %d/%d", r.PeakRight, r.Compared)
	if r.Pending > 0 {
		s += fmt.Sprintf("; %d pending", r.Pending)
	}
	verdict := "PASS"
	if !r.Pass {
		verdict = "FAIL"
	}
	return s + fmt.Sprintf("; %s at tolerance %s", verdict, Pct(r.Tolerance))
}

// Pct formats a fraction as a percentage with one decimal (two below 1%).
func Pct(f float64) string {
	if math.IsInf(f, 0) {
		return "inf"
	}
	if math.Abs(f) < 0.01 {
		return fmt.Sprintf("%.2f%%", 100*f)
	}
	return fmt.Sprintf("%.1f%%", 100*f)
}
