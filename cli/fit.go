package cli

import (
	"errors"
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	frameworks "github.com/memplan/memplan/emit"
	"github.com/memplan/memplan/engine"
	"github.com/memplan/memplan/report"
	"github.com/memplan/memplan/search"
	"github.com/memplan/memplan/units"
)

// fitFlags are fit's flags: plan's (spec, with searched set) and fit's own.
type fitFlags struct {
	plan                         *planFlags
	jsonOut                      bool
	allow, deny, emitTo, emitOut string
	gpus, globalBatch            int
	headroom                     float64
	searchMemory                 string
}

func newFitCmd(stdout, stderr io.Writer) *cobra.Command {
	ff := &fitFlags{plan: &planFlags{searched: true}}
	c := &cobra.Command{
		Use:   "fit",
		Short: "Find the fastest plan that fits the GPU: micro-batch × accumulation, checkpointing, offload, ZeRO, TP/PP/DP split",
		Long: "fit searches, by default: micro-batch × accumulation at a fixed global batch (the first 16 divisors of a\n" +
			"replica's share), checkpointing (none, every 2nd block, every block; selective too with --attention eager),\n" +
			"offload (none, activations, optimizer, both; under ZeRO-3 also params, params+activations), the optimizer\n" +
			"implementation (the given one and fused), the ZeRO stage (0-3 when dp > 1) and the split of --gpus into\n" +
			"tp × pp × dp (tp and pp in 1, 2, 4, 8; tp dividing the heads, KV heads and intermediate size; sp on and off\n" +
			"under tp). It keeps the precision, the optimizer, the adapters and the recipe as given; --allow opens families\n" +
			"that change the training result: lora (LoRA r=16, alpha=32 on every linear), qlora (the same on an NF4 base),\n" +
			"8bit (adamw8bit for Adam/AdamW), precision (bf16: 16-bit parameters with float32 master weights). Every\n" +
			"strategy flag given (--micro-batch, --accum, --tp, --sp, --pp, --dp, --zero/--fsdp, --checkpoint, --offload,\n" +
			"--optimizer-impl) pins its dimension; --deny closes a family. A plan over --host-memory (per node) does not\n" +
			"fit. Each verified plan prints the memplan plan command that reproduces it; --emit writes the winner's\n" +
			"DeepSpeed, accelerate, torchtune or litgpt config.\n\n" + exitHelp,
		Example: `  memplan fit --model llama-3-70b --gpu h100 --gpus 64 --global-batch 512 --seq 4096 --precision bf16
  memplan fit --model llama-2-7b --gpu rtx-4090 --global-batch 32 --seq 2048 --allow qlora,8bit
  memplan fit --model llama-3-8b --gpu h100 --gpus 8 --global-batch 64 --recipe torchtune --zero 3 --emit torchtune --emit-out 8B_full.yaml`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return ff.run(cmd, stdout, stderr) },
	}
	ff.register(c.Flags())
	return c
}

func (ff *fitFlags) register(fs *pflag.FlagSet) {
	ff.plan.register(fs)
	outputFlags(fs, &ff.jsonOut, "print the machine-readable JSON")
	fs.StringVar(&ff.allow, "allow", "", "also search options that change the training result: lora, qlora, 8bit, precision")
	fs.StringVar(&ff.deny, "deny", "", "close whole families to the search: offload, checkpoint, zero, tp, sp, pp, accum, fused (each keeps its dimension at none)")
	fs.StringVar(&ff.emitTo, "emit", "", "write the winner's framework config: "+strings.Join(frameworks.Names(), ", ")+" (after the report, or to --emit-out)")
	fs.StringVar(&ff.emitOut, "emit-out", "", "the file --emit writes (written whole, or not at all)")
	intVar(fs, &ff.gpus, "gpus", 0, "GPUs the job may use, split into data, tensor and pipeline parallel (default dp × tp × pp)")
	intVar(fs, &ff.globalBatch, "global-batch", 0, "samples per optimizer step over all replicas (default micro-batch × accum × dp)")
	fs.Float64Var(&ff.headroom, "headroom", 0, "fraction of each plan's usable memory (the GPU's less the recipe's cuda.overhead and an nccl.overhead per parallel group) kept free, e.g. for allocator fragmentation")
	fs.StringVar(&ff.searchMemory, "search-memory", search.DefaultMemoryBudget.String(), "the memory the search may hold in plans and programs, shared by its workers (one per GOMAXPROCS; about 512MiB each keeps a large search from rebuilding programs); this process stays near 1.5× it, and a search that needs more stops with an error")
}

