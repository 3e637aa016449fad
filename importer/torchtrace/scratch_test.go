package torchtrace

import "testing"

// TestScratchAtPiecewise: scratch is piecewise linear in the batch through the recorded points; an export at
// batch 1 adds a point below its fit (oneDNN's convolution weight gradient splits over min(batch, threads)
// threads, so batch 1's scratch is not on the line through 2 and 4). Two points keep the one line.
// python/tests/test_size1.py::test_scratch_bytes_piecewise checks memplan_torch.replay.scratch_bytes on the
// same table.
func TestScratchAtPiecewise(t *testing.T) {
	conv := &Scratch{Bytes: 1301192, Points: []ScratchPoint{{Batch: 2, Bytes: 2519432}, {Batch: 4, Bytes: 2548424},
		{Batch: 1, Bytes: 1301192}}}
	line := &Scratch{Bytes: 100, Points: []ScratchPoint{{Batch: 2, Bytes: 200}, {Batch: 4, Bytes: 400}}}
	seq := &Scratch{Bytes: 0, Points: []ScratchPoint{{Batch: 2, Seq: 4, Bytes: 80}, {Batch: 4, Seq: 4, Bytes: 160},
		{Batch: 2, Seq: 3, Bytes: 60}, {Batch: 4, Seq: 3, Bytes: 120}, {Batch: 2, Seq: 2, Bytes: 40},
		{Batch: 4, Seq: 2, Bytes: 80}, {Batch: 1, Seq: 2, Bytes: 5}, {Batch: 1, Seq: 3, Bytes: 5}, {Batch: 1, Seq: 4, Bytes: 5}}}
	for _, c := range []struct {
		sc   *Scratch
		b, s int64
		want int64
	}{
		{conv, 1, 0, 1301192},
		{conv, 2, 0, 2519432},
		{conv, 3, 0, 2533928},
		{conv, 8, 0, 2606408}, // the line through 2 and 4, extended
		{line, 1, 0, 100},
		{line, 8, 0, 800},
		{seq, 1, 2, 5},
		{seq, 1, 8, 5},
		{seq, 4, 8, 320},
	} {
		if got := ScratchAt(c.sc, c.b, c.s); got != c.want {
			t.Errorf("ScratchAt(%v, batch %d, seq %d) = %d, want %d", c.sc.Points, c.b, c.s, got, c.want)
		}
	}
}
