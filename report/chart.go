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
	capacity, reserved          rune
}

var (
	chartUnicode = chartGlyphs{
		cat:  [ir.NumCategories]rune{'█', '▓', '▒', '░', ':', '≡', '·'},
		vert: '│', tick: '┤', origin: '┼', axis: '─',
		boundAxis: '┬', boundLabel: '│', peak: '▲', capacity: '╌', reserved: '┄',
	}
	chartASCII = chartGlyphs{
		cat:  [ir.NumCategories]rune{'P', 'G', 'O', 'A', 'T', 'K', '.'},
		vert: '|', tick: '+', origin: '+', axis: '-',
		boundAxis: '+', boundLabel: '|', peak: '^', capacity: '-', reserved: '~',
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
// line marks the capacity when there is one, a dotted one the reserved bytes
// when r has the caching allocator's prediction (engine.Result.PredictReserved
// with its timeline). The output is deterministic.
func TerminalChartWith(w io.Writer, r *engine.Result, opt ChartOptions) error {
	if err := chartCheck(r); err != nil {
		return err
	}
	d := newChartDrawer(r, opt)
	d.scale()
	d.columns()
	d.fill()
	d.line(chartTitle(r))
	d.writeRows()
	d.writeAxis()
	d.writePeak()
	d.writeLegend()
	_, err := io.WriteString(w, d.b.String())
	return err
}

// chartDrawer draws one chart. Its phases run in order: scale (y range, tick labels, plot width), columns
// (the op each column shows), fill (the grid of cells), then the rows, the axis with the phase names, the peak
// marker and the legend, written into b.
type chartDrawer struct {
	r             *engine.Result
	g             chartGlyphs
	width, height int
	tl            []sim.Point
	peak          sim.Point
	capShown      bool
	reserved      []units.Bytes // at each timeline point; nil: no reserved line
	reservedTop   units.Bytes

	rowH   float64        // bytes per row
	tickAt map[int]string // tick labels by level (row from the bottom, 0 is the axis)
	capLvl int            // the capacity line's level, -1 when not drawn
	labelW int            // width of the tick labels
	plotW  int            // columns of the plot area

	lo      []int         // column c covers ops [lo[c], lo[c+1])
	cols    []*sim.Point  // the largest point of each column
	resCols []units.Bytes // the most reserved of each column (with a reserved line)
	peakCol int
	grid    [][]rune // rows from the top: row k shows level height-k

	b strings.Builder
}

func newChartDrawer(r *engine.Result, opt ChartOptions) *chartDrawer {
	d := &chartDrawer{r: r, g: chartUnicode, width: opt.Width, height: opt.Height, tl: r.Sim.Timeline, peak: r.Sim.Peak, reserved: reservedSeries(r)}
	for _, b := range d.reserved {
		d.reservedTop = max(d.reservedTop, b)
	}
	if opt.ASCII {
		d.g = chartASCII
	}
	if d.width == 0 {
		d.width = DefaultChartWidth
	}
	if d.height == 0 {
		d.height = DefaultChartHeight
	}
	d.width = max(d.width, MinChartWidth)
	d.height = max(d.height, MinChartHeight)
	return d
}

// line writes s without trailing spaces.
func (d *chartDrawer) line(s string) {
	d.b.WriteString(strings.TrimRight(s, " "))
	d.b.WriteByte('\n')
}

// pad right-aligns s in the tick labels' width.
func (d *chartDrawer) pad(s string) string { return strings.Repeat(" ", d.labelW-len([]rune(s))) + s }

// scale chooses the y range and its tick labels; the capacity line is labelled too when no tick shares its
// row. A right margin leaves room for the last phase's name.
func (d *chartDrawer) scale() {
	r := d.r
	top := d.peak.Total
	d.capShown = r.Capacity > 0 && r.Capacity <= chartCapacityFactor*max(d.peak.Total, 1)
	if d.capShown {
		top = max(top, r.Capacity)
	}
	ymax, ticks := chartTicks(top, min(4, d.height))
	d.rowH = float64(ymax) / float64(d.height)
	d.tickAt = map[int]string{}
	for _, t := range ticks {
		lvl := int(math.Round(float64(t) / d.rowH))
		if _, dup := d.tickAt[lvl]; !dup && lvl <= d.height {
			d.tickAt[lvl] = t.String()
		}
	}
	d.capLvl = -1
	if d.capShown {
		if l := int(math.Round(float64(r.Capacity) / d.rowH)); l >= 1 && l <= d.height {
			d.capLvl = l
			if _, ok := d.tickAt[l]; !ok {
				d.tickAt[l] = r.Capacity.String()
			}
		}
	}
	for _, l := range d.tickAt {
		d.labelW = max(d.labelW, len([]rune(l)))
	}
	d.plotW = max(d.width-d.labelW-2-chartMargin, 8)
}

// columns gives each column its ops [lo[c], lo[c+1]) and the largest point among them.
func (d *chartDrawer) columns() {
	n := len(d.tl)
	d.lo = make([]int, d.plotW+1)
	for c := 0; c <= d.plotW; c++ {
		d.lo[c] = c * n / d.plotW
	}
	d.cols = make([]*sim.Point, d.plotW)
	for c := range d.cols {
		a, b := d.lo[c], max(d.lo[c+1], d.lo[c]+1)
		best := &d.tl[a]
		for i := a + 1; i < b; i++ {
			if d.tl[i].Total > best.Total {
				best = &d.tl[i]
			}
		}
		d.cols[c] = best
	}
	if d.reserved != nil {
		d.resCols = make([]units.Bytes, d.plotW)
		for c := range d.resCols {
			for i := d.lo[c]; i < max(d.lo[c+1], d.lo[c]+1); i++ {
				d.resCols[c] = max(d.resCols[c], d.reserved[i])
			}
		}
	}
	d.peakCol = d.colOf(d.peak.Op)
}

// colOf is the first column covering op.
func (d *chartDrawer) colOf(op int) int {
	for c := 0; c < d.plotW; c++ {
		if op < max(d.lo[c+1], d.lo[c]+1) {
			return c
		}
	}
	return d.plotW - 1
}

// fill stacks each column's categories into the grid, marks each column's reserved bytes in the cell that holds
// them (over the bar's top cell when they share it; none above the top: the reserved line leaves the scale as
// it was), and draws the capacity line over the bars too: where it crosses them is the news.
func (d *chartDrawer) fill() {
	d.grid = make([][]rune, d.height)
	for k := range d.grid {
		d.grid[k] = []rune(strings.Repeat(" ", d.plotW))
	}
	for c, p := range d.cols {
		for lvl := 1; lvl <= d.height; lvl++ {
			mid := (float64(lvl) - 0.5) * d.rowH
			if float64(p.Total) < mid {
				break
			}
			d.grid[d.height-lvl][c] = d.g.cat[chartCategoryAt(&p.Cat, mid)]
		}
	}
	for c, b := range d.resCols {
		if lvl := int(math.Ceil(float64(b) / d.rowH)); lvl >= 1 && lvl <= d.height {
			d.grid[d.height-lvl][c] = d.g.reserved
		}
	}
	if d.capLvl > 0 {
		row := d.grid[d.height-d.capLvl]
		for c := range row {
			row[c] = d.g.capacity
		}
	}
}

// writeRows writes the grid with its tick labels.
func (d *chartDrawer) writeRows() {
	for k, row := range d.grid {
		lvl := d.height - k
		if l, ok := d.tickAt[lvl]; ok {
			d.line(d.pad(l) + " " + string(d.g.tick) + string(row))
		} else {
			d.line(d.pad("") + " " + string(d.g.vert) + string(row))
		}
	}
}

// chartSegment is where a phase starts on the axis.
type chartSegment struct {
	col   int
	phase ir.Phase
}

// segments lists the phases in order with their first column; phases shorter than a column still get one,
// pushed right.
func (d *chartDrawer) segments() []chartSegment {
	var segs []chartSegment
	for i := range d.tl {
		ph := d.r.Program.Ops[d.tl[i].Op].Phase
		if i > 0 && ph == d.r.Program.Ops[d.tl[i-1].Op].Phase {
			continue
		}
		c := d.colOf(i)
		if len(segs) > 0 {
			c = max(c, segs[len(segs)-1].col+1)
		}
		if c >= d.plotW {
			continue
		}
		segs = append(segs, chartSegment{c, ph})
	}
	return segs
}

// writeAxis writes the axis with the phase boundaries, then the phase names (shortened to fit).
func (d *chartDrawer) writeAxis() {
	segs := d.segments()
	axis := []rune(strings.Repeat(string(d.g.axis), d.plotW))
	names := []rune(strings.Repeat(" ", d.plotW))
	for i, s := range segs {
		end := d.plotW
		if i+1 < len(segs) {
			end = segs[i+1].col
		}
		start := s.col
		if i > 0 {
			axis[s.col] = d.g.boundAxis
			names[s.col] = d.g.boundLabel
			start++
		}
		room := end - start
		if i == len(segs)-1 {
			room = d.width - d.labelW - 2 - start // may use the margin
		}
		if room > 1 && i > 0 {
			start++ // a space after the boundary mark
			room--
		}
		names = chartPlaceName(names, start, room, s.phase.String())
	}
	d.line(d.pad(d.tickAt[0]) + " " + string(d.g.origin) + string(axis))
	d.line(strings.Repeat(" ", d.labelW+2) + string(names))
}

// chartPlaceName writes the longest of name, its first three letters and its first letter that fits in room
// cells at start, growing names when it ends past them.
func chartPlaceName(names []rune, start, room int, name string) []rune {
	for _, cand := range []string{name, name[:3], name[:1]} {
		if len(cand) <= room {
			if need := start + len(cand); need > len(names) {
				names = append(names, []rune(strings.Repeat(" ", need-len(names)))...)
			}
			copy(names[start:], []rune(cand))
			break
		}
	}
	return names
}

// marker writes the peak marker under its column with desc beside it, right or left; false when desc fits on
// neither side.
func (d *chartDrawer) marker(desc string) bool {
	col := d.labelW + 2 + d.peakCol
	n := len([]rune(desc))
	switch {
	case col+2+n <= d.width:
		d.line(strings.Repeat(" ", col) + string(d.g.peak) + " " + desc)
	case col >= n+1:
		d.line(strings.Repeat(" ", col-n-1) + desc + " " + string(d.g.peak))
	default:
		return false
	}
	return true
}

// writePeak writes the peak marker, described beside it, or below it when the description does not fit on
// either side.
func (d *chartDrawer) writePeak() {
	where := chartPeakWhere(d.r)
	short := "peak " + d.peak.Total.String()
	if d.marker(short + " at " + where) {
		return
	}
	if !d.marker(short) {
		d.line(strings.Repeat(" ", d.labelW+2+d.peakCol) + string(d.g.peak))
		where = short + " at " + where
	} else {
		where = "at " + where
	}
	if n := len([]rune(where)); d.labelW+2+n <= d.width {
		where = strings.Repeat(" ", d.labelW+2) + where
	}
	d.line(where)
}

// writeLegend writes the categories present, then the capacity, wrapped at the chart's width.
func (d *chartDrawer) writeLegend() {
	var items []string
	present := chartPresent(d.tl)
	for c := ir.Category(0); c < ir.NumCategories; c++ {
		if present[c] {
			items = append(items, string(d.g.cat[c])+" "+c.String())
		}
	}
	if d.r.Capacity > 0 {
		items = append(items, d.capacityItem())
	}
	if d.reserved != nil {
		it := string(d.g.reserved) + " reserved " + d.reservedTop.String() + " (caching allocator"
		if f := d.r.Reserved.First; f != nil && units.Bytes(f.PeakReserved) > d.reservedTop {
			it += "; first step " + units.Bytes(f.PeakReserved).String() // a program of its own, not drawn
		}
		it += ")"
		if float64(d.reservedTop) > float64(d.height)*d.rowH {
			it += ", off scale"
		}
		items = append(items, it)
	}
	cur := ""
	for _, it := range items {
		if cur != "" && len([]rune(cur))+2+len([]rune(it)) > d.width {
			d.line(cur)
			cur = ""
		}
		if cur != "" {
			cur += "  "
		}
		cur += it
	}
	if cur != "" {
		d.line(cur)
	}
}

// capacityItem is the legend's capacity entry: the GPU, whether the line is on the scale, and the verdict.
func (d *chartDrawer) capacityItem() string {
	r := d.r
	s := string(d.g.capacity) + " capacity " + r.Capacity.String()
	if name := chartGPUName(r); name != "" {
		s += " (" + name + ")"
	}
	if !d.capShown {
		s += ", off scale"
	}
	if r.Fits {
		s += ": fits, " + r.Headroom.String() + " headroom"
	} else {
		s += ": does not fit, " + r.Shortfall.String() + " short"
	}
	return s
}

// chartCheck rejects results that have nothing to draw.
func chartCheck(r *engine.Result) error {
	switch {
	case r == nil || r.Sim == nil || r.Program == nil:
		return errors.New("no result to draw")
	case len(r.Sim.Timeline) == 0:
		return errors.New("the timeline is empty")
	case len(r.Sim.Timeline) > len(r.Program.Ops):
		return errors.New("the timeline does not match the program")
	}
	for i := range r.Sim.Timeline {
		if op := r.Sim.Timeline[i].Op; op < 0 || op >= len(r.Program.Ops) {
			return fmt.Errorf("timeline point %d names op %d, out of range", i, op)
		}
	}
	if op := r.Sim.Peak.Op; op < 0 || op >= len(r.Program.Ops) {
		return fmt.Errorf("the peak names op %d, out of range", op)
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
	return s + ", " + opNumber(p.Op, len(r.Program.Ops))
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
	parts = append(parts, s.PrecisionName())
	if s.Mode == engine.Train {
		parts = append(parts, chartOptimizer(s))
	}
	if name := chartGPUName(r); name != "" {
		parts = append(parts, name)
	}
	return strings.Join(parts, " · ")
}
