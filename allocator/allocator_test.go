package allocator

import (
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/memplan/memplan/snapshot"
)

// Expected values follow from the functions of
// c10/cuda/CUDACachingAllocator.cpp (pytorch/pytorch @ 001074d2) and its
// own comment on roundup_power2_next_division ("if we need to round-up 1200
// and number of divisions is 4 ... return 1280").
func TestRoundSize(t *testing.T) {
	var four Config
	for i := range four.RoundupPower2Divisions {
		four.RoundupPower2Divisions[i] = 4
	}
	cases := []struct {
		cfg  Config
		size int64
		want int64
	}{
		{Config{}, 0, 512},
		{Config{}, 1, 512},
		{Config{}, 512, 512},
		{Config{}, 513, 1024},
		{Config{}, 8000, 8192},
		{Config{}, 40960000, 40960000}, // already a multiple of 512
		{Config{}, 5308694528, 5308694528},
		{four, 1200, 1536},         // under 512·4 bytes: 512-rounded
		{four, 1024, 1024},         // powers of two stay
		{four, 1536, 1536},         // on a division
		{four, 3 << 20, 3 << 20},   // 3 MiB is a division of [2, 4) MiB
		{four, 5<<20 + 1, 6 << 20}, // next quarter of [4, 8) MiB
		{four, 2047, 2048},         // above 512·4 = 2048? no: 2047 < 2048, 512-rounded
		{four, 2049, 2560},         // [2048, 4096) in quarters of 512
		{Config{RoundupPower2Divisions: [16]int64{0, 0, 0, 8}}, 9<<20 + 5, 10 << 20}, // [8, 16) MiB in eighths
	}
	// The C++ comment's example of roundup_power2_next_division.
	if got := roundupPower2NextDivision(1200, 4); got != 1280 {
		t.Errorf("roundup_power2_next_division(1200, 4) = %d, want 1280", got)
	}
	for _, c := range cases {
		if got := c.cfg.RoundSize(c.size); got != c.want {
			t.Errorf("RoundSize(%d) with %v = %d, want %d", c.size, c.cfg.RoundupPower2Divisions, got, c.want)
		}
	}
}

func TestAllocationSize(t *testing.T) {
	cases := []struct{ size, want int64 }{
		{512, SmallBuffer},
		{1 << 20, SmallBuffer},      // kSmallSize is still small
		{1<<20 + 512, LargeBuffer},  // 1–10 MiB: a 20 MiB segment
		{10<<20 - 512, LargeBuffer}, // just under kMinLargeAlloc
		{10 << 20, 10 << 20},        // from 10 MiB: rounded to 2 MiB
		{40960000, 41943040},        // 39.06 MiB → 40 MiB
		{5308694528, 5309988864},    // 2532 × 2 MiB
		{4194304 + 512, 20 << 20},   // a 4 MiB activation gets a 20 MiB segment
	}
	for _, c := range cases {
		if got := AllocationSize(c.size); got != c.want {
			t.Errorf("AllocationSize(%d) = %d, want %d", c.size, got, c.want)
		}
	}
}

// fakeDevice hands out segments from a bump pointer up to a capacity.
type fakeDevice struct {
	next, used, capacity int64
	mallocs, frees       int
}

func (d *fakeDevice) Malloc(size int64) (int64, bool) {
	if d.capacity > 0 && d.used+size > d.capacity {
		return 0, false
	}
	p := d.next
	d.next += size + 1<<30
	d.used += size
	d.mallocs++
	return p, true
}
func (d *fakeDevice) Free(ptr, size int64)     { d.used -= size; d.frees++ }
func (d *fakeDevice) Reserve(size int64) int64 { p := d.next; d.next += size; return p }
func (d *fakeDevice) Map(ptr, size int64) bool {
	if d.capacity > 0 && d.used+size > d.capacity {
		return false
	}
	d.used += size
	return true
}
func (d *fakeDevice) Unmap(ptr, size int64) { d.used -= size }

