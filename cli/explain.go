package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/memplan/memplan/allocator"
	"github.com/memplan/memplan/explain"
	"github.com/memplan/memplan/report"
	"github.com/memplan/memplan/snapshot"
	"github.com/memplan/memplan/units"
)

func newExplainCmd(stdout io.Writer) *cobra.Command {
	var jsonOut bool
	var device int64
	var svg, png, against string
	pf := &planFlags{}
	c := &cobra.Command{
		Use:   "explain SNAPSHOT",
		Short: "Explain a CUDA memory snapshot: its peaks, and the live memory at them by ledger category and code site",
		Long: "explain reads a torch.cuda.memory._dump_snapshot pickle (or a pickled torch.cuda.memory_snapshot() list)\n" +
			"without executing it, replays its trace through a model of PyTorch's caching allocator, and says where\n" +
			"the allocated and reserved peaks are and what was live there.",
		Example: `  memplan explain snapshot.pickle
  memplan explain snapshot.pickle --json --png timeline.png
  memplan explain snapshot.pickle --against plan.json        # what memplan plan --json predicted
  memplan explain snapshot.pickle --against flags --model ./config.json --micro-batch 4 --seq 128 --precision fp32`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 {
				return fmt.Errorf("explain: want one snapshot file, got %d arguments", len(args))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			s, err := snapshot.ReadFile(args[0])
			if err != nil {
				return err
			}
			rep, err := explain.Explain(s, args[0], device)
			if err != nil {
				return err
			}
			for _, p := range []string{svg, png} {
				if p != "" {
					if err := report.WriteSnapshotPlot(p, rep); err != nil {
						return err
					}
				}
			}
			var ag *againstJSON
			if against != "" {
				pj, name, err := planAgainst(against, pf, allocator.ConfigOf(s.Settings))
				if err != nil {
					return err
				}
				ag = compareAgainst(rep, pj, name)
			}
			return emit(stdout, jsonOut,
				func(w io.Writer) error {
					e := json.NewEncoder(w)
					e.SetIndent("", "  ")
					return e.Encode(struct {
						*explain.Report
						Against *againstJSON `json:"against,omitempty"`
					}{rep, ag})
				},
				func(w io.Writer) error {
					if err := explainText(w, rep); err != nil || ag == nil {
						return err
					}
					return writeAgainst(w, ag)
				})
		},
	}
	fl := c.Flags()
	fl.BoolVar(&jsonOut, "json", false, "print the machine-readable JSON report (memplan.explain/v1)")
	fl.Int64Var(&device, "device", -1, "the device to explain (default: the one with the largest allocated peak)")
	fl.StringVar(&svg, "svg", "", "draw the timeline to this SVG file")
	fl.StringVar(&png, "png", "", "draw the timeline to this PNG file")
	fl.StringVar(&against, "against", "", "compare with memplan's prediction, category by category: a plan JSON (memplan plan --json), or 'flags' for the plan the plan flags given here describe")
	pf.register(fl)
	return c
}

func explainText(w io.Writer, rep *explain.Report) error {
	fmt.Fprintln(w, rep.Paragraph)
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	for _, pk := range []struct {
		name string
		p    explain.Peak
	}{{"allocated peak", rep.PeakAllocated}, {"reserved peak", rep.PeakReserved}} {
		fmt.Fprintf(w, "%s: %s allocated, %s reserved, event %d (%s)\n", pk.name, units.Bytes(pk.p.Bytes), units.Bytes(pk.p.Reserved), pk.p.Event, pk.p.Phase)
		for _, s := range pk.p.ByCategory {
			fmt.Fprintf(tw, "  %s\t%s\t%.1f%%\t\n", s.Name, units.Bytes(s.Bytes), 100*float64(s.Bytes)/float64(max(pk.p.Bytes, 1)))
		}
		tw.Flush()
		fmt.Fprintln(w, "  by code site:")
		for _, s := range pk.p.BySite {
			fmt.Fprintf(tw, "    %s\t%s\t\n", s.Name, units.Bytes(s.Bytes))
		}
		tw.Flush()
	}
	if rep.Replay.Exact {
		fmt.Fprintf(w, "allocator model: reproduces the trace exactly (%d allocation addresses, %d segment events, the final segments)\n", rep.Replay.Addresses, rep.Replay.SegmentEvents)
	}
	return nil
}
