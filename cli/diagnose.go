package cli

import (
	"io"

	"github.com/spf13/cobra"

	"github.com/memplan/memplan/diagnose"
	"github.com/memplan/memplan/engine"
)

func newDiagnoseCmd(stdout io.Writer) *cobra.Command {
	f := &planFlags{}
	var reserved bool
	c := &cobra.Command{
		Use:   "diagnose",
		Short: "Vary one input at a time, watch which memory object grows, name the pressure object and the cheapest next step",
		Long: "diagnose plans the job, then the job with one input changed at a time (micro-batch ×2, sequence ×2,\n" +
			"accumulation ×2, the optimizer, checkpointing, the precision), prints how the peak, its phase and each\n" +
			"ledger category move, names the object that presses on the peak (activations, loss logits, optimizer\n" +
			"state, parameters, gradients, KV cache, temporaries; with --reserved, the caching allocator's\n" +
			"fragmentation) and the cheapest of compare's strategies that fits (or lowers the peak by 10%).",
		Example: `  memplan diagnose --model llama-3.2-1b --gpu rtx-4090 --micro-batch 4 --seq 2048`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			spec, err := f.spec()
			if err != nil {
				return err
			}
			warn(cmd.ErrOrStderr(), f.warnings(&spec))
			rep, err := diagnose.Diagnose(spec, reserved)
			if err != nil {
				return err
			}
			if err := diagnose.Write(stdout, rep); err != nil {
				return err
			}
			return diagnoseVerdict(spec, rep)
		},
	}
	f.register(c.Flags())
	c.Flags().BoolVar(&reserved, "reserved", false, "count the caching allocator's fragmentation (the reserved peak's unused bytes) as an object")
	return c
}

// diagnoseVerdict is diagnose's exit status: 3 when the job as given does
// not fit its GPU or budget.
func diagnoseVerdict(s engine.Spec, rep *diagnose.Report) error {
	if err := s.Validate(); err != nil {
		return err
	}
	c := s.CapacityBytes()
	return fitsVerdict(c > 0, rep.Base.Peak <= c)
}
