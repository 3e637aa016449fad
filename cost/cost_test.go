package cost

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"
)

const ms = time.Millisecond

func TestRoofline(t *testing.T) {
	ideal := DefaultEfficiency()
	for _, tc := range []struct {
		name                   string
		flops, bytes, peak, bw float64
		eff                    Efficiency
		want                   time.Duration
	}{
		// 1 TFLOP at 1000 TFLOP/s = 1 ms; 1 MB at 1 TB/s = 1 µs: compute-bound.
		{"compute-bound", 1e12, 1e6, 1e15, 1e12, ideal, 1 * ms},
		// 1 GFLOP / 1 PFLOP/s = 1 µs; 2 GB / 2 TB/s = 1 ms: memory-bound.
		{"memory-bound", 1e9, 2e9, 1e15, 2e12, ideal, 1 * ms},
		{"compute efficiency", 1e12, 0, 1e15, 1e12, Efficiency{Compute: 0.5, Memory: 1}, 2 * ms},
		{"memory efficiency", 0, 1e9, 1e15, 1e12, Efficiency{Compute: 1, Memory: 0.8}, 1250 * time.Microsecond},
		{"pure copy needs no peak", 0, 1e9, 0, 1e12, ideal, 1 * ms},
		{"pure math needs no bandwidth", 1e12, 0, 1e15, 0, ideal, 1 * ms},
		{"empty op", 0, 0, 0, 0, ideal, 0},
		// H100 SXM bf16 989.4 TFLOPS: a 4096³ matmul is 2·4096³ FLOPs ≈ 138.9 µs.
		{"h100 matmul", 2 * 4096 * 4096 * 4096, 3 * 2 * 4096 * 4096, 989.4e12, 3.35e12, ideal, 138911 * time.Nanosecond},
	} {
		got, err := Roofline(tc.flops, tc.bytes, tc.peak, tc.bw, tc.eff)
		if err != nil || got != tc.want {
			t.Errorf("%s: Roofline = %v, %v; want %v", tc.name, got, err, tc.want)
		}
	}
}

func TestRooflineErrors(t *testing.T) {
	ideal := DefaultEfficiency()
	for name, f := range map[string]func() error{
		"negative flops": func() error { _, err := Roofline(-1, 0, 1, 1, ideal); return err },
		"NaN bytes":      func() error { _, err := Roofline(0, math.NaN(), 1, 1, ideal); return err },
		"inf flops":      func() error { _, err := Roofline(math.Inf(1), 0, 1, 1, ideal); return err },
		"zero peak":      func() error { _, err := Roofline(1, 0, 0, 1, ideal); return err },
		"zero bandwidth": func() error { _, err := Roofline(0, 1, 1, 0, ideal); return err },
		"zero eff":       func() error { _, err := Roofline(1, 1, 1, 1, Efficiency{}); return err },
		"eff > 1":        func() error { _, err := Roofline(1, 1, 1, 1, Efficiency{Compute: 1.5, Memory: 1}); return err },
	} {
		err := f()
		if !errors.Is(err, ErrInvalid) || !strings.HasPrefix(err.Error(), "") {
			t.Errorf("%s: err = %v, want cost: ErrInvalid", name, err)
		}
	}
}

func TestTransfer(t *testing.T) {
	// PCIe Gen4 x16: 31.5 GB/s per direction; 1 GiB ≈ 34.08 ms.
	pcie4 := Link{Bandwidth: 16e9 * 16 * 128 / 130 / 8}
	for _, tc := range []struct {
		bytes float64
		link  Link
		want  time.Duration
	}{
		{1e9, Link{Bandwidth: 25e9}, 40 * ms},
		{1e9, Link{Bandwidth: 25e9, Latency: 10 * time.Microsecond}, 40*ms + 10*time.Microsecond},
		{0, Link{Bandwidth: 25e9, Latency: time.Second}, 0},
		{1 << 30, pcie4, 34078720 * time.Nanosecond},
	} {
		got, err := Transfer(tc.bytes, tc.link)
		if err != nil || got != tc.want {
			t.Errorf("Transfer(%v, %+v) = %v, %v; want %v", tc.bytes, tc.link, got, err, tc.want)
		}
	}
	for _, bad := range []struct {
		b float64
		l Link
	}{{-1, Link{Bandwidth: 1}}, {1, Link{}}, {1, Link{Bandwidth: 1, Latency: -1}}} {
		if _, err := Transfer(bad.b, bad.l); !errors.Is(err, ErrInvalid) {
			t.Errorf("Transfer(%v, %+v): err = %v", bad.b, bad.l, err)
		}
	}
}

