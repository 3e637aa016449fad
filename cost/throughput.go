package cost

import "time"

func perSecond(what string, n float64, step time.Duration) (float64, error) {
	if !finiteNonNeg(n) {
		return 0, invalid("%s %v must be finite and >= 0", what, n)
	}
	if step <= 0 {
		return 0, invalid("step time %v must be positive", step)
	}
	return n / step.Seconds(), nil
}

// TokensPerSecond is tokens processed per step over the step time.
func TokensPerSecond(tokensPerStep float64, step time.Duration) (float64, error) {
	return perSecond("tokens", tokensPerStep, step)
}

// SamplesPerSecond is samples (sequences, images) per step over the step
// time.
func SamplesPerSecond(samplesPerStep float64, step time.Duration) (float64, error) {
	return perSecond("samples", samplesPerStep, step)
}

// MFU is model FLOPs utilization (Chowdhery et al., "PaLM", 2022, appendix
// B): the model's FLOPs per step — excluding recomputation — divided by
// step time × peak FLOP/s. For data parallelism pass the summed FLOPs and
// peaks of all devices, or per-device values for both.
func MFU(modelFLOPsPerStep float64, step time.Duration, peakFLOPs float64) (float64, error) {
	perSec, err := perSecond("model FLOPs", modelFLOPsPerStep, step)
	if err != nil {
		return 0, err
	}
	if !positive(peakFLOPs) {
		return 0, invalid("peak %v FLOP/s must be positive", peakFLOPs)
	}
	return perSec / peakFLOPs, nil
}
