package snapshot

import (
	"bytes"
	"compress/gzip"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// The three data forms of one torch.profiler profile (python/profiler_timeline.py,
// torch 2.14.1 on CPU: two AdamW steps of a small two-block model).
var timelineFiles = []string{"cpu_mlp_step.json", "cpu_mlp_step.json.gz", "cpu_mlp_step.raw.json.gz"}

func readTimeline(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "testdata", "profiler", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// A raw file coalesces to the same timeline export_memory_timeline writes as
// [times, sizes] for the same profile, point for point.
func TestTimelineFormsAgree(t *testing.T) {
	var want *Timeline
	for _, name := range timelineFiles {
		tl, err := ParseTimeline(readTimeline(t, name))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if tl.Gzipped != strings.HasSuffix(name, ".gz") || (tl.Form == "raw") != strings.Contains(name, ".raw.") {
			t.Errorf("%s: form %s, gzipped %v", name, tl.Form, tl.Gzipped)
		}
		if want == nil {
			want = tl
			continue
		}
		if len(tl.Times) != len(want.Times) {
			t.Fatalf("%s: %d points, the .json has %d", name, len(tl.Times), len(want.Times))
		}
		for i := range tl.Times {
			if tl.Times[i] != want.Times[i] || tl.Sizes[i] != want.Sizes[i] {
				t.Fatalf("%s: point %d is %d %v, the .json's %d %v", name, i, tl.Times[i], tl.Sizes[i], want.Times[i], want.Sizes[i])
			}
		}
	}
	// Python's own reading of cpu_mlp_step.json: 714 points, the largest
	// sum 14,462,020 bytes at point 25 (json.load, max(map(sum, sizes))).
	best := 0
	for i := range want.Times {
		if want.Total(i) > want.Total(best) {
			best = i
		}
	}
	if len(want.Times) != 714 || best != 25 || want.Total(best) != 14462020 {
		t.Errorf("%d points, peak %d bytes at %d; want 714, 14462020 at 25", len(want.Times), want.Total(best), best)
	}
}

func gz(b []byte) []byte {
	var buf bytes.Buffer
	w := gzip.NewWriter(&buf)
	w.Write(b)
	w.Close()
	return buf.Bytes()
}

// Bad input: one line naming the problem, never a panic.
func TestTimelineBadInput(t *testing.T) {
	real := readTimeline(t, "cpu_mlp_step.json")
	cases := []struct {
		name string
		data []byte
		want string
	}{
		{"empty", nil, "empty memory timeline"},
		{"truncated JSON", real[:len(real)/2], "not a torch.profiler memory timeline"},
		{"truncated gzip", readTimeline(t, "cpu_mlp_step.raw.json.gz")[:100], "gzipped memory timeline"},
		{"HTML export", []byte("<html><body><img src='data:image/png;base64,AAAA'></body></html>"), "HTML memory timeline holds only a picture"},
		{"a JSON object", []byte(`{"times": []}`), "want a JSON array"},
		{"no points", []byte(`[[], []]`), "no time points"},
		{"no events", []byte(`[]`), "no events"},
		{"lengths differ", []byte(`[[1, 2], [[0,0,0,0,0,0,0,0,0]]]`), "2 times but 1 rows of sizes"},
		{"eight numbers", []byte(`[[1], [[0,0,0,0,0,0,0,0]]]`), "8 numbers, want 9"},
		{"leading number", []byte(`[[1], [[5,0,0,0,0,0,0,0,0]]]`), "the leading number is 5"},
		{"fractional size", []byte(`[[1], [[0,1.5,0,0,0,0,0,0,0]]]`), "item 1: 1.5 is not an integer"},
		{"string time", []byte(`[["1"], [[0,0,0,0,0,0,0,0,0]]]`), "\"1\" is not an integer"},
		{"negative size", []byte(`[[1, 2], [[0,0,0,0,0,0,0,0,0], [0,0,0,0,-4,0,0,0,0]]]`), "TEMPORARY is -4 bytes at time point 1"},
		{"time goes back", []byte(`[[5, 2], [[0,0,0,0,0,0,0,0,0], [0,0,0,0,0,0,0,0,0]]]`), "time point 1 (2 µs) is before"},
		// Times far apart wrapped explain's span and peak time negative.
		{"time before -1", []byte(`[[-9000000000000000000, 9000000000000000000], [[0,1,0,0,0,0,0,0,0], [0,2,0,0,0,0,0,0,0]]]`),
			"time point 0: -9000000000000000000 µs (want -1, or a time from 0 to 2^62 µs)"},
		{"time past ns/1000", []byte(`[[-1, 9223372036854775807], [[0,1,0,0,0,0,0,0,0], [0,2,0,0,0,0,0,0,0]]]`),
			"time point 1: 9223372036854775807 µs (want -1"},
		{"raw: three numbers", []byte(`[[-1, 1, 4]]`), "raw event 0: 3 numbers, want 4"},
		{"raw: unknown action", []byte(`[[-1, 1, 4, 0], [10, 7, 4, 0]]`), "raw event 1: action 7"},
		{"raw: unknown category", []byte(`[[-1, 1, 4, 8]]`), "category 8"},
		{"raw: time goes back", []byte(`[[2000, 2, 4, 0], [1000, 2, 4, 0]]`), "before the preceding event"},
		{"raw: positive destroy", []byte(`[[-1, 1, 4, 0], [1000, 4, 4, 0]]`), "a DESTROY of +4 bytes"},
		{"raw: negative create", []byte(`[[1000, 2, -4, 0]]`), "a CREATE of -4 bytes"},
		{"raw: timed preexisting", []byte(`[[1000, 1, 4, 0]]`), "a PREEXISTING tensor at time 1000 ns"},
		{"raw: half an increment", []byte(`[[-1, 1, 4, 0], [1000, 3, -4, 0]]`), "without its second half"},
		{"raw: increment halves differ", []byte(`[[-1, 1, 4, 0], [1000, 3, -4, 0], [1000, 3, 8, 4]]`), "second half of an INCREMENT_VERSION"},
		{"raw: destroyed twice", []byte(`[[-1, 1, 4, 0], [1000, 4, -4, 0], [2000, 4, -4, 0]]`), "PARAMETER is -4 bytes"},
		{"gzipped garbage", gz([]byte("hello")), "want a JSON array"},
		// Sums past int64 wrapped: the first reported a peak of 1 B at
		// point 1, the second a negative PARAMETER at point 0.
		{"sizes sum past int64", []byte(`[[0, 1], [[0,9000000000000000000,9000000000000000000,0,0,0,0,0,0], [0,1,0,0,0,0,0,0,0]]]`),
			"time point 0 (0 µs): the live bytes sum past 4 EiB (2^62 bytes)"},
		{"sizes sum past 4 EiB", []byte(`[[7], [[0,4611686018427387904,0,0,0,0,0,0,1]]]`), "time point 0 (7 µs): the live bytes sum past 4 EiB"},
		{"a size past 4 EiB", []byte(`[[7], [[0,0,0,0,0,4611686018427387905,0,0,0]]]`), "time point 0 (7 µs): the live bytes sum past 4 EiB"},
		{"raw: bytes past 4 EiB", []byte(`[[-1, 1, 9223372036854775807, 0]]`), "raw event 0: 9223372036854775807 bytes, past 4 EiB (2^62 bytes)"},
		{"raw: destroy of int64's least", []byte(`[[-1, 1, 4, 0], [1000, 4, -9223372036854775808, 0]]`), "raw event 1: -9223372036854775808 bytes, past 4 EiB"},
		{"raw: increment of int64's least", []byte(`[[-1, 1, 4, 0], [1000, 3, -9223372036854775808, 0], [1000, 3, 0, 4]]`), "raw event 1: -9223372036854775808 bytes"},
		{"raw: accumulated past int64", []byte(`[[-1,1,4611686018427387904,0],[-1,1,4611686018427387904,0],[-1,1,4,0]]`),
			"raw event 1 (time point 0): the live bytes of PARAMETER pass 4 EiB (2^62 bytes)"},
		{"raw: destroyed past -4 EiB", []byte(`[[-1,4,-4611686018427387904,2],[-1,4,-4611686018427387904,2],[-1,4,-4611686018427387904,2]]`),
			"raw event 1 (time point 0): the live bytes of INPUT fall below -4 EiB"},
		{"raw: categories sum past 4 EiB", []byte(`[[1000,2,4611686018427387904,0],[1000,2,4,1],[2000,4,-4,1]]`),
			"time point 0 (1 µs): the live bytes sum past 4 EiB"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := ParseTimeline(c.data)
			if err == nil {
				t.Fatalf("accepted")
			}
			if !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") {
				t.Errorf("error %q, want one line containing %q", err, c.want)
			}
		})
	}
	if _, err := ReadTimelineFile("no/such/file.json"); err == nil || !strings.Contains(err.Error(), "reading memory timeline") {
		t.Errorf("missing file: %v", err)
	}
}

