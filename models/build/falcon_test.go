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
