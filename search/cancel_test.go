package search

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/memplan/memplan/internal/ctxtest"
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

// Max and Fit hand their context to every plan they make: stopped at any
// of the checks a search makes (between probes and states, and the
// engine's between a plan's phases), they return its cause, not an answer.
func TestSearchStopsInsidePlans(t *testing.T) {
	base := baseSpec(t, "gpt2", "rtx-4090", 4)
	full := ctxtest.StopAt(math.MaxInt64)
	mr, err := MaxContext(full, base, DimMicroBatch)
	if err != nil {
		t.Fatal(err)
	}
	n := full.Looks()
	if n < 3*int64(mr.Plans) {
		t.Errorf("%d checks in %d plans: the plans do not look at the context", n, mr.Plans)
	}
	for at := int64(1); at <= n; at++ {
		if r, err := MaxContext(ctxtest.StopAt(at), base, DimMicroBatch); !errors.Is(err, context.Canceled) || r != nil {
			t.Fatalf("max stopped at check %d of %d: %v, %v", at, n, r, err)
		}
	}
	t.Logf("max: %d checks in %d plans", n, mr.Plans)
	// One worker: with more, the checks a search makes depend on how its
	// workers interleave, and a run may make fewer than the count below.
	full = ctxtest.StopAt(math.MaxInt64)
	if _, err := Fit(base, Options{GlobalBatch: 8, Workers: 1, Context: full}); err != nil {
		t.Fatal(err)
	}
	n = full.Looks()
	for _, at := range []int64{1, n / 3, n / 2, n - 1} {
		if r, err := Fit(base, Options{GlobalBatch: 8, Workers: 1, Context: ctxtest.StopAt(at)}); !errors.Is(err, context.Canceled) || r != nil {
			t.Fatalf("fit stopped at check %d of %d: %v, %v", at, n, r, err)
		}
	}
	t.Logf("fit: %d checks", n)
}
