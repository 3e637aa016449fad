package diagnose

import (
	"strconv"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"

	"github.com/memplan/memplan/engine"
	"github.com/memplan/memplan/hw"
	"github.com/memplan/memplan/importer/torchtrace"
	"github.com/memplan/memplan/lower"
	"github.com/memplan/memplan/models"
	"github.com/memplan/memplan/ops"
)

// TestDiagnose runs testdata/diagnose: each `diagnose` command plans a
// catalog job from key=value arguments and prints the observation table, the
// pressure object and the next step; `expect-pressure=NAME` fails the test
// when the pressure object is another. Regenerate with
// `go test ./diagnose -rewrite` and read the diff before committing it.
func TestDiagnose(t *testing.T) {
	datadriven.RunTest(t, "testdata/diagnose", func(t *testing.T, d *datadriven.TestData) string {
		if d.Cmd != "diagnose" {
			d.Fatalf(t, "unknown command %q", d.Cmd)
		}
		var s engine.Spec
		want := ""
		for _, a := range d.CmdArgs {
			v := a.Vals[0]
			var err error
			num := func() int {
				n, e := strconv.Atoi(v)
				err = e
				return n
			}
			switch a.Key {
			case "model":
				s.Model, err = models.Lookup(v)
			case "mb":
				s.MicroBatch = num()
			case "seq":
				s.Seq = num()
			case "precision":
				s.Precision, err = ops.ParsePrecision(v)
			case "optimizer":
				s.Optimizer, err = lower.ParseOptimizer(v)
			case "checkpoint":
				s.Checkpoint, err = engine.ParseCheckpoint(v)
			case "gpu":
				s.GPU, err = hw.Lookup(v)
			case "mode":
				s.Mode, err = engine.ParseMode(v)
			case "gen":
				s.GenTokens = num()
			case "expect-pressure":
				want = strings.ReplaceAll(v, "-", " ")
			default:
				d.Fatalf(t, "unknown argument %s", a.Key)
			}
			if err != nil {
				d.Fatalf(t, "%s: %v", a.Key, err)
			}
		}
		rep, err := Diagnose(s, false)
		if err != nil {
			return "error: " + err.Error() + "\n"
		}
		if want != "" && rep.Pressure.Name != want {
			t.Errorf("%s: pressure object %q, want %q", d.Pos, rep.Pressure.Name, want)
		}
		var b strings.Builder
		if err := Write(&b, rep); err != nil {
			t.Fatal(err)
		}
		return b.String()
	})
}

// A trace's rows are the inputs it can change: no sequence row when it
// records no sequence dimension, no precision row (it ran its recorded
// dtypes), and an optimizer row that replaces the recorded step (setting
// the optimizer alone left three_events' peak as it was: second sweep).
func TestVariationsOfATrace(t *testing.T) {
	tr, err := torchtrace.Load("../testdata/torch/three_events.trace.json")
	if err != nil {
		t.Fatal(err)
	}
	rep, err := Diagnose(engine.Spec{Job: engine.Job{Trace: tr}}, false)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, r := range rep.Rows {
		names = append(names, r.Name)
		if strings.HasPrefix(r.Name, "optimizer") && r.Err == nil && r.Peak == rep.Base.Peak {
			t.Errorf("%s: peak %d as the recorded step's", r.Name, r.Peak)
		}
	}
	got := strings.Join(names, "; ")
	if strings.Contains(got, "sequence") || strings.Contains(got, "precision") || !strings.Contains(got, "optimizer adamw") {
		t.Errorf("rows %s: want no sequence or precision row, and adamw in place of the recorded sgd", got)
	}
}

// The accumulation row is the job with twice the micro-steps planned: where
// it simulates as many as the base (sameAccum), the base's row stands for
// it, and that must be the row its own plan gives, with a pipeline too.
func TestAccumulationRowIsItsPlan(t *testing.T) {
	m, err := models.Lookup("gpt2")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ accum, pp int }{{1, 1}, {2, 1}, {4, 1}, {8, 1}, {2, 2}, {4, 2}, {8, 2}} {
		s := engine.Spec{Job: engine.Job{Model: m, MicroBatch: 1, Seq: 128, Accum: c.accum}}
		s.PP = c.pp
		rep, err := Diagnose(s, false)
		if err != nil {
			t.Fatalf("accum %d pp %d: %v", c.accum, c.pp, err)
		}
		var got *Row
		for i := range rep.Rows {
			if strings.HasPrefix(rep.Rows[i].Name, "accumulation") {
				got = &rep.Rows[i]
			}
		}
		if got == nil {
			t.Fatalf("accum %d pp %d: no accumulation row in %+v", c.accum, c.pp, rep.Rows)
		}
		v := rep.Plan.Spec
		v.Accum = 2 * c.accum
		r, err := engine.PlanWith(v, engine.Options{NoTimeline: true, AllAccum: true})
		want := rowOf(got.Name, r, err)
		if *got != want {
			t.Errorf("accum %d pp %d: row %+v, planned %+v", c.accum, c.pp, *got, want)
		}
	}
}
