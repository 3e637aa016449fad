package report

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/memplan/memplan/allocator"
	"github.com/memplan/memplan/engine"
	"github.com/memplan/memplan/hw"
	"github.com/memplan/memplan/ir"
	"github.com/memplan/memplan/lower"
	"github.com/memplan/memplan/models"
	"github.com/memplan/memplan/ops"
	"github.com/memplan/memplan/sim"
	"github.com/memplan/memplan/units"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// chartPlan plans gpt2 (micro-batch mb, seq 1024 or 512 under accumulation)
// on an RTX 4090; results are cached and must not be modified.
func chartPlan(t *testing.T, mb, accum int) *engine.Result {
	t.Helper()
	chartPlansMu.Lock()
	defer chartPlansMu.Unlock()
	key := [2]int{mb, accum}
	if r, ok := chartPlans[key]; ok {
		return r
	}
	a, err := models.Lookup("gpt2")
	if err != nil {
		t.Fatal(err)
	}
	gpu, err := hw.Lookup("rtx-4090")
	if err != nil {
		t.Fatal(err)
	}
	seq := 1024
	if accum > 1 {
		seq = 512
	}
	r, err := engine.Plan(engine.Spec{Job: engine.Job{Model: a, MicroBatch: mb, Seq: seq, Accum: accum, Precision: ops.AMPBF16, Optimizer: lower.AdamW}, Target: engine.Target{GPU: gpu}})
	if err != nil {
		t.Fatal(err)
	}
	chartPlans[key] = r
	return r
}

var (
	chartPlansMu sync.Mutex
	chartPlans   = map[[2]int]*engine.Result{}
)

// chartCopy returns a shallow copy of r the test may change the capacity of.
func chartCopy(r *engine.Result) *engine.Result {
	c := *r
	return &c
}

// chartOneOp is a hand-built result of a single op.
func chartOneOp(t *testing.T) *engine.Result {
	t.Helper()
	p := &ir.Program{
		Tensors: []ir.Tensor{
			{Name: "w", Bytes: 4 * units.MiB, Base: ir.NoTensor, Cat: ir.Parameter, Resident: true},
			{Name: "x", Bytes: 1 * units.MiB, Base: ir.NoTensor, Cat: ir.Other, Resident: true},
			{Name: "y", Bytes: 2 * units.MiB, Base: ir.NoTensor, Cat: ir.Activation},
		},
		Ops:          []ir.Op{{Name: "linear", Module: "fc", Phase: ir.Forward, In: []ir.TensorID{0, 1}, Out: []ir.TensorID{2}, Workspace: units.MiB, Node: -1}},
		MicroBatches: 1,
	}
	s, err := sim.Run(p)
	if err != nil {
		t.Fatal(err)
	}
	return &engine.Result{Program: p, Sim: s}
}

func chartRender(t *testing.T, r *engine.Result, opt ChartOptions) string {
	t.Helper()
	var b bytes.Buffer
	if err := TerminalChartWith(&b, r, opt); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

func chartGolden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./report/ -run %s -update)", err, t.Name())
	}
	if got != string(want) {
		t.Errorf("%s differs from the golden file (rerun with -update if the change is intended)\n--- got\n%s--- want\n%s", path, got, want)
	}
}

func TestTerminalChartGolden(t *testing.T) {
	r := chartPlan(t, 4, 1)
	tight := chartCopy(r)
	tight.Capacity = 6 * units.GiB
	tight.Fits, tight.Headroom = true, tight.Capacity-r.Sim.Peak.Total
	for _, tc := range []struct {
		name string
		r    *engine.Result
		opt  ChartOptions
	}{
		{"chart_gpt2.golden", r, ChartOptions{Width: 72, Height: 14}},
		{"chart_gpt2_ascii.golden", r, ChartOptions{Width: 48, Height: 8, ASCII: true}},
		{"chart_gpt2_capacity.golden", tight, ChartOptions{Width: 72, Height: 14}},
		{"chart_gpt2_accum.golden", chartPlan(t, 2, 3), ChartOptions{Width: 100, Height: 10}},
		{"chart_one_op.golden", chartOneOp(t), ChartOptions{Width: 40, Height: 6}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			chartGolden(t, tc.name, chartRender(t, tc.r, tc.opt))
		})
	}
}

