package cli

import (
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/memplan/memplan/diagnose"
)

func newDiagnoseCmd(stdout io.Writer) *cobra.Command {
	f := &planFlags{}
	var reserved bool
	var capacity string
	var device int64
	var jsonOut bool
	c := &cobra.Command{
		Use:   "diagnose [SNAPSHOT]",
		Short: "Vary one input at a time, watch which memory object grows, name the pressure object and the cheapest next step",
		Long: "diagnose plans the job, then the job with one input changed at a time (micro-batch ×2, sequence ×2,\n" +
			"accumulation ×2, the optimizer, checkpointing, the precision), prints how the peak, its phase and each\n" +
			"ledger category move, names the object that presses on the peak (activations, loss logits, optimizer\n" +
			"state, parameters, gradients, KV cache, temporaries; with --reserved, the caching allocator's\n" +
			"fragmentation) and the cheapest of compare's strategies that fits (or lowers the peak by 10%).\n" +
			"For --mode infer it varies the micro-batch, sequence, generated tokens and precision, and names the\n" +
			"change of the table that lowers the peak most.\n" +
			"Given a CUDA memory snapshot (torch.cuda.memory._dump_snapshot), it says which phase and which lifetime\n" +
			"objects hit the device's line: at the snapshot's recorded out-of-memory event, or where the caching\n" +
			"allocator model replaying its allocations on a device of --capacity bytes runs out (or on --gpu's memory\n" +
			"less the CUDA context, as plan counts it). A snapshot takes no other plan flag. Its exit status: 3 when\n" +
			"the run ran out (recorded or replayed; the report is printed), 0 when the replay fits the device given\n" +
			"(one line says so), 1 for bad input, a snapshot with no out-of-memory event and no device among it.",
		Example: `  memplan diagnose --model llama-3.2-1b --gpu rtx-4090 --micro-batch 4 --seq 2048
  memplan diagnose oom_snapshot.pickle
  memplan diagnose snapshot.pickle --capacity 12GiB
  memplan diagnose snapshot.pickle --gpu t4`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 1 {
				if device < -1 {
					return errBadDevice(device)
				}
				if n := firstGiven(cmd.Flags(), snapshotRefuses); n != "" {
					return fmt.Errorf("--%s does not apply to a snapshot (diagnose SNAPSHOT takes --capacity or --gpu, --device and --json)", n)
				}
				c, err := snapshotCapacity(capacity, f.gpu)
				if err != nil {
					return err
				}
				return diagnoseSnapshot(cmd.Context(), stdout, args[0], c, device, jsonOut)
			}
			if capacity != "" || jsonOut || device >= 0 {
				// Named as given: -o json is --json's other spelling.
				given := "--capacity"
				switch {
				case jsonOut && cmd.Flags().Changed("output"):
					given = "-o json"
				case jsonOut:
					given = "--json"
				case device >= 0:
					given = "--device"
				}
				return fmt.Errorf("%s: only with a snapshot file (diagnose SNAPSHOT takes --capacity, --json or -o json and --device; the job's report is text)", given)
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
			rep, err := diagnose.Diagnose(spec, reserved)
			if err != nil {
				return err
			}
			if err := diagnose.Write(stdout, rep); err != nil {
				return err
			}
			return planVerdict(rep.Plan)
		},
	}
	f.register(c.Flags())
	c.Flags().Lookup("gpu").Usage += "; with a snapshot: replay it on this GPU's memory less the CUDA context (instead of --capacity)"
	c.Flags().StringVar(&capacity, "capacity", "", "with a snapshot: replay it on a device of this many bytes (e.g. 12GiB) to find where it runs out")
	outputFlags(c.Flags(), &jsonOut, "with a snapshot: print the machine-readable JSON report (memplan.diagnose-oom/v1)")
	int64Var(c.Flags(), &device, "device", -1, "with a snapshot: the device to diagnose (default: the one with the largest allocated peak)")
	c.Flags().BoolVar(&reserved, "reserved", false, "count the caching allocator's fragmentation (the reserved peak's unused bytes) as an object")
	return c
}

// snapshotRefuses reports whether diagnose SNAPSHOT refuses flag name: the
// plan flags but --gpu (the device to replay on) and --reserved, which
// describe a job to plan; a snapshot is one that ran.
func snapshotRefuses(name string) bool {
	return isPlanFlag(name) && name != "gpu" || name == "reserved"
}
