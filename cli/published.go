package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"path/filepath"
	"strings"

	"github.com/jedib0t/go-pretty/v6/table"
	"github.com/jedib0t/go-pretty/v6/text"

	"github.com/memplan/memplan/published"
	"github.com/memplan/memplan/validate"
)

// publishedReport is the JSON of validate --published.
type publishedReport struct {
	Schema    string             `json:"schema"`
	File      string             `json:"file"`
	Tolerance *float64           `json:"tolerance,omitempty"`
	Rows      []published.Result `json:"rows"`
	Summary   published.Summary  `json:"summary"`
}

// runPublished predicts every row of a published file and compares. With
// an explicit tolerance it fails when an allocated-type row is beyond it or
// an oom row is predicted to fit.
func runPublished(stdout, stderr io.Writer, path string, tol float64, strict, jsonOut bool) error {
	rows, err := published.ReadFile(path)
	if err != nil {
		return err
	}
	dir := filepath.Dir(path)
	bar := progress(stderr, len(rows), "predicting rows")
	res := make([]published.Result, len(rows))
	for i := range rows {
		res[i] = published.Predict(&rows[i], dir)
		if bar != nil {
			_ = bar.Add(1)
		}
	}
	if bar != nil {
		_ = bar.Finish()
	}
	sum := published.Summarize(res)
	var buf bytes.Buffer
	if jsonOut {
		rep := publishedReport{Schema: "memplan.published-validation/v1", File: path, Rows: res, Summary: sum}
		if strict {
			rep.Tolerance = &tol
		}
		enc := json.NewEncoder(&buf)
		enc.SetIndent("", " ")
		if err := enc.Encode(rep); err != nil {
			return err
		}
	} else {
		writePublishedTable(&buf, rows, res, sum, tol, strict)
	}
	if _, err := stdout.Write(buf.Bytes()); err != nil {
		return err
	}
	if !strict {
		return nil
	}
	var beyond, wrongOOM int
	for i := range res {
		r := &res[i]
		if r.Compared() && r.Bound == "" && rows[i].Allocated() && valAbs(*r.RelError) > tol {
			beyond++
		}
		if m := float64(r.Measured); r.Bound != "" && r.Compared() && (m > (1+tol)*float64(r.Predicted) || m < (1-tol)*float64(r.Lower)) {
			beyond++ // outside its range
		}
		if r.Outcome == published.OutcomeOOM && r.Fits != nil && *r.Fits {
			wrongOOM++
		}
	}
	if beyond > 0 || wrongOOM > 0 {
		return fmt.Errorf("%w: %d rows beyond %s, %d oom rows predicted to fit", ErrValidation, beyond, validate.Pct(tol), wrongOOM)
	}
	return nil
}

func writePublishedTable(w io.Writer, rows []published.Row, res []published.Result, sum published.Summary, tol float64, strict bool) {
	t := table.NewWriter()
	t.SetStyle(table.StyleLight)
	t.AppendHeader(table.Row{"id", "recipe", "metric", "measured", "predicted", "error", ""})
	for i := range res {
		r := &res[i]
		measured := "oom"
		if r.Measured > 0 {
			measured = r.Measured.String()
		}
		switch {
		case len(r.Lacks) > 0:
			var ls []string
			for _, l := range r.Lacks {
				ls = append(ls, l.String())
			}
			t.AppendRow(table.Row{r.ID, r.Recipe, r.Metric, measured, "-", "-", "cannot express: " + truncate(strings.Join(ls, "; "), 160)})
		case r.Err != "":
			t.AppendRow(table.Row{r.ID, r.Recipe, r.Metric, measured, "-", "-", "error: " + truncate(r.Err, 160)})
		case r.Outcome == published.OutcomeOOM:
			note := "oom: predicted to fit (wrong)"
			if r.Fits == nil {
				note = "oom: no GPU to decide"
			} else if !*r.Fits {
				note = "oom: predicted not to fit"
			}
			t.AppendRow(table.Row{r.ID, r.Recipe, r.Metric, measured, r.Predicted.String(), "", note})
		case r.Bound != "" && r.Compared():
			t.AppendRow(table.Row{r.ID, r.Recipe, r.Metric, measured, r.Lower.String() + " … " + r.Predicted.String(), "", truncate("range: "+r.Bound, 160)})
		default:
			note := ""
			if strict && valAbs(*r.RelError) > tol {
				note = "beyond tolerance"
			}
			if rows[i].Confidence == "low" {
				note = strings.TrimSpace(note + " low confidence")
			}
			t.AppendRow(table.Row{r.ID, r.Recipe, r.Metric, measured, r.Predicted.String(), valSignedPct(*r.RelError), note})
		}
	}
	t.SetColumnConfigs([]table.ColumnConfig{{Number: 4, Align: text.AlignRight}, {Number: 5, Align: text.AlignRight}, {Number: 6, Align: text.AlignRight}})
	fmt.Fprintln(w, t.Render())
	reserved := ""
	if sum.ReservedCompared > 0 {
		reserved = fmt.Sprintf("; %d reserved-type and nvidia-smi rows compared, median |error| %s, worst %s (%s)",
			sum.ReservedCompared, validate.Pct(sum.ReservedMedian), validate.Pct(sum.ReservedWorst), sum.ReservedWorstID)
	}
	fmt.Fprintf(w, "%d rows: %d allocated-type rows compared, median |error| %s, worst %s (%s)%s; %d of %d oom rows predicted not to fit; %d of %d ranges hold their measurement; %d rows not expressible, %d errors\n",
		sum.Rows, sum.Compared, validate.Pct(sum.Median), validate.Pct(sum.Worst), sum.WorstID, reserved, sum.OOMRight, sum.OOMPredicted, sum.BoundsHold, sum.Bounds, sum.Lacking, sum.Errors)
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
