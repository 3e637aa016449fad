// Package heapwatch hands a function the Go heap's live bytes (as of the
// last collection, runtime/metrics' /gc/heap/live:bytes) at an interval:
// the CLI's heap limit follows it, and benchmarks record its largest value.
package heapwatch

import (
	"runtime/metrics"
	"sync"
	"time"
)

// Every calls f with the live heap every d until the returned function is
// called; that function returns once f has run for the last time.
func Every(d time.Duration, f func(live uint64)) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		sample := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
		t := time.NewTicker(d)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				metrics.Read(sample)
				if sample[0].Value.Kind() == metrics.KindUint64 {
					f(sample[0].Value.Uint64())
				}
			}
		}
	}()
	return func() {
		close(done)
		wg.Wait()
	}
}
