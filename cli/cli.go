// Package cli wires command-line flags into the library. Each command parses
// and validates its flags, calls engine or report, and prints; no planning
// logic lives here.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/memplan/memplan/allocator"
	"github.com/memplan/memplan/cost"
	"github.com/memplan/memplan/engine"
	"github.com/memplan/memplan/hw"
	"github.com/memplan/memplan/importer/torchtrace"
	"github.com/memplan/memplan/internal/boundedio"
	"github.com/memplan/memplan/lower"
	"github.com/memplan/memplan/models/build"
	"github.com/memplan/memplan/ops"
	"github.com/memplan/memplan/recipe"
	"github.com/memplan/memplan/report"
	"github.com/memplan/memplan/strategy"
	"github.com/memplan/memplan/units"
)

// Main runs the CLI with args and returns the process exit status (exit.go:
// 0 fits, 3 does not fit, 4 nothing fits, 1 bad input). Errors are one line
// on stderr, prefixed "memplan: "; warnings too, prefixed "memplan:
// warning: ". Every command but fit runs under a soft heap limit
// (limitHeap) unless GOMEMLIMIT sets one, restored when it returns.
func Main(args []string, stdout, stderr io.Writer) int {
	if err := versionAlone(args); err != nil {
		return exitCode(err, stderr)
	}
	root := NewRoot(stdout, stderr)
	root.SetArgs(args)
	if c, _, err := root.Find(args); err == nil && limitsHeap(c) {
		defer limitHeap(gcFor(c))()
	}
	return exitCode(root.Execute(), stderr)
}

// message is err's text with the job fields it names (engine.FieldError)
// named as their flags: the library says "micro-batch", the CLI
// "--micro-batch". The libraries' words for a whole class of errors
// ("invalid spec: ", "bad options: ", "recipe: " before a flag) are dropped
// when the rest names what was wrong, so that the line starts with it.
func message(err error) string {
	msg := err.Error()
	var fe *engine.FieldError
	if errors.As(err, &fe) {
		msg = strings.Replace(msg, fe.Error(), fe.Render(flagOf), 1)
	}
	var nm *strategy.NoMatchError
	if errors.As(err, &nm) {
		msg = strings.Replace(msg, nm.Error(), "--checkpoint: "+nm.Error(), 1)
	}
	return trimKind(err, msg, func(rest string) bool { return strings.HasPrefix(rest, "--") })
}

// trimKind drops from msg (err's message, its fields rendered) the kind of
// error it starts with ("invalid spec: ", "recipe: " before a flag): the
// message names the flag or file itself. The CLI and the HTTP API's
// messages both do (sweep F, round 25: the API kept them). A recipe's
// message keeps its kind unless it goes on with the flag it is about
// (named: whether rest starts with a flag, as the caller writes flags).
func trimKind(err error, msg string, named func(rest string) bool) string {
	for _, c := range []error{engine.ErrSpec, build.ErrBadOptions, recipe.ErrRecipe} {
		if rest, ok := strings.CutPrefix(msg, c.Error()+": "); ok && errors.Is(err, c) && (c != recipe.ErrRecipe || named(rest)) {
			msg = rest
		}
	}
	return msg
}

// flagOf is the flag that sets field f.
func flagOf(f engine.Field) string { return "--" + f.Key() }

// NewRoot builds the command tree.
func NewRoot(stdout, stderr io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:           "memplan",
		Short:         "GPU-memory planner for deep-learning training and inference",
		Long:          "memplan simulates one training or inference iteration op by op and reports the memory ledger,\nthe timeline, its peak, and whether the job fits on a GPU.\n\n" + exitHelp,
		Version:       version(),
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetFlagErrorFunc(flagError)
	root.PersistentPreRunE = func(c *cobra.Command, _ []string) error { return resolveOutput(c) }
	root.AddCommand(newPlanCmd(stdout), newCompareCmd(stdout), newFitCmd(stdout, stderr), newValidateCmd(stdout), newModelsCmd(stdout), newGPUsCmd(stdout), newRecipesCmd(stdout), newExplainCmd(stdout))
	root.AddCommand(newDiagnoseCmd(stdout), newMaxCmd(stdout))
	root.AddCommand(newPackCmd(stdout))
	root.AddCommand(newExtenderCmd(stderr))
	root.AddCommand(newServeCmd(stderr))
	root.SetVersionTemplate("memplan {{.Version}}\n")
	checkArgs(root)
	return root
}