// run is fit's command: read the flags into a spec and search options, search, then report the result and write
// the winner's framework config.
func (ff *fitFlags) run(cmd *cobra.Command, stdout, stderr io.Writer) error {
	spec, a, pins, gpus, err := ff.parse()
	if err != nil {
		return err
	}
	base := spec
	// Warnings are printed once the search has taken the job: a refusal
	// is one line (sweep H, round 25: a warning then the refusal).
	ws := ff.plan.warnings(&spec)
	mem, err := units.ParseBytes(ff.searchMemory)
	if err != nil {
		return fmt.Errorf("--search-memory: %v", err) // what is wrong with it, not only its lower bound
	}
	if mem < 64<<20 {
		return fmt.Errorf("--search-memory %q: want a size of at least 64MiB, e.g. 1GiB", ff.searchMemory)
	}
	// No Capacity: each plan fits its own usable memory (a --budget, or
	// the GPU's less a communicator per parallel group), as plan decides.
	o := search.Options{GPUs: gpus, GlobalBatch: ff.globalBatch, Headroom: ff.headroom, Allow: a, Pinned: pins, Context: cmd.Context(),
		MemoryBudget: mem}
	// A search holds up to its memory budget and plans on every core:
	// one at a time beside other requests of memplan serve.
	done, err := heavyTurn(cmd.Context(), nil)
	if err != nil {
		return err
	}
	defer done()
	if finish := showProgress(stderr, &o); finish != nil {
		defer finish()
	}
	defer searchGC(cmd, mem)()
	start := time.Now()
	res, err := search.Fit(spec, o)
	if err != nil && !errors.Is(err, search.ErrNothingFits) {
		return budgetFlagErr(err)
	}
	warn(cmd.ErrOrStderr(), ws)
	if err != nil {
		return budgetFlagErr(err)
	}
	elapsed := time.Since(start)
	fo := report.FitOptions{Warnings: ws, Command: func(p *search.Plan) string { return planCommand(cmd.Flags(), base, p) }}
	if fo.Emitted, err = emitWinner(ff.emitTo, ff.emitOut, res.Winner, res.Pinned); err != nil {
		return err
	}
	return emit(stdout, ff.jsonOut,
		func(w io.Writer) error { return report.WriteFitJSON(w, res, fo) },
		func(w io.Writer) error { return report.WriteFitText(w, res, elapsed, fo) })
}

// parse reads the flags into the spec, the families --allow opens, the dimensions the flags pin and the GPUs the
// job may use (--gpus, or --nodes × the GPUs per node).
func (ff *fitFlags) parse() (spec engine.Spec, a engine.Allow, pins search.Pins, gpus int, err error) {
	f := ff.plan
	if spec, err = f.spec(); err != nil {
		return spec, a, pins, 0, err
	}
	// Their default 0 is the plan's own (dp × tp × pp, micro-batch ×
	// accum × dp): a 0 given is refused, not read as it.
	if err = givenBelow(f.flags, 1, "gpus", "global-batch"); err != nil {
		return spec, a, pins, 0, err
	}
	if a, err = engine.ParseAllow(ff.allow); err != nil {
		return spec, a, pins, 0, err
	}
	if pins, err = fitPins(f.changed, ff.deny, &spec); err != nil {
		return spec, a, pins, 0, err
	}
	if err = checkEmit(ff.emitTo, ff.emitOut, &spec); err != nil {
		return spec, a, pins, 0, err
	}
	gpus = ff.gpus
	if f.nodes > 0 {
		if gpus > 0 && gpus != f.nodes*spec.NodeGPUs() {
			return spec, a, pins, 0, fmt.Errorf("--gpus %d contradicts --nodes %d × %d GPUs per node", gpus, f.nodes, spec.NodeGPUs())
		}
		gpus = f.nodes * spec.NodeGPUs()
	}
	return spec, a, pins, gpus, nil
}

// showProgress draws a progress bar on stderr while the search runs, when stderr is a terminal; it returns the
// function that clears the bar, or nil when there is none.
func showProgress(stderr io.Writer, o *search.Options) func() {
	bar := progress(stderr, -1, "searching plans")
	if bar == nil {
		return nil
	}
	o.Progress = func(done, total int) {
		bar.ChangeMax(total)
		_ = bar.Set(done)
	}
	return func() { _ = bar.Finish() }
}

// searchGC tunes the collector for a search, and returns the function that restores it. A search allocates gigabytes of short-lived programs and
// keeps little live (each bundle's cache and a few recycled
// arrays), so the collector runs often for little. Unless GOGC
// says otherwise, collect at 400% heap growth while searching
// (one cold fit on the search.BenchmarkFitLlama3_70B plan, 8
// interleaved runs each: median 1.89 s and 400-570 MB peak RSS
// at 400%, 1.98 s and 300-390 MB at 200%; at 100%, 1.75-2.26 s
// in 3 runs: a larger heap saves collections but pays page
// faults). The process is the CLI's to tune, not the library's.
// memplan serve runs fits side by side: the setting is the
// service's, not one request's. The heap is also held under 1.5× the
// search's memory budget (--search-memory) unless GOMEMLIMIT says
// otherwise: at 400% growth a search that keeps a few hundred MB live
// would otherwise grow to gigabytes before collecting.
func searchGC(cmd *cobra.Command, budget units.Bytes) func() {
	if isAPI(cmd) {
		return func() {}
	}
	var undo []func()
	if os.Getenv("GOGC") == "" {
		old := debug.SetGCPercent(400)
		undo = append(undo, func() { debug.SetGCPercent(old) })
	}
	if os.Getenv("GOMEMLIMIT") == "" {
		old := debug.SetMemoryLimit(int64(budget) / 2 * 3)
		undo = append(undo, func() { debug.SetMemoryLimit(old) })
	}
	return func() {
		for _, f := range undo {
			f()
		}
	}
}

// budgetFlagErr says a search over its memory budget in the flags that set
// and shape it (--search-memory, the strategy flags, --deny); other errors
// pass through.
func budgetFlagErr(err error) error {
	var be *search.BudgetError
	switch {
	case !errors.As(err, &be):
		return err
	case be.Plan == "":
		return fmt.Errorf("--search-memory %s: the search's %d candidate plans alone take %s, over a quarter of it (pin dimensions with the strategy flags, --deny a family, or raise --search-memory)",
			be.Total, be.Candidates, be.Held)
	}
	return fmt.Errorf("--search-memory %s: planning %s holds %s of program, over a worker's share of %s (raise --search-memory)",
		be.Total, be.Plan, be.Held, be.Share)
}
