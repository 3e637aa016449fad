package engine

import (
	"fmt"
	"math"
	"testing"

	"github.com/memplan/memplan/hw"
	"github.com/memplan/memplan/ir"
	"github.com/memplan/memplan/lower"
	"github.com/memplan/memplan/ops"
	"github.com/memplan/memplan/units"
)

// gradsToHost sums the bytes of p's optimizer-offload gradient copies.
func gradsToHost(p *ir.Program) (b units.Bytes) {
	for _, op := range p.Ops {
		if op.Name == "offload.grads_to_host" && op.Transfer != nil {
			b += op.Transfer.Bytes
		}
	}
	return b
}

// ZeRO-1 with the optimizer offloaded copies only the rank's partition of
// each reduced gradient to the host, as ZeRO-2 does: DeepSpeed stage 1 and 2
// share stage_1_and_2.py, whose cpu_offload gradient buffer
// (single_partition_of_fp32_groups[i].grad) is partition-sized on the CPU.
// So the host peak and the copied bytes of the two stages are equal at
// every DP. Under the hf recipe with amp-bf16 (fp32 parameters and
// gradients) and foreach AdamW, the host at its peak holds per parameter
// 20/DP bytes: exp_avg and exp_avg_sq (8/DP), the pinned parameter mirror
// (4/DP), the gradient partition (4/DP) and the step's fp32 temporary
// (4/DP), up to the per-tensor padding of ceil(numel/DP); the gradient
// copies are 4/DP bytes per parameter. Before the fix ZeRO-1 copied the
// whole fp32 gradient, 4 + 16/DP bytes per parameter on the host.
func TestZeRO1OffloadCopiesPartition(t *testing.T) {
	g, err := hw.Lookup("h100")
	if err != nil {
		t.Fatal(err)
	}
	for _, model := range []string{"gpt2", "qwen2.5-0.5b"} {
		for _, dp := range []int{2, 4, 8} {
			t.Run(fmt.Sprintf("%s/dp%d", model, dp), func(t *testing.T) {
				var host, copied [3]units.Bytes
				var psi float64
				for _, stage := range []int{1, 2} {
					s := Spec{Job: Job{Model: lookup(t, model), MicroBatch: 1, Seq: 256, Precision: ops.AMPBF16, Optimizer: lower.AdamW, Impl: lower.Foreach}, Target: Target{GPU: g}}
					s.DP, s.ZeRO, s.Offload = dp, stage, Offload{Optimizer: true}
					r, err := Plan(s)
					if err != nil {
						t.Fatal(err)
					}
					if r.Program == nil {
						t.Fatal("no program")
					}
					host[stage], copied[stage] = r.HostPeak, gradsToHost(r.Program)
					psi = float64(r.Sim.Params)
				}
				if host[1] != host[2] {
					t.Errorf("host peak: ZeRO-1 %d (%.3f B/param), ZeRO-2 %d (%.3f B/param)", host[1], float64(host[1])/psi, host[2], float64(host[2])/psi)
				}
				if copied[1] != copied[2] {
					t.Errorf("gradients copied to the host: ZeRO-1 %d, ZeRO-2 %d", copied[1], copied[2])
				}
				// Padding: at most DP−1 elements per tensor, far below 1 %.
				if got, want := float64(host[1])/psi, 20/float64(dp); math.Abs(got-want) > 0.01*want {
					t.Errorf("ZeRO-1 host peak %.4f B/param, want 20/DP = %.4f", got, want)
				}
				if got, want := float64(copied[1])/psi, 4/float64(dp); math.Abs(got-want) > 0.01*want {
					t.Errorf("ZeRO-1 gradient copies %.4f B/param, want 4/DP = %.4f", got, want)
				}
			})
		}
	}
}
