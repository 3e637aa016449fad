package heapwatch

import (
	"sync/atomic"
	"testing"
	"time"
)

// f sees a live heap while it runs, and never after stop returns.
func TestEvery(t *testing.T) {
	var calls atomic.Int64
	var seen atomic.Uint64
	stop := Every(time.Millisecond, func(live uint64) {
		calls.Add(1)
		seen.Store(live)
	})
	keep := make([]byte, 8<<20)
	deadline := time.Now().Add(5 * time.Second)
	for calls.Load() < 3 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	stop()
	n := calls.Load()
	if n < 3 {
		t.Fatalf("%d calls in 5 s at 1 ms", n)
	}
	time.Sleep(10 * time.Millisecond)
	if calls.Load() != n {
		t.Fatal("called after stop returned")
	}
	_ = keep[len(keep)-1]
}
