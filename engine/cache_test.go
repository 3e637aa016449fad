package engine

import (
	"reflect"
	"slices"
	"testing"

	"github.com/memplan/memplan/ir"
	"github.com/memplan/memplan/lower"
	"github.com/memplan/memplan/ops"
	"pgregory.net/rapid"
)

// TestCacheEvictsLeastRecentlyUsed: a full cache drops the programs used
// least recently until the new one fits, not every program (which made a
// search rebuild the lowered programs the next ZeRO stage asks for again).
func TestCacheEvictsLeastRecentlyUsed(t *testing.T) {
	prog := func(ops int) *cacheEntry { return &cacheEntry{prog: &ir.Program{Ops: make([]ir.Op, ops)}} }
	key := func(i int) cacheKey { return cacheKey{stage: i} }
	has := func(c *Cache, want ...bool) {
		t.Helper()
		for i, w := range want {
			if got := c.m[key(i)] != nil; got != w {
				t.Errorf("program %d cached: %v, want %v", i, got, w)
			}
		}
	}
	c := &Cache{Limit: 10}
	c.put(key(0), prog(4))
	c.put(key(1), prog(4))
	if c.get(key(0)) == nil {
		t.Fatal("program 0 not cached")
	}
	c.put(key(2), prog(4)) // 12 ops: program 1, used least recently, goes
	has(c, true, false, true)
	if c.size != 8 {
		t.Errorf("size %d ops, want 8", c.size)
	}
	c.put(key(2), prog(6)) // replacing a key counts it once
	has(c, true, false, true)
	if c.size != 10 {
		t.Errorf("size %d ops after replacing program 2, want 10", c.size)
	}
	c.put(key(3), prog(20)) // larger than the limit: it alone stays
	has(c, false, false, false, true)
	if c.size != 20 {
		t.Errorf("size %d ops, want 20", c.size)
	}
	if h, m := c.Stats(); h != 1 || m != 0 {
		t.Errorf("stats %d hits, %d misses; want 1, 0", h, m)
	}
}

// TestCacheCountsSharedProgramsOnce: a lowered program without
// checkpointing is also its scheduled one (two keys, one program); counted
// twice, deepseek-v2's steady and first-step programs (299,427 ops each)
// overflowed the default limit and the lever and compare built and lowered
// the model again. The default limit keeps four of the largest program.
func TestCacheCountsSharedProgramsOnce(t *testing.T) {
	prog := func(ops int) *ir.Program { return &ir.Program{Ops: make([]ir.Op, ops)} }
	key := func(i int) cacheKey { return cacheKey{stage: i} }
	c := &Cache{Limit: 10}
	p := prog(6)
	c.put(key(0), &cacheEntry{prog: p})
	c.put(key(1), &cacheEntry{prog: p}) // shared: still 6 ops, nothing evicted
	if c.size != 6 || c.m[key(0)] == nil {
		t.Fatalf("size %d ops, program 0 cached %v; want 6, true", c.size, c.m[key(0)] != nil)
	}
	c.put(key(0), &cacheEntry{prog: prog(2)}) // key 1 still holds p
	if c.size != 8 {
		t.Errorf("size %d ops after key 0 moved to another program, want 8", c.size)
	}
	c.put(key(2), &cacheEntry{prog: prog(4)}) // 12 ops: the LRU, key 1 (p), goes
	if c.m[key(1)] != nil || c.size != 6 {
		t.Errorf("key 1 cached %v, size %d; want false, 6", c.m[key(1)] != nil, c.size)
	}

	// Four programs of 200Ki ops: past the fixed 512Ki (which kept two),
	// within four times the largest. Distinct programs over one op list.
	ops := make([]ir.Op, 200<<10)
	d := &Cache{}
	for i := range 4 {
		d.put(key(i), &cacheEntry{prog: &ir.Program{Ops: ops}})
	}
	if len(d.m) != 4 {
		t.Errorf("default limit kept %d of four %d-op programs, want 4", len(d.m), len(ops))
	}
	d.put(key(4), &cacheEntry{prog: &ir.Program{Ops: ops}})
	if len(d.m) != 4 || d.m[key(0)] != nil {
		t.Errorf("a fifth program: %d kept, the oldest cached %v; want 4, false", len(d.m), d.m[key(0)] != nil)
	}
}

