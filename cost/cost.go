package cost

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// ErrInvalid is wrapped by every error this package returns for a bad
// argument (negative sizes, non-positive rates, NaN, bad indices).
var ErrInvalid = errors.New("invalid argument")

func invalid(format string, a ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalid}, a...)...)
}

// finiteNonNeg reports whether v is a usable size: finite and >= 0.
func finiteNonNeg(v float64) bool { return v >= 0 && !math.IsInf(v, 1) }

// positive reports whether v is a usable rate: finite and > 0.
func positive(v float64) bool { return v > 0 && !math.IsInf(v, 1) }

// seconds converts s seconds to a Duration, rounding to the nanosecond and
// saturating at the largest Duration.
func seconds(s float64) time.Duration {
	ns := math.Round(s * 1e9)
	if ns >= math.MaxInt64 {
		return time.Duration(math.MaxInt64)
	}
	return time.Duration(ns)
}

// addSat adds durations, saturating instead of overflowing.
func addSat(a, b time.Duration) time.Duration {
	if b > 0 && a > math.MaxInt64-b {
		return time.Duration(math.MaxInt64)
	}
	return a + b
}

// Efficiency holds the achievable fractions of the hardware peaks.
//
// The zero value is not valid; DefaultEfficiency returns {1, 1}, the ideal
// roofline (Williams, Waterman & Patterson, "Roofline: An Insightful Visual
// Performance Model for Multicore Architectures", CACM 52(4), 2009), i.e. an
// upper bound on speed. This package ships no "measured" fractions: real
// values depend on kernel, shape and library and should be supplied by the
// caller from a profile. For scale only: Chowdhery et al., "PaLM" (2022),
// Table 3, report 46.2% model FLOPs utilization for a 540B-parameter model
// on TPU v4.
type Efficiency struct {
	// Compute is the fraction of peak FLOP/s reached by compute-bound ops,
	// in (0, 1].
	Compute float64
	// Memory is the fraction of peak DRAM bandwidth reached by
	// memory-bound ops, in (0, 1].
	Memory float64
}

// DefaultEfficiency is the ideal roofline: Compute = Memory = 1.
func DefaultEfficiency() Efficiency { return Efficiency{Compute: 1, Memory: 1} }

// Validate checks that both fractions lie in (0, 1].
func (e Efficiency) Validate() error {
	if !(e.Compute > 0 && e.Compute <= 1) || !(e.Memory > 0 && e.Memory <= 1) {
		return invalid("efficiency {Compute: %v, Memory: %v} must lie in (0, 1]", e.Compute, e.Memory)
	}
	return nil
}

// Roofline is the time of one op under the roofline model:
//
//	t = max(flops / (peakFLOPs·eff.Compute), bytes / (bandwidth·eff.Memory))
//
// An op with no FLOPs needs no peakFLOPs (and likewise for bytes), so a pure
// copy may pass peakFLOPs = 0.
func Roofline(flops, bytes, peakFLOPs, bandwidth float64, eff Efficiency) (time.Duration, error) {
	if err := eff.Validate(); err != nil {
		return 0, err
	}
	if !finiteNonNeg(flops) || !finiteNonNeg(bytes) {
		return 0, invalid("op of %v FLOPs and %v bytes: both must be finite and >= 0", flops, bytes)
	}
	var tc, tm float64
	if flops > 0 {
		if !positive(peakFLOPs) {
			return 0, invalid("peak %v FLOP/s must be positive for an op with FLOPs", peakFLOPs)
		}
		tc = flops / (peakFLOPs * eff.Compute)
	}
	if bytes > 0 {
		if !positive(bandwidth) {
			return 0, invalid("bandwidth %v B/s must be positive for an op that moves bytes", bandwidth)
		}
		tm = bytes / (bandwidth * eff.Memory)
	}
	return seconds(math.Max(tc, tm)), nil
}
