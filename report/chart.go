package report

import (
	"errors"
	"fmt"
	"io"
	"math"
	"strings"

	"github.com/memplan/memplan/engine"
	"github.com/memplan/memplan/ir"
	"github.com/memplan/memplan/sim"
	"github.com/memplan/memplan/units"
)

// Default and minimum sizes of a terminal chart, in character cells.
const (
	DefaultChartWidth  = 72
	DefaultChartHeight = 14
	// MinChartWidth and MinChartHeight are what smaller requests are raised
	// to. The plot area is never narrower than 8 columns, so with wide
	// y-axis labels a minimum-width chart runs a little past MinChartWidth.
	MinChartWidth  = 24
	MinChartHeight = 3
)

// ChartOptions tunes TerminalChartWith.
type ChartOptions struct {
	// Width is the width of the chart in cells, y-axis labels included
	// (DefaultChartWidth when 0; raised to MinChartWidth). The legend lines
	// wrap at it; the peak line may run past it on very narrow charts.
	Width int
	// Height is the number of rows of bars above the axis
	// (DefaultChartHeight when 0; raised to MinChartHeight).
	Height int
	// ASCII draws with letters and ASCII punctuation only, for terminals
	// without Unicode block elements.
	ASCII bool
}

// chartGlyphs is the character set of one chart style.
type chartGlyphs struct {
	cat                         [ir.NumCategories]rune
	vert, tick, origin, axis    rune
	boundAxis, boundLabel, peak rune
	capacity                    rune
}

var (
	chartUnicode = chartGlyphs{
		cat:  [ir.NumCategories]rune{'█', '▓', '▒', '░', ':', '≡', '·'},
		vert: '│', tick: '┤', origin: '┼', axis: '─',
		boundAxis: '┬', boundLabel: '│', peak: '▲', capacity: '╌',
	}
	chartASCII = chartGlyphs{
		cat:  [ir.NumCategories]rune{'P', 'G', 'O', 'A', 'T', 'K', '.'},
		vert: '|', tick: '+', origin: '+', axis: '-',
		boundAxis: '+', boundLabel: '|', peak: '^', capacity: '-',
	}
)

// chartCapacityFactor: the y range is extended to show the capacity line
// when the capacity is at most this many times the peak; a larger capacity
// would flatten the timeline, so it is only named under the chart.
const chartCapacityFactor = 3

// chartMargin is the number of cells right of the plot area.
const chartMargin = 4

// TerminalChart draws r's memory timeline as a text chart of width × height
// cells (see ChartOptions) with Unicode block elements.
func TerminalChart(w io.Writer, r *engine.Result, width, height int) error {
	return TerminalChartWith(w, r, ChartOptions{Width: width, Height: height})
}

