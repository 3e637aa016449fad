package report

import (
	"fmt"
	"image/color"
	"io"

	"github.com/memplan/memplan/internal/boundedio"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgsvg"

	"github.com/memplan/memplan/pack"
	"github.com/memplan/memplan/units"
)

// packColors are the jobs' colors, in turn.
var packColors = []color.Color{okabeBlue, okabeOrange, okabeGreen, okabeSkyBlue, okabePurple, okabeYellow, okabeVermillion, plotGray}

// WritePackPlot draws the assignment of policy p in res, one panel per GPU:
// each job's allocated curve stacked (context included), the memory the
// processes hold as p runs them (their reserved curves, or their curves
// under their limits) as a line, and the GPU's capacity, to path (.svg or
// .png), written to a temporary file and renamed into place.
func WritePackPlot(path string, res *pack.Result, p pack.Policy) (err error) {
	format, err := plotFormat(path)
	if err != nil {
		return err
	}
	if format == "pdf" {
		return fmt.Errorf("unsupported plot format \".pdf\" for a packing (want .svg or .png)")
	}
	var pr *pack.PolicyResult
	for i := range res.Policies {
		if res.Policies[i].Policy == p {
			pr = &res.Policies[i]
		}
	}
	if pr == nil {
		return fmt.Errorf("no %s assignment to draw", p)
	}
	if len(pr.GPUs) == 0 {
		return fmt.Errorf("the %s policy placed no job to draw", p)
	}
	cols := min(len(pr.GPUs), 4)
	rows := (len(pr.GPUs) + cols - 1) / cols
	w, h := DefaultPlotWidth, vg.Length(rows)*2.6*vg.Inch
	return boundedio.WriteFile(path, 0o644, func(f io.Writer) error {
		var canvas vg.CanvasWriterTo
		if format == "svg" {
			canvas = vgsvg.New(w, h)
		} else {
			canvas = vgimg.PngCanvas{Canvas: vgimg.NewWith(vgimg.UseWH(w, h), vgimg.UseDPI(DefaultPlotDPI))}
		}
		drawPack(draw.New(canvas), res, pr, rows, cols)
		if _, err := canvas.WriteTo(f); err != nil {
			return fmt.Errorf("writing plot: %w", err)
		}
		return nil
	})
}

func drawPack(dc draw.Canvas, res *pack.Result, pr *pack.PolicyResult, rows, cols int) {
	dc.SetColor(color.White)
	dc.Fill(dc.Rectangle.Path())
	envs := map[string]*pack.Envelope{}
	for _, e := range res.Envelopes {
		envs[e.Job] = e
	}
	top := float64(res.Capacity)
	for _, g := range pr.GPUs {
		for _, s := range g.Combined {
			top = max(top, float64(s.Bytes))
		}
	}
	tiles := draw.Tiles{Rows: rows, Cols: cols, PadX: vg.Points(6), PadY: vg.Points(6), PadTop: vg.Points(4), PadBottom: vg.Points(4), PadLeft: vg.Points(4), PadRight: vg.Points(4)}
	for i := range pr.GPUs {
		packPanel(tiles.At(dc, i%cols, i/cols), &pr.GPUs[i], envs, res.Capacity, top, pr.Policy)
	}
}

