package engine

import (
	"testing"

	"github.com/memplan/memplan/lower"
	"github.com/memplan/memplan/ops"
)

// Each --allow family adds its one row to compare, as it adds its one
// option to fit's search (search.TestSearchSpaceAsDocumented): `compare
// --allow precision` was parsed and then ignored. Lowering the precision
// applies only to one with float32 parameters.
func TestCompareAllowAddsEachFamily(t *testing.T) {
	base := Spec{Job: Job{Model: lookup(t, "gpt2"), MicroBatch: 1, Seq: 128, Precision: ops.AMPBF16, Optimizer: lower.AdamW}}
	names := func(s Spec, a Allow) map[string]bool {
		out := map[string]bool{}
		for _, v := range Variants(s, a) {
			out[v.Name] = true
		}
		return out
	}
	without := names(base, Allow{})
	for _, c := range []struct {
		allow Allow
		check func(s *Spec) bool
	}{
		{Allow{LoRA: true}, func(s *Spec) bool { return s.LoRA != nil && !s.QLoRA }},
		{Allow{QLoRA: true}, func(s *Spec) bool { return s.QLoRA }},
		{Allow{EightBit: true}, func(s *Spec) bool { return s.Optimizer == lower.Adam8bit }},
		{Allow{LowerPrecision: true}, func(s *Spec) bool { return s.Precision == ops.BF16 }},
	} {
		var added []Variant
		for _, v := range Variants(base, c.allow) {
			if !without[v.Name] {
				added = append(added, v)
			}
		}
		if len(added) != 1 {
			t.Errorf("%+v: added %d rows, want 1", c.allow, len(added))
			continue
		}
		s := base
		if err := added[0].apply(&s); err != nil || !c.check(&s) {
			t.Errorf("%+v: row %q does not make the change (err %v)", c.allow, added[0].Name, err)
		}
	}
	for _, p := range []ops.Precision{ops.BF16, ops.PureBF16, ops.PureFP16, ops.AutocastBF16} {
		s := base
		s.Precision = p
		if got, want := len(Variants(s, Allow{LowerPrecision: true})), len(Variants(s, Allow{})); got != want {
			t.Errorf("%s with --allow precision: %d rows, want %d (nothing lower to offer)", p, got, want)
		}
	}
	for _, p := range []ops.Precision{ops.FP32, ops.AMPBF16, ops.AMPFP16} {
		if to, ok := LoweredPrecision(p); !ok || to != ops.BF16 {
			t.Errorf("LoweredPrecision(%s) = %s, %v; want bf16, true", p, to, ok)
		}
	}
}
