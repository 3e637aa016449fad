package report

import (
	"fmt"
	"image/color"
	"io"
	"math"
	"path/filepath"
	"strings"

	"github.com/memplan/memplan/internal/boundedio"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/text"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgpdf"
	"gonum.org/v1/plot/vg/vgsvg"

	"github.com/memplan/memplan/engine"
	"github.com/memplan/memplan/ir"
	"github.com/memplan/memplan/units"
)

// Plot defaults.
const (
	DefaultPlotWidth     = 10 * vg.Inch
	DefaultPlotHeight    = 5 * vg.Inch
	DefaultPlotDPI       = 120
	DefaultPlotMaxPoints = 4000
)

// PlotOptions tunes WritePlot. The zero value gives the defaults.
type PlotOptions struct {
	// Width and Height of the figure (DefaultPlotWidth × DefaultPlotHeight).
	Width, Height vg.Length
	// DPI is the resolution of PNG output (DefaultPlotDPI); vector formats
	// ignore it.
	DPI int
	// Title replaces the default title ("gpt2 · train · 4 × 1024 · amp-bf16
	// · adamw · rtx-4090").
	Title string
	// MaxPoints caps the x points drawn (DefaultPlotMaxPoints): larger
	// programs are bucketed, each bucket showing its largest op.
	MaxPoints int
}

// Okabe–Ito colors, distinguishable under the common color-vision
// deficiencies.
var (
	okabeOrange     = color.RGBA{0xE6, 0x9F, 0x00, 0xFF}
	okabeSkyBlue    = color.RGBA{0x56, 0xB4, 0xE9, 0xFF}
	okabeGreen      = color.RGBA{0x00, 0x9E, 0x73, 0xFF}
	okabeYellow     = color.RGBA{0xF0, 0xE4, 0x42, 0xFF}
	okabeBlue       = color.RGBA{0x00, 0x72, 0xB2, 0xFF}
	okabeVermillion = color.RGBA{0xD5, 0x5E, 0x00, 0xFF}
	okabePurple     = color.RGBA{0xCC, 0x79, 0xA7, 0xFF}
	plotGray        = color.RGBA{0x99, 0x99, 0x99, 0xFF}
)

// plotReservedLine draws the caching allocator's reserved bytes over the
// stack, in plan's plot and explain's alike (dark, not the capacity's
// vermillion, so that the two lines read apart).
var plotReservedLine = draw.LineStyle{Color: color.RGBA{0x22, 0x22, 0x22, 0xFF}, Width: vg.Points(1.5), Dashes: []vg.Length{vg.Points(4), vg.Points(2)}}

// plotColors colors the ledger categories; the capacity line is vermillion.
var plotColors = [ir.NumCategories]color.Color{
	ir.Parameter:      okabeBlue,
	ir.Gradient:       okabeSkyBlue,
	ir.OptimizerState: okabeGreen,
	ir.Activation:     okabeOrange,
	ir.Temporary:      okabeYellow,
	ir.KVCache:        okabePurple,
	ir.Other:          plotGray,
}

// plotPhaseShade tints the background of each phase.
var plotPhaseShade = [ir.NumPhases]color.Color{
	ir.Forward:   color.White,
	ir.Backward:  color.RGBA{0xEE, 0xEE, 0xEE, 0xFF},
	ir.Optimizer: color.RGBA{0xDD, 0xDD, 0xE8, 0xFF},
}

var plotFont = font.Font{Typeface: "Liberation", Variant: "Sans"}

// plotFormat returns the output format of path from its extension.
func plotFormat(path string) (string, error) {
	ext := filepath.Ext(path)
	switch f := strings.ToLower(strings.TrimPrefix(ext, ".")); f {
	case "svg", "png", "pdf":
		return f, nil
	}
	return "", fmt.Errorf("unsupported plot format %q (want .svg, .png or .pdf)", ext)
}

// WritePlot draws r's memory timeline as a stacked area chart by ledger
// category and writes it to path, in the format its extension names (.svg,
// .png or .pdf). The file is written to a temporary file in the same
// directory and renamed into place, so a failure leaves nothing behind.
func WritePlot(path string, r *engine.Result, opt PlotOptions) (err error) {
	format, err := plotFormat(path)
	if err != nil {
		return err
	}
	if err := chartCheck(r); err != nil {
		return err
	}
	return boundedio.WriteFile(path, 0o644, func(w io.Writer) error { return WritePlotTo(w, format, r, opt) })
}

