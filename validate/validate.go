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

	"github.com/memplan/memplan/engine"
	"github.com/memplan/memplan/importer/torchtrace"
	"github.com/memplan/memplan/ir"
	"github.com/memplan/memplan/sim"
	"github.com/memplan/memplan/workload"
)

func bytesReader(b []byte) *bytes.Reader { return bytes.NewReader(b) }

// CounterFor is how a measured case counted its memory (its memory kind
// and threshold), for its trace tr.
func CounterFor(m Memory, tr *torchtrace.Trace) engine.Counter {
	device := workload.DeviceCPU
	if m.Kind == CUDACachingAllocator {
		device = workload.DeviceCUDA
	}
	return workload.Counter(device, m.Threshold, tr)
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

// Predict predicts w from its trace, counting as memplan_torch measures on
// w's device (workload.DeviceCounter).
func Predict(w *workload.Workload, tr *torchtrace.Trace) (Prediction, error) {
	return PredictWith(w, tr, workload.DeviceCounter(w.Device, tr))
}

// PredictWith predicts w from its trace, counting as c does: it plans the
// spec workload.Spec makes of w (the one plan --graph --workload plans),
// with its first step.
func PredictWith(w *workload.Workload, tr *torchtrace.Trace, c engine.Counter) (Prediction, error) {
	pr := Prediction{Case: w.Name}
	if w.Strategy.Offload != workload.OffloadNone {
		// On a CPU the "host" is the same memory: offload cases are
		// measured for their time only and not compared here.
		pr.Pending = "activation offload moves nothing off a CPU device"
		return pr, nil
	}
	s, err := w.Spec(tr, engine.Spec{Target: engine.Target{FirstStep: true}})
	if err != nil {
		return pr, fmt.Errorf("case %s: %w", w.Name, err)
	}
	s.Count = c
	res, err := engine.Plan(s)
	if err != nil {
		return pr, fmt.Errorf("case %s: %w", w.Name, err)
	}
	pr.Steady, pr.First = phasesOf(res.Sim), phasesOf(res.First)
	return pr, nil
}

// phasesOf is the peak of each phase of r.
func phasesOf(r *sim.Result) Phases {
	return Phases{Forward: peakOf(r, ir.Forward), Backward: peakOf(r, ir.Backward), Optimizer: peakOf(r, ir.Optimizer)}
}

func peakOf(r *sim.Result, ph ir.Phase) int64 {
	if r.PhasePeak[ph].Op < 0 {
		return 0
	}
	return int64(r.PhasePeak[ph].Total)
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