func FuzzParseTimeline(f *testing.F) {
	for _, name := range timelineFiles {
		data := readTimeline(f, name)
		if len(data) <= 8<<10 {
			f.Add(data) // the gzipped forms, whole
		}
		f.Add(data[:min(len(data), 2048)])
	}
	for _, s := range []string{`[[1, 2], [[0,0,0,0,0,0,0,0,0], [0,1,2,3,4,5,6,7,8]]]`, `[[-1, 1, 4, 0], [1000, 3, -4, 0], [1000, 3, 4, 4], [2000, 4, -4, 4]]`, `<html>`,
		// Sums at int64's edge: every one is refused.
		`[[0,1],[[0,9000000000000000000,9000000000000000000,0,0,0,0,0,0],[0,1,0,0,0,0,0,0,0]]]`,
		`[[0],[[0,4611686018427387904,0,0,0,0,0,0,1]]]`,
		`[[-1,1,4611686018427387904,0],[-1,1,4611686018427387904,0],[-1,1,4,0]]`,
		`[[-1,1,4,0],[1000,4,-9223372036854775808,0]]`,
		`[[1000,2,4611686018427387904,0],[1000,2,4,1],[2000,4,-4,1]]`,
		`[[-9000000000000000000,9000000000000000000],[[0,1,0,0,0,0,0,0,0],[0,2,0,0,0,0,0,0,0]]]`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		tl, err := ParseTimeline(data)
		if err != nil {
			if strings.Contains(err.Error(), "\n") {
				t.Fatalf("multi-line error %q", err)
			}
			return
		}
		if len(tl.Times) == 0 || len(tl.Times) != len(tl.Sizes) {
			t.Fatalf("%d times, %d sizes", len(tl.Times), len(tl.Sizes))
		}
		if span := tl.Times[len(tl.Times)-1] - tl.Times[0]; span < 0 {
			t.Fatalf("times %d to %d: the span wraps to %d", tl.Times[0], tl.Times[len(tl.Times)-1], span)
		}
		for i, row := range tl.Sizes {
			var sum uint64 // stopped at 2^62, so it cannot wrap
			for _, b := range row {
				if b < 0 {
					t.Fatalf("negative size at %d accepted", i)
				}
				if sum += uint64(b); sum > 1<<62 {
					t.Fatalf("point %d: sizes sum past 2^62 accepted", i)
				}
			}
			if tl.Total(i) != int64(sum) {
				t.Fatalf("point %d: Total %d, the sizes sum to %d", i, tl.Total(i), sum)
			}
		}
	})
}

