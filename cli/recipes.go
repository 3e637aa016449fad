package cli

import (
	"fmt"
	"io"
	"strings"

	"github.com/jedib0t/go-pretty/v6/table"
	"github.com/jedib0t/go-pretty/v6/text"
	"github.com/spf13/cobra"

	"github.com/memplan/memplan/lower"
	"github.com/memplan/memplan/ops"
	"github.com/memplan/memplan/recipe"
)

func newRecipesCmd(stdout io.Writer) *cobra.Command {
	return &cobra.Command{
		Use:   "recipes [NAME|FILE]",
		Short: "List the framework recipes, or one recipe's switches with their sources",
		Long: "A recipe says how a framework runs a job where frameworks differ in memory: precision policy,\n" +
			"optimizer state, loss, LoRA and 4-bit semantics, training-loop habits, library workspaces and the\n" +
			"device memory outside PyTorch's allocator. plan, compare and fit take --recipe NAME and --set key=value.",
		Example: "  memplan recipes\n  memplan recipes litgpt\n  memplan plan --model llama-2-7b --recipe litgpt --set loss=fp32-logits",
		Args:    cobra.MaximumNArgs(1),
		RunE: func(_ *cobra.Command, args []string) error {
			if len(args) == 0 {
				return listRecipes(stdout)
			}
			r, err := recipe.Load(args[0])
			if err != nil {
				return err
			}
			return showRecipe(stdout, r)
		},
	}
}

func listRecipes(w io.Writer) error {
	rs, err := recipe.List()
	if err != nil {
		return err
	}
	t := table.NewWriter()
	t.SetStyle(table.StyleLight)
	t.AppendHeader(table.Row{"recipe", "framework", "version"})
	for _, r := range rs {
		t.AppendRow(table.Row{r.Name, r.Framework, r.Version})
	}
	fmt.Fprintln(w, t.Render())
	t = table.NewWriter()
	t.SetStyle(table.StyleLight)
	t.AppendHeader(table.Row{"switch", "values", "what it changes"})
	for _, s := range recipe.Switches() {
		doc := s.Doc
		if s.Training {
			doc += " (training only: ignored with --mode infer)"
		}
		t.AppendRow(table.Row{s.Key, s.Values, doc})
	}
	t.SetColumnConfigs([]table.ColumnConfig{{Number: 2, WidthMax: 40}, {Number: 3, WidthMax: 70}})
	fmt.Fprintln(w, t.Render())
	t = table.NewWriter()
	t.SetStyle(table.StyleLight)
	t.AppendHeader(table.Row{"precision", "where parameters, gradients and state live"})
	for _, p := range ops.Precisions() {
		t.AppendRow(table.Row{p.String(), p.Doc()})
	}
	t.SetColumnConfigs([]table.ColumnConfig{{Number: 2, WidthMax: 100}})
	fmt.Fprintln(w, t.Render())
	t = table.NewWriter()
	t.SetStyle(table.StyleLight)
	t.AppendHeader(table.Row{"optimizer", "state it keeps", "steps", "follows"})
	for _, o := range lower.Optimizers() {
		var steps []string
		for _, i := range o.Impls() {
			steps = append(steps, i.String())
		}
		t.AppendRow(table.Row{o.String(), o.Doc(), strings.Join(steps, ", "), o.Source()})
	}
	t.SetColumnConfigs([]table.ColumnConfig{{Number: 2, WidthMax: 60}, {Number: 4, WidthMax: 60}})
	_, err = fmt.Fprintln(w, t.Render())
	return err
}

func showRecipe(w io.Writer, r *recipe.Recipe) error {
	fmt.Fprintf(w, "%s: %s (%s)\n", r.Name, r.Framework, r.Version)
	fmt.Fprintln(w, text.WrapSoft(strings.TrimSpace(r.Doc), 110))
	t := table.NewWriter()
	t.SetStyle(table.StyleLight)
	t.AppendHeader(table.Row{"switch", "value", "source"})
	for _, s := range r.Settings {
		t.AppendRow(table.Row{s.Key, s.Value, s.Source})
	}
	t.SetColumnConfigs([]table.ColumnConfig{{Number: 3, WidthMax: 90}})
	_, err := fmt.Fprintln(w, t.Render())
	return err
}
