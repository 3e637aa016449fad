package engine

import (
	"testing"

	"github.com/memplan/memplan/hw"
	"github.com/memplan/memplan/units"
)

// Host memory per node is the per-GPU host peak times the job's GPUs on a
// node, and a host limit under it makes the plan not fit while the device
// still does.
func TestHostMemoryPerNode(t *testing.T) {
	g, err := hw.Lookup("h100")
	if err != nil {
		t.Fatal(err)
	}
	base := Spec{Job: Job{Model: lookup(t, "gpt2"), MicroBatch: 2, Seq: 512}, Target: Target{GPU: g}}
	base.DP, base.ZeRO, base.Offload = 16, 2, Offload{Optimizer: true}
	for _, c := range []struct {
		perNode, onNode int
	}{{0, 8}, {4, 4}, {32, 16}} {
		s := base
		s.GPUsPerNode = c.perNode
		r, err := Plan(s)
		if err != nil {
			t.Fatal(err)
		}
		if r.HostPeak <= 0 {
			t.Fatalf("optimizer offload pins no host memory")
		}
		if r.HostPeak < r.Sim.HostPeak || r.First != nil && r.HostPeak < r.First.HostPeak {
			t.Errorf("host peak %s below a simulated one", r.HostPeak)
		}
		if got := r.Spec.GPUsOnNode(); got != c.onNode {
			t.Errorf("gpus per node %d: %d GPUs on a node, want %d", c.perNode, got, c.onNode)
		}
		if r.HostPerNode != r.HostPeak*units.Bytes(c.onNode) {
			t.Errorf("host per node %s, want %s × %d", r.HostPerNode, r.HostPeak, c.onNode)
		}
		if !r.Fits {
			t.Fatalf("does not fit the device without a host limit")
		}
		s.HostMemory = r.HostPerNode
		if r, _ := Plan(s); !r.Fits || r.HostShortfall != 0 {
			t.Errorf("a host limit equal to the need does not fit")
		}
		s.HostMemory = r.HostPerNode - 1
		r2, err := Plan(s)
		if err != nil {
			t.Fatal(err)
		}
		if r2.Fits || r2.HostShortfall != 1 || r2.Shortfall != 0 {
			t.Errorf("host limit one byte short: fits %v, host shortfall %s, device shortfall %s", r2.Fits, r2.HostShortfall, r2.Shortfall)
		}
	}
	bad := base
	bad.HostMemory = -1
	if _, err := Plan(bad); err == nil {
		t.Error("negative host memory accepted")
	}
}
