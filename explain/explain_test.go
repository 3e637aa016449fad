package explain

import (
	"path/filepath"
	"testing"

	"github.com/memplan/memplan/allocator"
	"github.com/memplan/memplan/snapshot"
)

// Issue 11's bar on every snapshot of ../shared/snapshots (CI has the
// shared directory next to the clone): explain's allocated peak is the
// allocator replay's, and at least 95% of its bytes are in a ledger
// category other than unknown.
func TestEverySnapshot(t *testing.T) {
	files, _ := filepath.Glob(filepath.Join("..", "..", "shared", "snapshots", "raw", "*"))
	if len(files) < 8 {
		t.Fatalf("found %d snapshots in ../shared/snapshots/raw", len(files))
	}
	for _, f := range files {
		s, err := snapshot.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, dev := range s.Devices() {
			rep, err := Explain(s, f, dev)
			if err != nil {
				t.Fatal(err)
			}
			r, err := allocator.ReplayDevice(s, dev)
			if err != nil {
				t.Fatal(err)
			}
			name := filepath.Base(f)[:24]
			if !rep.Replay.Exact {
				t.Errorf("%s/%d: replay not exact: %s%s", name, dev, rep.Replay.Diverged, rep.Replay.FinalMismatch)
			}
			if rep.PeakAllocated.Bytes != r.PeakRequested.Requested || rep.PeakAllocated.Event != r.PeakRequested.Event {
				t.Errorf("%s/%d: explain's peak %d at %d, the replay's %d at %d", name, dev, rep.PeakAllocated.Bytes, rep.PeakAllocated.Event, r.PeakRequested.Requested, r.PeakRequested.Event)
			}
			if rep.PeakAllocated.Classified < 0.95 {
				t.Errorf("%s/%d: %.1f%% of the peak classified", name, dev, 100*rep.PeakAllocated.Classified)
			}
			t.Logf("%s/%d: %s", name, dev, rep.Paragraph)
		}
	}
}

// What the classification says on snapshots whose programs are known
// (../shared/snapshots/summaries' config and window_artifacts).
func TestKnownPrograms(t *testing.T) {
	raw := filepath.Join("..", "..", "shared", "snapshots", "raw")
	cases := []struct {
		file  string
		phase string
		want  map[string]int64 // category → bytes at the allocated peak, at least
	}{
		// Wedsonlin 128 training: peak in the non-in-place AdamW step; the
		// previous m, v (2 × 1.69 GB, freed by the step) are optimizer
		// state, the 423,183,360 fp32 parameters (1.69 GB) parameters,
		// their gradients gradients.
		{"Wedsonlin__assignment2-systems__8630bcfe__results_medium_128_training_memory_snapshot.pickle", "optimizer",
			map[string]int64{"optimizer_state": 2 * 1692733440, "parameters": 1692733440, "gradients": 1692733440}},
		// notHanmin: zero_grad after the forward, so the previous step's
		// gradients (3,877,647,360 bytes) are alive at the forward peak.
		{"notHanmin__assignment2-systems__33be88e6__memory_snapshot.pickle", "forward",
			map[string]int64{"gradients": 3877647360, "optimizer_state": 2 * 3877647360}},
	}
	for _, c := range cases {
		s, err := snapshot.ReadFile(filepath.Join(raw, c.file))
		if err != nil {
			t.Fatal(err)
		}
		rep, err := Explain(s, c.file, -1)
		if err != nil {
			t.Fatal(err)
		}
		if rep.PeakAllocated.Phase != c.phase {
			t.Errorf("%s: peak in %s, want %s", c.file, rep.PeakAllocated.Phase, c.phase)
		}
		got := map[string]int64{}
		for _, sh := range rep.PeakAllocated.ByCategory {
			got[sh.Name] = sh.Bytes
		}
		for cat, b := range c.want {
			if got[cat] < b {
				t.Errorf("%s: %s %d at the peak, want at least %d", c.file, cat, got[cat], b)
			}
		}
	}
}
