package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/memplan/memplan/allocator"
	"github.com/memplan/memplan/explain"
	"github.com/memplan/memplan/internal/boundedio"
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
		Use:   "explain SNAPSHOT|TIMELINE",
		Short: "Explain a CUDA memory snapshot: its peaks, and the live memory at them by ledger category and code site",
		Long: "explain reads a torch.cuda.memory._dump_snapshot pickle (or a pickled torch.cuda.memory_snapshot() list)\n" +
			"without executing it, replays its trace through a model of PyTorch's caching allocator, and says where\n" +
			"the allocated and reserved peaks are and what was live there. It also reads torch.profiler's memory\n" +
			"timeline (export_memory_timeline's .json, .json.gz or .raw.json.gz): its peak and the live tensors there,\n" +
			"its categories mapped to the ledger.",
		Example: `  memplan explain snapshot.pickle
  memplan explain snapshot.pickle --json --png timeline.png
  memplan explain memory_timeline.raw.json.gz                # torch.profiler's export_memory_timeline
  memplan explain snapshot.pickle --against plan.json        # what memplan plan --json predicted
  memplan explain snapshot.pickle --against flags --model ./config.json --micro-batch 4 --seq 128 --precision fp32`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 {
				return fmt.Errorf("explain: want one snapshot or memory timeline file, got %d arguments", len(args))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if device < -1 {
				return errBadDevice(device)
			}
			if err := checkPlotNames(svg, png); err != nil {
				return err
			}
			if n := firstGiven(cmd.Flags(), isPlanFlag); n != "" && against != "flags" {
				return fmt.Errorf("--%s applies only with --against flags (the plan to compare the snapshot with)", n)
			}
			rep, settings, err := readExplained(cmd.Context(), args[0], device, cmd.Flags().Changed("device"))
			if err != nil {
				return err
			}
			var ag *againstJSON
			if against != "" {
				pj, name, err := planAgainst(against, pf, allocator.ConfigOf(settings))
				if err != nil {
					return err
				}
				ag = compareAgainst(rep, pj, name)
			}
			// The plots are written once nothing can be refused, so
			// that a refusal leaves no file behind.
			for _, o := range plotFlags(svg, png) {
				if o.path != "" {
					if err := report.WriteSnapshotPlot(o.path, rep); err != nil {
						return onFlag(o.flag, err)
					}
				}
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
	outputFlags(fl, &jsonOut, "print the machine-readable JSON report (memplan.explain/v1)")
	int64Var(fl, &device, "device", -1, "the device to explain (default: the one with the largest allocated peak)")
	fl.StringVar(&svg, "svg", "", "draw the timeline to this SVG file")
	fl.StringVar(&png, "png", "", "draw the timeline to this PNG file")
	fl.StringVar(&against, "against", "", "compare with memplan's prediction, category by category: a plan JSON (memplan plan --json), or 'flags' for the plan the plan flags given here describe (the plan flags apply only then)")
	pf.register(fl)
	return c
}

// readExplained explains a snapshot pickle or a torch.profiler memory
// timeline, told apart by their first bytes; the allocator settings are the
// snapshot's (the defaults for a timeline, which records none).
func readExplained(ctx context.Context, path string, device int64, deviceSet bool) (*explain.Report, snapshot.Settings, error) {
	data, err := boundedio.ReadFile(path, boundedio.LargeFile)
	if err != nil {
		return nil, snapshot.Settings{}, fmt.Errorf("reading snapshot or memory timeline: %w", err)
	}
	if snapshot.IsTimeline(data) {
		if deviceSet {
			return nil, snapshot.Settings{}, fmt.Errorf("--device: %s is a torch.profiler memory timeline, which holds the one device it was exported for", path)
		}
		tl, err := snapshot.ParseTimeline(data)
		if err != nil {
			return nil, snapshot.Settings{}, fmt.Errorf("%s: %w", path, err)
		}
		return explain.ExplainTimeline(tl, path), snapshot.DefaultSettings(), nil
	}
	s, err := snapshot.Parse(data)
	if err != nil {
		return nil, snapshot.Settings{}, fmt.Errorf("%s: %w", path, err)
	}
	if ctx == nil {
		ctx = context.Background()
	}
	rep, err := explain.ExplainContext(ctx, s, path, device)
	return rep, s.Settings, explainFlagErr(err)
}

// explainFlagErr says explain's errors in the flags that chose what they are
// about (--device, --capacity); other errors pass through.
func explainFlagErr(err error) error {
	var de *explain.DeviceError
	var ce *explain.CapacityError
	switch {
	case errors.As(err, &de):
		return fmt.Errorf("--device %d: %s has devices %v", de.Device, de.File, de.Have)
	case errors.As(err, &ce) && ce.Capacity == 0:
		return fmt.Errorf("%s: the trace records no out-of-memory event; give --capacity or --gpu to replay it on a smaller device", ce.File)
	}
	return err
}

func explainText(w io.Writer, rep *explain.Report) error {
	fmt.Fprintln(w, rep.Paragraph)
	fmt.Fprintln(w)
	if rep.Source == explain.SourceProfiler {
		return timelineText(w, rep)
	}
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

// timelineText: a profiler timeline's peak by ledger line and by the
// profiler's own categories.
func timelineText(w io.Writer, rep *explain.Report) error {
	p := rep.PeakAllocated
	fmt.Fprintf(w, "peak: %s of tensors at time point %d (%.3f ms)\n", units.Bytes(p.Bytes), p.Event, float64(p.TimeUS)/1e3)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	for _, s := range p.ByCategory {
		fmt.Fprintf(tw, "  %s\t%s\t%.1f%%\t\n", s.Name, units.Bytes(s.Bytes), 100*float64(s.Bytes)/float64(max(p.Bytes, 1)))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w, "  by torch.profiler's categories:")
	for _, s := range p.ProfilerCategories {
		fmt.Fprintf(tw, "    %s\t%s\t\n", s.Name, units.Bytes(s.Bytes))
	}
	return tw.Flush()
}

// errBadDevice refuses a --device below -1 (the default, the device with
// the largest peak), which explained that default instead (probe: explain
// SNAPSHOT --device -2).
func errBadDevice(d int64) error {
	return fmt.Errorf("--device %d: want a CUDA device index, 0 or more (or -1, the default: the device with the largest allocated peak)", d)
}
