package cli

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/jedib0t/go-pretty/v6/table"
	"github.com/jedib0t/go-pretty/v6/text"
	"github.com/spf13/cobra"

	"github.com/memplan/memplan/importer/torchtrace"
	"github.com/memplan/memplan/units"
	"github.com/memplan/memplan/validate"
)

// ErrValidation is returned when predictions miss the tolerance (exit 1).
var ErrValidation = errors.New("predictions beyond tolerance")

type validateFlags struct {
	traces, tolerance, published string
	jsonOut                      bool
}

func newValidateCmd(stdout io.Writer) *cobra.Command {
	f := &validateFlags{}
	c := &cobra.Command{
		Use:   "validate MEASURED.json",
		Short: "Compare predictions from PyTorch traces with measured peaks (memplan.measured/v1)",
		Long: "validate predicts every case of a memplan.measured/v1 file (python3 -m memplan_torch suite|measure)\n" +
			"from its trace at the measured micro-batch, accumulation and strategy, and compares the per-phase\n" +
			"peaks of the steady and the first step. It exits 1 when an error exceeds --tolerance or a peak\n" +
			"phase is wrong.",
		Example: "  memplan validate testdata/torch/measured.json --tolerance 3%\n" +
			"  memplan validate --published ../shared/published/published.jsonl",
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			tol, err := parseTolerance(f.tolerance)
			if err != nil {
				return err
			}
			if f.published != "" {
				if len(args) > 0 {
					return fmt.Errorf("give a measured file or --published, not both")
				}
				if cmd.Flags().Changed("traces") {
					// A published row names a model and a recipe, never a
					// trace: ignoring --traces would hide a mistaken command.
					return fmt.Errorf("--traces is for a measured file: --published rows name no traces")
				}
				return runPublished(stdout, cmd.ErrOrStderr(), f.published, tol, cmd.Flags().Changed("tolerance"), f.jsonOut)
			}
			if len(args) == 0 {
				return fmt.Errorf("give a measured file (memplan.measured/v1) or --published FILE")
			}
			m, err := validate.LoadMeasured(args[0])
			if err != nil {
				return err
			}
			dir := f.traces
			if dir == "" {
				dir = filepath.Dir(args[0])
			}
			preds, err := predictAll(m, dir)
			if err != nil {
				return err
			}
			rep := validate.Compare(m, preds, tol)
			var buf bytes.Buffer
			if f.jsonOut {
				enc := json.NewEncoder(&buf)
				enc.SetIndent("", " ")
				if err := enc.Encode(rep); err != nil {
					return err
				}
			} else {
				writeValidationTable(&buf, &rep)
			}
			if _, err := stdout.Write(buf.Bytes()); err != nil {
				return err
			}
			if !rep.Pass {
				return fmt.Errorf("%w: %s", ErrValidation, valFailures(&rep))
			}
			return nil
		},
	}
	fl := c.Flags()
	fl.StringVar(&f.traces, "traces", "", "directory of the cases' trace files (default: the measured file's directory; not with --published)")
	fl.StringVar(&f.tolerance, "tolerance", "3%", "largest accepted relative error of a phase peak: a percentage (3%) or a fraction up to 1 (0.03)")
	outputFlags(fl, &f.jsonOut, "print the report as JSON (memplan.validation/v1, or memplan.published-validation/v1 with --published)")
	fl.StringVar(&f.published, "published", "", "compare with published GPU measurements in the frameworks' own terms (memplan.published/v1 JSON Lines)")
	return c
}