func TestOverlap(t *testing.T) {
	c := []time.Duration{10 * ms, 10 * ms, 10 * ms}
	for _, tc := range []struct {
		name          string
		copies        []Copy
		total, expose time.Duration
	}{
		{"no copies", nil, 30 * ms, 0},
		// Offload after item 0, needed only at the end: hidden behind items 1, 2.
		{"hidden offload", []Copy{{Duration: 15 * ms, IssueAt: 1, NeededBy: 3}}, 30 * ms, 0},
		// Offload issued after the last item: fully exposed.
		{"trailing offload", []Copy{{Duration: 5 * ms, IssueAt: 3, NeededBy: 3}}, 35 * ms, 5 * ms},
		// Copy needed by the item at whose readiness it is issued: exposed.
		{"blocking copy", []Copy{{Duration: 4 * ms, IssueAt: 1, NeededBy: 1}}, 34 * ms, 4 * ms},
		// Prefetch at start for item 2 longer than items 0–1: 5 ms exposed.
		{"late prefetch", []Copy{{Duration: 25 * ms, IssueAt: 0, NeededBy: 2}}, 35 * ms, 5 * ms},
		// Two copies serialize on the copy stream: second ends at 24 ms,
		// item 1 waits from 10 to 24 ms.
		{"fifo", []Copy{{Duration: 12 * ms, NeededBy: 1}, {Duration: 12 * ms, NeededBy: 1}}, 44 * ms, 14 * ms},
	} {
		s, err := Overlap(c, tc.copies)
		if err != nil || s.Total != tc.total || s.Exposed != tc.expose || s.Compute != 30*ms {
			t.Errorf("%s: Overlap = %+v, %v; want total %v exposed %v", tc.name, s, err, tc.total, tc.expose)
		}
	}
	for name, copies := range map[string][]Copy{
		"needed before issue": {{Duration: ms, IssueAt: 2, NeededBy: 1}},
		"out of range":        {{Duration: ms, IssueAt: 0, NeededBy: 4}},
		"negative":            {{Duration: -ms}},
		"issue order":         {{Duration: ms, IssueAt: 2, NeededBy: 2}, {Duration: ms, IssueAt: 1, NeededBy: 2}},
	} {
		if _, err := Overlap(c, copies); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: err = %v, want ErrInvalid", name, err)
		}
	}
}

func TestPrefetch(t *testing.T) {
	c := []time.Duration{10 * ms, 10 * ms, 10 * ms, 10 * ms}
	x := []time.Duration{8 * ms, 8 * ms, 8 * ms, 8 * ms}
	for _, tc := range []struct {
		depth   int
		total   time.Duration
		exposed time.Duration
	}{
		{0, 72 * ms, 32 * ms}, // every copy blocks its item
		{1, 48 * ms, 8 * ms},  // only the first copy is exposed
		{4, 48 * ms, 8 * ms},  // all issued at start; copy 0 still exposed
	} {
		s, err := Prefetch(c, x, tc.depth)
		if err != nil || s.Total != tc.total || s.Exposed != tc.exposed {
			t.Errorf("depth %d: %+v, %v; want total %v exposed %v", tc.depth, s, err, tc.total, tc.exposed)
		}
	}
	if _, err := Prefetch(c, x[:2], 1); !errors.Is(err, ErrInvalid) {
		t.Errorf("length mismatch: err = %v", err)
	}
	if _, err := Prefetch(c, x, -1); !errors.Is(err, ErrInvalid) {
		t.Errorf("negative depth: err = %v", err)
	}
}