func TestTerminalChartDefaultsAndShape(t *testing.T) {
	r := chartPlan(t, 4, 1)
	var b bytes.Buffer
	if err := TerminalChart(&b, r, 0, 0); err != nil {
		t.Fatal(err)
	}
	if got, want := b.String(), chartRender(t, r, ChartOptions{Width: DefaultChartWidth, Height: DefaultChartHeight}); got != want {
		t.Error("TerminalChart(w, r, 0, 0) differs from the default size")
	}
	out := b.String()
	if out != chartRender(t, r, ChartOptions{}) {
		t.Error("output is not deterministic")
	}
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	for i, l := range lines {
		if n := len([]rune(l)); n > DefaultChartWidth {
			t.Errorf("line %d is %d cells wide, over %d: %q", i, n, DefaultChartWidth, l)
		}
		if strings.HasSuffix(l, " ") {
			t.Errorf("line %d has trailing spaces", i)
		}
	}
	if got := strings.Count(out, "▲"); got != 1 {
		t.Errorf("%d peak markers, want 1", got)
	}
	for _, want := range []string{"gpt2 · train · 4 × 1024 · amp-bf16 · adamw · rtx-4090", "forward", "backward", "opt",
		"peak " + r.Sim.Peak.Total.String(), "█ parameters", "▒ optimizer_state", "░ activations",
		"capacity " + r.Capacity.String() + " (rtx-4090), off scale", "0 B ┼"} {
		if !strings.Contains(out, want) {
			t.Errorf("chart lacks %q:\n%s", want, out)
		}
	}
	// Rows of bars: title, then Height rows down to the axis.
	axis := -1
	for i, l := range lines {
		if strings.Contains(l, "┼") {
			axis = i
		}
	}
	if axis != 1+DefaultChartHeight {
		t.Errorf("axis on line %d, want %d", axis, 1+DefaultChartHeight)
	}
}

func TestTerminalChartCapacityLine(t *testing.T) {
	r := chartCopy(chartPlan(t, 4, 1))
	r.Capacity = 4 * units.GiB // below the peak: the line crosses the bars
	r.Fits, r.Shortfall = false, r.Sim.Peak.Total-r.Capacity
	out := chartRender(t, r, ChartOptions{})
	if !strings.Contains(out, "╌╌╌") {
		t.Errorf("no capacity line:\n%s", out)
	}
	if !strings.Contains(out, "does not fit, "+r.Shortfall.String()+" short") {
		t.Errorf("no shortfall in the legend:\n%s", out)
	}
	r.Capacity = 5 * units.GiB // between ticks: labelled on the axis
	r.Fits, r.Shortfall = false, r.Sim.Peak.Total-r.Capacity
	if out := chartRender(t, r, ChartOptions{}); !strings.Contains(out, "5.00 GiB ┤╌╌╌") {
		t.Errorf("capacity row not labelled:\n%s", out)
	}
	r.Capacity = 0
	if out := chartRender(t, r, ChartOptions{}); strings.Contains(out, "╌") || strings.Contains(out, "capacity") {
		t.Errorf("capacity drawn without one:\n%s", out)
	}
}

func TestTerminalChartTinySizes(t *testing.T) {
	for _, r := range []*engine.Result{chartPlan(t, 4, 1), chartPlan(t, 2, 3), chartOneOp(t)} {
		for _, w := range []int{-10, 1, 2, 5, 12, MinChartWidth, 25, 300} {
			for _, h := range []int{-3, 1, 2, MinChartHeight, 4, 60} {
				for _, ascii := range []bool{false, true} {
					out := chartRender(t, r, ChartOptions{Width: w, Height: h, ASCII: ascii})
					origin := "┼"
					if ascii {
						origin = "+-"
					}
					lines := strings.Split(out, "\n")
					axis := -1
					for i, l := range lines {
						if strings.Contains(l, origin) {
							axis = i
							break
						}
					}
					if want := 1 + max(h, MinChartHeight); axis != want {
						t.Errorf("%dx%d ascii=%v: axis on line %d, want %d:\n%s", w, h, ascii, axis, want, out)
					}
					if ascii {
						for _, c := range out {
							if c > 0x7e && !strings.ContainsRune("·×", c) { // the title keeps its separators
								t.Errorf("%dx%d: non-ASCII %q in ASCII chart", w, h, c)
								break
							}
						}
					}
				}
			}
		}
	}
}