func parseTolerance(s string) (float64, error) {
	t := strings.TrimSpace(s)
	pct := strings.HasSuffix(t, "%")
	v, err := strconv.ParseFloat(strings.TrimSuffix(t, "%"), 64)
	if err != nil || v < 0 || v != v || math.IsInf(v, 0) { // Inf passed every case (probe: validate --tolerance Inf)
		return 0, fmt.Errorf("--tolerance %q: want a percentage such as 3%% or a fraction such as 0.03", s)
	}
	if pct {
		return v / 100, nil
	}
	if v > 1 {
		// A bare number is a fraction, so "3" would be 300% and pass
		// nearly anything: whoever wrote it almost surely meant 3%.
		g := func(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }
		return 0, fmt.Errorf("--tolerance %q: give a fraction (%s) or a percentage (%s%%)", s, g(v/100), g(v))
	}
	return v, nil
}

func predictAll(m *validate.Measured, dir string) ([]validate.Prediction, error) {
	traces := map[string]*torchtrace.Trace{}
	var preds []validate.Prediction
	for _, c := range m.Cases {
		if c.Trace == "" {
			preds = append(preds, validate.Prediction{Case: c.Name, Pending: "the case names no trace"})
			continue
		}
		tr, ok := traces[c.Trace]
		if !ok {
			var err error
			if tr, err = torchtrace.Load(filepath.Join(dir, c.Trace)); err != nil {
				return nil, err
			}
			traces[c.Trace] = tr
		}
		p, err := validate.PredictWith(c.Workload, tr, validate.CounterFor(c.Memory, tr))
		if err != nil {
			return nil, err
		}
		p.Case = c.Name
		preds = append(preds, p)
	}
	return preds, nil
}

func valBytes(b int64) string {
	return units.Bytes(b).String()
}

func writeValidationTable(w io.Writer, rep *validate.Report) {
	t := table.NewWriter()
	t.SetStyle(table.StyleLight)
	t.AppendHeader(table.Row{"case", "step", "phase", "predicted", "measured", "error", ""})
	prev := ""
	for _, r := range rep.Rows {
		name := r.Case
		if name == prev {
			name = ""
		}
		prev = r.Case
		if r.Pending != "" {
			t.AppendRow(table.Row{name, r.Step, r.Phase, "pending", valBytes(r.Measured), "", r.Pending})
			continue
		}
		mark := ""
		if a := valAbs(r.Error); a > rep.Tolerance {
			mark = "beyond tolerance"
		}
		t.AppendRow(table.Row{name, r.Step, r.Phase, valBytes(r.Predicted), valBytes(r.Measured), valSignedPct(r.Error), mark})
	}
	t.SetColumnConfigs([]table.ColumnConfig{{Number: 4, Align: text.AlignRight}, {Number: 5, Align: text.AlignRight}, {Number: 6, Align: text.AlignRight}})
	fmt.Fprintln(w, t.Render())
	for _, c := range rep.Cases {
		if c.Pending == "" && !c.PeakRight {
			fmt.Fprintf(w, "%s: peak phase predicted %s/%s (steady/first), measured %s/%s\n", c.Case,
				c.PredictedPeakPhase, c.FirstPredictedPeakPhase, c.MeasuredPeakPhase, c.FirstMeasuredPeakPhase)
		}
	}
	fmt.Fprintln(w, rep.Summary())
}

func valAbs(f float64) float64 {
	if f < 0 {
		return -f
	}
	return f
}

func valSignedPct(f float64) string {
	s := validate.Pct(f)
	if f >= 0 && s != "inf" {
		s = "+" + s
	}
	return s
}

func valFailures(rep *validate.Report) string {
	var beyond int
	for _, r := range rep.Rows {
		if r.Pending == "" && valAbs(r.Error) > rep.Tolerance {
			beyond++
		}
	}
	wrong := rep.Compared - rep.PeakRight
	if rep.Compared == 0 {
		return "no case could be compared"
	}
	return fmt.Sprintf("%d of %d phase peaks beyond %s (worst %s at %s), peak phase wrong in %d of %d cases",
		beyond, rep.Peaks, validate.Pct(rep.Tolerance), validate.Pct(rep.Worst), rep.WorstAt, wrong, rep.Compared)
}
