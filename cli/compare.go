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
			// Each row is read into the report and compacted before the
			// next is planned: one variant's program is live at a time.
			rep := report.NewCompare(jsonOut)
			var v compareVerdict
			// Each strategy is a whole plan: deepseek-v3's seven take
			// about 12 s on two cores.
			bar := progress(cmd.ErrOrStderr(), compareRows(spec, a), "comparing strategies")
			err = engine.CompareEachContext(cmd.Context(), spec, a, func(r engine.Row) error {
				rep.Add(r)
				v.add(r)
				r.Result.Compact()
				if bar != nil {
					_ = bar.Add(1)
				}
				return nil
			})
			if bar != nil {
				_ = bar.Finish()
			}
			if err != nil {
				return err
			}
			err = emit(stdout, jsonOut,
				func(w io.Writer) error {
					j := rep.JSON()
					j.Warnings = ws
					return writeJSON(w, j)
				},
				rep.WriteText)
			if err != nil {
				return err
			}
			return v.err()
		},
	}
	f.register(c.Flags())
	outputFlags(c.Flags(), &jsonOut, "print the machine-readable JSON")
	c.Flags().StringVar(&allow, "allow", "", "also compare options that change the training result: lora, qlora, 8bit, precision")
	return c
}

// compareRows is the number of rows compare plans for spec (-1 when spec
// is invalid: CompareEach then refuses it).
func compareRows(spec engine.Spec, a engine.Allow) int {
	if spec.Validate() != nil {
		return -1
	}
	return len(engine.Variants(spec, a))
}

// compareVerdict is compare's exit status, read row by row (the baseline
// first): the job fits as given (0), only with one of the strategies (3), or
// with none of them (4); 0 without a GPU or budget.
type compareVerdict struct {
	base         *engine.Result
	strategyFits bool
}

func (v *compareVerdict) add(r engine.Row) {
	switch {
	case v.base == nil:
		v.base = r.Result
	case r.Err == nil && r.Result.Fits:
		v.strategyFits = true
	}
}

func (v *compareVerdict) err() error {
	switch {
	case v.base.Capacity == 0 || v.base.Fits:
		return nil
	case v.strategyFits:
		return verdict(ExitDoesNotFit)
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
