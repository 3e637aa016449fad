package engine

import (
	"context"
	"fmt"
	"strings"

	"github.com/memplan/memplan/ir"
	"github.com/memplan/memplan/lower"
	"github.com/memplan/memplan/models/build"
	"github.com/memplan/memplan/ops"
	"github.com/memplan/memplan/units"
)

// Allow lists options that change the training result and may only enter a
// comparison or a search when the user allows them.
type Allow struct {
	LoRA, QLoRA, EightBit, LowerPrecision bool
}

// LoweredPrecision is what --allow precision trades p for: bfloat16
// parameters and activations with float32 master weights and optimizer
// state (Megatron-LM's and DeepSpeed's bf16). Only a precision that keeps
// float32 parameters is lowered; ok is false for one already in 16 bits
// (bf16 itself, or pure 16-bit, which is smaller still).
func LoweredPrecision(p ops.Precision) (lowered ops.Precision, ok bool) {
	return ops.BF16, p.ParamDType() == units.F32
}

// ParseAllow reads a comma list of lora, qlora, 8bit, precision.
func ParseAllow(s string) (Allow, error) {
	var a Allow
	for _, f := range strings.Split(s, ",") {
		switch strings.TrimSpace(f) {
		case "":
		case "lora":
			a.LoRA = true
		case "qlora":
			a.QLoRA = true
		case "8bit":
			a.EightBit = true
		case "precision":
			a.LowerPrecision = true
		default:
			return a, fieldErr(FieldAllow, "{allow} %q: want lora, qlora, 8bit or precision", f)
		}
	}
	return a, nil
}

// Variant is one strategy applied to a base spec.
type Variant struct {
	Name string
	// Changes and Keeps say, for a person, what part of the curve the
	// strategy moves and what it leaves alone.
	Changes, Keeps string
	apply          func(*Spec) error
	// fwdBwd: the strategy changes only what forward and backward hold
	// (activations), not one op of the optimizer step, so it cannot lower
	// a peak in the optimizer step (TestPropertyFwdBwdVariantsKeepOptimizerPeak).
	fwdBwd bool
	// stepOnly: the strategy changes only the optimizer step, so it cannot
	// lower the peak below forward's and backward's (unless the step runs
	// inside backward) (TestPropertyStepOnlyVariantsKeepForwardBackward).
	stepOnly bool
}

// Row is one compared plan.
type Row struct {
	Variant
	Result *Result
	// Err says why the variant does not apply to this job.
	Err error
}

