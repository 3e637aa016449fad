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
	} {
		if got := Problems(c.msg); (len(got) > 0) != c.bad {
			t.Errorf("%q: problems %v, want bad=%t", c.msg, got, c.bad)
		}
	}
}
