package cli

import (
	"bytes"
	"io"

	"github.com/spf13/cobra"

	"github.com/memplan/memplan/engine"
	"github.com/memplan/memplan/report"
)

func newCompareCmd(stdout io.Writer) *cobra.Command {
	f := &planFlags{}
	var jsonOut bool
	var allow string
	c := &cobra.Command{
		Use:   "compare",
		Short: "Compare memory-saving strategies on the same job: peak, fits, extra FLOPs, step time",
		Long: "compare plans the job with each memory-saving strategy applied alone and puts peak, fits, extra FLOPs\n" +
			"and step time side by side.\n\n" + exitHelp + " compare exits 3 when the job fits only with a\nstrategy, 4 when it fits with none.",
		Example: `  memplan compare --model llama-3-8b --gpu h100 --micro-batch 8 --seq 4096 --precision bf16
  memplan compare --model llama-2-7b --gpu rtx-4090 --allow lora,qlora,8bit --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			spec, err := f.spec()
			if err != nil {
				return err
			}
			a, err := engine.ParseAllow(allow)
			if err != nil {
				return err
			}
			ws := f.warnings(&spec)
			warn(cmd.ErrOrStderr(), ws)
			rows, err := engine.Compare(spec, a)
			if err != nil {
				return err
			}
			err = emit(stdout, jsonOut,
				func(w io.Writer) error {
					j := report.BuildCompare(rows, true)
					j.Warnings = ws
					return writeJSON(w, j)
				},
				func(w io.Writer) error { return report.WriteCompareText(w, rows) })
			if err != nil {
				return err
			}
			return compareVerdict(rows)
		},
	}
	f.register(c.Flags())
	c.Flags().BoolVar(&jsonOut, "json", false, "print the machine-readable JSON")
	c.Flags().StringVar(&allow, "allow", "", "also compare options that change the training result: lora, qlora, 8bit, precision")
	return c
}

// compareVerdict is compare's exit status: the job fits as given (0), only
// with one of the strategies (3), or with none of them (4); 0 without a GPU
// or budget.
func compareVerdict(rows []engine.Row) error {
	base := rows[0].Result
	if base.Capacity == 0 || base.Fits {
		return nil
	}
	for _, r := range rows[1:] {
		if r.Err == nil && r.Result.Fits {
			return verdict(ExitDoesNotFit)
		}
	}
	return verdict(ExitNothingFits)
}

// emit renders the JSON or the text form into a buffer and writes it only
// when rendering succeeded, so a failure prints nothing half-done.
func emit(stdout io.Writer, jsonOut bool, asJSON, asText func(io.Writer) error) error {
	var buf bytes.Buffer
	render := asText
	if jsonOut {
		render = asJSON
	}
	if err := render(&buf); err != nil {
		return err
	}
	_, err := stdout.Write(buf.Bytes())
	return err
}
