package allocator

import (
	"context"
	"errors"
	"math"
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
	events := len(s.Traces[dev])
	for name, run := range map[string]func(context.Context) error{
		"replay": func(ctx context.Context) error { _, err := ReplayDeviceContext(ctx, s, dev); return err },
		"capped": func(ctx context.Context) error { _, err := ReplayCappedContext(ctx, s, dev, 1<<40); return err },
	} {
		full := ctxtest.StopAt(math.MaxInt64)
		if err := run(full); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		n := full.Looks()
		want := int64((events + stopEvery - 1) / stopEvery)
		if name == "capped" {
			want *= 2 // the replay it starts from, then its own pass
		}
		if n != want {
			t.Errorf("%s: %d looks over %d events, want %d", name, n, events, want)
		}
		for at := int64(1); at <= n; at++ {
			if err := run(ctxtest.StopAt(at)); !errors.Is(err, context.Canceled) {
				t.Errorf("%s stopped at look %d of %d: %v", name, at, n, err)
			}
		}
	}
}