func mustMalloc(t *testing.T, a *Allocator, size int64) *Block {
	t.Helper()
	b, err := a.Malloc(size, 0)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// The caching rules on small scripted sequences: what each allocation
// reserves and which block it gets.
func TestCachingRules(t *testing.T) {
	t.Run("small requests share a 2 MiB segment", func(t *testing.T) {
		a := New(Config{}, &fakeDevice{next: 1 << 40})
		b1 := mustMalloc(t, a, 1000)
		b2 := mustMalloc(t, a, 1000)
		if a.Reserved != SmallBuffer || b2.Ptr != b1.Ptr+1024 {
			t.Errorf("reserved %d, second block at +%d; want 2 MiB and +1024", a.Reserved, b2.Ptr-b1.Ptr)
		}
	})
	t.Run("a 4 MiB request splits a 20 MiB segment; the next reuses the rest", func(t *testing.T) {
		a := New(Config{}, &fakeDevice{next: 1 << 40})
		b1 := mustMalloc(t, a, 4<<20)
		b2 := mustMalloc(t, a, 4<<20)
		if a.Reserved != LargeBuffer || b2.Ptr != b1.Ptr+4<<20 || a.Allocated != 8<<20 {
			t.Errorf("reserved %d allocated %d second at +%d", a.Reserved, a.Allocated, b2.Ptr-b1.Ptr)
		}
	})
	t.Run("a large block keeps a remainder of 1 MiB or less", func(t *testing.T) {
		a := New(Config{}, &fakeDevice{next: 1 << 40})
		b := mustMalloc(t, a, 19<<20+512) // 20 MiB segment, 1 MiB - 512 left: not split
		if b.Size != LargeBuffer || a.Allocated != LargeBuffer {
			t.Errorf("block %d bytes, allocated %d; want the whole 20 MiB", b.Size, a.Allocated)
		}
	})
	t.Run("best fit: the smallest cached block, then the lowest address", func(t *testing.T) {
		a := New(Config{}, &fakeDevice{next: 1 << 40})
		big := mustMalloc(t, a, 64<<20)
		mid := mustMalloc(t, a, 32<<20)
		mid2 := mustMalloc(t, a, 32<<20)
		for _, b := range []*Block{big, mid, mid2} {
			if err := a.Free(b.Ptr); err != nil {
				t.Fatal(err)
			}
		}
		midPtr := mid.Ptr // the cached block object becomes the remainder of a split
		got := mustMalloc(t, a, 30<<20)
		if got.Ptr != midPtr {
			t.Errorf("30 MiB went to %#x, want the first 32 MiB segment %#x", got.Ptr, midPtr)
		}
	})
	t.Run("freed neighbours merge", func(t *testing.T) {
		a := New(Config{}, &fakeDevice{next: 1 << 40})
		b1 := mustMalloc(t, a, 2<<20)
		b2 := mustMalloc(t, a, 2<<20)
		b3 := mustMalloc(t, a, 2<<20)
		for _, b := range []*Block{b1, b3, b2} {
			if err := a.Free(b.Ptr); err != nil {
				t.Fatal(err)
			}
		}
		if cached := a.pools[1].blocks.all(); len(cached) != 1 || cached[0].Size != LargeBuffer {
			t.Errorf("cache holds %d blocks, want one 20 MiB block", len(cached))
		}
	})
	t.Run("max_split_size: an oversize block is not split and serves only requests within 20 MiB", func(t *testing.T) {
		a := New(Config{MaxSplitSize: 100 << 20}, &fakeDevice{next: 1 << 40})
		b := mustMalloc(t, a, 200<<20)
		if err := a.Free(b.Ptr); err != nil {
			t.Fatal(err)
		}
		small := mustMalloc(t, a, 50<<20) // under max_split_size: never an oversize block
		if small.Ptr == b.Ptr || a.Reserved != 250<<20 {
			t.Errorf("50 MiB took the oversize block or reserved %d", a.Reserved)
		}
		near := mustMalloc(t, a, 190<<20) // within 20 MiB of 200 MiB: reuses it, unsplit
		if near.Ptr != b.Ptr || near.Size != 200<<20 {
			t.Errorf("190 MiB got %#x of %d bytes, want the cached 200 MiB block", near.Ptr, near.Size)
		}
	})
	t.Run("on a full device the cache is freed and the allocation retried", func(t *testing.T) {
		dev := &fakeDevice{next: 1 << 40, capacity: 100 << 20}
		a := New(Config{}, dev)
		b := mustMalloc(t, a, 60<<20)
		if err := a.Free(b.Ptr); err != nil {
			t.Fatal(err)
		}
		c := mustMalloc(t, a, 80<<20) // 60 cached + 80 > 100: release, then retry
		if dev.frees != 1 || a.Reserved != 80<<20 || c.Size != 80<<20 {
			t.Errorf("frees %d reserved %d", dev.frees, a.Reserved)
		}
		if _, err := a.Malloc(40<<20, 0); err == nil {
			t.Error("120 MiB on a 100 MiB device did not fail")
		}
	})
	t.Run("expandable segments grow by 20 MiB pages and keep one segment", func(t *testing.T) {
		a := New(Config{Expandable: true}, &fakeDevice{next: 1 << 40})
		var maps []SegmentEvent
		a.OnSegment = func(e SegmentEvent) { maps = append(maps, e) }
		b1 := mustMalloc(t, a, 30<<20)
		b2 := mustMalloc(t, a, 30<<20)
		segs := a.Segments()
		if len(segs) != 1 || a.Reserved != 60<<20 || b2.Ptr != b1.Ptr+30<<20 {
			t.Errorf("%d segments, reserved %d (want one, 60 MiB: 40 then 20 more)", len(segs), a.Reserved)
		}
		if len(maps) != 2 || maps[0].Size != 40<<20 || maps[1].Size != 20<<20 {
			t.Errorf("maps %v", maps)
		}
		if err := a.Free(b2.Ptr); err != nil {
			t.Fatal(err)
		}
		a.ReleaseCachedBlocks() // unmaps whole free pages: [60, 60) — b2 spans 30..60, pages 40..60
		if a.Reserved != 40<<20 {
			t.Errorf("after empty_cache reserved %d, want 40 MiB", a.Reserved)
		}
	})
	t.Run("garbage collection frees old cached segments past the threshold", func(t *testing.T) {
		dev := &fakeDevice{next: 1 << 40}
		a := New(Config{GCThreshold: 0.4, AllowedMemory: 200 << 20}, dev)
		old := mustMalloc(t, a, 40<<20)
		if err := a.Free(old.Ptr); err != nil {
			t.Fatal(err)
		}
		mustMalloc(t, a, 60<<20) // reserved 40 MiB ≤ the 80 MiB threshold: no GC
		if dev.frees != 0 {
			t.Fatalf("GC ran below the threshold")
		}
		mustMalloc(t, a, 70<<20) // no cached fit; reserved 100 MiB > 80: the cached 40 MiB block goes
		if dev.frees != 1 {
			t.Errorf("GC freed %d segments, want 1", dev.frees)
		}
	})
}

func sharedSnapshot(t *testing.T, name string) string {
	t.Helper()
	p := filepath.Join("..", "..", "shared", "snapshots", "raw", name)
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("%s: the real snapshots live in ../shared next to the clone (as in CI): %v", name, err)
	}
	return p
}

