package strategy

import (
	"fmt"

	"github.com/memplan/memplan/ir"
)

// FSDP is PyTorch FullyShardedDataParallel with FULL_SHARD over DP ranks:
// the stage-3 rewrite of ZeRO (see there) under FSDP's name.
type FSDP struct {
	DP       int
	Prefetch int
}

// Name implements Transform.
func (f *FSDP) Name() string { return "fsdp" }

// Apply implements Transform.
func (f *FSDP) Apply(p *ir.Program) (*ir.Program, error) {
	if f.DP < 2 {
		return nil, fmt.Errorf("FSDP needs at least 2 data-parallel ranks; with %d it changes nothing", max(f.DP, 1))
	}
	z := &ZeRO{Stage: 3, DP: f.DP, Prefetch: f.Prefetch, name: "fsdp"}
	return z.Apply(p)
}