type planFlags struct {
	model, gpu, mode, precision, optimizer, impl, attention, kernels, budget, checkpoint, lora string
	tp, ep, dp, zero, pp, ppInterleave                                                         int
	fsdp                                                                                       bool
	offload, ppSchedule                                                                        string
	sp, qlora                                                                                  bool
	microBatch, seq, accum, genTokens                                                          int
	jsonOut, noTimeline, noChart, firstStep                                                    bool
	timelinePoints                                                                             int
	svg, png                                                                                   string
	graph, workloadPath                                                                        string
	hostMemory                                                                                 string
	gpusPerNode, nodes                                                                         int
	cluster                                                                                    string
	// searched is set by fit: its GPUs are --gpus (or --nodes × GPUs per
	// node), split by the search, so --nodes is not checked against dp × tp × pp.
	searched bool
	recipe   string
	sets     []string
	changed  func(string) bool
	// flags is the flag set register added to: a refusal quotes a flag's
	// value as given.
	flags *pflag.FlagSet
}

// refusedFirst is the refusal of a spec the engine will refuse, checked
// before any warning is printed, so that a refusal is its one line on
// stderr (a warning about a v1 trace's --dp came before --zero 3's
// refusal of it). It validates a copy: the plan validates its own.
func refusedFirst(s engine.Spec) error { return s.Validate() }

func newPlanCmd(stdout io.Writer) *cobra.Command {
	f, rf, sf := &planFlags{}, &reservedFlags{}, &serveFlags{}
	c := &cobra.Command{
		Use:   "plan",
		Short: "Simulate one iteration and report its memory ledger, timeline and peak",
		Example: `  memplan plan --model llama-3-8b --gpu h100 --micro-batch 1 --seq 4096 --precision bf16
  memplan plan --model ./config.json --mode infer --seq 2048 --gen-tokens 512 --json`,
		Long: "plan simulates one iteration of the job op by op and reports its memory ledger, timeline and peak,\n" +
			"and whether it fits the --gpu or --budget; a job that does not fit names compare's largest lever.\n\n" + exitHelp,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if f.mode == "serve" {
				return sf.run(cmd, stdout, f)
			}
			if err := sf.unreadOutsideServe(f.mode); err != nil {
				return err
			}
			if n := f.timelinePoints; n < 1 || n > report.MaxTimelinePoints {
				return fmt.Errorf("--timeline-points %d: want 1 to %d events (--no-timeline leaves the timeline out)", n, report.MaxTimelinePoints)
			}
			spec, err := f.spec()
			if err != nil {
				return err
			}
			ws := f.warnings(&spec) // drops what they say is ignored
			if err := refusedFirst(spec); err != nil {
				return err
			}
			warn(cmd.ErrOrStderr(), ws)
			done, err := heavyTurn(cmd.Context(), &spec) // beside another request of memplan serve
			if err != nil {
				return err
			}
			defer done()
			// The lever of a job that does not fit plans it again with
			// other strategies: through the baseline's cache, the model
			// is built and lowered once, and the cache keeps only what
			// the lever plans from.
			cache := engine.LeverCache(spec)
			// The per-op timeline is drawn by the chart and the plots and
			// listed by the JSON; --json --no-timeline reads none of it
			// (deepseek-v3 --accum 4 --checkpoint full: 0.2 GB of points).
			plots := plotFlags(f.svg, f.png)
			timeline := !f.jsonOut || !f.noTimeline || plots[0].path != "" || plots[1].path != ""
			res, err := engine.PlanWith(spec, engine.Options{Cache: cache, Context: cmd.Context(), NoTimeline: !timeline})
			if err != nil {
				return err
			}
			// The reserved bytes are predicted before the next step is
			// planned: side by side, the replays' allocator state was live
			// beside the next step's programs (deepseek-v3 --accum 8: 1.87
			// GiB of peak RSS side by side, 1.77 GiB in turn), for little
			// time saved (6.1-6.6 s side by side, 6.7-6.8 s in turn).
			if err := rf.apply(cmd.Context(), res, timeline); err != nil {
				return err
			}
			// The report is drawn before the next step is planned, and
			// the result compacted, unless a plot reads it after: its
			// first-step program and timelines were live beside the next
			// step's programs.
			var j *report.PlanJSON
			var text *report.Text
			if f.jsonOut {
				points := f.timelinePoints
				if f.noTimeline {
					points = 0
				}
				j = report.Build(res, points)
			} else if text, err = report.PrepareText(res, report.TextOptions{Chart: !f.noChart}); err != nil {
				return err
			}
			if plots[0].path == "" && plots[1].path == "" {
				res.Compact()
			}
			next, err := nextStep(cmd.Context(), res, cache)
			if err != nil {
				return err
			}
			for _, o := range plots {
				if o.path != "" {
					if err := report.WritePlot(o.path, res, report.PlotOptions{}); err != nil {
						return onFlag(o.flag, err)
					}
				}
			}
			err = emit(stdout, f.jsonOut,
				func(w io.Writer) error {
					j.NextStep, j.Warnings = report.NextStep(next), ws
					return writeJSON(w, j)
				},
				func(w io.Writer) error { return text.Write(w, next) })
			if err != nil {
				return err
			}
			return planVerdict(res)
		},
	}
	fl := c.Flags()
	f.register(fl)
	outputFlags(fl, &f.jsonOut, "print the machine-readable JSON report (memplan.plan/v1)")
	fl.BoolVar(&f.noTimeline, "no-timeline", false, "leave the per-op timeline out of the JSON")
	intVar(fl, &f.timelinePoints, "timeline-points", report.DefaultTimelinePoints,
		fmt.Sprintf("most events of the JSON timeline: a plan of more ops gives each run of ops in a row as its highest (the peak's op among them), with op_index and ops (at most %d)", report.MaxTimelinePoints))
	fl.BoolVar(&f.noChart, "no-chart", false, "leave the terminal chart out of the text report")
	fl.StringVar(&f.svg, "svg", "", "draw the timeline to this SVG file")
	fl.StringVar(&f.png, "png", "", "draw the timeline to this PNG file")
	rf.register(fl)
	sf.register(fl)
	return c
}

