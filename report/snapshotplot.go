package report

import (
	"fmt"
	"image/color"
	"io"
	"path/filepath"

	"github.com/memplan/memplan/internal/boundedio"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgsvg"

	"github.com/memplan/memplan/explain"
	"github.com/memplan/memplan/ir"
	"github.com/memplan/memplan/units"
)

// WriteSnapshotPlot draws what explain found in a snapshot as the stacked
// timeline plan draws (the live bytes of each ledger category, event by
// event, with the same colors), plus the reserved bytes as a line, to path
// (.svg or .png). The file is written to a temporary file and renamed into
// place.
func WriteSnapshotPlot(path string, rep *explain.Report) (err error) {
	format, err := plotFormat(path)
	if err != nil {
		return err
	}
	if format == "pdf" {
		return fmt.Errorf("unsupported plot format \".pdf\" for a snapshot (want .svg or .png)")
	}
	return boundedio.WriteFile(path, 0o644, func(f io.Writer) error {
		var canvas vg.CanvasWriterTo
		if format == "svg" {
			canvas = vgsvg.New(DefaultPlotWidth, DefaultPlotHeight)
		} else {
			canvas = vgimg.PngCanvas{Canvas: vgimg.NewWith(vgimg.UseWH(DefaultPlotWidth, DefaultPlotHeight), vgimg.UseDPI(DefaultPlotDPI))}
		}
		drawSnapshot(draw.New(canvas), rep)
		if _, err := canvas.WriteTo(f); err != nil {
			return fmt.Errorf("writing plot: %w", err)
		}
		return nil
	})
}

// drawSnapshot draws the snapshot's timeline: each category's bytes stacked at the largest point of every bucket
// (snapshotPoints), on axes sized to the peak (snapshotPlot), with the reserved line for a memory snapshot.
func drawSnapshot(dc draw.Canvas, rep *explain.Report) {
	tl := rep.Timeline
	idx := snapshotPoints(tl)
	// A profiler timeline records no reserved bytes: no reserved line.
	timeline := rep.Source == explain.SourceProfiler
	plt, y := snapshotPlot(rep, timeline)
	leg := plot.NewLegend()
	leg.TextStyle.Font = font.From(plotFont, 10)
	leg.Top, leg.Left = true, true
	stackCategories(plt, &leg, tl, idx, y)
	var res plotter.XYs
	for _, i := range idx {
		res = append(res, plotter.XY{X: float64(i), Y: y(tl[i].Reserved)})
	}
	if l, err := plotter.NewLine(res); err == nil && !timeline {
		l.LineStyle = plotReservedLine
		plt.Add(l)
		leg.Add("reserved", l)
	}
	dc.SetColor(color.White)
	dc.Fill(dc.Rectangle.Path())
	legW := leg.Rectangle(dc).Max.X - leg.Rectangle(dc).Min.X + vg.Points(16)
	plt.Draw(draw.Crop(dc, 0, -legW, 0, 0))
	leg.Draw(draw.Crop(dc, dc.Max.X-dc.Min.X-legW+vg.Points(8), 0, 0, -vg.Points(30)))
}

// snapshotPoints are the indices plotted: the largest point of each of at most DefaultPlotMaxPoints buckets.
func snapshotPoints(tl []explain.Point) []int {
	n := len(tl)
	step := max(1, (n+DefaultPlotMaxPoints-1)/DefaultPlotMaxPoints)
	var idx []int // the largest point of each bucket
	for lo := 0; lo < n; lo += step {
		best := lo
		for i := lo; i < min(lo+step, n); i++ {
			if total(tl[i]) > total(tl[best]) {
				best = i
			}
		}
		idx = append(idx, best)
	}
	return idx
}

// snapshotPlot is the titled plot with axes from the first to the last point and up to the peak, in GiB (MiB
// under one GiB), and the function that converts bytes to that unit.
func snapshotPlot(rep *explain.Report, timeline bool) (*plot.Plot, func(int64) float64) {
	n := len(rep.Timeline)
	top := max(rep.PeakReserved.Reserved, rep.PeakAllocated.Bytes)
	unit, unitName := units.GiB, "GiB"
	if top < int64(units.GiB) {
		unit, unitName = units.MiB, "MiB"
	}
	y := func(b int64) float64 { return float64(b) / float64(unit) }
	plt := plot.New()
	plt.Title.Text = fmt.Sprintf("%s · device %d", filepath.Base(rep.File), rep.Device)
	plt.Title.TextStyle.Font = font.From(plotFont, 13)
	plt.X.Label.Text = "trace event"
	if timeline {
		plt.Title.Text = fmt.Sprintf("%s · torch.profiler memory timeline", filepath.Base(rep.File))
		plt.X.Label.Text = "time point"
	}
	plt.Y.Label.Text = "device memory (" + unitName + ")"
	plt.Y.Tick.Marker = plotYTicker{}
	plt.X.Min, plt.X.Max = 0, float64(max(n-1, 1))
	plt.Y.Min, plt.Y.Max = 0, max(y(top), 1e-9)*1.1
	return plt, y
}

// stackCategories adds one filled band per category present in the timeline, stacked in category order, each
// with its legend entry.
func stackCategories(plt *plot.Plot, leg *plot.Legend, tl []explain.Point, idx []int, y func(int64) float64) {
	lower := make([]float64, len(idx))
	for c := ir.Category(0); c <= explain.Unknown; c++ {
		present := false
		upper := make([]float64, len(idx))
		for k, i := range idx {
			upper[k] = lower[k] + y(tl[i].ByCat[c])
			present = present || tl[i].ByCat[c] != 0
		}
		if !present {
			continue
		}
		var pts plotter.XYs
		for k, i := range idx {
			pts = append(pts, plotter.XY{X: float64(i), Y: upper[k]})
		}
		for k := len(idx) - 1; k >= 0; k-- {
			pts = append(pts, plotter.XY{X: float64(idx[k]), Y: lower[k]})
		}
		poly, err := plotter.NewPolygon(pts)
		if err == nil {
			col := color.Color(plotGray)
			if c < ir.NumCategories {
				col = plotColors[c]
			} else {
				col = color.Black
			}
			poly.Color = col
			poly.LineStyle.Width = 0
			plt.Add(poly)
			leg.Add(explain.CategoryName(c), plotSwatch{color: col})
		}
		lower = upper
	}
}

func total(p explain.Point) int64 {
	var t int64
	for _, b := range p.ByCat {
		t += b
	}
	return t
}
