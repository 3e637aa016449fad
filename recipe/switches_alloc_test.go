package recipe

import (
	"strings"
	"testing"

	"github.com/memplan/memplan/engine"
)

// cuda.alloc-conf carries PYTORCH_CUDA_ALLOC_CONF to the reserved
// prediction (torchtitan launches with expandable segments) and refuses
// what the allocator model does not read; a byte switch takes 0.
func TestAllocConfAndZeroBytes(t *testing.T) {
	r, err := Load("torchtitan")
	if err != nil {
		t.Fatal(err)
	}
	var s engine.Spec
	if err := r.Apply(&s, nil); err != nil {
		t.Fatal(err)
	}
	if s.Sem.AllocConf != "expandable_segments:True" {
		t.Errorf("torchtitan's allocator settings %q, want expandable_segments:True", s.Sem.AllocConf)
	}
	for _, c := range []struct{ kv, err string }{
		{"cuda.alloc-conf=max_split_size_mb:512", ""},
		{"cuda.alloc-conf=backend:cudaMallocAsync", "only the native caching allocator"},
		{"cuda.alloc-conf=colour:blue", "unknown option"},
		{"cuda.cublas-workspace=0", ""},
		{"cuda.overhead=0", ""},
		{"cuda.overhead=0B", ""},
		{"cuda.cublas-workspace=0.0MiB", ""},
		{"cuda.overhead=-5", "want a byte size"},
	} {
		rc := r.Clone()
		err := rc.Set(c.kv)
		if err == nil {
			var s engine.Spec
			err = rc.Apply(&s, nil)
		}
		if c.err == "" && err != nil || c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)) {
			t.Errorf("%s: error %v, want %q", c.kv, err, c.err)
		}
	}
}
