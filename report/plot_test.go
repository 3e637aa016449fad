package report

import (
	"bytes"
	"html"
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gonum.org/v1/plot/vg"

	"github.com/memplan/memplan/engine"
	"github.com/memplan/memplan/ir"
	"github.com/memplan/memplan/sim"
	"github.com/memplan/memplan/units"
)

// plotDirFiles lists the names in dir.
func plotDirFiles(t *testing.T, dir string) []string {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range es {
		names = append(names, e.Name())
	}
	return names
}

func TestWritePlotPNG(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name  string
		r     *engine.Result
		opt   PlotOptions
		w, h  int
		files string
	}{
		{"gpt2.png", chartPlan(t, 4, 1), PlotOptions{}, 1200, 600, ""},
		{"accum.PNG", chartPlan(t, 2, 3), PlotOptions{Width: 6 * vg.Inch, Height: 4 * vg.Inch, DPI: 50}, 300, 200, ""},
		{"one.png", chartOneOp(t), PlotOptions{}, 1200, 600, ""},
	} {
		path := filepath.Join(dir, tc.name)
		if err := WritePlot(path, tc.r, tc.opt); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		img, err := png.Decode(f)
		f.Close()
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if b := img.Bounds(); b.Dx() != tc.w || b.Dy() != tc.h {
			t.Errorf("%s: %dx%d, want %dx%d", tc.name, b.Dx(), b.Dy(), tc.w, tc.h)
		}
		if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o644 {
			t.Errorf("%s: mode %v, %v", tc.name, fi.Mode(), err)
		}
	}
	if got := plotDirFiles(t, dir); len(got) != 3 {
		t.Errorf("directory holds %v; want just the three plots", got)
	}
}

func TestWritePlotSVGAndPDF(t *testing.T) {
	r := chartPlan(t, 4, 1)
	dir := t.TempDir()
	svg := filepath.Join(dir, "plot.svg")
	if err := WritePlot(svg, r, PlotOptions{}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(svg)
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	if !strings.HasPrefix(s, "<?xml") && !strings.HasPrefix(s, "<svg") {
		t.Errorf("SVG starts with %q", s[:min(len(s), 20)])
	}
	title := chartTitle(r)
	for _, want := range []string{html.EscapeString(title), "parameters", "optimizer_state", "rtx-4090 capacity 23.99 GiB",
		"peak " + r.Sim.Peak.Total.String(), "</svg>"} {
		if !strings.Contains(s, want) {
			t.Errorf("SVG lacks %q", want)
		}
	}
	if strings.Contains(s, ">kv_cache<") {
		t.Error("SVG names kv_cache, which training gpt2 does not have")
	}
	if len(b) > 1<<20 {
		t.Errorf("SVG is %d bytes", len(b))
	}

	pdf := filepath.Join(dir, "plot.pdf")
	if err := WritePlot(pdf, r, PlotOptions{Title: "custom title"}); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(pdf); err != nil || !bytes.HasPrefix(b, []byte("%PDF-")) {
		t.Errorf("PDF: %q, %v", b[:min(len(b), 8)], err)
	}

	var buf bytes.Buffer
	if err := WritePlotTo(&buf, "svg", r, PlotOptions{Title: "custom title"}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), "custom title") || strings.Contains(buf.String(), html.EscapeString(title)) {
		t.Error("PlotOptions.Title is not used")
	}
	if err := WritePlotTo(&buf, "gif", r, PlotOptions{}); err == nil {
		t.Error("WritePlotTo accepted gif")
	}
}

