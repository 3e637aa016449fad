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
			rows, err := engine.Compare(spec, a)
			if err != nil {
				return err
			}
			return emit(stdout, jsonOut,
				func(w io.Writer) error { return report.WriteCompareJSON(w, rows) },
				func(w io.Writer) error { return report.WriteCompareText(w, rows) })
		},
	}
	f.register(c.Flags())
	c.Flags().BoolVar(&jsonOut, "json", false, "print the machine-readable JSON")
	c.Flags().StringVar(&allow, "allow", "", "also compare options that change the training result: lora, qlora, 8bit, precision")
	return c
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
