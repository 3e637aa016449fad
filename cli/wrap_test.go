package cli

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/memplan/memplan/lower"
	"github.com/memplan/memplan/ops"
	"github.com/memplan/memplan/recipe"
)

// memplan recipes fits 80 columns when not printing to a terminal and wraps
// at word boundaries (issue 15: it cut "pure-bf16" into "pu" and "re-bf16"
// at fixed column widths, 190 columns wide): every word of its output is a
// whole word of the texts it prints, or a piece of one longer than a column
// holds.
func TestRecipesWrapAtWords(t *testing.T) {
	// The tables' headers, then what their rows print.
	source := []string{"recipe framework version switch values what it changes value source optimizer state it keeps steps follows"}
	for _, s := range recipe.Switches() {
		source = append(source, s.Key, s.Values, s.Doc, "(training only: ignored with --mode infer)")
	}
	for _, p := range ops.Precisions() {
		source = append(source, p.String(), p.Doc())
	}
	for _, o := range lower.Optimizers() {
		source = append(source, o.String(), o.Doc(), o.Source(), "foreach, single, fused")
	}
	rs, err := recipe.List()
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rs {
		source = append(source, r.Name, r.Framework, r.Version, r.Doc, r.Name+":", "("+r.Version+")")
		for _, s := range r.Settings {
			source = append(source, s.Key, s.Value, s.Source)
		}
	}
	words := map[string]bool{}
	var long []string
	for _, w := range strings.Fields(strings.Join(source, " ") + " " + strings.ToUpper(strings.Join(source, " "))) {
		words[w] = true
		if len(w) > 12 {
			long = append(long, w)
		}
	}
	for _, args := range [][]string{{"recipes"}, {"recipes", "litgpt"}, {"recipes", "torchtitan"}, {"recipes", "hf5"}} {
		code, out, errs := run(args...)
		if code != 0 {
			t.Fatalf("%q: exit %d: %s", args, code, errs)
		}
		for _, line := range strings.Split(strings.TrimRight(out, "\n"), "\n") {
			if n := utf8.RuneCountInString(line); n > 80 {
				t.Errorf("%q: a line of %d columns: %q", args, n, line)
			}
			for _, w := range strings.Fields(strings.NewReplacer("│", " ", "┌", " ", "└", " ", "├", " ").Replace(line)) {
				if words[w] || strings.Trim(w, "─┬┼┴┐┘┤") == "" || pieceOfLong(w, long) {
					continue
				}
				t.Errorf("%q: %q is no whole word of the texts (a word cut in the middle?) in %q", args, w, line)
			}
		}
	}
}

// pieceOfLong reports whether w is part of a word too long for a column.
func pieceOfLong(w string, long []string) bool {
	for _, l := range long {
		if strings.Contains(l, w) || strings.Contains(strings.ToUpper(l), w) {
			return true
		}
	}
	return false
}