// WritePlotTo is WritePlot to a writer; format is "svg", "png" or "pdf".
func WritePlotTo(w io.Writer, format string, r *engine.Result, opt PlotOptions) (err error) {
	if err := chartCheck(r); err != nil {
		return err
	}
	defer func() {
		// gonum/plot reports some drawing failures by panicking.
		if p := recover(); p != nil {
			err = fmt.Errorf("drawing plot: %v", p)
		}
	}()
	if opt.Width <= 0 {
		opt.Width = DefaultPlotWidth
	}
	if opt.Height <= 0 {
		opt.Height = DefaultPlotHeight
	}
	if opt.DPI <= 0 {
		opt.DPI = DefaultPlotDPI
	}
	if opt.MaxPoints <= 0 {
		opt.MaxPoints = DefaultPlotMaxPoints
	}
	if opt.Title == "" {
		opt.Title = chartTitle(r)
	}
	var canvas vg.CanvasWriterTo
	switch format {
	case "svg":
		canvas = vgsvg.New(opt.Width, opt.Height)
	case "png":
		canvas = vgimg.PngCanvas{Canvas: vgimg.NewWith(vgimg.UseWH(opt.Width, opt.Height), vgimg.UseDPI(opt.DPI))}
	case "pdf":
		canvas = vgpdf.New(opt.Width, opt.Height)
	default:
		return fmt.Errorf("unsupported plot format %q (want svg, png or pdf)", format)
	}
	drawPlot(draw.New(canvas), r, opt)
	if _, err := canvas.WriteTo(w); err != nil {
		return fmt.Errorf("writing plot: %w", err)
	}
	return nil
}

// plotSeries is the timeline bucketed for drawing: bucket k covers ops
// [x[k], x[k+1]) and shows its largest point.
type plotSeries struct {
	unit     units.Bytes // of the y axis
	unitName string
	x        []float64 // len(pts)+1 edges, in ops
	pts      []int     // timeline index of each bucket's largest point
	reserved []float64 // the most reserved bytes of each bucket, in unit (nil: no reserved line)
	cats     []ir.Category
	phases   []plotPhase
}

// y is b in the unit of the y axis.
func (s *plotSeries) y(b units.Bytes) float64 { return float64(b) / float64(s.unit) }

// plotPhase is a run of ops in one phase and micro-step.
type plotPhase struct {
	from, to int // ops [from, to)
	phase    ir.Phase
	micro    int
}

func newPlotSeries(r *engine.Result, maxPoints int) *plotSeries {
	tl := r.Sim.Timeline
	n := len(tl)
	size := (n + maxPoints - 1) / maxPoints
	s := &plotSeries{}
	for lo := 0; lo < n; lo += size {
		hi := min(lo+size, n)
		best := lo
		for i := lo + 1; i < hi; i++ {
			if tl[i].Total > tl[best].Total {
				best = i
			}
		}
		s.x = append(s.x, float64(lo))
		s.pts = append(s.pts, best)
	}
	s.x = append(s.x, float64(n))
	top := max(r.Sim.Peak.Total, r.Capacity)
	res := reservedSeries(r)
	s.unit, s.unitName = units.GiB, "GiB"
	switch {
	case top < units.MiB:
		s.unit, s.unitName = units.KiB, "KiB"
	case top < units.GiB:
		s.unit, s.unitName = units.MiB, "MiB"
	}
	present := chartPresent(tl)
	for c := ir.Category(0); c < ir.NumCategories; c++ {
		if present[c] {
			s.cats = append(s.cats, c)
		}
	}
	if res != nil {
		for k := range s.pts {
			var most units.Bytes
			for i := int(s.x[k]); i < int(s.x[k+1]); i++ {
				most = max(most, res[i])
			}
			s.reserved = append(s.reserved, s.y(most))
		}
	}
	for i := range tl {
		op := &r.Program.Ops[tl[i].Op]
		if k := len(s.phases) - 1; k >= 0 && s.phases[k].phase == op.Phase && s.phases[k].micro == op.Micro {
			s.phases[k].to = i + 1
			continue
		}
		s.phases = append(s.phases, plotPhase{from: i, to: i + 1, phase: op.Phase, micro: op.Micro})
	}
	return s
}

// plotStack draws the stacked category bands.
type plotStack struct {
	s      *plotSeries
	r      *engine.Result
	colors [ir.NumCategories]color.Color
}