func TestTerminalChartOneOp(t *testing.T) {
	r := chartOneOp(t)
	out := chartRender(t, r, ChartOptions{})
	for _, want := range []string{"peak 8.00 MiB", "linear (fc), forward, op 1 of 1 (op_index 0)", "█ parameters", "░ activations", ": temporaries", "· other"} {
		if !strings.Contains(out, want) {
			t.Errorf("lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "backward") {
		t.Errorf("a forward-only program shows a backward phase:\n%s", out)
	}
}

func TestTerminalChartErrors(t *testing.T) {
	var b bytes.Buffer
	for name, r := range map[string]*engine.Result{
		"nil":     nil,
		"no sim":  {Program: &ir.Program{}},
		"empty":   {Program: &ir.Program{}, Sim: &sim.Result{}},
		"bad op":  {Program: &ir.Program{Ops: make([]ir.Op, 1)}, Sim: &sim.Result{Timeline: []sim.Point{{Op: 3}}}},
		"bad pk":  {Program: &ir.Program{Ops: make([]ir.Op, 1)}, Sim: &sim.Result{Timeline: []sim.Point{{Op: 0}}, Peak: sim.Point{Op: -1}}},
		"too big": {Program: &ir.Program{}, Sim: &sim.Result{Timeline: []sim.Point{{Op: 0}}}},
	} {
		if err := TerminalChart(&b, r, 72, 14); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	if b.Len() != 0 {
		t.Errorf("wrote %q on error", b.String())
	}
}

func TestChartTicks(t *testing.T) {
	for _, tc := range []struct {
		top  units.Bytes
		max  int
		want []units.Bytes
	}{
		{5 * units.GiB, 4, []units.Bytes{0, 2 * units.GiB, 4 * units.GiB, 6 * units.GiB}},
		{3 * units.GiB, 4, []units.Bytes{0, units.GiB, 2 * units.GiB, 3 * units.GiB}},
		{23*units.GiB + 990*units.MiB, 4, []units.Bytes{0, 8 * units.GiB, 16 * units.GiB, 24 * units.GiB}},
		{1100 * units.MiB, 4, []units.Bytes{0, 512 * units.MiB, units.GiB, 1536 * units.MiB}},
		{79 * units.GiB, 4, []units.Bytes{0, 20 * units.GiB, 40 * units.GiB, 60 * units.GiB, 80 * units.GiB}},
		{100, 4, []units.Bytes{0, 25, 50, 75, 100}},
		{3, 4, []units.Bytes{0, 1, 2, 3}},
		{0, 4, []units.Bytes{0, 1}},
		{7 * units.GiB, 2, []units.Bytes{0, 4 * units.GiB, 8 * units.GiB}},
	} {
		ymax, got := chartTicks(tc.top, tc.max)
		if len(got) != len(tc.want) || ymax != tc.want[len(tc.want)-1] {
			t.Errorf("chartTicks(%v, %d) = %v, %v; want %v", tc.top, tc.max, ymax, got, tc.want)
			continue
		}
		for i := range got {
			if got[i] != tc.want[i] {
				t.Errorf("chartTicks(%v, %d) = %v; want %v", tc.top, tc.max, got, tc.want)
				break
			}
		}
	}
}

// chartReserved is a copy of gpt2's plan with the caching allocator's
// reserved prediction and its timeline, as memplan plan makes it.
func chartReserved(t *testing.T) *engine.Result {
	t.Helper()
	r := chartCopy(chartPlan(t, 4, 1))
	if _, err := r.PredictReserved(allocator.Config{}, false, true); err != nil {
		t.Fatal(err)
	}
	return r
}

// The reserved line: one mark per column, in the row holding the most
// reserved bytes of the column's ops (the allocator replay's timeline), on
// or above the column's bar, none where that is above the top (the scale is
// the chart's without the line); none without the prediction.
func TestTerminalChartReservedLine(t *testing.T) {
	r := chartReserved(t)
	chartGolden(t, "chart_gpt2_reserved.golden", chartRender(t, r, ChartOptions{Width: 72, Height: 14}))
	d := newChartDrawer(r, ChartOptions{Width: 72, Height: 14})
	d.scale()
	d.columns()
	d.fill()
	res := reservedSeries(r)
	for c := 0; c < d.plotW; c++ {
		var most units.Bytes
		for i := d.lo[c]; i < max(d.lo[c+1], d.lo[c]+1); i++ {
			most = max(most, res[i])
		}
		marks := 0
		for k := range d.grid {
			if d.grid[k][c] == d.g.reserved {
				marks++
				lvl := d.height - k
				if lo, hi := float64(lvl-1)*d.rowH, float64(lvl)*d.rowH; float64(most) <= lo || float64(most) > hi {
					t.Errorf("column %d: mark at level %d (%.0f, %.0f], reserved %d", c, lvl, lo, hi, most)
				}
				if most < d.cols[c].Total {
					t.Errorf("column %d: reserved %d under the allocated %d", c, most, d.cols[c].Total)
				}
			}
		}
		if want := 1; marks != want && (float64(most) <= float64(d.height)*d.rowH || marks != 0) {
			t.Errorf("column %d: %d reserved marks for %d reserved bytes (top %.0f)", c, marks, most, float64(d.height)*d.rowH)
		}
	}
	if plain := chartRender(t, chartPlan(t, 4, 1), ChartOptions{Width: 72, Height: 14}); strings.ContainsRune(plain, chartUnicode.reserved) || strings.Contains(plain, "reserved") {
		t.Errorf("a plan without the reserved prediction drew a reserved line:\n%s", plain)
	}
}
