package build

import (
	"testing"

	"github.com/memplan/memplan/ops"
)

// Falcon's attention per device (falcon.go): CPU kernels run the flash
// kernel with the float mask (one sdpa_flash_masked, k and v copied out of
// the fused projection); CUDA kernels the math path (flash refuses the mask,
// memory-efficient the single key/value head): two matmuls over the
// expanded key and value, one softmax.
func TestFalconAttentionPaths(t *testing.T) {
	a := lookup(t, "falcon-7b")
	for _, c := range []struct {
		dev  ops.Device
		want map[string]int
	}{
		{ops.CPU, map[string]int{"sdpa_flash_masked": 1, "matmul": 0, "softmax": 0}},
		{ops.CUDA, map[string]int{"sdpa_flash_masked": 0, "matmul": 2, "softmax": 1}},
	} {
		g, err := Graph(a, Options{MicroBatch: 1, Seq: 64, Training: true, Precision: ops.BF16, Device: c.dev})
		if err != nil {
			t.Fatal(err)
		}
		k := kinds(g, "transformer.h.0.self_attention")
		for kind, n := range c.want {
			if k[kind] != n {
				t.Errorf("%v: %d %s, want %d (%v)", c.dev, k[kind], kind, n, k)
			}
		}
		if k["copy"] < 2 {
			t.Errorf("%v: key and value are not copied out of query_key_value: %v", c.dev, k)
		}
	}
}

// Falcon's eager attention (falconEager) is FalconAttention's eager path in
// Megatron's core_attention region: two matmuls over the copied query and
// the key and value expanded to every head, the in-place scale, the mask
// added, one softmax, no SDPA kernel; the model's float mask is
// eager_mask's, made once. Its memory is checked against transformers' own
// step in python/tests/test_export_hf.py (test_eager_attention_matches_catalog).
func TestFalconEagerAttention(t *testing.T) {
	a := lookup(t, "falcon-7b")
	g, err := Graph(a, Options{MicroBatch: 1, Seq: 64, Training: true, Precision: ops.AMPBF16, Attention: Eager})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int{"matmul": 2, "softmax": 1, "mul_scalar": 1, "add": 1, "copy": 3, "sdpa_flash_masked": 0, "sdpa_flash": 0}
	k := kinds(g, "transformer.h.0.self_attention.core_attention")
	for kind, n := range want {
		if k[kind] != n {
			t.Errorf("%d %s in core_attention, want %d (%v)", k[kind], kind, n, k)
		}
	}
	if n := kinds(g, "transformer")["where"]; n != 1 {
		t.Errorf("%d where ops make the float mask, want one for the model", n)
	}
}
