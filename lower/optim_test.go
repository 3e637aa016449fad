package lower

import (
	"slices"
	"testing"
)

// Each optimizer's implementations are what its framework runs, and a
// request for one it lacks is planned as the one it has (Planned) and said
// why in words (CheckImpl). Sources: torch/optim/{sgd,adam,adamw,adagrad}.py
// take fused=True (sgd.py from v2.3.0); rmsprop.py @v2.1.0 and the stable
// docs' RMSprop(...) take no fused argument; lion-pytorch 0.1.2 and
// transformers' Adafactor step parameter by parameter; bitsandbytes 0.41.1
// and torchao 0.5 run one kernel of their own per parameter.
func TestOptimizerImpls(t *testing.T) {
	all := []Impl{Foreach, Single, Fused}
	for _, tc := range []struct {
		o     Optimizer
		impls []Impl
		err   string // CheckImpl of the first implementation it lacks
	}{
		{SGD, all, ""}, {SGDMomentum, all, ""}, {Adam, all, ""}, {AdamW, all, ""}, {AdamWAMSGrad, all, ""}, {Adagrad, all, ""},
		{RMSprop, []Impl{Foreach, Single}, "rmsprop has only foreach and single"},
		{Lion, []Impl{Single}, "lion has only single"},
		{Adafactor, []Impl{Single}, "adafactor has only single"},
		{Adam8bit, []Impl{Fused}, "adamw8bit has only fused"},
		{AdamW8bitAO, []Impl{Fused}, "adamw8bit-torchao has only fused"},
		{AdamW4bitAO, []Impl{Fused}, "adamw4bit-torchao has only fused"},
	} {
		if got := tc.o.Impls(); !slices.Equal(got, tc.impls) {
			t.Errorf("%s: implementations %v, want %v", tc.o, got, tc.impls)
		}
		only, ok := tc.o.OnlyImpl()
		if ok != (len(tc.impls) == 1) || ok && only != tc.impls[0] {
			t.Errorf("%s: OnlyImpl %v %v, want the one of %v", tc.o, only, ok, tc.impls)
		}
		for _, i := range all {
			has := slices.Contains(tc.impls, i)
			want := i
			if !has {
				want = tc.impls[0]
			}
			if got := tc.o.Planned(i); got != want {
				t.Errorf("%s: %s is planned as %s, want %s", tc.o, i, got, want)
			}
			c := TrainConfig{Optimizer: tc.o, Impl: i}
			if c.defaults(); c.Impl != want {
				t.Errorf("%s: lowering plans %s as %s, want %s", tc.o, i, c.Impl, want)
			}
			err := tc.o.CheckImpl(i)
			switch {
			case has && err != nil:
				t.Errorf("%s: %s refused: %v", tc.o, i, err)
			case !has && (err == nil || err.Error() != tc.err):
				t.Errorf("%s: %s: got %v, want %q", tc.o, i, err, tc.err)
			}
		}
	}
	if n := len(Optimizers()); n != 12 {
		t.Errorf("%d optimizers: add the new ones' implementations to this table", n)
	}
}
