package cli

import (
	"bytes"
	"regexp"
	"strings"
	"testing"
)

// A recipe's cuda.alloc-conf is the allocator setting plan replays with
// unless --alloc-conf is given: torchtitan launches with expandable
// segments (run_llama_train.sh @9dec370a), so its reserved line counts a
// few mapped segments, and --alloc-conf expandable_segments:False brings
// back the hundreds of cudaMalloc segments.
func TestPlanReservedFollowsRecipeAllocConf(t *testing.T) {
	segs := regexp.MustCompile(`in (\d+) segments\)`)
	run := func(extra ...string) string {
		var out, errb bytes.Buffer
		args := append([]string{"plan", "--model", "llama-3.2-1b", "--gpu", "h100", "--micro-batch", "2", "--seq", "2048", "--recipe", "torchtitan", "--no-chart"}, extra...)
		if rc := Main(args, &out, &errb); rc != 0 {
			t.Fatalf("%v: exit %d: %s", args, rc, errb.String())
		}
		m := segs.FindStringSubmatch(out.String())
		if m == nil {
			t.Fatalf("%v: no reserved line:\n%s", args, out.String())
		}
		return m[1]
	}
	expandable, plain := run(), run("--alloc-conf", "expandable_segments:False")
	if len(expandable) > 1 || len(plain) < 2 || strings.HasPrefix(plain, "0") {
		t.Errorf("segments: %s with the recipe's expandable segments, %s without; want a few against many", expandable, plain)
	}
}
