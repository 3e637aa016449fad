package report

import (
	"testing"

	"github.com/memplan/memplan/ir"
	"github.com/memplan/memplan/sim"
	"github.com/memplan/memplan/units"
)

// A timeline of more ops than its points is cut into runs of ops in a row,
// each given as its highest op with op_index and ops: the peak's op is an
// event, no event is above the peak, every op is in exactly one run, and a
// timeline of at most points ops is given op by op without them.
func TestTimelineEvents(t *testing.T) {
	const n = 1003
	p := &ir.Program{Ops: make([]ir.Op, n)}
	tl := make([]sim.Point, n)
	for i := range tl {
		p.Ops[i].Name = "op"
		tl[i] = sim.Point{Op: i, Total: units.Bytes((i * 7919) % 1000)}
	}
	tl[617].Total = 5000 // the peak
	for _, points := range []int{1, 2, 10, 100, 1002, 1003, 5000} {
		ev := timelineEvents(p, tl, points)
		if points >= n {
			if len(ev) != n || ev[617].OpIndex != 0 || ev[617].Ops != 0 || ev[617].Total != 5000 {
				t.Errorf("points %d: %d events (peak event %+v), want every op as it is", points, len(ev), ev[617])
			}
			continue
		}
		if len(ev) > points {
			t.Errorf("points %d: %d events", points, len(ev))
		}
		covered, peak := 0, false
		for _, e := range ev {
			covered += e.Ops
			if e.Total > 5000 {
				t.Errorf("points %d: event above the peak", points)
			}
			if e.OpIndex == 617 && e.Total == 5000 {
				peak = true
			}
		}
		if covered != n || !peak {
			t.Errorf("points %d: runs cover %d of %d ops, peak event %v", points, covered, n, peak)
		}
	}
}