func (a *plotStack) Plot(c draw.Canvas, plt *plot.Plot) {
	trX, trY := plt.Transforms(&c)
	tl := a.r.Sim.Timeline
	m := len(a.s.pts)
	lower := make([]float64, m)
	upper := make([]float64, m)
	for _, cat := range a.s.cats {
		for k, p := range a.s.pts {
			upper[k] = lower[k] + a.s.y(tl[p].Cat[cat])
		}
		// Upper edge left to right, lower edge right to left, as steps;
		// runs of equal values collapse to one step.
		poly := make([]vg.Point, 0, 4*m)
		for k := 0; k < m; k++ {
			if k > 0 && upper[k] == upper[k-1] {
				poly[len(poly)-1].X = trX(a.s.x[k+1])
				continue
			}
			y := trY(upper[k])
			poly = append(poly, vg.Point{X: trX(a.s.x[k]), Y: y}, vg.Point{X: trX(a.s.x[k+1]), Y: y})
		}
		for k := m - 1; k >= 0; k-- {
			if k < m-1 && lower[k] == lower[k+1] {
				poly[len(poly)-1].X = trX(a.s.x[k])
				continue
			}
			y := trY(lower[k])
			poly = append(poly, vg.Point{X: trX(a.s.x[k+1]), Y: y}, vg.Point{X: trX(a.s.x[k]), Y: y})
		}
		c.FillPolygon(a.colors[cat], c.ClipPolygonXY(poly))
		lower, upper = upper, lower
	}
}

// plotReserved draws the reserved bytes as steps over the buckets.
type plotReserved struct{ s *plotSeries }

func (a *plotReserved) Plot(c draw.Canvas, plt *plot.Plot) {
	trX, trY := plt.Transforms(&c)
	var line []vg.Point
	for k, y := range a.s.reserved {
		line = append(line, vg.Point{X: trX(a.s.x[k]), Y: trY(y)}, vg.Point{X: trX(a.s.x[k+1]), Y: trY(y)})
	}
	for _, l := range c.ClipLinesXY(line) {
		c.StrokeLines(plotReservedLine, l)
	}
}

// plotBands shades the background of each phase, behind the areas.
type plotBands struct{ s *plotSeries }

func (b *plotBands) Plot(c draw.Canvas, plt *plot.Plot) {
	trX, _ := plt.Transforms(&c)
	for _, ph := range b.s.phases {
		x0, x1 := trX(float64(ph.from)), trX(float64(ph.to))
		if sh := plotPhaseShade[ph.phase]; sh != color.White {
			c.FillPolygon(sh, []vg.Point{{X: x0, Y: c.Min.Y}, {X: x1, Y: c.Min.Y}, {X: x1, Y: c.Max.Y}, {X: x0, Y: c.Max.Y}})
		}
	}
}

// plotOverlay draws what goes over the areas: phase and micro-step
// boundaries, phase names, the capacity line and the peak.
type plotOverlay struct {
	s     *plotSeries
	r     *engine.Result
	style text.Style
}

