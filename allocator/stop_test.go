package allocator

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/memplan/memplan/internal/ctxtest"
	"github.com/memplan/memplan/snapshot"
)

// A snapshot's replay looks at its context every stopEvery events (from
// the first): stopped at each look it returns the context's cause, and the
// capped replay behind diagnose does the same over its own pass.
func TestSnapshotReplayStops(t *testing.T) {
	f := filepath.Join("..", "testdata", "snapshots", "MAGMA27__assignment2-systems__15883f2b__memory_snapshot.pickle")
	s, err := snapshot.ReadFile(f)
	if err != nil {
		t.Fatal(err)
	}
	dev := s.Devices()[0]
	if int(dev) >= len(s.Traces) || len(s.Traces[dev]) == 0 {
		t.Fatalf("%s: no trace on device %d", f, dev)
	}
	events := int64(len(s.Traces[dev]))
	passes := (events + stopEvery - 1) / stopEvery
	if n := ctxtest.EveryLook(t, func(ctx context.Context) error { _, err := ReplayDeviceContext(ctx, s, dev); return err }); n != passes {
		t.Errorf("replay: %d looks over %d events, want %d", n, events, passes)
	}
	// the replay it starts from, then its own pass
	if n := ctxtest.EveryLook(t, func(ctx context.Context) error { _, err := ReplayCappedContext(ctx, s, dev, 1<<40); return err }); n != 2*passes {
		t.Errorf("capped: %d looks over %d events, want %d", n, events, 2*passes)
	}
}
