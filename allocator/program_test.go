package allocator_test

import (
	"testing"

	"github.com/memplan/memplan/allocator"
	"github.com/memplan/memplan/engine"
	"github.com/memplan/memplan/lower"
	"github.com/memplan/memplan/models"
	"github.com/memplan/memplan/ops"
	"github.com/memplan/memplan/units"
)

func planOf(t testing.TB, model string, mb, seq int, prec ops.Precision, opt lower.Optimizer, loop ...func(*engine.Spec)) *engine.Result {
	t.Helper()
	a, err := models.Lookup(model)
	if err != nil {
		t.Fatal(err)
	}
	spec := engine.Spec{Job: engine.Job{Model: a, MicroBatch: mb, Seq: seq, Precision: prec, Optimizer: opt}}
	for _, f := range loop {
		f(&spec)
	}
	r, err := engine.Plan(spec)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// The replay's requested bytes are the simulator's: the same storages are
// allocated and freed at the same ops, so the requested peak equals sim's
// allocated peak; blocks round each request up to 512 bytes and segments
// hold at least the blocks. The loop habits carry storages from one
// iteration into the next: the second pass holds the first one's, not both
// (gradients zeroed after the forward were counted twice before the replay
// freed the previous pass's at zero_grad).
func TestReplayProgramMatchesSim(t *testing.T) {
	afterForward := func(s *engine.Spec) { s.Sem.ZeroGrad, s.Sem.Hold = lower.ZeroAfterForward, lower.HoldNextForward }
	inPlace := func(s *engine.Spec) { s.Sem.ZeroGrad, s.Sem.Hold = lower.ZeroInPlace, lower.HoldBackward }
	for _, c := range []struct {
		model string
		mb    int
		seq   int
		prec  ops.Precision
		opt   lower.Optimizer
		loop  func(*engine.Spec)
	}{
		{"gpt2", 4, 1024, ops.AMPBF16, lower.AdamW, nil},
		{"llama-3.2-1b", 1, 2048, ops.BF16, lower.AdamW, nil},
		{"pythia-160m", 8, 512, ops.FP32, lower.SGD, nil},
		{"pythia-160m", 2, 512, ops.FP32, lower.AdamW, afterForward},
		{"gpt2", 2, 512, ops.AMPBF16, lower.SGD, inPlace},
	} {
		var loop []func(*engine.Spec)
		if c.loop != nil {
			loop = append(loop, c.loop)
		}
		r := planOf(t, c.model, c.mb, c.seq, c.prec, c.opt, loop...)
		for _, cfg := range []allocator.Config{{}, {Expandable: true}, {MaxSplitSize: 64 << 20}, {RoundupPower2Divisions: [16]int64{4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4}}} {
			pr, err := allocator.ReplayProgram(r.Program, cfg, 0, true)
			if err != nil {
				t.Fatal(err)
			}
			if pr.PeakRequested != int64(r.Sim.Peak.Total) {
				t.Errorf("%s %+v: requested peak %d, sim's allocated peak %d", c.model, cfg, pr.PeakRequested, r.Sim.Peak.Total)
			}
			if pr.PeakAllocated < pr.PeakRequested || pr.PeakReserved < pr.PeakAllocated || pr.Fragmentation != pr.PeakReserved-pr.AllocatedAtPeak {
				t.Errorf("%s %+v: requested %d ≤ allocated %d ≤ reserved %d does not hold", c.model, cfg, pr.PeakRequested, pr.PeakAllocated, pr.PeakReserved)
			}
			if len(pr.Timeline) != len(r.Program.Ops) || pr.Timeline[len(pr.Timeline)-1] > pr.PeakReserved {
				t.Errorf("%s: timeline of %d points for %d ops", c.model, len(pr.Timeline), len(r.Program.Ops))
			}
			t.Logf("%s %+v: requested %s, blocks %s, reserved %s (fragmentation %s, %d segments)", c.model, cfg.Expandable, units.Bytes(pr.PeakRequested), units.Bytes(pr.PeakAllocated), units.Bytes(pr.PeakReserved), units.Bytes(pr.Fragmentation), pr.Segments)
		}
	}
}

// With a capacity, the replay says where the device runs out: under the
// reserved peak it OOMs, at the reserved peak it does not.
func TestReplayProgramOOMLine(t *testing.T) {
	r := planOf(t, "gpt2", 4, 1024, ops.AMPBF16, lower.AdamW)
	free, err := allocator.ReplayProgram(r.Program, allocator.Config{}, 0, false)
	if err != nil {
		t.Fatal(err)
	}
	at, err := allocator.ReplayProgram(r.Program, allocator.Config{}, free.PeakReserved, false)
	if err != nil || at.OOM {
		t.Fatalf("OOM at exactly the unlimited reserved peak %d: %v %+v", free.PeakReserved, err, at)
	}
	under, err := allocator.ReplayProgram(r.Program, allocator.Config{}, free.PeakRequested-1, false)
	if err != nil {
		t.Fatal(err)
	}
	if !under.OOM || under.OOMOp < 0 {
		t.Fatalf("no OOM under the requested peak: %+v", under)
	}
}

func BenchmarkReplayProgramLlama3_70B(b *testing.B) {
	r := planOf(b, "llama-3-70b", 1, 8192, ops.BF16, lower.AdamW)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := allocator.ReplayProgram(r.Program, allocator.Config{}, 0, true); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkReplayProgramQwen3_30B_A3B replays a catalog MoE (48 layers of
// 128 experts): 30,612 segments, 75,468 live blocks and 29,985 cached at the
// end, so every pool insert and erase meets a large set.
func BenchmarkReplayProgramQwen3_30B_A3B(b *testing.B) {
	r := planOf(b, "qwen3-30b-a3b", 1, 2048, ops.BF16, lower.AdamW)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := allocator.ReplayProgram(r.Program, allocator.Config{}, 0, true); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkReplayProgramQwen3_30B_A3BExpandable: the same replay under
// expandable_segments:True, whose largest segment ends with 74,505 blocks,
// where Segments walked back to the segment's head from every block.
func BenchmarkReplayProgramQwen3_30B_A3BExpandable(b *testing.B) {
	r := planOf(b, "qwen3-30b-a3b", 1, 2048, ops.BF16, lower.AdamW)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := allocator.ReplayProgram(r.Program, allocator.Config{Expandable: true}, 0, true); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkReplayProgramDeepSeekV2 replays the steady program of
// deepseek-v2 (60 layers of 160 experts, 301,600 ops; amp-bf16, AdamW),
// whose replays dominated `memplan plan --model deepseek-v2 --gpu h100`.
func BenchmarkReplayProgramDeepSeekV2(b *testing.B) {
	r := planOf(b, "deepseek-v2", 1, 2048, ops.AMPBF16, lower.AdamW)
	b.ReportAllocs()
	var res *allocator.ProgramResult
	for b.Loop() {
		var err error
		if res, err = allocator.ReplayProgram(r.Program, allocator.Config{}, 0, true); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(res.Segments), "segments")
}
