package ir

import "testing"

func TestBlockOfCases(t *testing.T) {
	for in, want := range map[string]string{"model.layers.3.mlp": "model.layers.3", "lm_head": "lm_head", "": "", "a.b": "a.b", "h.12": "h.12", "x..3.y": "x..3", "7": "7", "a.7b.c": "a.7b.c"} {
		if got := BlockOf(in); got != want {
			t.Errorf("BlockOf(%q) = %q, want %q", in, got, want)
		}
	}
}
