package cost_test

import (
	"fmt"
	"time"

	"github.com/memplan/memplan/cost"
)

func Example() {
	// An H100 SXM (989.4 dense BF16 TFLOPS, 3.35 TB/s): a 4096×4096×4096
	// bf16 matmul is compute-bound.
	const peak, bandwidth = 989.4e12, 3.35e12
	mm, _ := cost.Roofline(2*4096*4096*4096, 3*2*4096*4096, peak, bandwidth, cost.DefaultEfficiency())
	fmt.Println("matmul:", mm)

	// Ring all-reduce of 1 GB of gradients on 8 ranks at 100 GB/s, α = 0.
	ar, _ := cost.Cost(cost.AllReduce, 1e9, cost.Network{Ranks: 8, Bandwidth: 100e9})
	fmt.Println("all-reduce:", ar)

	// Offload 1 GB over PCIe Gen4 (31.5 GB/s) after layer 0 of three 20 ms
	// layers; only the end of the step waits for it.
	off, _ := cost.Transfer(1e9, cost.Link{Bandwidth: 31.5e9})
	s, _ := cost.Overlap(
		[]time.Duration{20 * time.Millisecond, 20 * time.Millisecond, 20 * time.Millisecond},
		[]cost.Copy{{Duration: off, IssueAt: 1, NeededBy: 3}},
	)
	fmt.Println("offload:", off, "step:", s.Total, "exposed:", s.Exposed)

	mfu, _ := cost.MFU(30e12, s.Total, peak)
	fmt.Printf("MFU: %.1f%%\n", 100*mfu)
	// Output:
	// matmul: 138.911µs
	// all-reduce: 17.5ms
	// offload: 31.746032ms step: 60ms exposed: 0s
	// MFU: 50.5%
}
