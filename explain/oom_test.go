package explain

import (
	"errors"
	"strings"
	"testing"

	"github.com/memplan/memplan/snapshot"
)

// None of the shared snapshots recorded an OOM, so one is produced: the
// MAGMA27 run (../shared/snapshots: 12.97 GiB allocated peak in the loss,
// 13.21 GiB reserved) replayed through the allocator model on smaller
// devices. It stops in the phase where the capacity is crossed, with the
// live set below the capacity, and fits again above its reserved peak.
func TestDiagnoseOOMOnSmallerDevice(t *testing.T) {
	path := "../testdata/snapshots/MAGMA27__assignment2-systems__15883f2b__memory_snapshot.pickle"
	s, err := snapshot.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := Explain(s, path, -1)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		capacity int64
		phase    string
		pressure string // the largest category alive
	}{
		{6 << 30, "forward", "activations"},
		{12<<30 + 900<<20, "loss", "activations"},
		{1 << 30, "before recording", "parameters"},
	} {
		o, err := DiagnoseOOM(s, rep, c.capacity)
		if err != nil {
			t.Fatalf("%d: %v", c.capacity, err)
		}
		if o.Recorded || o.Phase != c.phase || o.Live.ByCategory[0].Name != c.pressure || o.Event >= 0 && o.Live.Bytes > c.capacity || o.Event > rep.PeakAllocated.Event {
			t.Errorf("capacity %d: %+v", c.capacity, o)
		}
		if o.Event >= 0 && o.Live.Bytes+o.Request <= rep.Timeline[0].Reserved && o.Allocated+o.Request <= c.capacity && o.Reserved < c.capacity-(20<<20) {
			t.Errorf("capacity %d: failed with room left: %+v", c.capacity, o)
		}
		if !strings.Contains(o.Paragraph, strings.TrimSuffix(c.phase, " recording")) || len(o.Lifetimes) == 0 {
			t.Errorf("capacity %d: %s", c.capacity, o.Paragraph)
		}
		t.Log(o.Paragraph)
	}
	var ce *CapacityError
	if _, err := DiagnoseOOM(s, rep, rep.PeakReserved.Reserved*11/10); !errors.As(err, &ce) || ce.Capacity == 0 || ce.Reserved <= 0 || ce.Reserved > ce.Capacity || !strings.Contains(err.Error(), "fits in a capacity of") {
		t.Errorf("above the reserved peak: %v", err)
	}
	if _, err := DiagnoseOOM(s, rep, 0); !errors.As(err, &ce) || ce.Capacity != 0 || strings.Contains(err.Error(), "--") {
		t.Errorf("no capacity: %v", err)
	}
}
