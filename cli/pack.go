package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/jedib0t/go-pretty/v6/table"
	"github.com/jedib0t/go-pretty/v6/text"
	"github.com/spf13/cobra"

	"github.com/memplan/memplan/internal/boundedio"
	"github.com/memplan/memplan/pack"
	"github.com/memplan/memplan/report"
	"github.com/memplan/memplan/units"
)

type packFlags struct {
	gpus, policies, margin, arrivals, svg, png, plotPolicy string
	nodeGPUs                                               int
	jsonOut                                                bool
	changed                                                func(name string) bool
}

func newPackCmd(stdout io.Writer) *cobra.Command {
	f := &packFlags{}
	c := &cobra.Command{
		Use:   "pack JOBS",
		Short: "Place jobs on a pool of GPUs by their memory curves and compare the policies schedulers use",
		Long: "pack reads a job file (kind: memplan.jobs/v1: training jobs in plan's terms, inference services, plan\n" +
			"JSONs, snapshots), computes each process's memory (CUDA context, allocated and reserved peaks, the\n" +
			"smallest per-process limit its caching allocator survives, its curve over one step), and places the\n" +
			"jobs under four policies: a GPU per job, a static size (declared, else model_size), the sum of peaks,\n" +
			"and the curve read through the allocator. With --arrivals it also runs a trace of arrivals through\n" +
			"each policy: utilisation, OOMs and queueing.",
		Example: `  memplan pack testdata/pack/mix.yaml --gpus 8xh100
  memplan pack testdata/pack/mix.yaml --gpus 8xh100 --arrivals testdata/pack/arrivals.yaml --png pack.png
  memplan pack jobs.yaml --gpus 4xa100-80gb --policy static,curve --margin 2GiB --json`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 {
				return fmt.Errorf("pack: want one job file, got %d arguments", len(args))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error { return f.run(cmd.Context(), stdout, args[0]) },
	}
	fl := c.Flags()
	f.changed = fl.Changed
	fl.StringVar(&f.gpus, "gpus", "", "the pool: COUNTxGPU, e.g. 8xh100 (see 'memplan gpus')")
	intVar(fl, &f.nodeGPUs, "node-gpus", 0, "GPUs per node of the pool, for jobs of several GPUs that say same-node (default: the GPU's server in the catalog, 8 for an H100, at most the pool; else the whole pool)")
	fl.StringVar(&f.policies, "policy", "all", "policies to compare: all, or a comma list of whole-gpu, static, peaks, curve (each once)")
	fl.StringVar(&f.margin, "margin", "0", "memory every policy but whole-gpu leaves free on each GPU, e.g. 2GiB")
	fl.StringVar(&f.arrivals, "arrivals", "", "an arrival trace (kind: memplan.arrivals/v1) to simulate")
	outputFlags(fl, &f.jsonOut, "print the machine-readable JSON (memplan.pack/v1, with the simulation when asked)")
	fl.StringVar(&f.svg, "svg", "", "draw each GPU's combined curve to this SVG file")
	fl.StringVar(&f.png, "png", "", "draw each GPU's combined curve to this PNG file")
	fl.StringVar(&f.plotPolicy, "plot-policy", "curve", "whose assignment --svg/--png draw")
	return c
}

func (f *packFlags) options() (pack.Pool, pack.Options, pack.Policy, error) {
	var opt pack.Options
	if f.gpus == "" {
		return pack.Pool{}, opt, 0, fmt.Errorf("pack needs --gpus, e.g. --gpus 8xh100")
	}
	pool, err := pack.ParsePool(f.gpus)
	if err != nil {
		return pool, opt, 0, fmt.Errorf("--gpus: %v", err)
	}
	if f.nodeGPUs < 0 || f.nodeGPUs > pool.Count || f.nodeGPUs == 0 && f.changed("node-gpus") {
		return pool, opt, 0, fmt.Errorf("--node-gpus must be between 1 and the pool's %d GPUs, got %d", pool.Count, f.nodeGPUs)
	}
	pool.NodeGPUs = f.nodeGPUs
	if f.policies != "all" {
		for _, name := range strings.Split(f.policies, ",") {
			p, err := pack.ParsePolicy(strings.TrimSpace(name))
			if err != nil {
				return pool, opt, 0, badChoice("--policy", name, policyNames()...)
			}
			if containsPolicy(opt.Policies, p) { // a second row of the same assignment
				return pool, opt, 0, fmt.Errorf("--policy %q: %s is named twice", f.policies, p)
			}
			opt.Policies = append(opt.Policies, p)
		}
	}
	if opt.Margin, err = units.ParseBytesOrZero(f.margin); err != nil {
		return pool, opt, 0, fmt.Errorf("--margin: %v", err)
	}
	if opt.Margin < 0 || opt.Margin >= pool.Capacity() {
		return pool, opt, 0, fmt.Errorf("--margin must be between 0 and the GPU's %s, got %s", pool.Capacity(), opt.Margin)
	}
	plot, err := pack.ParsePolicy(f.plotPolicy)
	if err != nil {
		return pool, opt, 0, badChoice("--plot-policy", f.plotPolicy, policyNames()...)
	}
	if (f.svg != "" || f.png != "") && len(opt.Policies) > 0 && !containsPolicy(opt.Policies, plot) {
		return pool, opt, 0, fmt.Errorf("--plot-policy %s is not among --policy %s", plot, f.policies)
	}
	if err := checkPlotNames(f.svg, f.png); err != nil {
		return pool, opt, 0, err
	}
	for _, o := range plotFlags(f.svg, f.png) {
		if o.path == "" {
			continue
		}
		if _, err := os.Stat(dirOf(o.path)); err != nil {
			return pool, opt, 0, fmt.Errorf("%s: cannot write %s: no such directory", o.flag, o.path)
		}
	}
	return pool, opt, plot, nil
}

func containsPolicy(ps []pack.Policy, p pack.Policy) bool {
	for _, q := range ps {
		if q == p {
			return true
		}
	}
	return false
}

func (f *packFlags) run(ctx context.Context, stdout io.Writer, path string) error {
	pool, opt, plotPolicy, err := f.options()
	if err != nil {
		return err
	}
	file, err := pack.ReadFile(path)
	if err != nil {
		return err
	}
	var trace *pack.Trace
	if f.arrivals != "" {
		data, err := boundedio.ReadFile(f.arrivals, boundedio.TraceFile)
		if err != nil {
			return err
		}
		if trace, err = pack.ParseArrivals(data, f.arrivals, file.Jobs); err != nil {
			return err
		}
	}
	envs, byName, err := pack.EnvelopesContext(ctx, file.Jobs, pool)
	if err != nil {
		return err
	}
	res, err := pack.PackEnvelopesContext(ctx, envs, pool, opt)
	if err != nil {
		return err
	}
	var sim *pack.SimResult
	if trace != nil {
		if sim, err = pack.SimulateContext(ctx, byName, trace, pool, opt); err != nil {
			return err
		}
	}
	for _, o := range plotFlags(f.svg, f.png) {
		if o.path != "" {
			if err := report.WritePackPlot(o.path, res, plotPolicy); err != nil {
				return onFlag(o.flag, err)
			}
		}
	}
	return emit(stdout, f.jsonOut,
		func(w io.Writer) error {
			return writeJSON(w, struct {
				*pack.Result
				Simulation *pack.SimResult `json:"simulation,omitempty"`
			}{res, sim})
		},
		func(w io.Writer) error { return packText(w, res, sim) })
}

func unwrapPathErr(err error) error {
	if u, ok := err.(*os.PathError); ok {
		return u.Err
	}
	return err
}

func newTable() table.Writer {
	t := table.NewWriter()
	t.SetStyle(table.StyleLight)
	return t
}

func packText(w io.Writer, res *pack.Result, sim *pack.SimResult) error {
	fmt.Fprintf(w, "%d × %s (%s each, %d to a node), %d processes, margin %s\n\n", res.GPUs, res.GPU, res.Capacity, res.NodeGPUs, len(res.Envelopes), res.Margin)
	t := newTable()
	t.SetTitle("What each process needs (CUDA context included)")
	t.AppendHeader(table.Row{"job", "source", "model_size", "allocated peak", "reserved peak", "limit", "period", "run it with"})
	for _, e := range res.Envelopes {
		t.AppendRow(table.Row{e.Job, source(e), e.ModelSize, e.Allocated, e.Peak, e.Cap, fmt.Sprintf("%.3gs", e.Period), e.Setting})
	}
	right(t, 3, 4, 5, 6, 7)
	fmt.Fprintln(w, t.Render())
	t = newTable()
	t.SetTitle("Policies")
	t.AppendHeader(table.Row{"policy", "GPUs needed", "unplaced", "oom GPUs", "at-risk GPUs"})
	for _, p := range res.Policies {
		t.AppendRow(table.Row{p.Policy, p.GPUsNeeded, len(p.Unplaced), p.OOMGPUs, p.AtRisk})
	}
	right(t, 2, 3, 4, 5)
	fmt.Fprintln(w, t.Render())
	writeSaved(w, res)
	for _, p := range res.Policies {
		t = newTable()
		t.SetTitle(fmt.Sprintf("Assignment: %s", p.Policy))
		t.AppendHeader(table.Row{"GPU", "jobs", "counted", "held", "allocated peaks", "margin", "status"})
		for _, g := range p.GPUs {
			t.AppendRow(table.Row{g.Index, strings.Join(g.Jobs, ", "), g.Counted, g.Reach, g.Allocated, g.Margin, g.Status})
		}
		right(t, 1, 3, 4, 5, 6)
		fmt.Fprintln(w, t.Render())
		if len(p.Unplaced) > 0 {
			fmt.Fprintf(w, "unplaced under %s: %s\n", p.Policy, strings.Join(p.Unplaced, ", "))
		}
	}
	if sim == nil {
		return nil
	}
	t = newTable()
	t.SetTitle(fmt.Sprintf("Simulation: %d arrivals on %d × %s", sim.Arrivals, sim.GPUs, sim.GPU))
	t.AppendHeader(table.Row{"policy", "started", "completed", "OOM", "at-risk starts", "never placed", "mean wait", "p95 wait", "max wait", "memory used", "busy GPUs", "makespan"})
	for _, p := range sim.Policies {
		t.AppendRow(table.Row{p.Policy, p.Started, p.Completed, p.OOM, p.AtRisk, p.Queued, hours(p.MeanWait), hours(p.P95Wait), hours(p.MaxWait),
			fmt.Sprintf("%.1f%%", 100*p.Utilisation), fmt.Sprintf("%.2f", p.Busy), hours(p.Makespan)})
	}
	right(t, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12)
	_, err := fmt.Fprintln(w, t.Render())
	return err
}

// writeSaved writes curve's savings against the policies that count the
// same processes, and why the others are not compared.
func writeSaved(w io.Writer, res *pack.Result) {
	var parts []string
	for _, p := range res.Policies {
		if n, ok := res.Saved[p.Policy.String()]; ok {
			parts = append(parts, fmt.Sprintf("%d against %s", n, p.Policy))
		}
	}
	if len(parts) > 0 {
		fmt.Fprintf(w, "GPUs curve saves: %s (negative: curve needs more).\n", strings.Join(parts, ", "))
	}
	for _, p := range res.Policies {
		if why, ok := res.NotCompared[p.Policy.String()]; ok {
			fmt.Fprintf(w, "GPUs curve saves against %s: not compared: %s.\n", p.Policy, why)
		}
	}
}

// source is where e comes from and, for a rank of a job of several GPUs,
// which rank and pipeline stage it is.
func source(e *pack.Envelope) string {
	if e.Ranks < 2 {
		return e.Source
	}
	where := ""
	if e.SameNode {
		where = ", same node"
	}
	return fmt.Sprintf("%s, rank %d of %d, stage %d%s", e.Source, e.Rank, e.Ranks, e.Stage, where)
}

func hours(s float64) string { return fmt.Sprintf("%.2fh", s/3600) }

func right(t table.Writer, cols ...int) {
	var cc []table.ColumnConfig
	for _, c := range cols {
		cc = append(cc, table.ColumnConfig{Number: c, Align: text.AlignRight})
	}
	t.SetColumnConfigs(cc)
}