// Variants lists the strategies applicable to base (itself first).
func Variants(base Spec, allow Allow) []Variant {
	vs := []Variant{{Name: "baseline", Changes: "-", Keeps: "-", apply: func(*Spec) error { return nil }}}
	if base.Mode != Train {
		return vs
	}
	for _, k := range []int{2, 4, 8} {
		if base.MicroBatch%k != 0 {
			continue
		}
		k := k
		vs = append(vs, Variant{
			Name:    fmt.Sprintf("accumulate ×%d (micro-batch %d)", k, base.MicroBatch/k),
			Changes: "activations per micro-step ÷" + fmt.Sprint(k),
			Keeps:   "parameters, gradients, optimizer state, effective batch",
			apply: func(s *Spec) error {
				s.MicroBatch /= k
				s.Accum *= k
				return nil
			}})
	}
	if base.Checkpoint.Kind != CheckpointFull {
		vs = append(vs, Variant{Name: "checkpoint every block", Changes: "activations: each block keeps only its input; +1 forward of the blocks",
			Keeps: "model states, workspace of single ops", fwdBwd: true,
			apply: func(s *Spec) error { s.Checkpoint = CheckpointPolicy{Kind: CheckpointFull}; return nil }})
		vs = append(vs, Variant{Name: "checkpoint every 2nd block", Changes: "activations of half the blocks",
			Keeps: "model states", fwdBwd: true, apply: func(s *Spec) error { s.Checkpoint = CheckpointPolicy{Kind: CheckpointEvery, Every: 2}; return nil }})
	}
	if base.CapacityBytes() > 0 && base.Checkpoint.Kind != CheckpointAuto {
		vs = append(vs, Variant{Name: "checkpoint auto (fits the GPU)", Changes: "activations of the blocks the DP picks; least recompute that fits",
			Keeps: "model states", fwdBwd: true, apply: func(s *Spec) error { s.Checkpoint = CheckpointPolicy{Kind: CheckpointAuto}; return nil }})
	}
	if !base.Offload.Activations {
		vs = append(vs, Variant{Name: "offload activations (save_on_cpu)", Changes: "saved activations move to pinned host memory; PCIe copies both ways",
			Keeps: "model states, working set of each op", fwdBwd: true, apply: func(s *Spec) error { s.Offload.Activations = true; return nil }})
	}
	if !base.Offload.Optimizer && !base.Offload.Params {
		vs = append(vs, Variant{Name: "offload optimizer (ZeRO-Offload)", Changes: "optimizer state and master weights on host; step on CPU; gradients/params over PCIe",
			Keeps: "parameters, gradients, activations", apply: func(s *Spec) error { s.Offload.Optimizer = true; return nil }})
	}
	if base.DP > 1 {
		for stage := base.ZeRO + 1; stage <= 3; stage++ {
			stage := stage
			what := map[int]string{1: "optimizer state ÷dp", 2: "optimizer state and gradients ÷dp", 3: "parameters, gradients and optimizer state ÷dp (FSDP)"}[stage]
			vs = append(vs, Variant{Name: fmt.Sprintf("ZeRO-%d over dp %d", stage, base.DP), Changes: what + "; collectives over the data-parallel group",
				Keeps: "activations", apply: func(s *Spec) error {
					s.ZeRO = stage
					if stage != 3 {
						s.Offload.Params = false
					}
					return nil
				}})
		}
	}
	// Only a fused step the optimizer has: another would plan its own step
	// again (Planned), a row equal to the baseline.
	if base.Impl != lower.Fused && base.Optimizer.Has(lower.Fused) {
		vs = append(vs, Variant{Name: "fused optimizer step", Changes: "optimizer-step temporaries", stepOnly: true,
			Keeps: "training result, model states", apply: func(s *Spec) error { s.Impl = lower.Fused; return nil }})
	}
	if allow.LoRA && base.LoRA == nil {
		vs = append(vs, Variant{Name: "LoRA r=16 on every linear", Changes: "gradients and optimizer state only for adapters; frozen linears save no input",
			Keeps: "parameters, most activations", apply: func(s *Spec) error {
				s.LoRA = &build.LoRA{Rank: 16, Alpha: 32, Targets: []string{"all-linear"}}
				return nil
			}})
	}
	if allow.QLoRA && !base.QLoRA {
		vs = append(vs, Variant{Name: "QLoRA r=16 on every linear (NF4 base)", Changes: "base weights 4-bit + constants; adapter-only gradients and state",
			Keeps: "activations (minus frozen linears' inputs); adds dequantization workspace", apply: func(s *Spec) error {
				s.LoRA = &build.LoRA{Rank: 16, Alpha: 32, Targets: []string{"all-linear"}}
				s.QLoRA = true
				return nil
			}})
	}
	if to, ok := LoweredPrecision(base.Precision); allow.LowerPrecision && ok {
		vs = append(vs, Variant{Name: "precision " + to.String() + " (float32 master weights)", Changes: "16-bit parameters and gradients beside a float32 master copy; every activation in bf16",
			Keeps: "optimizer state", apply: func(s *Spec) error { s.Precision = to; return nil }})
	}
	if allow.EightBit && base.Optimizer != lower.Adam8bit && (base.Optimizer == lower.Adam || base.Optimizer == lower.AdamW) {
		vs = append(vs, Variant{Name: "8-bit AdamW (bitsandbytes)", Changes: "optimizer state 8 → 2 bytes/param (+ block constants)",
			Keeps: "parameters, gradients, activations", apply: func(s *Spec) error { s.Optimizer = lower.Adam8bit; return nil }})
	}
	return vs
}

// Compare plans every variant of base (CompareEach) and returns the rows,
// each result whole.
func Compare(base Spec, allow Allow) ([]Row, error) {
	var rows []Row
	err := CompareEach(base, allow, func(r Row) error {
		rows = append(rows, r)
		return nil
	})
	return rows, err
}

// CompareEach plans every variant of base, one at a time, and hands each
// row to each before planning the next: a caller that keeps what it reads
// and compacts the result (Result.Compact) holds one variant's program at
// a time (compare on deepseek-v3 held seven of about 470,000 ops). The
// variants are planned through one Cache: those that change only sharding
// or offload build and lower the model once, the checkpointing ones lower
// it once. A variant that cannot apply keeps its reason in Row.Err; an
// error in the baseline, or one each returns, is returned.
func CompareEach(base Spec, allow Allow, each func(Row) error) error {
	return CompareEachContext(context.Background(), base, allow, each)
}

// CompareEachContext is CompareEach stopped by ctx (Options.Context): once
// ctx is done no more rows are planned or handed to each, and its cause is
// returned.
func CompareEachContext(ctx context.Context, base Spec, allow Allow, each func(Row) error) error {
	if err := base.Validate(); err != nil {
		return err
	}
	const holds = "compare holds (a baseline's programs beside each strategy's)"
	if base.Model != nil {
		if err := base.validateSimulatedBlocks(MaxCompareBlocks, holds); err != nil {
			return err
		}
	}
	if base.Trace != nil {
		if err := base.validateTraceEvents(MaxCompareEventSteps, holds); err != nil {
			return err
		}
	}
	first := true
	return eachVariant(base, Variants(base, allow), Options{Cache: &Cache{}, NoTimeline: true, Context: ctx}, nil, func(_ int, r Row) error {
		if first && r.Err != nil {
			return r.Err // the baseline
		}
		first = false
		return each(r)
	})
}

// TotalFLOPs sums the FLOPs of every op.
func TotalFLOPs(p *ir.Program) float64 {
	var f float64
	for i := range p.Ops {
		f += p.Ops[i].FLOPs
	}
	return f
}

// Peak is the larger of the steady and first-step peaks.
func (r *Result) PeakBytes() units.Bytes {
	p := r.Sim.Peak.Total
	if r.First != nil && r.First.Peak.Total > p {
		p = r.First.Peak.Total
	}
	return p
}
