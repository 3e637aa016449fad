package search

import (
	"context"
	"errors"
	"testing"
	"time"
)

// A search whose context is done stops and returns the context's error:
// the service's request deadline and a client that went away reach Fit and
// Max through it.
func TestFitAndMaxCancelled(t *testing.T) {
	base := baseSpec(t, "llama-3.2-1b", "rtx-4090", 0)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Fit(base, Options{GlobalBatch: 16, Context: ctx}); !errors.Is(err, context.Canceled) {
		t.Errorf("Fit with a cancelled context: %v, want context.Canceled", err)
	}
	if _, err := MaxContext(ctx, base, DimMicroBatch); !errors.Is(err, context.Canceled) {
		t.Errorf("Max with a cancelled context: %v, want context.Canceled", err)
	}
	// A deadline that passes mid-search stops it well before the search's
	// own time (a full fit of this job takes seconds; the check is between
	// states and verification batches).
	ctx, cancel2 := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel2()
	start := time.Now()
	_, err := Fit(baseSpec(t, "llama-3-8b", "h100", 0), Options{GlobalBatch: 64, GPUs: 8, Context: ctx})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Fit past its deadline: %v, want context.DeadlineExceeded", err)
	}
	t.Logf("fit stopped %s after a 20ms deadline", time.Since(start))
}