// register adds the flags that describe a job, shared by plan, compare and
// fit.
func (f *planFlags) register(fl *pflag.FlagSet) {
	fl.StringVar(&f.graph, "graph", "", "a PyTorch training-step trace (python3 -m memplan_torch export ... --out trace.json) instead of --model")
	fl.StringVar(&f.workloadPath, "workload", "", "a workload file (YAML/JSON, docs/measure-format.md) setting batch, accumulation, optimizer, checkpointing; with --graph")
	f.changed, f.flags = fl.Changed, fl
	fl.StringVar(&f.model, "model", "gpt2", "catalog model name (see 'memplan models') or path to a HuggingFace config.json")
	fl.StringVar(&f.gpu, "gpu", "", "GPU to fit on (see 'memplan gpus')")
	fl.StringVar(&f.budget, "budget", "", "memory budget instead of a GPU's capacity, e.g. 24GiB or 80GB")
	fl.StringVar(&f.hostMemory, "host-memory", "", "host memory of one node the job may pin for offload, e.g. 512GiB (a plan over it does not fit)")
	intVar(fl, &f.gpusPerNode, "gpus-per-node", 0, "GPUs of one node: they share its host memory and NVLink, ranks fill a node tensor parallel first (default: the GPU catalog's node, else 8)")
	intVar(fl, &f.nodes, "nodes", 0, "nodes the job runs on: dp × tp × pp must be nodes × GPUs per node (fit: the GPUs to split, unless --gpus)")
	fl.StringVar(&f.cluster, "cluster", "", "a cluster file (YAML: gpus_per_node, inter_node: {gbps, latency_us}) giving the link collectives across nodes are priced on")
	fl.StringVar(&f.mode, "mode", "train", "train, infer, or serve (plan and max: vLLM's start-up, paged KV cache and concurrency)")
	intVar(fl, &f.microBatch, "micro-batch", 1, "sequences (or images) per micro-step; with --graph, the batch the trace was exported at unless given")
	intVar(fl, &f.seq, "seq", 0, "sequence length in tokens (default min(2048, the model's positions); with --graph, the trace's own)")
	intVar(fl, &f.accum, "accum", 1, "gradient-accumulation micro-steps per optimizer step")
	intVar(fl, &f.genTokens, "gen-tokens", 0, "inference: tokens generated after the prompt (sizes the KV cache)")
	fl.StringVar(&f.precision, "precision", "amp-bf16", "fp32, amp-bf16, amp-fp16, bf16, fp16 (bf16/fp16 keep fp32 master weights), pure-bf16 or pure-fp16 (16-bit state, no master: litgpt bf16-true), autocast-bf16 (bf16 state under autocast: transformers 5.x bf16=True over a bf16 checkpoint)")
	fl.StringVar(&f.optimizer, "optimizer", "adamw", strings.Join(lower.OptimizerNames(), ", "))
	fl.StringVar(&f.impl, "optimizer-impl", "foreach", "optimizer step implementation: foreach, single or fused")
	fl.StringVar(&f.attention, "attention", "sdpa", "attention implementation: sdpa (flash/memory-efficient; flash and flash_attention_2, Hugging Face's names, mean the same) or eager")
	fl.StringVar(&f.kernels, "kernels", "cuda", "kernel semantics: cuda, or cpu (dropout masks in the input dtype)")
	fl.StringVar(&f.checkpoint, "checkpoint", "none", "activation checkpointing: none, full (every block), every=K, modules=GLOB[,GLOB], selective (attention core), selective-op (torchtitan: SDPA and every other matmul kept), auto (the least recompute that fits)")
	intVar(fl, &f.tp, "tp", 1, "tensor-parallel degree (Megatron-LM); plans one GPU of the group")
	fl.BoolVar(&f.sp, "sp", false, "sequence parallel (with --tp > 1)")
	intVar(fl, &f.ep, "ep", 1, "expert-parallel degree for mixture-of-experts models")
	intVar(fl, &f.dp, "dp", 1, "data-parallel degree (DDP gradient buckets, or the ZeRO/FSDP sharding degree)")
	intVar(fl, &f.zero, "zero", 0, "ZeRO stage over --dp ranks: 1 (optimizer state), 2 (+gradients), 3 (+parameters, = FSDP FULL_SHARD)")
	fl.BoolVar(&f.fsdp, "fsdp", false, "FSDP FULL_SHARD over --dp ranks (same as --zero 3)")
	intVar(fl, &f.pp, "pp", 1, "pipeline-parallel stages (--accum is the number of micro-batches); every stage is planned, the worst reported")
	fl.StringVar(&f.ppSchedule, "pp-schedule", "1f1b", "pipeline schedule: 1f1b or gpipe")
	intVar(fl, &f.ppInterleave, "pp-interleave", 1, "virtual pipeline stages per rank (interleaved 1F1B)")
	fl.StringVar(&f.offload, "offload", "none", "move to host memory: activations (save_on_cpu), optimizer (ZeRO-Offload), params (with --zero 3); comma list")
	fl.StringVar(&f.lora, "lora", "", "LoRA adapters, e.g. r=16,alpha=32,dropout=0.05,targets=q_proj,v_proj (targets=all-linear for every linear)")
	fl.BoolVar(&f.qlora, "qlora", false, "QLoRA: NF4 base weights with double-quantized constants (needs --lora)")
	fl.BoolVar(&f.firstStep, "first-step", true, "also simulate the first step, which creates the optimizer state")
	fl.StringVar(&f.recipe, "recipe", "hf", "how the framework runs the job: "+strings.Join(recipe.Names(), ", ")+", or a recipe file (see 'memplan recipes')")
	fl.StringArrayVar(&f.sets, "set", nil, "override one recipe switch, key=value (repeatable; see 'memplan recipes NAME'); the switches flags also set ("+strings.Join(flaggedSwitches(), ", ")+") must agree with their flag when both are given")
	recipeDefaults(fl, f.recipe)
}

