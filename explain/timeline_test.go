package explain

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/memplan/memplan/ir"
	"github.com/memplan/memplan/snapshot"
)

// explain on torch.profiler's memory timelines (testdata/profiler, from
// python/profiler_timeline.py): the peak is the file's own maximum, read
// here with encoding/json apart from the reader, and every category of the
// profiler lands on its ledger line.
func TestExplainTimeline(t *testing.T) {
	dir := filepath.Join("..", "testdata", "profiler")
	data, err := os.ReadFile(filepath.Join(dir, "cpu_mlp_step.json"))
	if err != nil {
		t.Fatal(err)
	}
	var file [2][]any
	if err := json.Unmarshal(data, &file); err != nil {
		t.Fatal(err)
	}
	var own float64
	ownAt := -1
	var ownRow []any
	for i, r := range file[1] {
		var sum float64
		for _, v := range r.([]any) {
			sum += v.(float64)
		}
		if sum > own {
			own, ownAt, ownRow = sum, i, r.([]any)
		}
	}
	for _, name := range []string{"cpu_mlp_step.json", "cpu_mlp_step.json.gz", "cpu_mlp_step.raw.json.gz"} {
		tl, err := snapshot.ReadTimelineFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		rep := ExplainTimeline(tl, name)
		p := rep.PeakAllocated
		if p.Bytes != int64(own) || p.Event != ownAt {
			t.Errorf("%s: peak %d at point %d, the file's own maximum %.0f at %d", name, p.Bytes, p.Event, own, ownAt)
		}
		// The ledger at the peak is the file's row, mapped line by line
		// (the row: a leading 0, then the categories in
		// _CATEGORY_TO_INDEX's order).
		want := map[string]int64{}
		for c, v := range ownRow[1:] {
			want[CategoryName(ProfilerLedger[c])] += int64(v.(float64))
		}
		for _, s := range p.ByCategory {
			if s.Bytes != want[s.Name] {
				t.Errorf("%s: %s %d at the peak, the file's row gives %d", name, s.Name, s.Bytes, want[s.Name])
			}
			delete(want, s.Name)
		}
		for c, b := range want {
			if b != 0 {
				t.Errorf("%s: %s missing (%d bytes in the file)", name, c, b)
			}
		}
		if p.Classified < 0.95 {
			t.Errorf("%s: %.1f%% classified", name, 100*p.Classified)
		}
		if len(rep.Timeline) != len(file[0]) || rep.Source != SourceProfiler || !strings.Contains(rep.Paragraph, "peak 13.79 MiB") {
			t.Errorf("%s: %d points, source %q, %s", name, len(rep.Timeline), rep.Source, rep.Paragraph)
		}
		t.Log(rep.Paragraph)
	}
}

// Every profiler category has a ledger line; only None is unknown.
func TestProfilerLedgerCoversEveryCategory(t *testing.T) {
	for c := snapshot.ProfilerCategory(0); c < snapshot.NumProfilerCategories; c++ {
		l := ProfilerLedger[c]
		if (l == Unknown) != (c == snapshot.ProfUnknown) || l > Unknown {
			t.Errorf("%s → %s", c, CategoryName(l))
		}
	}
	if ProfilerLedger[snapshot.ProfAutogradDetail] != ir.Temporary || ProfilerLedger[snapshot.ProfInput] != ir.Other {
		t.Errorf("AUTOGRAD_DETAIL → %s, INPUT → %s", CategoryName(ProfilerLedger[snapshot.ProfAutogradDetail]), CategoryName(ProfilerLedger[snapshot.ProfInput]))
	}
}