// A timeline past what torch.profiler writes is refused while it is read,
// holding little: a 2 MB gzipped file of 2 GiB of spaces took 4.6 GB and
// 10 s and then said it had no events; 51 KB of 50 MB of "0," took 1.8 GB.
func TestTimelineBounds(t *testing.T) {
	// maxTimelinePoints + 1 points of a valid [times, sizes] file.
	var b bytes.Buffer
	b.WriteString("[[")
	for i := 0; i <= maxTimelinePoints; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteByte('0')
	}
	b.WriteString("],[")
	for i := 0; i <= maxTimelinePoints; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString("[0,0,0,0,0,0,0,0,0]")
	}
	b.WriteString("]]")
	if _, err := ParseTimeline(b.Bytes()); err == nil || !strings.Contains(err.Error(), "more than 2097152 items") {
		t.Errorf("%d points: %v", maxTimelinePoints+1, err)
	}

	// "[", 513 MiB of spaces, "]": gzip members of 1 MiB each, concatenated.
	member := gz(bytes.Repeat([]byte(" "), 1<<20))
	var bomb bytes.Buffer
	bomb.Write(gz([]byte("[")))
	for i := 0; i < maxTimelineBytes>>20+1; i++ {
		bomb.Write(member)
	}
	bomb.Write(gz([]byte("]")))
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err := ParseTimeline(bomb.Bytes())
	runtime.ReadMemStats(&after)
	if err == nil || !strings.Contains(err.Error(), "larger than 512 MiB") {
		t.Errorf("513 MiB of spaces: %v", err)
	}
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 16<<20 {
		t.Errorf("reading 513 MiB of spaces allocated %d MiB", alloc>>20)
	}

	for _, c := range []struct {
		name string
		data []byte
		want string
	}{
		{"gzipped whitespace", gz([]byte(" \n ")), "empty memory timeline: it holds only whitespace"},
		{"plain whitespace", []byte(" \n "), "empty memory timeline: it holds only whitespace"},
		{"more rows than times", []byte(`[[1], [[0,0,0,0,0,0,0,0,0], [0,0,0,0,0,0,0,0,0]]]`), "1 times but 2 rows of sizes"},
		{"raw: five numbers", []byte(`[[-1, 1, 4, 0], [-1, 1, 4, 0, 9]]`), "raw event 1: 5 numbers, want 4"},
		{"trailing data", []byte(`[[-1, 1, 4, 0]] x`), "more data after the timeline's array: x"},
		{"trailing comma", []byte(`[[-1, 1, 4, 0,]]`), "a comma before ]"},
		{"leading zero", []byte(`[[-1, 1, 04, 0]]`), "item 2: 04 is not an integer"},
		{"past int64", []byte(`[[-1, 1, 9223372036854775808, 0]]`), "item 2: 9223372036854775808 is not an integer"},
	} {
		if _, err := ParseTimeline(c.data); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", c.name, err, c.want)
		}
	}
	bom := append([]byte("\xef\xbb\xbf"), readTimeline(t, "cpu_mlp_step.json")...)
	if tl, err := ParseTimeline(bom); !IsTimeline(bom) || err != nil || len(tl.Times) != 714 {
		t.Errorf("a timeline with a UTF-8 BOM: %v", err)
	}
	if !IsTimeline([]byte(" \n")) {
		t.Errorf("whitespace is not read as a timeline (the pickle reader calls it an unknown opcode)")
	}
}
