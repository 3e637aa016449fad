package msgcheck

import "testing"

func TestProblems(t *testing.T) {
	for _, c := range []struct {
		msg string
		bad bool
	}{
		{"memplan: --micro-batch must be positive, got 0", false},
		{"memplan: invalid spec: ZeRO-2 shards over data-parallel ranks: it needs --dp of at least 2", false},
		{"memplan: engine: invalid spec", true},
		{"memplan: plan --graph x: strategy: unknown pipeline schedule", true},
		{"set PriceOptions.DType", true},
		{"default strategy.DefaultReduceBucketElems", true},
		{"MicroBatch must be positive", true},
		{"TraceOptimizer needs a trace", true},
		{"--qlora needs --lora (QLoRA trains LoRA adapters on a 4-bit base)", false},
		{"wraps ErrSpec", true},
		{"micro-batch {micro-batch}", true},
		{"model.layers.3 of config.json", false},
		{`invalid argument "NaN" for "--seq" flag: invalid syntax`, true},
		{`invalid argument "5" for "--timeout" flag: time: invalid duration "5"`, true},
		{`recipe: x.yaml: error unmarshaling JSON: while decoding JSON: json: unknown field "a"`, true},
		{`--cluster c.yaml: not a cluster file: error converting YAML to JSON: yaml: line 4: did not find expected node content`, true},
		{`--addr nope: listen tcp: address nope: missing port in address`, true},
		{`--seq "NaN": want a whole number (see 'memplan plan --help')`, false},
		{`trunc.yaml: invalid YAML: line 4: did not find expected node content`, false},
		{`--cluster c.yaml: not a cluster file: unknown key "jobs"`, false},
	} {
		if got := Problems(c.msg); (len(got) > 0) != c.bad {
			t.Errorf("%q: problems %v, want bad=%t", c.msg, got, c.bad)
		}
	}
}