func (o *plotOverlay) Plot(c draw.Canvas, plt *plot.Plot) {
	trX, trY := plt.Transforms(&c)
	r := o.r
	sty := o.style
	em := sty.Width("M")
	lineH := sty.Height("Mg")
	multi := r.Program.MicroBatches > 1

	// Phase names along the top, boundaries as thin lines; a micro-step
	// boundary is dashed and darker.
	thin := draw.LineStyle{Color: color.RGBA{0x80, 0x80, 0x80, 0xFF}, Width: vg.Points(0.5)}
	micro := draw.LineStyle{Color: color.RGBA{0x40, 0x40, 0x40, 0xFF}, Width: vg.Points(0.8), Dashes: []vg.Length{vg.Points(3), vg.Points(2)}}
	nameY := c.Max.Y - lineH
	for i, ph := range o.s.phases {
		x0, x1 := trX(float64(ph.from)), trX(float64(ph.to))
		if i > 0 {
			ls := thin
			if ph.micro != o.s.phases[i-1].micro {
				ls = micro
			}
			c.StrokeLine2(ls, x0, c.Min.Y, x0, c.Max.Y)
		}
		name := ph.phase.String()
		if multi && ph.phase != ir.Optimizer {
			name = fmt.Sprintf("%s %d", name, ph.micro+1)
		}
		for _, cand := range []string{name, name[:3]} {
			if w := sty.Width(cand); w+em <= x1-x0 {
				c.FillText(sty, vg.Point{X: x0 + em/2, Y: nameY}, cand)
				break
			}
		}
	}

	// Capacity line, labelled on the side away from the peak.
	peak := r.Sim.Peak
	peakX := trX(float64(peak.Op) + 0.5)
	peakY := trY(o.s.y(peak.Total))
	if r.Capacity > 0 {
		y := trY(o.s.y(r.Capacity))
		c.StrokeLine2(draw.LineStyle{Color: okabeVermillion, Width: vg.Points(1.5), Dashes: []vg.Length{vg.Points(6), vg.Points(3)}},
			c.Min.X, y, c.Max.X, y)
		label := "capacity " + r.Capacity.String()
		if name := chartGPUName(r); name != "" {
			label = name + " " + label
		}
		ls := sty
		ls.Color = okabeVermillion
		x := c.Min.X + em/2
		if peakX < (c.Min.X+c.Max.X)/2 {
			x = c.Max.X - em/2 - ls.Width(label)
		}
		plotTextBox(c, ls, vg.Point{X: x, Y: y + 3}, label)
	}

	// Peak: a marker on the top of the stack and its description above it,
	// kept inside the plot.
	c.DrawGlyph(draw.GlyphStyle{Color: color.Black, Radius: vg.Points(4), Shape: draw.PyramidGlyph{}}, vg.Point{X: peakX, Y: peakY + vg.Points(4)})
	op := &r.Program.Ops[peak.Op]
	desc := "peak " + peak.Total.String() + " · " + peak.Phase.String()
	if multi && peak.Phase != ir.Optimizer {
		desc += fmt.Sprintf(" %d", peak.Micro+1)
	}
	desc += " · " + op.Label()
	ps := sty
	ps.Font.Size = sty.Font.Size + 1
	w := ps.Width(desc)
	x := min(max(peakX-w/2, c.Min.X+em/2), c.Max.X-em/2-w)
	y := peakY + vg.Points(11)
	plotTextBox(c, ps, vg.Point{X: x, Y: y}, desc)
}

// plotTextBox writes txt at pt on a translucent white box, which keeps it
// readable over the areas and lines.
func plotTextBox(c draw.Canvas, sty text.Style, pt vg.Point, txt string) {
	box := sty.Rectangle(txt).Add(pt)
	box.Min = box.Min.Sub(vg.Point{X: 2, Y: 1})
	box.Max = box.Max.Add(vg.Point{X: 2, Y: 1})
	c.FillPolygon(color.NRGBA{0xFF, 0xFF, 0xFF, 0xD0}, []vg.Point{box.Min, {X: box.Max.X, Y: box.Min.Y}, box.Max, {X: box.Min.X, Y: box.Max.Y}})
	c.FillText(sty, pt, txt)
}

// plotOpTicker is plotYTicker without fractional op indices.
type plotOpTicker struct{}

func (plotOpTicker) Ticks(lo, hi float64) []plot.Tick {
	var out []plot.Tick
	for _, t := range (plotYTicker{}).Ticks(lo, hi) {
		if t.Value == math.Trunc(t.Value) {
			out = append(out, t)
		}
	}
	return out
}

// plotYTicker puts labelled ticks at round values (1, 2, 2.5 or 5 × 10^k
// apart, at most 6 of them) and unlabelled ones halfway.
type plotYTicker struct{}

func (plotYTicker) Ticks(lo, hi float64) []plot.Tick {
	if !(hi > lo) {
		return nil
	}
	span := hi - lo
	var step float64
	for e := math.Pow(10, math.Floor(math.Log10(span/6))); step == 0; e *= 10 {
		for _, m := range []float64{1, 2, 2.5, 5} {
			if span/(m*e) <= 6 {
				step = m * e
				break
			}
		}
	}
	var ticks []plot.Tick
	for i := math.Ceil(lo / step * 2); i*step/2 <= hi+1e-9*step; i++ {
		v := i * step / 2
		t := plot.Tick{Value: v}
		if int64(i)%2 == 0 {
			t.Label = fmt.Sprintf("%.6g", v)
		}
		ticks = append(ticks, t)
	}
	return ticks
}

// plotSwatch is a legend thumbnail: a filled square, outlined when pale.
type plotSwatch struct {
	color   color.Color
	outline bool
}

