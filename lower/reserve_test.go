package lower

import (
	"testing"

	"pgregory.net/rapid"

	"github.com/memplan/memplan/units"
)

// The program's lists are reserved once and never outgrown: for every
// optimizer, implementation, accumulation, loop shape and first or steady
// step, Train's Ops and Tensors keep the capacity reserve gave them (an
// append past it would copy the whole program).
func TestPropertyReserveHolds(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		g, prec := genGraph(t, true)
		c := TrainConfig{
			Optimizer:  Optimizer(rapid.IntRange(0, len(optimizers)-1).Draw(t, "optimizer")),
			Impl:       Impl(rapid.IntRange(0, 2).Draw(t, "impl")),
			Precision:  prec,
			Accum:      rapid.IntRange(1, 3).Draw(t, "accum"),
			FirstStep:  rapid.Bool().Draw(t, "first"),
			Hold:       Hold(rapid.IntRange(0, 2).Draw(t, "hold")),
			ZeroGrad:   ZeroGrad(rapid.IntRange(0, 2).Draw(t, "zerograd")),
			InBackward: rapid.Bool().Draw(t, "inbackward"),
			Workspace:  units.Bytes(rapid.IntRange(0, 1).Draw(t, "workspace") << 20),
		}
		if c.InBackward {
			c.Accum = 1
		}
		if rapid.Bool().Draw(t, "statedtype") {
			c.StateDType = units.F32
		}
		p, err := Train(g, c)
		if err != nil {
			t.Fatal(err)
		}
		c.defaults()
		l := newLowerer(g)
		l.reserve(c)
		if cap(p.Ops) != cap(l.p.Ops) || cap(p.Tensors) != cap(l.p.Tensors) {
			t.Fatalf("lists outgrew their reservation: ops %d of %d reserved (cap now %d), tensors %d of %d (cap now %d)",
				len(p.Ops), cap(l.p.Ops), cap(p.Ops), len(p.Tensors), cap(l.p.Tensors), cap(p.Tensors))
		}
	})
}