// packPanel draws one GPU.
func packPanel(dc draw.Canvas, g *pack.GPUResult, envs map[string]*pack.Envelope, capacity units.Bytes, top float64, p pack.Policy) {
	gib := func(b float64) float64 { return b / float64(units.GiB) }
	plt := plot.New()
	plt.Title.Text = fmt.Sprintf("GPU %d · %s · margin %s", g.Index, g.Status, g.Margin)
	plt.Title.TextStyle.Font = font.From(plotFont, 9)
	plt.X.Label.Text = "s"
	plt.Y.Label.Text = "GiB"
	plt.X.Label.TextStyle.Font = font.From(plotFont, 8)
	plt.Y.Label.TextStyle.Font = font.From(plotFont, 8)
	plt.X.Tick.Label.Font = font.From(plotFont, 7)
	plt.Y.Tick.Label.Font = font.From(plotFont, 7)
	// Room above the capacity line for the legend's rows.
	plt.Y.Min, plt.Y.Max = 0, gib(top)*(1.06+0.075*float64(len(g.Jobs)+3))
	var ts []float64
	for _, s := range g.Combined {
		ts = append(ts, s.T)
	}
	if len(ts) == 0 {
		return
	}
	plt.X.Min, plt.X.Max = ts[0], max(ts[len(ts)-1], ts[0]+1e-9)
	lower := make([]float64, len(ts))
	for k, job := range g.Jobs {
		e := envs[job]
		if e == nil {
			continue
		}
		upper := make([]float64, len(ts))
		var pts plotter.XYs
		for i, t := range ts {
			upper[i] = lower[i] + gib(float64(e.Live(t)))
			pts = append(pts, plotter.XY{X: t, Y: upper[i]})
		}
		for i := len(ts) - 1; i >= 0; i-- {
			pts = append(pts, plotter.XY{X: ts[i], Y: lower[i]})
		}
		if poly, err := plotter.NewPolygon(pts); err == nil {
			poly.Color = packColors[k%len(packColors)]
			poly.LineStyle.Width = 0
			plt.Add(poly)
		}
		lower = upper
	}
	var held plotter.XYs
	for _, s := range g.Combined {
		held = append(held, plotter.XY{X: s.T, Y: gib(float64(s.Bytes))})
	}
	if l, err := plotter.NewLine(held); err == nil {
		l.LineStyle = draw.LineStyle{Color: color.Black, Width: vg.Points(1.2), Dashes: []vg.Length{vg.Points(4), vg.Points(2)}}
		plt.Add(l)
	}
	// Drifting phases meet: the sum of the allocated peaks is reached.
	worst := plotter.XYs{{X: plt.X.Min, Y: gib(float64(g.Allocated))}, {X: plt.X.Max, Y: gib(float64(g.Allocated))}}
	worstStyle := draw.LineStyle{Color: plotGray, Width: vg.Points(1), Dashes: []vg.Length{vg.Points(1), vg.Points(2)}}
	if l, err := plotter.NewLine(worst); err == nil {
		l.LineStyle = worstStyle
		plt.Add(l)
	}
	capLine := plotter.XYs{{X: plt.X.Min, Y: gib(float64(capacity))}, {X: plt.X.Max, Y: gib(float64(capacity))}}
	if l, err := plotter.NewLine(capLine); err == nil {
		l.LineStyle = draw.LineStyle{Color: okabeVermillion, Width: vg.Points(1.5)}
		plt.Add(l)
	}
	leg := plot.NewLegend()
	leg.TextStyle.Font = font.From(plotFont, 7)
	leg.Top, leg.Left = true, true
	for k, job := range g.Jobs {
		leg.Add(job, plotSwatch{color: packColors[k%len(packColors)]})
	}
	heldName := "held (reserved)"
	if p == pack.Curve {
		heldName = "held (under limits)"
	}
	leg.Add(heldName, plotLegendLine{draw.LineStyle{Color: color.Black, Width: vg.Points(1.2), Dashes: []vg.Length{vg.Points(4), vg.Points(2)}}})
	leg.Add("allocated peaks summed", plotLegendLine{worstStyle})
	leg.Add("capacity", plotLegendLine{draw.LineStyle{Color: okabeVermillion, Width: vg.Points(1.5)}})
	plt.Legend = leg
	plt.Draw(dc)
}

// plotLegendLine is a legend thumbnail of a line style.
type plotLegendLine struct{ style draw.LineStyle }

func (l plotLegendLine) Thumbnail(c *draw.Canvas) {
	y := (c.Min.Y + c.Max.Y) / 2
	c.StrokeLine2(l.style, c.Min.X, y, c.Max.X, y)
}