func TestCollectives(t *testing.T) {
	net := func(n int, bw float64, a time.Duration) Network {
		return Network{Ranks: n, Bandwidth: bw, Latency: a}
	}
	for _, tc := range []struct {
		c     Collective
		bytes float64
		net   Network
		want  time.Duration
	}{
		// 2·7/8 · 1 GB / 100 GB/s = 17.5 ms.
		{AllReduce, 1e9, net(8, 100e9, 0), 17500 * time.Microsecond},
		// + 2·7 · 5 µs = 70 µs.
		{AllReduce, 1e9, net(8, 100e9, 5*time.Microsecond), 17570 * time.Microsecond},
		// 7/8 · 1 GB / 100 GB/s = 8.75 ms (+ 7α).
		{AllGather, 1e9, net(8, 100e9, 0), 8750 * time.Microsecond},
		{ReduceScatter, 1e9, net(8, 100e9, 10*time.Microsecond), 8820 * time.Microsecond},
		{AllToAll, 1e9, net(4, 100e9, 0), 7500 * time.Microsecond},
		// 2 ranks: all-reduce moves the whole buffer once each way.
		{AllReduce, 1e9, net(2, 100e9, 0), 10 * ms},
		// One rank costs nothing, whatever α.
		{AllReduce, 1e9, net(1, 100e9, time.Second), 0},
		{AllGather, 1e9, net(1, 100e9, time.Second), 0},
		// No bytes: latency only.
		{AllReduce, 0, net(4, 100e9, time.Microsecond), 6 * time.Microsecond},
	} {
		got, err := Cost(tc.c, tc.bytes, tc.net)
		if err != nil || got != tc.want {
			t.Errorf("%v(%v, %+v) = %v, %v; want %v", tc.c, tc.bytes, tc.net, got, err, tc.want)
		}
	}
	n := Network{Ranks: 8, Bandwidth: 100e9}
	for c, name := range collectiveNames {
		got, err := Cost(c, 1e9, n)
		if err != nil || c.String() != name {
			t.Errorf("%s: %v, %v", name, c, err)
		}
		// NCCL-tests: busbw of an α = 0 prediction is the link bandwidth.
		if bb := BusBandwidth(c, 1e9, 8, got); math.Abs(bb-100e9) > 1e3 {
			t.Errorf("%s busbw = %v, want 100e9", name, bb)
		}
	}
	for name, f := range map[string]func() error{
		"0 ranks":     func() error { _, err := Cost(AllReduce, 1, Network{Bandwidth: 1}); return err },
		"bad op":      func() error { _, err := Cost(Collective(99), 1, Network{Ranks: 2, Bandwidth: 1}); return err },
		"neg bytes":   func() error { _, err := Cost(AllGather, -1, Network{Ranks: 2, Bandwidth: 1}); return err },
		"zero bw":     func() error { _, err := Cost(AllGather, 1, Network{Ranks: 2}); return err },
		"neg latency": func() error { _, err := Cost(AllGather, 1, Network{Ranks: 2, Bandwidth: 1, Latency: -1}); return err },
		"lat overflows": func() error {
			_, err := Cost(AllGather, 1, Network{Ranks: 1 << 20, Bandwidth: 1, Latency: 1 << 50})
			return err
		},
	} {
		if err := f(); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: err = %v, want ErrInvalid", name, err)
		}
	}
	if Collective(99).String() != "collective(?)" || BusBandwidth(AllReduce, 1, 8, 0) != 0 {
		t.Error("edge cases of String/BusBandwidth")
	}
}

func TestThroughput(t *testing.T) {
	step := 500 * ms
	if got, err := TokensPerSecond(1<<20, step); err != nil || got != 2097152 {
		t.Errorf("TokensPerSecond = %v, %v", got, err)
	}
	if got, err := SamplesPerSecond(256, step); err != nil || got != 512 {
		t.Errorf("SamplesPerSecond = %v, %v", got, err)
	}
	// 6·N·D rule: 7e9 params × 1M tokens × 6 = 4.2e16 FLOPs per step; in 100 s
	// on 8 GPUs of 989.4 TFLOPS: 4.2e14 / 7.9152e15 ≈ 5.3% MFU.
	got, err := MFU(6*7e9*1e6, 100*time.Second, 8*989.4e12)
	if err != nil || math.Abs(got-0.0530625) > 1e-6 {
		t.Errorf("MFU = %v, %v", got, err)
	}
	for name, err := range map[string]error{
		"zero step":  func() error { _, err := TokensPerSecond(1, 0); return err }(),
		"neg tokens": func() error { _, err := SamplesPerSecond(-1, step); return err }(),
		"zero peak":  func() error { _, err := MFU(1, step, 0); return err }(),
		"nan flops":  func() error { _, err := MFU(math.NaN(), step, 1); return err }(),
	} {
		if !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: err = %v", name, err)
		}
	}
}

func TestSaturation(t *testing.T) {
	got, err := Roofline(1e300, 0, 1, 1, DefaultEfficiency())
	if err != nil || got != time.Duration(math.MaxInt64) {
		t.Errorf("huge op = %v, %v; want saturated", got, err)
	}
}

// Properties.

func genNetwork(t *rapid.T) Network {
	return Network{
		Ranks:     rapid.IntRange(1, 1024).Draw(t, "ranks"),
		Bandwidth: rapid.Float64Range(1e6, 1e13).Draw(t, "bw"),
		Latency:   time.Duration(rapid.Int64Range(0, int64(time.Millisecond)).Draw(t, "alpha")),
	}
}

var allCollectives = []Collective{AllReduce, AllGather, ReduceScatter, AllToAll}