// Every snapshot of ../shared/snapshots (and the copies in testdata),
// replayed through the model with the allocator settings it recorded:
// every allocation lands at the recorded address, every segment event is
// reproduced with its address and size (so the reserved bytes equal the
// recorded segment totals at every segment event), and the end state equals
// the dumped segments block for block. The allocated peaks (requested
// bytes) are those of the independently decoded summaries
// (../shared/snapshots/summaries).
func TestReplayRealSnapshots(t *testing.T) {
	cases := []struct {
		file          string
		dev           int64
		peakRequested int64 // summaries' peak_allocated
		peakReserved  int64 // summaries' peak_reserved
		segEvents     int
	}{
		{"../testdata/snapshots/MAGMA27__assignment2-systems__15883f2b__memory_snapshot.pickle", 0, 13923997700, 14180941824, 0},
		{"../testdata/snapshots/Muduard__LayoutEditing__413b2eb4__memory_snapshot.pkl", 1, 3308174782, 3649044480, 0},
		{sharedSnapshot(t, "Wedsonlin__assignment2-systems__8630bcfe__results_medium_128_inference_memory_snapshot.pickle"), 0, 1736962048, 1763704832, 0},
		{sharedSnapshot(t, "Wedsonlin__assignment2-systems__8630bcfe__results_medium_128_training_memory_snapshot.pickle"), 0, 7013335044, 7235174400, 0},
		{sharedSnapshot(t, "Wedsonlin__assignment2-systems__8630bcfe__results_medium_512_training_memory_snapshot.pickle"), 0, 12426629128, 12660506624, 1},
		{sharedSnapshot(t, "notHanmin__assignment2-systems__33be88e6__memory_snapshot.pickle"), 0, 22827925508, 23842521088, 0},
		{sharedSnapshot(t, "cranberrii__ftcourse__9f4902cf__memory_snapshot.pickle"), 0, 5876132840, 6471811072, 152},
		// Constructor-Sun: expandable segments on three GPUs. The summary
		// adds the blocks of all devices to device 2's trace (its baseline
		// 8,498,134,768 is devices 0 and 1's live blocks, checked in
		// TestSummaryMixesDevices); per device the peaks are these.
		{sharedSnapshot(t, "Constructor-Sun__code_location__52e52b22__memory_snapshot.pickle"), 0, 8456473388, 8541700096, 175},
		{sharedSnapshot(t, "Constructor-Sun__code_location__52e52b22__memory_snapshot.pickle"), 1, 84063351764, 84202749952, 46},
		{sharedSnapshot(t, "Constructor-Sun__code_location__52e52b22__memory_snapshot.pickle"), 2, 21564645800, 21883781120, 78},
	}
	for _, c := range cases {
		t.Run(filepath.Base(c.file)[:24]+"/"+string(rune('0'+c.dev)), func(t *testing.T) {
			s, err := snapshot.ReadFile(c.file)
			if err != nil {
				t.Fatal(err)
			}
			r, err := ReplayDevice(s, c.dev)
			if err != nil {
				t.Fatal(err)
			}
			if r.Diverged != "" {
				t.Fatalf("replay diverged: %s", r.Diverged)
			}
			if r.FinalMismatch != "" {
				t.Fatalf("end state: %s", r.FinalMismatch)
			}
			if r.SegmentEvents != c.segEvents || r.AddressChecks != len(alloced(s, c.dev)) {
				t.Errorf("%d segment events, %d addresses checked; want %d and %d", r.SegmentEvents, r.AddressChecks, c.segEvents, len(alloced(s, c.dev)))
			}
			if r.PeakRequested.Requested != c.peakRequested {
				t.Errorf("peak requested %d, want %d", r.PeakRequested.Requested, c.peakRequested)
			}
			if r.PeakReserved.Reserved != c.peakReserved {
				t.Errorf("peak reserved %d, want %d", r.PeakReserved.Reserved, c.peakReserved)
			}
			// The end: allocated and requested bytes equal the dump's.
			var alloc, req int64
			for _, sg := range s.Segments {
				if sg.Device == c.dev {
					for _, b := range sg.Blocks {
						if b.State != "inactive" {
							alloc += b.Size
							req += b.Requested
						}
					}
				}
			}
			last := State{Reserved: r.InitialReserved, Allocated: r.InitialAllocated, Requested: r.InitialRequested}
			if n := len(r.After); n > 0 {
				last = r.After[n-1]
			}
			if last.Allocated != alloc || last.Requested != req {
				t.Errorf("ends with %d allocated / %d requested, the dump holds %d / %d", last.Allocated, last.Requested, alloc, req)
			}
			t.Logf("%d events, %d segment events, %d addresses; peak allocated %d (blocks) %d (requested) at event %d, reserved %d", len(r.After), r.SegmentEvents, r.AddressChecks, r.Peak.Allocated, r.PeakRequested.Requested, r.PeakRequested.Event, r.PeakReserved.Reserved)
		})
	}
}

