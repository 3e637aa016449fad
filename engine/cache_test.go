package engine

import (
	"testing"

	"github.com/memplan/memplan/ir"
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
