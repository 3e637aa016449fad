package engine

import (
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"

	"github.com/memplan/memplan/ir"
	"github.com/memplan/memplan/lower"
	"github.com/memplan/memplan/models"
	"github.com/memplan/memplan/models/build"
	"github.com/memplan/memplan/ops"
)

// TestPlans runs the scripts in testdata/plans: each `plan` command builds a
// spec from key=value arguments and prints the peak, each phase's peak, the
// model states and the saved activations. Regenerate with
// `go test ./engine -run TestPlans -rewrite` and read the diff before
// committing it.
func TestPlans(t *testing.T) {
	datadriven.Walk(t, "testdata/plans", func(t *testing.T, path string) {
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			if d.Cmd != "plan" {
				d.Fatalf(t, "unknown command %q", d.Cmd)
			}
			s, err := specFromArgs(d)
			if err != nil {
				return "error: " + err.Error() + "\n"
			}
			r, err := Plan(s)
			if err != nil {
				return "error: " + err.Error() + "\n"
			}
			var b strings.Builder
			name, module := r.PeakOp()
			fmt.Fprintf(&b, "peak %d (%s) in %s at %s [%s]\n", int64(r.Sim.Peak.Total), r.Sim.Peak.Total, r.Sim.Peak.Phase, name, module)
			for ph := ir.Phase(0); ph < ir.NumPhases; ph++ {
				if pp := r.Sim.PhasePeak[ph]; pp.Op >= 0 {
					fmt.Fprintf(&b, "  %-9s %d (%s) at %s\n", ph, int64(pp.Total), pp.Total, r.Program.Ops[pp.Op].Name)
				}
			}
			ms := r.Sim.ModelStates
			if r.Sim.Params > 0 {
				fmt.Fprintf(&b, "model states %.4f bytes/param (params %d, grads %d, optimizer %d)\n",
					float64(ms.Parameters+ms.Gradients+ms.OptimizerState)/float64(r.Sim.Params), int64(ms.Parameters), int64(ms.Gradients), int64(ms.OptimizerState))
			}
			fmt.Fprintf(&b, "saved %d (%s); host peak %d\n", int64(r.Sim.SavedTotal), r.Sim.SavedTotal, int64(r.Sim.HostPeak))
			return b.String()
		})
	})
}

func specFromArgs(d *datadriven.TestData) (Spec, error) {
	var s Spec
	for _, a := range d.CmdArgs {
		if len(a.Vals) != 1 {
			return s, fmt.Errorf("%s needs one value", a.Key)
		}
		v := a.Vals[0]
		var err error
		num := func() int {
			n, e := strconv.Atoi(v)
			if e != nil {
				err = e
			}
			return n
		}
		switch a.Key {
		case "model":
			s.Model, err = models.Lookup(v)
		case "layers":
			if s.Model != nil {
				s.Model = s.Model.Clone()
				s.Model.Layers = num()
			}
		case "mb":
			s.MicroBatch = num()
		case "seq":
			s.Seq = num()
		case "accum":
			s.Accum = num()
		case "precision":
			s.Precision, err = ops.ParsePrecision(v)
		case "optimizer":
			s.Optimizer, err = lower.ParseOptimizer(v)
		case "impl":
			s.Impl, err = lower.ParseImpl(v)
		case "attention":
			s.Attention, err = build.ParseAttention(v)
		case "checkpoint":
			s.Checkpoint, err = ParseCheckpoint(v)
		case "dp":
			s.DP = num()
		case "zero":
			s.ZeRO = num()
		case "tp":
			s.TP = num()
		case "sp":
			s.SP = v == "true"
		case "pp":
			s.PP = num()
		case "offload":
			s.Offload, err = ParseOffload(v)
		case "mode":
			s.Mode, err = ParseMode(v)
		case "gen":
			s.GenTokens = num()
		default:
			return s, fmt.Errorf("unknown argument %s", a.Key)
		}
		if err != nil {
			return s, err
		}
	}
	return s, nil
}