func TestWritePlotErrors(t *testing.T) {
	r := chartPlan(t, 4, 1)
	dir := t.TempDir()
	err := WritePlot(filepath.Join(dir, "plot.xyz"), r, PlotOptions{})
	if err == nil || !strings.Contains(err.Error(), `unsupported plot format ".xyz" (want .svg`) {
		t.Errorf("bad extension: %v", err)
	}
	if err := WritePlot(filepath.Join(dir, "plot"), r, PlotOptions{}); err == nil || !strings.Contains(err.Error(), `format ""`) {
		t.Errorf("no extension: %v", err)
	}
	missing := filepath.Join(dir, "missing", "plot.png")
	if err := WritePlot(missing, r, PlotOptions{}); err == nil {
		t.Error("writing into a missing directory succeeded")
	}
	if _, err := os.Stat(filepath.Dir(missing)); !os.IsNotExist(err) {
		t.Errorf("missing directory: %v", err)
	}
	if err := WritePlot(filepath.Join(dir, "empty.png"), &engine.Result{Program: &ir.Program{}, Sim: &sim.Result{}}, PlotOptions{}); err == nil {
		t.Error("plotted an empty timeline")
	}
	if got := plotDirFiles(t, dir); len(got) != 0 {
		t.Errorf("failed writes left %v", got)
	}

	// A failed write keeps the previous file intact.
	old := filepath.Join(dir, "keep.png")
	if err := os.WriteFile(old, []byte("previous"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := WritePlot(old, nil, PlotOptions{}); err == nil {
		t.Error("plotted a nil result")
	}
	if b, _ := os.ReadFile(old); string(b) != "previous" {
		t.Errorf("failed write changed the file to %q", b)
	}
	if got := plotDirFiles(t, dir); len(got) != 1 {
		t.Errorf("directory holds %v", got)
	}
}

func TestPlotSeriesDownsample(t *testing.T) {
	r := chartPlan(t, 2, 3)
	n := len(r.Sim.Timeline)
	for _, maxPts := range []int{1, 7, 100, n - 1, n, 10 * n} {
		s := newPlotSeries(r, maxPts)
		if len(s.pts) > maxPts || len(s.pts) == 0 || len(s.x) != len(s.pts)+1 {
			t.Errorf("max %d: %d points, %d edges", maxPts, len(s.pts), len(s.x))
			continue
		}
		if s.x[0] != 0 || s.x[len(s.x)-1] != float64(n) {
			t.Errorf("max %d: edges span %v..%v, want 0..%d", maxPts, s.x[0], s.x[len(s.x)-1], n)
		}
		found := false
		for k, p := range s.pts {
			if float64(p) < s.x[k] || float64(p) >= s.x[k+1] {
				t.Errorf("max %d: bucket %d [%v, %v) shows op %d", maxPts, k, s.x[k], s.x[k+1], p)
			}
			found = found || r.Sim.Timeline[p].Total == r.Sim.Peak.Total
		}
		if !found {
			t.Errorf("max %d: the peak was lost", maxPts)
		}
	}
	s := newPlotSeries(r, DefaultPlotMaxPoints)
	// 3 micro-steps of forward and backward, then the optimizer.
	var got []string
	for _, ph := range s.phases {
		got = append(got, ph.phase.String()[:1])
	}
	if strings.Join(got, "") != "fbfbfbo" {
		t.Errorf("phases %v", got)
	}
	for _, c := range s.cats {
		if c == ir.KVCache {
			t.Error("kv_cache is drawn though it is always zero")
		}
	}
	var buf bytes.Buffer
	if err := WritePlotTo(&buf, "svg", r, PlotOptions{MaxPoints: 50}); err != nil {
		t.Fatal(err)
	}
}

// plan's plot draws the reserved line, in explain's reserved style, when the
// plan has the caching allocator's prediction, with the y range reaching
// its highest step; no such line without it.
func TestWritePlotReservedLine(t *testing.T) {
	r := chartReserved(t)
	s := newPlotSeries(r, DefaultPlotMaxPoints)
	var top float64
	for _, y := range s.reserved {
		top = max(top, y)
	}
	if len(s.reserved) != len(s.pts) || top != s.y(units.Bytes(r.Reserved.Steady.PeakReserved)) {
		t.Errorf("%d reserved steps for %d buckets, highest %.3f, the replay's peak %.3f", len(s.reserved), len(s.pts), top, s.y(units.Bytes(r.Reserved.Steady.PeakReserved)))
	}
	var with, without bytes.Buffer
	if err := WritePlotTo(&with, "svg", r, PlotOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := WritePlotTo(&without, "svg", chartPlan(t, 4, 1), PlotOptions{}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(with.String(), ">reserved<") || strings.Contains(without.String(), ">reserved<") {
		t.Errorf("legend: reserved in the plot with the prediction %v, without it %v", strings.Contains(with.String(), ">reserved<"), strings.Contains(without.String(), ">reserved<"))
	}
}
