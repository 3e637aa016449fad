package cli

import (
	"io"
	"os"
	"slices"
	"strings"

	"github.com/jedib0t/go-pretty/v6/table"
	"github.com/jedib0t/go-pretty/v6/text"
	"golang.org/x/term"
)

// textWidth is the width text tables wrap to: the terminal's when w is one,
// else 80 columns (a pipe, a file, a test's buffer), and never under 40.
func textWidth(w io.Writer) int {
	if f, ok := w.(*os.File); ok {
		if cols, _, err := term.GetSize(int(f.Fd())); err == nil && cols > 0 {
			return max(cols, 40)
		}
	}
	return 80
}

// wrappedTable renders a light-ruled table at most width columns wide
// where it can be: the columns numbered in wrap (from 1) share what the
// others leave and wrap at word boundaries (a word longer than its column
// is broken). memplan recipes cut words in the middle at fixed widths
// ("pu│re-bf16") and ran 190 columns wide.
func wrappedTable(header []string, rows [][]string, wrap []int, width int) string {
	natural, word := make([]int, len(header)), make([]int, len(header))
	for _, r := range append([][]string{header}, rows...) {
		for i, cell := range r {
			for _, line := range strings.Split(cell, "\n") {
				natural[i] = max(natural[i], text.RuneWidthWithoutEscSequences(line))
			}
			for _, w := range strings.Fields(cell) {
				word[i] = max(word[i], text.RuneWidthWithoutEscSequences(w))
			}
		}
	}
	// "│ a │ b │" : three columns of rule and padding per cell, one more.
	left := width - 3*len(header) - 1
	for i, n := range natural {
		if !slices.Contains(wrap, i+1) {
			left -= n
		}
	}
	t := table.NewWriter()
	t.SetStyle(table.StyleLight)
	t.AppendHeader(toRow(header))
	for _, r := range rows {
		t.AppendRow(toRow(r))
	}
	var cfg []table.ColumnConfig
	for col, w := range shareWidth(natural, word, wrap, left) {
		cfg = append(cfg, table.ColumnConfig{Number: col, WidthMax: w, WidthMaxEnforcer: wrapText})
	}
	t.SetColumnConfigs(cfg)
	return t.Render()
}

// shareWidth gives the columns in wrap (numbered from 1) widths summing to
// at most left where it can. Each first gets its longest word (up to 24
// columns, and an even share of left when the words do not fit: a longer
// word is broken), so that words are not cut;
// what is left goes to them in proportion to what more their natural
// (unwrapped) width asks. A table too narrow for even the words is wider
// than left rather than one letter a line.
func shareWidth(natural, word, wrap []int, left int) map[int]int {
	out := map[int]int{}
	words := 0
	for _, col := range wrap {
		out[col] = min(natural[col-1], word[col-1], 24)
		words += out[col]
	}
	if words > left { // the words alone are too wide: the longest are broken
		for _, col := range wrap {
			out[col] = min(out[col], max(left/len(wrap), 12))
		}
	}
	more := 0
	for _, col := range wrap {
		left -= out[col]
		more += natural[col-1] - out[col]
	}
	for _, col := range wrap {
		if left <= 0 || more == 0 {
			break
		}
		want := natural[col-1] - out[col]
		add := min(want, left*want/more)
		out[col] += add
		left -= add
		more -= want
	}
	return out
}

// wrapText wraps s at word boundaries to width columns, with no padding
// after a line's last word. A word longer than a line (a source's path) is
// broken after a '/' (else a '.', '_' or ',') where one falls in the line,
// else at the width.
func wrapText(s string, width int) string {
	var lines []string
	for _, para := range strings.Split(s, "\n") {
		line := ""
		for _, w := range strings.Fields(para) {
			for text.RuneWidthWithoutEscSequences(w) > width {
				if line != "" {
					lines, line = append(lines, line), ""
				}
				cut := breakAt(w, width)
				lines, w = append(lines, w[:cut]), w[cut:]
			}
			switch {
			case line == "":
				line = w
			case text.RuneWidthWithoutEscSequences(line)+1+text.RuneWidthWithoutEscSequences(w) <= width:
				line += " " + w
			default:
				lines, line = append(lines, line), w
			}
		}
		lines = append(lines, line)
	}
	return strings.Join(lines, "\n")
}

// breakAt is where to cut w, longer than width: after the last '/' within
// width runes, else the last '.', '_' or ',', else at width runes.
func breakAt(w string, width int) int {
	end, n := 0, 0
	for i := range w {
		if n == width {
			end = i
			break
		}
		n++
	}
	for _, at := range []string{"/", "._,"} {
		if k := strings.LastIndexAny(w[:end], at); k > 0 {
			return k + 1
		}
	}
	return end
}

func toRow(cells []string) table.Row {
	r := make(table.Row, len(cells))
	for i, c := range cells {
		r[i] = c
	}
	return r
}
