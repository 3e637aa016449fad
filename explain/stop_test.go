package explain

import (
	"context"
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
	var rep *Report
	explainRun := func(ctx context.Context) error {
		r, err := ExplainContext(ctx, s, f, -1)
		if err != nil && r != nil {
			t.Errorf("a report with the error %v", err)
		}
		if err == nil {
			rep = r
		}
		return err
	}
	if n := ctxtest.EveryLook(t, explainRun); n < int64(len(s.Devices())) {
		t.Fatalf("%d looks over %d devices' replays", n, len(s.Devices()))
	}
	// diagnose replays the device again on a capacity it overflows.
	capacity := rep.PeakReserved.Bytes / 2
	diagnoseRun := func(ctx context.Context) error {
		o, err := DiagnoseOOMContext(ctx, s, rep, capacity)
		if err != nil && o != nil {
			t.Errorf("a diagnosis with the error %v", err)
		}
		return err
	}
	if n := ctxtest.EveryLook(t, diagnoseRun); n < 2 {
		t.Fatalf("diagnose looked %d times over its two replays", n)
	}
}
