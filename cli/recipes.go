package cli

import (
	"fmt"
	"io"
	"strings"

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
	width := textWidth(w)
	var rows [][]string
	for _, r := range rs {
		rows = append(rows, []string{r.Name, r.Framework, r.Version})
	}
	fmt.Fprintln(w, wrappedTable([]string{"recipe", "framework", "version"}, rows, []int{2, 3}, width))
	rows = nil
	for _, s := range recipe.Switches() {
		doc := s.Doc
		if s.Training {
			doc += " (training only: ignored with --mode infer)"
		}
		rows = append(rows, []string{s.Key, s.Values, doc})
	}
	fmt.Fprintln(w, wrappedTable([]string{"switch", "values", "what it changes"}, rows, []int{2, 3}, width))
	rows = nil
	for _, p := range ops.Precisions() {
		rows = append(rows, []string{p.String(), p.Doc()})
	}
	fmt.Fprintln(w, wrappedTable([]string{"precision", "where parameters, gradients and state live"}, rows, []int{2}, width))
	rows = nil
	for _, o := range lower.Optimizers() {
		var steps []string
		for _, i := range o.Impls() {
			steps = append(steps, i.String())
		}
		rows = append(rows, []string{o.String(), o.Doc(), strings.Join(steps, ", "), o.Source()})
	}
	_, err = fmt.Fprintln(w, wrappedTable([]string{"optimizer", "state it keeps", "steps", "follows"}, rows, []int{2, 3, 4}, width))
	return err
}

func showRecipe(w io.Writer, r *recipe.Recipe) error {
	width := textWidth(w)
	fmt.Fprintln(w, wrapText(fmt.Sprintf("%s: %s (%s)", r.Name, r.Framework, r.Version), width))
	fmt.Fprintln(w, wrapText(strings.TrimSpace(r.Doc), width))
	var rows [][]string
	for _, s := range r.Settings {
		rows = append(rows, []string{s.Key, s.Value, s.Source})
	}
	_, err := fmt.Fprintln(w, wrappedTable([]string{"switch", "value", "source"}, rows, []int{2, 3}, width))
	return err
}
