package hw_test

import (
	"errors"
	"fmt"

	"github.com/memplan/memplan/hw"
	"github.com/memplan/memplan/units"
)

func Example() {
	g, err := hw.Lookup("H100")
	if err != nil {
		panic(err)
	}
	fmt.Println(g.Name, g.Capacity())
	fmt.Printf("bf16 %.1f TFLOPS, HBM %.2f TB/s, %s\n",
		g.PeakFLOPs(units.BF16)/1e12, g.MemBandwidth/1e12, g.HostLink)

	_, err = hw.Lookup("h1000")
	fmt.Println(errors.Is(err, hw.ErrUnknownGPU))
	fmt.Println(err)
	// Output:
	// h100-sxm 79.19 GiB
	// bf16 989.4 TFLOPS, HBM 3.35 TB/s, PCIe Gen5 x16 (63.0 GB/s/dir)
	// true
	// unknown GPU "h1000"; closest: h100-sxm, a100-80gb, h200
}