// TerminalChartWith draws r's memory timeline as a text chart: x is the op
// index across the iteration, y is device bytes stacked by ledger category.
// Each column shows the op with the largest total among the ops it covers.
// Under the axis are the phase boundaries, the peak and a legend; a dashed
// line marks the capacity when there is one. The output is deterministic.
func TerminalChartWith(w io.Writer, r *engine.Result, opt ChartOptions) error {
	if err := chartCheck(r); err != nil {
		return err
	}
	g := chartUnicode
	if opt.ASCII {
		g = chartASCII
	}
	width, height := opt.Width, opt.Height
	if width == 0 {
		width = DefaultChartWidth
	}
	if height == 0 {
		height = DefaultChartHeight
	}
	width = max(width, MinChartWidth)
	height = max(height, MinChartHeight)

	tl := r.Sim.Timeline
	peak := r.Sim.Peak
	top := peak.Total
	capShown := r.Capacity > 0 && r.Capacity <= chartCapacityFactor*max(peak.Total, 1)
	if capShown {
		top = max(top, r.Capacity)
	}
	ymax, ticks := chartTicks(top, min(4, height))

	// Tick labels by level (row from the bottom, 0 is the axis); the
	// capacity line is labelled too when no tick shares its row.
	rowH := float64(ymax) / float64(height)
	tickAt := map[int]string{}
	for _, t := range ticks {
		lvl := int(math.Round(float64(t) / rowH))
		if _, dup := tickAt[lvl]; !dup && lvl <= height {
			tickAt[lvl] = t.String()
		}
	}
	capLvl := -1
	if capShown {
		if l := int(math.Round(float64(r.Capacity) / rowH)); l >= 1 && l <= height {
			capLvl = l
			if _, ok := tickAt[l]; !ok {
				tickAt[l] = r.Capacity.String()
			}
		}
	}
	labelW := 0
	for _, l := range tickAt {
		labelW = max(labelW, len([]rune(l)))
	}
	// A right margin leaves room for the last phase's name.
	plotW := max(width-labelW-2-chartMargin, 8)

	// Columns: each covers ops [lo[c], lo[c+1]) and shows its largest point.
	n := len(tl)
	lo := make([]int, plotW+1)
	for c := 0; c <= plotW; c++ {
		lo[c] = c * n / plotW
	}
	colOf := func(op int) int { // first column covering op
		for c := 0; c < plotW; c++ {
			if op < max(lo[c+1], lo[c]+1) {
				return c
			}
		}
		return plotW - 1
	}
	cols := make([]*sim.Point, plotW)
	for c := range cols {
		a, b := lo[c], max(lo[c+1], lo[c]+1)
		best := &tl[a]
		for i := a + 1; i < b; i++ {
			if tl[i].Total > best.Total {
				best = &tl[i]
			}
		}
		cols[c] = best
	}
	peakCol := colOf(peak.Op)

	// Grid rows from the top: row index k shows level h-k (1..h).
	grid := make([][]rune, height)
	for k := range grid {
		grid[k] = []rune(strings.Repeat(" ", plotW))
	}
	for c, p := range cols {
		for lvl := 1; lvl <= height; lvl++ {
			mid := (float64(lvl) - 0.5) * rowH
			if float64(p.Total) < mid {
				break
			}
			grid[height-lvl][c] = g.cat[chartCategoryAt(&p.Cat, mid)]
		}
	}
	if capLvl > 0 {
		// Drawn over the bars too: where it crosses them is the news.
		row := grid[height-capLvl]
		for c := range row {
			row[c] = g.capacity
		}
	}

	var b strings.Builder
	line := func(s string) {
		b.WriteString(strings.TrimRight(s, " "))
		b.WriteByte('\n')
	}
	line(chartTitle(r))

	pad := func(s string) string { return strings.Repeat(" ", labelW-len([]rune(s))) + s }
	for k, row := range grid {
		lvl := height - k
		if l, ok := tickAt[lvl]; ok {
			line(pad(l) + " " + string(g.tick) + string(row))
		} else {
			line(pad("") + " " + string(g.vert) + string(row))
		}
	}

	// Axis with phase boundaries, then the phase names.
	type segment struct {
		col   int
		phase ir.Phase
	}
	var segs []segment
	for i := range tl {
		ph := r.Program.Ops[tl[i].Op].Phase
		if i > 0 && ph == r.Program.Ops[tl[i-1].Op].Phase {
			continue
		}
		c := colOf(i)
		if len(segs) > 0 {
			// Phases shorter than a column still get one, pushed right.
			c = max(c, segs[len(segs)-1].col+1)
		}
		if c >= plotW {
			continue
		}
		segs = append(segs, segment{c, ph})
	}
	axis := []rune(strings.Repeat(string(g.axis), plotW))
	names := []rune(strings.Repeat(" ", plotW))
	for i, s := range segs {
		end := plotW
		if i+1 < len(segs) {
			end = segs[i+1].col
		}
		start := s.col
		if i > 0 {
			axis[s.col] = g.boundAxis
			names[s.col] = g.boundLabel
			start++
		}
		room := end - start
		if i == len(segs)-1 {
			room = width - labelW - 2 - start // may use the margin
		}
		if room > 1 && i > 0 {
			start++ // a space after the boundary mark
			room--
		}
		name := s.phase.String()
		for _, cand := range []string{name, name[:3], name[:1]} {
			if len(cand) <= room {
				if need := start + len(cand); need > len(names) {
					names = append(names, []rune(strings.Repeat(" ", need-len(names)))...)
				}
				copy(names[start:], []rune(cand))
				break
			}
		}
	}
	line(pad(tickAt[0]) + " " + string(g.origin) + string(axis))
	line(strings.Repeat(" ", labelW+2) + string(names))

	// Peak marker under its column, described beside it, or below it when
	// the description does not fit on either side.
	col := labelW + 2 + peakCol
	marker := func(desc string) bool {
		n := len([]rune(desc))
		switch {
		case col+2+n <= width:
			line(strings.Repeat(" ", col) + string(g.peak) + " " + desc)
		case col >= n+1:
			line(strings.Repeat(" ", col-n-1) + desc + " " + string(g.peak))
		default:
			return false
		}
		return true
	}
	where := chartPeakWhere(r)
	if short := "peak " + peak.Total.String(); !marker(short + " at " + where) {
		if !marker(short) {
			line(strings.Repeat(" ", col) + string(g.peak))
			where = short + " at " + where
		} else {
			where = "at " + where
		}
		if n := len([]rune(where)); labelW+2+n <= width {
			where = strings.Repeat(" ", labelW+2) + where
		}
		line(where)
	}

	// Legend: the categories present, then the capacity.
	var items []string
	present := chartPresent(tl)
	for c := ir.Category(0); c < ir.NumCategories; c++ {
		if present[c] {
			items = append(items, string(g.cat[c])+" "+c.String())
		}
	}
	if r.Capacity > 0 {
		s := string(g.capacity) + " capacity " + r.Capacity.String()
		if name := chartGPUName(r); name != "" {
			s += " (" + name + ")"
		}
		if !capShown {
			s += ", off scale"
		}
		if r.Fits {
			s += ": fits, " + r.Headroom.String() + " headroom"
		} else {
			s += ": does not fit, " + r.Shortfall.String() + " short"
		}
		items = append(items, s)
	}
	cur := ""
	for _, it := range items {
		if cur != "" && len([]rune(cur))+2+len([]rune(it)) > width {
			line(cur)
			cur = ""
		}
		if cur != "" {
			cur += "  "
		}
		cur += it
	}
	if cur != "" {
		line(cur)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// chartCheck rejects results that have nothing to draw.
func chartCheck(r *engine.Result) error {
	switch {
	case r == nil || r.Sim == nil || r.Program == nil:
		return errors.New("report: no result to draw")
	case len(r.Sim.Timeline) == 0:
		return errors.New("report: the timeline is empty")
	case len(r.Sim.Timeline) > len(r.Program.Ops):
		return errors.New("report: the timeline does not match the program")
	}
	for i := range r.Sim.Timeline {
		if op := r.Sim.Timeline[i].Op; op < 0 || op >= len(r.Program.Ops) {
			return fmt.Errorf("report: timeline point %d names op %d, out of range", i, op)
		}
	}
	if op := r.Sim.Peak.Op; op < 0 || op >= len(r.Program.Ops) {
		return fmt.Errorf("report: the peak names op %d, out of range", op)
	}
	return nil
}

// chartCategoryAt is the category at height y in the stack of l (bottom first).
func chartCategoryAt(l *sim.Ledger, y float64) ir.Category {
	var acc float64
	last := ir.Category(0)
	for c := ir.Category(0); c < ir.NumCategories; c++ {
		if l[c] <= 0 {
			continue
		}
		acc += float64(l[c])
		last = c
		if y < acc {
			return c
		}
	}
	return last
}

// chartPresent reports the categories with bytes somewhere in tl.
func chartPresent(tl []sim.Point) [ir.NumCategories]bool {
	var p [ir.NumCategories]bool
	for i := range tl {
		for c, v := range tl[i].Cat {
			if v > 0 {
				p[c] = true
			}
		}
	}
	return p
}

// chartSteps are the tick spacings chartTicks may use, in a binary unit.
// Fractions are binary so that ticks below one unit read as round numbers
// of the next unit down (0.25 GiB is 256 MiB).
var chartSteps = []float64{0.25, 0.5, 1, 2, 2.5, 4, 5, 8, 10, 20, 25, 40, 50, 80, 100, 200, 250, 400, 500, 800}

// chartTicks picks a y range [0, ymax] ≥ top with at most maxTicks evenly
// spaced ticks above zero at round values of a binary unit (chartSteps). It returns ymax and the ticks, zero first.
func chartTicks(top units.Bytes, maxTicks int) (units.Bytes, []units.Bytes) {
	if top <= 0 {
		top = 1
	}
	unit := units.Bytes(1)
	for _, u := range []units.Bytes{units.TiB, units.GiB, units.MiB, units.KiB} {
		if top >= u {
			unit = u
			break
		}
	}
	v := float64(top) / float64(unit)
	step := 0.0
	for _, s := range chartSteps {
		if unit == 1 && s != math.Trunc(s) {
			continue // whole bytes
		}
		if math.Ceil(v/s-1e-9) <= float64(maxTicks) {
			step = s
			break
		}
	}
	if step == 0 { // v < 1024 and maxTicks >= 2 always find one; be safe
		step = math.Ceil(v / float64(max(maxTicks, 1)))
	}
	k := int(math.Ceil(v/step - 1e-9))
	ticks := make([]units.Bytes, 0, k+1)
	for i := 0; i <= k; i++ {
		ticks = append(ticks, units.Bytes(math.Round(float64(i)*step*float64(unit))))
	}
	return ticks[k], ticks
}

// chartPeakWhere describes the peak op: "aten::mm (model.h.3.mlp), backward,
// op 532 of 1200".
func chartPeakWhere(r *engine.Result) string {
	p := r.Sim.Peak
	op := &r.Program.Ops[p.Op]
	s := op.Name
	if s == "" {
		s = "op"
	}
	if op.Module != "" {
		s += " (" + op.Module + ")"
	}
	s += ", " + p.Phase.String()
	if r.Program.MicroBatches > 1 && p.Phase != ir.Optimizer {
		s += fmt.Sprintf(" of micro-step %d/%d", p.Micro+1, r.Program.MicroBatches)
	}
	return s + fmt.Sprintf(", op %d of %d", p.Op+1, len(r.Program.Ops))
}

// chartGPUName is the GPU the spec names, or "".
func chartGPUName(r *engine.Result) string {
	if r.Spec.GPU != nil {
		return r.Spec.GPU.Name
	}
	return ""
}

// chartTitle names the job: "gpt2 · train · 4 × 1024 · amp-bf16 · adamw".
func chartTitle(r *engine.Result) string {
	s := &r.Spec
	var parts []string
	if s.Model != nil && s.Model.Name != "" {
		parts = append(parts, s.JobName())
	}
	parts = append(parts, s.Mode.String())
	if s.MicroBatch > 0 || s.Seq > 0 {
		bs := fmt.Sprintf("%d × %d", s.MicroBatch, s.Seq)
		if s.Mode == engine.Infer && s.GenTokens > 0 {
			bs += fmt.Sprintf(" + %d gen", s.GenTokens)
		}
		parts = append(parts, bs)
	}
	if s.Accum > 1 {
		parts = append(parts, fmt.Sprintf("accum %d", s.Accum))
	}
	parts = append(parts, s.Precision.String())
	if s.Mode == engine.Train {
		parts = append(parts, s.Optimizer.String())
	}
	if name := chartGPUName(r); name != "" {
		parts = append(parts, name)
	}
	return strings.Join(parts, " · ")
}
