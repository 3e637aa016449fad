package models

import (
	"reflect"
	"sort"
	"strings"
	"testing"
)

// TestFamilyTable checks that the family table is consistent: one row per
// model type, each with a source, a parser and LoRA targets; Families is the
// table's types, sorted; decoder rows carry their defaults and other rows
// leave the decoder's fields alone; every family has a catalog config.
func TestFamilyTable(t *testing.T) {
	decoder := reflect.ValueOf((*parser).decoder).Pointer()
	seen := map[string]bool{}
	var types []string
	for i, r := range families {
		if r.ModelType == "" {
			t.Errorf("row %d: no model type", i)
		}
		if seen[r.ModelType] {
			t.Errorf("%s: two rows", r.ModelType)
		}
		seen[r.ModelType] = true
		types = append(types, r.ModelType)
		if !strings.HasPrefix(r.Source, "transformers src/transformers/models/") || !strings.Contains(r.Source, " @v") {
			t.Errorf("%s: source %q does not cite a transformers configuration file at a version", r.ModelType, r.Source)
		}
		if r.parse == nil {
			t.Errorf("%s: no parser", r.ModelType)
			continue
		}
		if len(r.LoRATargets) == 0 {
			t.Errorf("%s: no default LoRA targets", r.ModelType)
		}
		for _, tg := range r.LoRATargets {
			if strings.TrimSpace(tg) == "" {
				t.Errorf("%s: empty LoRA target", r.ModelType)
			}
		}
		if got := DefaultLoRATargets(r.ModelType); !reflect.DeepEqual(got, r.LoRATargets) {
			t.Errorf("%s: DefaultLoRATargets = %v, want %v", r.ModelType, got, r.LoRATargets)
		}
		if reflect.ValueOf(r.parse).Pointer() == decoder {
			if r.MaxPositions <= 0 || !(r.RopeTheta > 0) || r.ActKey == "" || !knownActs[r.Act] || r.HeadDim < 0 {
				t.Errorf("%s: decoder row lacks its defaults: %+v", r.ModelType, r)
			}
			if r.HeadDim > 0 && !r.HeadDimKey {
				t.Errorf("%s: a head_dim default without the head_dim key", r.ModelType)
			}
			if r.MoE != (r.ExpertsPerToken > 0) {
				t.Errorf("%s: MoE %v with num_experts_per_tok default %d", r.ModelType, r.MoE, r.ExpertsPerToken)
			}
			if (r.Window == noWindow) && (r.SlidingWindow != 0 || r.WindowAlternating) {
				t.Errorf("%s: a sliding-window default without a window policy", r.ModelType)
			}
			continue
		}
		// Rows with their own parser: the decoder's fields stay zero.
		z := r
		z.ModelType, z.Source, z.LoRATargets, z.parse, z.HeadDimKey = "", "", nil, nil, false
		if !reflect.DeepEqual(z, family{}) {
			t.Errorf("%s: has its own parser but sets decoder fields: %+v", r.ModelType, r)
		}
	}
	sort.Strings(types)
	if got := Families(); !reflect.DeepEqual(got, types) {
		t.Errorf("Families() = %v, want the table's types sorted %v", got, types)
	}
	if !sort.StringsAreSorted(Families()) {
		t.Errorf("Families() not sorted")
	}
	for _, f := range []string{FamilyGPT2, FamilyLlama, FamilyMistral, FamilyMixtral, FamilyQwen2, FamilyQwen3,
		FamilyGemma, FamilyGemma2, FamilyPhi3, FamilyGPTNeoX, FamilyPhi, FamilyBERT, FamilyViT} {
		if !knownFamily(f) {
			t.Errorf("Family constant %q has no row", f)
		}
	}
	if knownFamily("t5") || explicitHeadDimFamily("t5") {
		t.Error("a model type outside the table is known")
	}
	if got := DefaultLoRATargets("t5"); !reflect.DeepEqual(got, []string{"q_proj", "v_proj"}) {
		t.Errorf("DefaultLoRATargets(t5) = %v", got)
	}
	// DefaultLoRATargets hands out a copy: the table cannot be changed through it.
	DefaultLoRATargets(FamilyGPT2)[0] = "x"
	if lookupFamily(FamilyGPT2).LoRATargets[0] != "c_attn" {
		t.Error("DefaultLoRATargets returned the table's slice")
	}
	// Every family has a real config in the catalog that parses as it.
	have := map[string]bool{}
	for _, e := range Catalog() {
		have[e.Family] = true
	}
	for _, f := range types {
		if !have[f] {
			t.Errorf("%s: no catalog config", f)
		}
	}
}