// recipeDefaults words the help of each flag a recipe switch mirrors
// (--precision, --optimizer, --optimizer-impl, --attention, --checkpoint)
// as what it is: left out, the flag takes the --recipe's value, the flag's
// own only where the recipe sets none. Their built-in default was shown
// as the default ("--optimizer-impl ... (default "foreach")" while
// --recipe megatron plans fused), and the service's field docs repeated
// it. The help names the value under the default recipe instead.
func recipeDefaults(fl *pflag.FlagSet, defaultRecipe string) {
	r, err := recipe.Load(defaultRecipe)
	if err != nil {
		panic("cli: the default recipe does not load: " + err.Error()) // an embedded file
	}
	for _, sw := range recipe.Switches() {
		f := fl.Lookup(sw.Flag)
		if sw.Flag == "" || f == nil || f.DefValue == "" {
			continue
		}
		v := r.Value(sw.Key)
		if v == "" {
			v = f.DefValue
		}
		f.Usage += fmt.Sprintf(" (default: the --recipe's; %s with --recipe %s)", v, defaultRecipe)
		f.DefValue = ""
	}
}

// flaggedSwitches are the keys of the recipe switches a flag also sets
// (recipe.Switch.Flag).
func flaggedSwitches() []string {
	var out []string
	for _, sw := range recipe.Switches() {
		if sw.Flag != "" {
			out = append(out, sw.Key)
		}
	}
	return out
}