func (s plotSwatch) Thumbnail(c *draw.Canvas) {
	pts := []vg.Point{c.Min, {X: c.Max.X, Y: c.Min.Y}, c.Max, {X: c.Min.X, Y: c.Max.Y}}
	c.FillPolygon(s.color, pts)
	if s.outline {
		c.StrokeLines(draw.LineStyle{Color: plotGray, Width: vg.Points(0.5)}, append(pts, pts[0]))
	}
}

// drawPlot lays out the figure on dc: the plot, and the legend in a strip
// on its right so that it never covers the data.
func drawPlot(dc draw.Canvas, r *engine.Result, opt PlotOptions) {
	s := newPlotSeries(r, opt.MaxPoints)
	n := len(r.Sim.Timeline)

	plt := plot.New()
	plt.Title.Text = opt.Title
	plt.Title.TextStyle.Font = font.From(plotFont, 13)
	plt.Title.Padding = vg.Points(6)
	for _, ax := range []*plot.Axis{&plt.X, &plt.Y} {
		ax.Label.TextStyle.Font = font.From(plotFont, 11)
		ax.Tick.Label.Font = font.From(plotFont, 9)
		ax.Padding = 0
	}
	plt.X.Label.Text = "op (execution order)"
	plt.Y.Label.Text = "device memory (" + s.unitName + ")"
	plt.X.Tick.Marker = plotOpTicker{}
	plt.Y.Tick.Marker = plotYTicker{}

	top := s.y(r.Sim.Peak.Total)
	if r.Capacity > 0 {
		top = max(top, s.y(r.Capacity))
	}
	if top <= 0 {
		top = 1
	}
	// Headroom above the highest line for the phase names and the peak label.
	plt.X.Min, plt.X.Max = 0, float64(n)
	plt.Y.Min, plt.Y.Max = 0, top*1.18

	small := text.Style{Color: color.Black, Font: font.From(plotFont, 9), Handler: plt.TextHandler}
	plt.Add(&plotBands{s: s})
	plt.Add(&plotStack{s: s, r: r, colors: plotColors})
	if s.reserved != nil {
		plt.Add(&plotReserved{s: s})
	}
	plt.Add(&plotOverlay{s: s, r: r, style: small})

	// Legend, top category first as the stack reads.
	leg := plot.NewLegend()
	leg.TextStyle.Font = font.From(plotFont, 10)
	leg.Top, leg.Left = true, true
	leg.ThumbnailWidth = vg.Points(12)
	leg.Padding = vg.Points(3)
	for i := len(s.cats) - 1; i >= 0; i-- {
		leg.Add(s.cats[i].String(), plotSwatch{color: plotColors[s.cats[i]]})
	}
	if r.Capacity > 0 {
		l, err := plotter.NewLine(plotter.XYs{{X: 0, Y: 0}, {X: 1, Y: 0}})
		if err == nil {
			l.LineStyle = draw.LineStyle{Color: okabeVermillion, Width: vg.Points(1.5), Dashes: []vg.Length{vg.Points(4), vg.Points(2)}}
			leg.Add("capacity", l)
		}
	}
	var hasPhase [ir.NumPhases]bool
	for _, ph := range s.phases {
		hasPhase[ph.phase] = true
	}
	for _, ph := range []ir.Phase{ir.Backward, ir.Optimizer} {
		if hasPhase[ph] {
			leg.Add(ph.String()+" phase", plotSwatch{color: plotPhaseShade[ph], outline: true})
		}
	}
	// The reserved line last, so that it leaves the rest of the figure as it
	// was: the y range is not stretched for it (it is clipped at the top;
	// the text report gives its peak).
	if s.reserved != nil {
		if l, err := plotter.NewLine(plotter.XYs{{X: 0, Y: 0}, {X: 1, Y: 0}}); err == nil {
			l.LineStyle = plotReservedLine
			leg.Add("reserved", l)
		}
	}
	legW := leg.Rectangle(dc).Max.X - leg.Rectangle(dc).Min.X + vg.Points(16)
	plotC := draw.Crop(dc, 0, -legW, 0, 0)
	legC := draw.Crop(dc, dc.Max.X-dc.Min.X-legW+vg.Points(8), 0, 0, -vg.Points(30))
	dc.SetColor(color.White)
	dc.Fill(dc.Rectangle.Path())
	plt.Draw(plotC)
	leg.Draw(legC)
}