func alloced(s *snapshot.Snapshot, dev int64) []snapshot.Event {
	var out []snapshot.Event
	if int(dev) < len(s.Traces) {
		for _, e := range s.Traces[dev] {
			if e.Action == snapshot.Alloc {
				out = append(out, e)
			}
		}
	}
	return out
}

// The Constructor-Sun summary's peak (30,062,780,568) is device 2's peak
// plus the live blocks of devices 0 and 1.
func TestSummaryMixesDevices(t *testing.T) {
	s, err := snapshot.ReadFile(sharedSnapshot(t, "Constructor-Sun__code_location__52e52b22__memory_snapshot.pickle"))
	if err != nil {
		t.Fatal(err)
	}
	var other int64
	for _, sg := range s.Segments {
		if sg.Device != 2 {
			for _, b := range sg.Blocks {
				if b.State != "inactive" {
					other += b.Requested
				}
			}
		}
	}
	if other+21564645800 != 30062780568 {
		t.Errorf("devices 0 and 1 hold %d live bytes; %d + device 2's peak != the summary's 30062780568", other, other)
	}
}

func TestConfigOfDefaults(t *testing.T) {
	c := ConfigOf(snapshot.DefaultSettings())
	if c.maxSplit() != math.MaxInt64 || c.Expandable || c.GCThreshold != 0 {
		t.Errorf("defaults %+v", c)
	}
}
