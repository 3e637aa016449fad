package search

import (
	"fmt"
	"slices"
	"testing"

	"github.com/memplan/memplan/engine"
	"github.com/memplan/memplan/lower"
	"github.com/memplan/memplan/ops"
)

// The search space is what fit's help and the README say: by default the
// precision, the optimizer and the adapters stay as given and every other
// dimension is searched over the documented values; each --allow family
// adds exactly its documented option.
func TestSearchSpaceAsDocumented(t *testing.T) {
	base := baseSpec(t, "llama-3.2-1b", "h100", 0)
	base.Attention = 0 // sdpa: no selective checkpointing
	o := Options{GPUs: 8, GlobalBatch: 64}
	if err := fitDefaults(&base, &o); err != nil {
		t.Fatal(err)
	}
	seen := map[string]map[string]bool{}
	add := func(dim string, v any) {
		if seen[dim] == nil {
			seen[dim] = map[string]bool{}
		}
		seen[dim][fmtAny(v)] = true
	}
	for _, p := range enumerate(base, o) {
		s := &p.Spec
		add("precision", s.Precision)
		add("optimizer", s.Optimizer)
		add("lora", s.LoRA != nil)
		add("impl", s.Impl)
		add("checkpoint", s.Checkpoint)
		add("offload", s.Offload)
		add("zero", s.ZeRO)
		add("tp", s.TP)
		add("pp", s.PP)
		add("sp", s.SP)
		add("micro-batch", s.MicroBatch)
	}
	want := map[string][]string{
		"precision":  {base.Precision.String()},
		"optimizer":  {base.Optimizer.String()},
		"lora":       {"false"},
		"impl":       {"foreach", "fused"},
		"checkpoint": {"none", "every=2", "full"},
		"offload":    {"", "activations", "optimizer", "activations,optimizer", "params", "activations,params"},
		"zero":       {"0", "1", "2", "3"},
		"tp":         {"1", "2", "4", "8"},
		"pp":         {"1", "2", "4", "8"},
		"sp":         {"false", "true"},
		// The first 16 divisors of the replica's batch: 64/1 at dp 1 …
		// 64/8 at dp 8.
		"micro-batch": {"1", "2", "4", "8", "16", "32", "64"},
	}
	for dim, vs := range want {
		var got []string
		for v := range seen[dim] {
			got = append(got, v)
		}
		slices.Sort(got)
		slices.Sort(vs)
		if !slices.Equal(got, vs) {
			t.Errorf("%s: searched %v, documented %v", dim, got, vs)
		}
	}
	// Each --allow family adds its one option.
	for _, c := range []struct {
		allow engine.Allow
		dim   string
		adds  string
	}{
		{engine.Allow{LowerPrecision: true}, "precision", ops.BF16.String()},
		{engine.Allow{EightBit: true}, "optimizer", lower.Adam8bit.String()},
		{engine.Allow{LoRA: true}, "lora", "r=16,alpha=32,all-linear"},
		{engine.Allow{QLoRA: true}, "lora", "qlora r=16,alpha=32,all-linear"},
	} {
		o := o
		o.Allow = c.allow
		got := map[string]bool{}
		for _, p := range enumerate(base, o) {
			s := &p.Spec
			switch c.dim {
			case "precision":
				got[s.Precision.String()] = true
			case "optimizer":
				got[s.Optimizer.String()] = true
			case "lora":
				v := "none"
				if s.LoRA != nil {
					v = "r=" + fmtAny(s.LoRA.Rank) + ",alpha=" + fmtAny(s.LoRA.Alpha) + "," + s.LoRA.Targets[0]
					if s.QLoRA {
						v = "qlora " + v
					}
				}
				got[v] = true
			}
		}
		if len(got) != 2 || !got[c.adds] {
			t.Errorf("%+v: %s searched %v, want the given one and %s", c.allow, c.dim, got, c.adds)
		}
	}
}

func fmtAny(v any) string {
	switch x := v.(type) {
	case interface{ String() string }:
		return x.String()
	}
	return fmtPlain(v)
}

func fmtPlain(v any) string { return fmt.Sprint(v) }

// fit searches only the optimizer steps each optimizer has, and every plan
// names the step it plans: lion's single loop alone (no fused variant that
// would plan it again under another name), RMSprop without a fused step
// (torch.optim.RMSprop takes no fused=True), --allow 8bit's bitsandbytes
// AdamW only with its own kernel.
func TestSearchSpaceImpls(t *testing.T) {
	for _, c := range []struct {
		opt   lower.Optimizer
		allow engine.Allow
		want  []string // optimizer/impl pairs searched
	}{
		{lower.Lion, engine.Allow{}, []string{"lion/single"}},
		{lower.RMSprop, engine.Allow{}, []string{"rmsprop/foreach"}},
		{lower.Adam8bit, engine.Allow{}, []string{"adamw8bit/fused"}},
		{lower.AdamW, engine.Allow{EightBit: true}, []string{"adamw/foreach", "adamw/fused", "adamw8bit/fused"}},
	} {
		base := baseSpec(t, "llama-3.2-1b", "h100", 0)
		base.Optimizer = c.opt
		o := Options{GPUs: 2, GlobalBatch: 4, Allow: c.allow}
		if err := fitDefaults(&base, &o); err != nil {
			t.Fatal(err)
		}
		seen := map[string]bool{}
		for _, p := range enumerate(base, o) {
			seen[p.Spec.Optimizer.String()+"/"+p.Spec.Impl.String()] = true
		}
		var got []string
		for k := range seen {
			got = append(got, k)
		}
		slices.Sort(got)
		if !slices.Equal(got, c.want) {
			t.Errorf("%s %+v: searched %v, want %v", c.opt, c.allow, got, c.want)
		}
	}
}
