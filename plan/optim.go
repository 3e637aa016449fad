package plan

import (
	"fmt"
	"strings"
)

// Optimizer names a torch.optim (or bitsandbytes) optimizer.
type Optimizer uint8

const (
	SGD Optimizer = iota
	SGDMomentum
	Adam
	AdamW
	Adafactor
	Adam8bit
)

var optimizerNames = []string{"sgd", "sgd-momentum", "adam", "adamw", "adafactor", "adamw8bit"}

func (o Optimizer) String() string {
	if int(o) < len(optimizerNames) {
		return optimizerNames[o]
	}
	return fmt.Sprintf("optimizer(%d)", o)
}

// ParseOptimizer reads an optimizer name; "adam8bit" is accepted for
// adamw8bit.
func ParseOptimizer(s string) (Optimizer, error) {
	t := strings.ToLower(strings.TrimSpace(s))
	if t == "adam8bit" || t == "8bit-adam" || t == "adamw-8bit" {
		return Adam8bit, nil
	}
	if t == "momentum" {
		return SGDMomentum, nil
	}
	for i, n := range optimizerNames {
		if t == n {
			return Optimizer(i), nil
		}
	}
	return 0, fmt.Errorf("plan: unknown optimizer %q (want one of %s)", s, strings.Join(optimizerNames, ", "))
}

// OptimizerNames lists the accepted names.
func OptimizerNames() []string { return append([]string(nil), optimizerNames...) }

// Impl is how the optimizer step is implemented (torch.optim's foreach,
// for-loop or fused kernels).
type Impl uint8

const (
	// Foreach is PyTorch 2's default on CUDA: _foreach_* kernels over all
	// parameters of one dtype at once; intermediate lists are as large as the
	// whole state they are computed from.
	Foreach Impl = iota
	// Single is the per-parameter for-loop (foreach=False).
	Single
	// Fused is the fused CUDA kernel (fused=True): no intermediates.
	Fused
)

var implNames = []string{"foreach", "single", "fused"}

func (i Impl) String() string {
	if int(i) < len(implNames) {
		return implNames[i]
	}
	return fmt.Sprintf("impl(%d)", i)
}

// ParseImpl reads foreach, single (or for-loop), fused.
func ParseImpl(s string) (Impl, error) {
	t := strings.ToLower(strings.TrimSpace(s))
	if t == "for-loop" || t == "forloop" {
		return Single, nil
	}
	for i, n := range implNames {
		if t == n {
			return Impl(i), nil
		}
	}
	return 0, fmt.Errorf("plan: unknown optimizer implementation %q (want foreach, single or fused)", s)
}

// Bitsandbytes 8-bit optimizer constants: block-wise quantization with one
// float32 absmax per block of 2048 values (Dettmers et al., "8-bit
// Optimizers via Block-wise Quantization", ICLR 2022, §2), and tensors under
// min_8bit_size = 4096 elements keep 32-bit state (bnb.optim.Optimizer8bit).
const (
	bnbBlock      = 2048
	bnbMin8bitNum = 4096
)
