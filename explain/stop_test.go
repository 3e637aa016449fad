package explain

import (
	"context"
	"errors"
	"math"
	"path/filepath"
	"testing"

	"github.com/memplan/memplan/internal/ctxtest"
	"github.com/memplan/memplan/snapshot"
)

// explain and diagnose's snapshot replays look at their context every
// 65,536 events of each device's trace (the server's time limit, a client
// gone): stopped at each of their looks in turn, they return the
// context's cause and no report, and run in full they look at least once
// per replay.
func TestExplainStopsAtEveryLook(t *testing.T) {
	f := filepath.Join("..", "testdata", "snapshots", "MAGMA27__assignment2-systems__15883f2b__memory_snapshot.pickle")
	s, err := snapshot.ReadFile(f)
	if err != nil {
		t.Fatal(err)
	}
	full := ctxtest.StopAt(math.MaxInt64)
	rep, err := ExplainContext(full, s, f, -1)
	if err != nil {
		t.Fatal(err)
	}
	n := full.Looks()
	if n < int64(len(s.Devices())) {
		t.Fatalf("%d looks over %d devices' replays", n, len(s.Devices()))
	}
	for at := int64(1); at <= n; at++ {
		if r, err := ExplainContext(ctxtest.StopAt(at), s, f, -1); !errors.Is(err, context.Canceled) || r != nil {
			t.Errorf("explain stopped at look %d of %d: %v, %v", at, n, r, err)
		}
	}
	// diagnose replays the device again on a capacity it overflows.
	capacity := rep.PeakReserved.Bytes / 2
	full = ctxtest.StopAt(math.MaxInt64)
	if _, err := DiagnoseOOMContext(full, s, rep, capacity); err != nil {
		t.Fatal(err)
	}
	n = full.Looks()
	if n < 2 {
		t.Fatalf("diagnose looked %d times over its two replays", n)
	}
	for at := int64(1); at <= n; at++ {
		if o, err := DiagnoseOOMContext(ctxtest.StopAt(at), s, rep, capacity); !errors.Is(err, context.Canceled) || o != nil {
			t.Errorf("diagnose stopped at look %d of %d: %v, %v", at, n, o, err)
		}
	}
}
