package models

import (
	"strings"
	"testing"
)

const falconCfg = `{"model_type": "falcon", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2, "vocab_size": 256%s}`

func TestFalconConfig(t *testing.T) {
	a, err := ParseHFConfig([]byte(strings.Replace(falconCfg, "%s", "", 1)), "f.json")
	if err != nil {
		t.Fatal(err)
	}
	// FalconConfig defaults @v5.24.0: ffn_hidden_size 4*hidden, gelu, eps 1e-5,
	// 2048 positions, tied head; falcon-7b's structure.
	if a.KVHeads != 1 || a.HeadDim != 16 || a.Intermediate != 256 || a.Act != "gelu" || a.NormEps != 1e-5 ||
		a.MaxPositions != 2048 || !a.TieEmbeddings || !a.FusedQKV || !a.SharedNorm || !a.ParallelResidual ||
		a.PosEmbedding != "rotary" || a.RotaryPct != 1 || a.QKVBias || a.MLPBias {
		t.Errorf("falcon defaults: %+v", a)
	}
	for _, c := range []struct{ extra, want string }{
		{`, "alibi": true`, `"alibi": true is not supported for falcon`},
		{`, "new_decoder_architecture": true`, `"new_decoder_architecture": true is not supported`},
		{`, "parallel_attn": false`, `"parallel_attn": false is not supported`},
		{`, "multi_query": false`, `"multi_query": false is not supported`},
		{`, "bias": true`, `"bias": true is not supported`},
		{`, "ffn_hidden_size": -1`, `ffn_hidden_size`},
		{`, "activation": "nope"`, `activation`},
		{`, "alibi": "yes"`, `alibi`},
	} {
		_, err := ParseHFConfig([]byte(strings.Replace(falconCfg, "%s", c.extra, 1)), "f.json")
		if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: %v, want one line with %q", c.extra, err, c.want)
		}
	}
}