// planFlagNames are the flags register adds, by name.
var planFlagNames = registeredNames((&planFlags{}).register)

// registeredNames is the set of flags register adds, by name, made once.
func registeredNames(register func(*pflag.FlagSet)) func() map[string]bool {
	return sync.OnceValue(func() map[string]bool {
		fl := pflag.NewFlagSet("names", pflag.ContinueOnError)
		register(fl)
		names := map[string]bool{}
		fl.VisitAll(func(f *pflag.Flag) { names[f.Name] = true })
		return names
	})
}

// isPlanFlag reports whether flag name describes a job to plan (register's).
func isPlanFlag(name string) bool { return planFlagNames()[name] }

// firstGiven is the first flag given on fl, in name order, that refused
// reports true for ("" when none): a command path that reads only some of
// its command's flags refuses the others by name instead of ignoring them.
func firstGiven(fl *pflag.FlagSet, refused func(name string) bool) string {
	var first string
	fl.Visit(func(f *pflag.Flag) {
		if first == "" && refused(f.Name) {
			first = f.Name
		}
	})
	return first
}

func (f *planFlags) spec() (engine.Spec, error) {
	var s engine.Spec
	for _, part := range []func(*engine.Spec) error{f.specSource, f.specNames, f.specSizes, f.specHardware,
		f.specCheckpoint, f.specParallel, f.specSavings, f.specFinish} {
		if err := part(&s); err != nil {
			return s, err
		}
	}
	return s, nil
}

// specSource reads the model or the trace.
func (f *planFlags) specSource(s *engine.Spec) error {
	var err error
	switch {
	case f.graph != "":
		if f.changed("model") {
			return fmt.Errorf("give --model or --graph, not both")
		}
		s.Trace, err = torchtrace.Load(f.graph)
	case f.workloadPath != "":
		return fmt.Errorf("--workload needs --graph: the trace of the workload's model (memplan_torch export)")
	default:
		s.Model, err = resolveModel(f.model)
	}
	return err
}

// specNames reads the switches that name a table row: mode, precision, optimizer, implementation, attention,
// kernels.
func (f *planFlags) specNames(s *engine.Spec) error {
	var err error
	if s.Mode, err = engine.ParseMode(f.mode); err != nil {
		// serve is plan's and max's own path (vLLM), before any spec.
		return fmt.Errorf("--mode %q: want train or infer (or serve, in plan and max)", f.mode)
	}
	if s.Precision, err = ops.ParsePrecision(f.precision); err != nil {
		return badChoice("--precision", f.precision, ops.PrecisionNames()...)
	}
	if s.Optimizer, err = lower.ParseOptimizer(f.optimizer); err != nil {
		return badChoice("--optimizer", f.optimizer, lower.OptimizerNames()...)
	}
	if s.Impl, err = lower.ParseImpl(f.impl); err != nil {
		return badChoice("--optimizer-impl", f.impl, "foreach", "single", "fused")
	}
	if s.Attention, err = build.ParseAttention(f.attention); err != nil {
		return badChoice("--attention", f.attention, "eager", "sdpa")
	}
	switch f.kernels {
	case "cuda":
		s.Device = ops.CUDA
	case "cpu":
		s.Device = ops.CPU
	default:
		return badChoice("--kernels", f.kernels, "cuda", "cpu")
	}
	return nil
}