// A plan through a cache lowers the cache's last graph when it was built
// from the same model and build options (the fused step after the foreach
// one), with the peaks of a plan built from scratch, and builds a new one
// when an option of the build differs (the micro-batch).
func TestCacheReusesGraph(t *testing.T) {
	a := lookup(t, "llama-3.2-1b").Clone()
	a.Layers = 2
	s := Spec{Job: Job{Model: a, MicroBatch: 1, Seq: 256, Precision: ops.AMPBF16, Optimizer: lower.AdamW, Impl: lower.Foreach}}
	c := &Cache{}
	if _, err := PlanWith(s, Options{Cache: c}); err != nil {
		t.Fatal(err)
	}
	g := c.graph.g
	fused := s
	fused.Impl = lower.Fused
	r, err := PlanWith(fused, Options{Cache: c})
	if err != nil {
		t.Fatal(err)
	}
	if c.graph.g != g {
		t.Fatal("the fused step built the model again")
	}
	if want := mustPlan(t, fused); r.PeakBytes() != want.PeakBytes() || r.Sim.PhasePeak != want.Sim.PhasePeak {
		t.Fatalf("through the cache's graph: peak %d, from scratch %d", r.PeakBytes(), want.PeakBytes())
	}
	wider := s
	wider.MicroBatch = 2
	if _, err := PlanWith(wider, Options{Cache: c}); err != nil {
		t.Fatal(err)
	}
	if c.graph.g == g {
		t.Fatal("a plan of another micro-batch lowered the old graph")
	}
}

// Plans through one cache, one after another, each planned from what the
// ones before cached, equal the same plans made alone: a program the cache
// holds is never written, and one it refuses (its filter, putOnlyFor),
// which the next transform rewrites in place (Cache.transform), is nobody
// else's. The plans differ in checkpointing, sharding and offload, so each
// finds the lowered, checkpointed or sharded programs of the ones before.
func TestPropertyCachedPlansEqualPlansAlone(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		s := leverSpec(t, rt)
		if pp := rapid.IntRange(1, 2).Draw(rt, "pp"); pp > 1 {
			s.PP, s.Model.Layers = pp, 2*pp
		}
		s.Accum = rapid.IntRange(1, 5).Draw(rt, "accum")
		// Validated, as compare's and the lever's specs are: the filter
		// keys on the spec as planned (recipe defaults filled).
		if err := s.Validate(); err != nil {
			rt.Skip(err)
		}
		specs := make([]Spec, 4)
		for i := range specs {
			v := s
			v.Checkpoint = rapid.SampledFrom([]CheckpointPolicy{{}, {Kind: CheckpointFull}}).Draw(rt, "checkpoint")
			if v.DP > 1 {
				v.ZeRO = rapid.IntRange(0, 3).Draw(rt, "zero")
			}
			v.Offload.Activations = rapid.Bool().Draw(rt, "offload activations")
			v.Offload.Optimizer = rapid.Bool().Draw(rt, "offload optimizer")
			specs[i] = v
		}
		c := &Cache{}
		if rapid.Bool().Draw(rt, "filter") {
			// Only what the last two plan from is kept: the first two's
			// other programs are refused, and rewritten in place (their
			// lowered one held for a checkpointed plan after them).
			c.putOnlyFor(specs[2:], Options{}, true)
		}
		held := 0
		for i, v := range specs {
			alone, err := PlanWith(v, Options{})
			if err != nil {
				rt.Skip(err)
			}
			cached, err := PlanWith(v, Options{Cache: c})
			if err != nil {
				t.Fatalf("plan %d alone planned, through the cache: %v", i, err)
			}
			if !reflect.DeepEqual(alone.Program.Ops, cached.Program.Ops) || !reflect.DeepEqual(alone.Program.Tensors, cached.Program.Tensors) ||
				!slices.Equal(alone.StagePeaks, cached.StagePeaks) || alone.PeakBytes() != cached.PeakBytes() {
				t.Fatalf("plan %d through the cache (peaks %v) differs from the plan alone (%v)", i, cached.StagePeaks, alone.StagePeaks)
			}
			held += len(c.m)
		}
		if held == 0 {
			t.Fatal("the cache held no program for any plan")
		}
	})
}
