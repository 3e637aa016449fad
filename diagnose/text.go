package diagnose

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/memplan/memplan/ir"
	"github.com/memplan/memplan/units"
)

func signed(b units.Bytes) string {
	switch {
	case b > 0:
		return "+" + b.String()
	case b < 0:
		return "−" + (-b).String()
	}
	return "0"
}

// Write prints the observation table, the pressure object and the next step.
func Write(w io.Writer, rep *Report) error {
	b := rep.Base
	fmt.Fprintf(w, "baseline: peak %s in %s at %s\n\n", b.Peak, b.Phase, b.Op)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	head := []string{"one input changed", "peak", "Δ peak", "phase"}
	for c := ir.Category(0); c < ir.NumCategories; c++ {
		head = append(head, "Δ "+c.String())
	}
	fmt.Fprintln(tw, strings.Join(head, "\t"))
	// A row that could not be planned keeps every column (a row of fewer
	// cells splits tabwriter's column blocks: the rows under it lost their
	// alignment with the header); why is said under the table.
	var why []string
	for _, r := range rep.Rows {
		if r.Err != nil {
			fmt.Fprintf(tw, "%s\tn/a%s\n", r.Name, strings.Repeat("\t-", len(head)-2))
			why = append(why, fmt.Sprintf("%s: n/a: %s", r.Name, r.Err))
			continue
		}
		cells := []string{r.Name, r.Peak.String(), signed(r.Peak - b.Peak), r.Phase}
		for c := range r.Ledger {
			cells = append(cells, signed(r.Ledger[c]-b.Ledger[c]))
		}
		fmt.Fprintln(tw, strings.Join(cells, "\t"))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(why) > 0 {
		fmt.Fprintf(w, "\n%s\n", strings.Join(why, "\n"))
	}
	var objs []string
	for _, o := range rep.Objects {
		if o.Bytes > 0 {
			objs = append(objs, fmt.Sprintf("%s %s", o.Name, o.Bytes))
		}
	}
	fmt.Fprintf(w, "\nlive at the peak: %s\n", strings.Join(objs, ", "))
	fmt.Fprintf(w, "pressure object: %s (%.0f%% of the peak)\n", rep.Pressure.Name, 100*float64(rep.Pressure.Bytes)/float64(max(b.Peak, 1)))
	if rep.Next != "" {
		fmt.Fprintf(w, "next step (%s): %s\n", rep.Why, rep.Next)
	} else {
		fmt.Fprintf(w, "next step: %s\n", rep.Why)
	}
	return nil
}