// specSizes reads micro-batch, seq, accum and generated tokens.
func (f *planFlags) specSizes(s *engine.Spec) error {
	// --seq's default 0 is the model's (or the trace's) own length: a 0
	// given is refused, not read as that default; --gen-tokens 0 is
	// generating none.
	if err := givenBelow(f.flags, 1, "micro-batch", "seq", "accum"); err != nil {
		return err
	}
	if err := givenBelow(f.flags, 0, "gen-tokens"); err != nil {
		return err
	}
	s.MicroBatch, s.Seq, s.Accum, s.GenTokens = f.microBatch, f.seq, f.accum, f.genTokens
	return nil
}

// specHardware reads the GPU and the budget.
func (f *planFlags) specHardware(s *engine.Spec) error {
	var err error
	if f.gpu != "" {
		if s.GPU, err = lookupGPU(f.gpu); err != nil {
			return err
		}
	}
	if f.budget != "" {
		if s.Capacity, err = units.ParseBytes(f.budget); err != nil {
			return fmt.Errorf("--budget: %w", err)
		}
	}
	if f.hostMemory != "" {
		if s.HostMemory, err = units.ParseBytes(f.hostMemory); err != nil {
			return fmt.Errorf("--host-memory: %w", err)
		}
		if s.HostMemory <= 0 {
			return fmt.Errorf("--host-memory must be positive, got %q", f.hostMemory)
		}
	}
	if err := givenBelow(f.flags, 1, "gpus-per-node", "nodes"); err != nil {
		return err
	}
	s.GPUsPerNode = f.gpusPerNode
	return f.specCluster(s)
}

// specCluster reads --cluster: its inter-node link, and its GPUs per node
// unless --gpus-per-node says the same or nothing.
func (f *planFlags) specCluster(s *engine.Spec) error {
	if f.cluster == "" {
		return nil
	}
	data, err := boundedio.ReadFile(f.cluster, boundedio.SmallFile)
	if err != nil {
		return fmt.Errorf("--cluster: %v", err)
	}
	c, err := hw.ParseCluster(data)
	if err != nil {
		return fmt.Errorf("--cluster %s: %v", f.cluster, err)
	}
	if c.GPUsPerNode > 0 {
		if f.changed("gpus-per-node") && f.gpusPerNode != c.GPUsPerNode {
			return fmt.Errorf("--gpus-per-node %d contradicts --cluster %s (gpus_per_node: %d)", f.gpusPerNode, f.cluster, c.GPUsPerNode)
		}
		s.GPUsPerNode = c.GPUsPerNode
	}
	s.InterNode = cost.Link{Bandwidth: c.InterNodePerDirection, Latency: c.InterNodeLatency}
	return nil
}

// checkNodes holds --nodes to the plan's GPUs: dp × tp × pp must fill the
// nodes exactly.
func (f *planFlags) checkNodes(s *engine.Spec) error {
	if f.nodes == 0 || f.searched {
		return nil
	}
	want, ok := units.MulChecked(int64(f.nodes), int64(s.NodeGPUs()), engine.MaxGPUs)
	if !ok {
		return fmt.Errorf("--nodes %d × %d GPUs per node is over the limit of %d GPUs", f.nodes, s.NodeGPUs(), engine.MaxGPUs)
	}
	job, ok1 := units.MulChecked(int64(max(s.DP, 1)), int64(max(s.TP, 1)), engine.MaxGPUs)
	job, ok2 := units.MulChecked(job, int64(max(s.PP, 1)), engine.MaxGPUs)
	if !ok1 || !ok2 {
		return fmt.Errorf("--dp × --tp × --pp is over the limit of %d GPUs", engine.MaxGPUs)
	}
	if job != want {
		return fmt.Errorf("--nodes %d × %d GPUs per node = %d GPUs, but --dp %d × --tp %d × --pp %d = %d; make them equal (e.g. --dp %d)",
			f.nodes, s.NodeGPUs(), want, max(s.DP, 1), max(s.TP, 1), max(s.PP, 1), job, max(want/int64(max(s.TP, 1)*max(s.PP, 1)), 1))
	}
	return nil
}

