package engine

import (
	"math/bits"

	"github.com/memplan/memplan/units"
)

// Limits on a job's dimensions. Each is derived from what a job can
// physically be, so that every size, FLOP and time total the planner
// multiplies out of them stays far inside int64 (whose wrap-around would
// otherwise turn into a silently wrong answer); each is refused in one line
// naming the field and its limit.
const (
	// MaxTokens bounds the tokens of one micro-step (micro-batch ×
	// (sequence + generated tokens)): 2^34 tokens' int64 ids alone are
	// 128 GiB, and every model's embedding output (hidden ≥ 64, 2 bytes)
	// 2 TiB, more than any GPU holds.
	MaxTokens = 1 << 34
	// MaxAccum bounds the micro-steps of one optimizer step (2^30: a step's
	// sample count stays an exact float64 even times MaxGPUs).
	MaxAccum = 1 << 30
	// MaxGPUs bounds dp × tp × pp (2^24 = 16.7M GPUs, a hundred times
	// the largest cluster built).
	MaxGPUs = 1 << 24
	// MaxBytes bounds the sum of every tensor a program allocates (2^62 B
	// = 4 EiB): under it, no sum of live bytes can wrap.
	MaxBytes = units.Bytes(1) << 62
)

// mulChecked is a × b for non-negative a, b, with ok false when it exceeds
// limit (or int64).
func mulChecked(a, b, limit int64) (int64, bool) {
	if a < 0 || b < 0 {
		return 0, false
	}
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	if hi != 0 || lo > uint64(limit) {
		return 0, false
	}
	return int64(lo), true
}

// validateLimits checks the filled job's dimensions against the limits.
func (s *Spec) validateLimits() error {
	if s.Accum > MaxAccum {
		return invalid(FieldAccum, "{accum} %d is over the limit of %d micro-steps per optimizer step", s.Accum, MaxAccum)
	}
	if s.PP > 1 && s.Accum > MaxPipelineAccum {
		return invalid(FieldAccum, "{accum} %d is over the limit of %d micro-steps for a pipeline ({pp} %d simulates every micro-step)", s.Accum, MaxPipelineAccum, s.PP)
	}
	seq := int64(s.Seq) + int64(s.GenTokens)
	if s.Trace != nil && seq == 0 {
		seq = 1
	}
	if _, ok := mulChecked(int64(s.MicroBatch), max(seq, 1), MaxTokens); !ok {
		return invalid(FieldMicroBatch, "{micro-batch} %d × {seq} %d is over the limit of 2^34 tokens per micro-step (their int64 ids alone would be 128 GiB)", s.MicroBatch, seq)
	}
	g := int64(1)
	for _, d := range []int{s.DP, s.TP, s.PP} {
		var ok bool
		if g, ok = mulChecked(g, int64(max(d, 1)), MaxGPUs); !ok {
			return invalid(FieldDP, "{dp} × {tp} × {pp} is over the limit of %d GPUs", MaxGPUs)
		}
	}
	return nil
}
