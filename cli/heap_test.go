package cli

import (
	"io"
	"runtime/debug"
	"testing"
)

// limit reads the soft memory limit without changing it.
func limit() int64 { return debug.SetMemoryLimit(-1) }

// Unless its variable is set, a command runs under heapLimit and heapGC's
// growth, and what was set before it is restored when it returns;
// GOMEMLIMIT's and GOGC's are left alone.
func TestLimitHeap(t *testing.T) {
	gc := func() int64 { g := debug.SetGCPercent(100); debug.SetGCPercent(g); return int64(g) }
	for _, c := range []struct {
		env, set string
		read     func() int64
		under    int64
	}{
		{"GOMEMLIMIT", "4GiB", limit, heapLimit},
		{"GOGC", "50", gc, heapGC},
	} {
		before := c.read()
		t.Setenv("GOMEMLIMIT", "")
		t.Setenv("GOGC", "")
		undo := limitHeap(heapGC)
		if got := c.read(); got != c.under {
			t.Fatalf("%s: %d under a command, want %d", c.env, got, c.under)
		}
		undo()
		if got := c.read(); got != before {
			t.Fatalf("%s: %d after the command, want %d as before it", c.env, got, before)
		}
		t.Setenv(c.env, c.set)
		undo = limitHeap(heapGC)
		if got := c.read(); got != before {
			t.Fatalf("%s set: %d, want %d (the runtime's)", c.env, got, before)
		}
		undo()
	}
}

// The limit is heapLimit up to a live heap of heapLimit/heapGrowth, and
// follows the live heap at heapGrowth past it.
func TestLimitFor(t *testing.T) {
	for _, tc := range []struct {
		live uint64
		want int64
	}{
		{0, heapLimit},
		{512 << 20, heapLimit},
		{uint64(heapLimit) * 4 / 5, heapLimit},
		{2 << 30, 5 << 29},
		{8 << 30, 10 << 30},
	} {
		if got := limitFor(tc.live); got != tc.want {
			t.Errorf("live %d: limit %d, want %d", tc.live, got, tc.want)
		}
	}
}

// Every command but fit (searchGC's) is limited, serve too; Main restores
// the limit it found.
func TestLimitsHeapButFit(t *testing.T) {
	root := NewRoot(io.Discard, io.Discard)
	for _, tc := range []struct {
		args []string
		want bool
	}{
		{[]string{"plan", "--model", "gpt2"}, true},
		{[]string{"compare"}, true},
		{[]string{"fit"}, false},
		{[]string{"max"}, true},
		{[]string{"serve", "--addr", ":0"}, true},
	} {
		c, _, err := root.Find(tc.args)
		if err != nil {
			t.Fatalf("%v: %v", tc.args, err)
		}
		if got := limitsHeap(c); got != tc.want {
			t.Errorf("%v: limited %v, want %v", tc.args, got, tc.want)
		}
	}
	t.Setenv("GOMEMLIMIT", "")
	before := limit()
	if code := Main([]string{"gpus"}, io.Discard, io.Discard); code != 0 {
		t.Fatalf("gpus: exit %d", code)
	}
	if got := limit(); got != before {
		t.Fatalf("limit %d after Main, want %d as before it", got, before)
	}
}

// serve runs at Go's default growth under the limit; the one-job commands
// at heapGC.
func TestServeKeepsDefaultGrowth(t *testing.T) {
	root := NewRoot(io.Discard, io.Discard)
	for args, want := range map[string]int{"serve": 100, "plan": heapGC, "compare": heapGC} {
		c, _, err := root.Find([]string{args})
		if err != nil {
			t.Fatal(err)
		}
		if got := gcFor(c); got != want {
			t.Errorf("%s: GOGC %d under the limit, want %d", args, got, want)
		}
	}
}