// specParallel reads the parallel layout: tensor, sequence, expert, data (ZeRO, FSDP) and pipeline.
func (f *planFlags) specParallel(s *engine.Spec) error {
	var err error
	if err := givenBelow(f.flags, 1, "tp", "ep", "dp", "pp", "pp-interleave"); err != nil {
		return err
	}
	s.TP, s.SP, s.EP, s.QLoRA = f.tp, f.sp, f.ep, f.qlora
	s.DP, s.ZeRO, s.PP, s.PPInterleave = f.dp, f.zero, f.pp, f.ppInterleave
	if s.PPSchedule, err = strategy.ParseSchedule(f.ppSchedule); err != nil {
		return badChoice("--pp-schedule", f.ppSchedule, "1f1b", "gpipe")
	}
	if f.fsdp {
		if f.zero != 0 && f.zero != 3 {
			return fmt.Errorf("--fsdp is ZeRO-3; it cannot go with --zero %d", f.zero)
		}
		s.ZeRO = 3
	}
	return f.checkNodes(s)
}

// specCheckpoint reads the checkpointing policy.
func (f *planFlags) specCheckpoint(s *engine.Spec) (err error) {
	s.Checkpoint, err = engine.ParseCheckpoint(f.checkpoint)
	return err
}

// specSavings reads offload and LoRA.
func (f *planFlags) specSavings(s *engine.Spec) error {
	var err error
	if s.Offload, err = engine.ParseOffload(f.offload); err != nil {
		return err
	}
	if f.lora != "" {
		l, err := build.ParseLoRA(f.lora)
		if err != nil {
			return fmt.Errorf("--lora: %s", strings.TrimPrefix(err.Error(), "LoRA: "))
		}
		s.LoRA = l
	}
	s.FirstStep = f.firstStep
	return nil
}

// specFinish applies the recipe, what a trace keeps (its recorded optimizer step unless one is asked for, its
// batch, its dtypes) and the workload, and checks that the plot files can be written.
func (f *planFlags) specFinish(s *engine.Spec) error {
	if err := f.applyRecipe(s); err != nil {
		return err
	}
	if s.Trace != nil {
		f.traceHold(s)
		s.TraceOptimizer = f.changed("optimizer") || f.changed("optimizer-impl")
		if !f.changed("micro-batch") {
			s.MicroBatch = 0
		}
		if f.changed("precision") {
			return fmt.Errorf("--precision does not apply to a trace: it ran in the dtypes it recorded")
		}
		if f.changed("attention") {
			return fmt.Errorf("--attention: a trace ran the attention it recorded")
		}
	}
	if err := f.checkImpl(s); err != nil {
		return err
	}
	if f.workloadPath != "" {
		if err := f.applyWorkload(s); err != nil {
			return err
		}
	}
	if err := checkPlotNames(f.svg, f.png); err != nil {
		return err
	}
	for _, o := range plotFlags(f.svg, f.png) {
		if o.path == "" {
			continue
		}
		if _, err := os.Stat(dirOf(o.path)); err != nil {
			return fmt.Errorf("%s: cannot write %s: %w", o.flag, o.path, errors.Unwrap(err))
		}
	}
	return nil
}

// traceHold sets how long the loop keeps a trace's model output: --set
// loop.hold-outputs when given, else --recipe's when given, else the loop
// the exporter modelled (export-hf: the Trainer's, none), else a plain
// loop's (`out = model(x); loss = f(out); loss.backward()` holds it through
// backward). A trace that does not record its output (exported before
// memplan_torch did) is replayed as recorded (dropped once the loss exists)
// unless the switch is set.
func (f *planFlags) traceHold(s *engine.Spec) {
	if _, set := f.setValue("loop.hold-outputs"); set {
		return
	}
	mo := s.Trace.ModelOutput
	switch {
	case mo == nil:
		s.Sem.Hold = lower.HoldNone
	case f.changed("recipe"):
	case mo.Hold != "":
		s.Sem.Hold = lower.Hold(slices.Index(torchtrace.Holds, mo.Hold))
	default:
		s.Sem.Hold = lower.HoldBackward
	}
}

// checkImpl refuses an optimizer step the user asked for (--optimizer-impl, or --set optimizer.impl) that the
// optimizer does not have: planning its own step instead would answer another question than the one asked
// (torch.optim.RMSprop(fused=True) raises, bitsandbytes has no foreach loop). A step a recipe chose for its
// own optimizer (torchtune's fused AdamW) is planned as the optimizer's own (engine.Spec.Validate).
func (f *planFlags) checkImpl(s *engine.Spec) error {
	if s.Mode != engine.Train || s.Trace != nil && !s.TraceOptimizer {
		return nil // no step planned: the flag is warned about, or the trace's own step replayed
	}
	err := s.Optimizer.CheckImpl(s.Impl)
	if err == nil {
		return nil
	}
	if f.changed("optimizer-impl") {
		return fmt.Errorf("--optimizer-impl %s: %v", f.impl, err)
	}
	if v, ok := f.setOf("optimizer.impl"); ok {
		return fmt.Errorf("--set optimizer.impl=%s: %v", v, err)
	}
	return nil
}