func TestPropCollectivesMonotonic(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		c := rapid.SampledFrom(allCollectives).Draw(t, "op")
		net := genNetwork(t)
		a := rapid.Float64Range(0, 1e12).Draw(t, "a")
		b := rapid.Float64Range(0, 1e12).Draw(t, "b")
		if a > b {
			a, b = b, a
		}
		ta, err1 := Cost(c, a, net)
		tb, err2 := Cost(c, b, net)
		if err1 != nil || err2 != nil {
			t.Fatal(err1, err2)
		}
		if ta > tb {
			t.Fatalf("%v: %v bytes take %v > %v bytes take %v", c, a, ta, b, tb)
		}
		// All-reduce costs exactly reduce-scatter + all-gather (±1 ns rounding).
		ar, _ := Cost(AllReduce, b, net)
		rs, _ := Cost(ReduceScatter, b, net)
		ag, _ := Cost(AllGather, b, net)
		if d := ar - rs - ag; d < -1 || d > 1 {
			t.Fatalf("all-reduce %v != reduce-scatter %v + all-gather %v", ar, rs, ag)
		}
	})
}

func TestPropOneRankFree(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		net := genNetwork(t)
		net.Ranks = 1
		c := rapid.SampledFrom(allCollectives).Draw(t, "op")
		got, err := Cost(c, rapid.Float64Range(0, 1e15).Draw(t, "bytes"), net)
		if err != nil || got != 0 {
			t.Fatalf("%v on 1 rank = %v, %v", c, got, err)
		}
	})
}

func genDurations(t *rapid.T, label string, n int) []time.Duration {
	ds := make([]time.Duration, n)
	for i := range ds {
		ds[i] = time.Duration(rapid.Int64Range(0, int64(time.Second)).Draw(t, label))
	}
	return ds
}

func TestPropOverlapBounds(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(0, 20).Draw(t, "n")
		compute := genDurations(t, "compute", n)
		m := rapid.IntRange(0, 20).Draw(t, "m")
		issue := make([]int, m)
		for k := range issue {
			issue[k] = rapid.IntRange(0, n).Draw(t, "issue")
		}
		// FIFO issue order.
		for i := 1; i < m; i++ {
			for j := i; j > 0 && issue[j] < issue[j-1]; j-- {
				issue[j], issue[j-1] = issue[j-1], issue[j]
			}
		}
		copies := make([]Copy, m)
		for k := range copies {
			copies[k] = Copy{
				Duration: time.Duration(rapid.Int64Range(0, int64(time.Second)).Draw(t, "copy")),
				IssueAt:  issue[k],
				NeededBy: rapid.IntRange(issue[k], n).Draw(t, "needed"),
			}
		}
		s, err := Overlap(compute, copies)
		if err != nil {
			t.Fatal(err)
		}
		if s.Total < max(s.Compute, s.Transfer) || s.Total > s.Compute+s.Transfer {
			t.Fatalf("total %v outside [max(%v, %v), sum]", s.Total, s.Compute, s.Transfer)
		}
		if s.Exposed < 0 || s.Exposed > s.Transfer || s.Exposed != s.Total-s.Compute {
			t.Fatalf("exposed %v not in [0, %v]", s.Exposed, s.Transfer)
		}
	})
}

func TestPropPrefetchDepthHelps(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(1, 16).Draw(t, "n")
		c, x := genDurations(t, "compute", n), genDurations(t, "transfer", n)
		d := rapid.IntRange(0, n).Draw(t, "depth")
		a, err1 := Prefetch(c, x, d)
		b, err2 := Prefetch(c, x, d+1)
		if err1 != nil || err2 != nil {
			t.Fatal(err1, err2)
		}
		if b.Total > a.Total {
			t.Fatalf("depth %d: %v, depth %d: %v", d, a.Total, d+1, b.Total)
		}
		// depth 0 serializes everything.
		z, _ := Prefetch(c, x, 0)
		if z.Total != z.Compute+z.Transfer {
			t.Fatalf("depth 0 total %v != %v + %v", z.Total, z.Compute, z.Transfer)
		}
	})
}

func TestPropRooflineBounds(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		f := rapid.Float64Range(0, 1e15).Draw(t, "flops")
		b := rapid.Float64Range(0, 1e12).Draw(t, "bytes")
		peak := rapid.Float64Range(1e12, 1e16).Draw(t, "peak")
		bw := rapid.Float64Range(1e10, 1e13).Draw(t, "bw")
		eff := Efficiency{
			Compute: rapid.Float64Range(0.01, 1).Draw(t, "ec"),
			Memory:  rapid.Float64Range(0.01, 1).Draw(t, "em"),
		}
		got, err := Roofline(f, b, peak, bw, eff)
		ideal, err2 := Roofline(f, b, peak, bw, DefaultEfficiency())
		if err != nil || err2 != nil {
			t.Fatal(err, err2)
		}
		// Lower efficiency never speeds an op up; the ideal time is a
		// lower bound.
		if got < ideal {
			t.Fatalf("eff %+v: %v < ideal %v", eff, got, ideal)
		}
		// Doubling the work never makes it faster.
		more, _ := Roofline(2*f, 2*b, peak, bw, eff)
		if more < got {
			t.Fatalf("double work %v < %v", more, got)
		}
	})
}