// setOf is the value --set last gave key, and whether it gave one.
func (f *planFlags) setOf(key string) (string, bool) {
	v, ok := "", false
	for _, kv := range f.sets {
		if k, val, found := strings.Cut(kv, "="); found && strings.TrimSpace(k) == key {
			v, ok = strings.TrimSpace(val), true
		}
	}
	return v, ok
}

// applyRecipe applies --recipe and --set: a recipe's value for a switch that
// mirrors a flag yields to that flag when it was given, and a --set of it
// that disagrees with the flag is refused naming both (recipe.Apply). A
// trace keeps the dtypes it recorded.
func (f *planFlags) applyRecipe(s *engine.Spec) error {
	r, err := loadRecipe(f.recipe)
	if err != nil {
		return err
	}
	r = r.Clone()
	given := map[string]string{}
	for _, kv := range f.sets {
		if err := r.Set(kv); err != nil {
			return err
		}
		// A key given twice is refused, as in a recipe file: the last
		// one silently won.
		key, value, _ := strings.Cut(kv, "=")
		key, value = strings.TrimSpace(key), strings.TrimSpace(value)
		if prev, ok := given[key]; ok {
			return fmt.Errorf("--set %s given twice (%s=%s, then %s=%s): give it once", key, key, prev, key, value)
		}
		given[key] = value
	}
	if err := f.allocConfFlag(s); err != nil {
		return err
	}
	prec := s.Precision
	var d *recipe.Disagreement
	if err := r.Apply(s, f.changed); errors.As(err, &d) {
		return fmt.Errorf("--%s %s and --set %s=%s disagree", d.Flag, f.flags.Lookup(d.Flag).Value, d.Key, d.Value)
	} else if err != nil {
		return err
	}
	if s.Trace != nil {
		if s.Precision != prec && r.Value("precision") != "" && slices.ContainsFunc(f.sets, func(kv string) bool { return strings.HasPrefix(kv, "precision=") }) {
			return fmt.Errorf("--set precision does not apply to a trace: it ran in the dtypes it recorded")
		}
		s.Precision = prec
	}
	return nil
}

// allocConfFlag sets the spec's allocator settings from --alloc-conf when
// it was given (plan's flag; the switch cuda.alloc-conf mirrors it), before
// the recipe: a recipe's own setting yields to it and a --set that
// disagrees is refused, as with every mirrored flag (it was silently
// replaced by the flag).
func (f *planFlags) allocConfFlag(s *engine.Spec) error {
	fl := f.flags.Lookup("alloc-conf")
	if fl == nil || !f.changed("alloc-conf") {
		return nil
	}
	v := fl.Value.String()
	if _, err := allocator.ParseConf(v); err != nil {
		return fmt.Errorf("--alloc-conf: %v", err)
	}
	s.Sem.AllocConf = v
	return nil
}

func dirOf(p string) string {
	if i := strings.LastIndexByte(p, '/'); i >= 0 {
		if i == 0 {
			return "/"
		}
		return p[:i]
	}
	return "."
}

// commas formats n with thousands separators (124,439,808).
func commas(n int64) string {
	s := fmt.Sprint(n)
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

// goParser matches pflag's quote of the Go function that failed to parse a
// flag's value.
var goParser = regexp.MustCompile(`^strconv\.\w+: parsing "[^"]*": `)

// nextStep is where plan and max point a job that does not fit: compare's
// largest lever (planned through cache) when it is over its GPU or budget;
// none when it is over --host-memory alone, as the levers lower the device
// peak and those that lower it most (offload) add host memory.
func nextStep(ctx context.Context, res *engine.Result, cache *engine.Cache) (*engine.Row, error) {
	if res.Capacity <= 0 || res.Shortfall <= 0 {
		return nil, nil
	}
	return engine.LargestLeverContext(ctx, res, cache)
}
