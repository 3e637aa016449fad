package engine

import (
	"context"

	"github.com/memplan/memplan/allocator"
	"github.com/memplan/memplan/units"
)

// Reserved is what PyTorch's caching allocator reserves for the planned
// iteration: the program's allocations and frees replayed through the
// allocator model (allocator.ReplayProgram).
type Reserved struct {
	Config allocator.Config
	// Steady is the reported stage's iteration, First the first iteration
	// (when planned), each replayed twice from the resident state on a
	// device without limit; Capped is the replay on the capacity when the
	// unlimited one reserves more than it (the allocator then frees its
	// cache and retries, so only an OOM there means it does not fit).
	Steady, First, Capped *allocator.ProgramResult
	// Peak is the larger reserved peak of Steady and First; Fragmentation
	// what it holds beyond its live blocks.
	Peak, Fragmentation units.Bytes
	// FitsOnReserved: no request fails on the capacity (true without one).
	FitsOnReserved bool
	// DecidesFit: Fits, Shortfall and Headroom were decided on Peak.
	DecidesFit bool
}

// PredictReserved replays r's programs through the caching allocator with
// cfg. With decide, Fits, Shortfall and Headroom are decided on the reserved
// peak instead of the allocated one.
func (r *Result) PredictReserved(cfg allocator.Config, decide, timeline bool) (*Reserved, error) {
	return r.PredictReservedContext(context.Background(), cfg, decide, timeline)
}

// PredictReservedContext is PredictReserved stopped by ctx (each replay
// looks at it, allocator.ReplayProgramContext).
func (r *Result) PredictReservedContext(ctx context.Context, cfg allocator.Config, decide, timeline bool) (*Reserved, error) {
	rv := &Reserved{Config: cfg, FitsOnReserved: true}
	// The two iterations are replayed side by side: each replay owns its
	// allocator and only reads its program (deepseek-v3 --accum 8: two
	// replays of 1.4M ops, about 3 s each).
	var errFirst error
	done := make(chan struct{})
	if r.FirstProgram == nil {
		close(done)
	} else {
		go func() {
			defer close(done)
			rv.First, errFirst = allocator.ReplayProgramContext(ctx, r.FirstProgram, cfg, 0, false)
		}()
	}
	var err error
	rv.Steady, err = allocator.ReplayProgramContext(ctx, r.Program, cfg, 0, timeline)
	<-done
	if err == nil {
		err = errFirst // the steady iteration's error first, as when they were replayed in turn
	}
	if err != nil {
		return nil, err
	}
	worst := rv.Steady
	if rv.First != nil && rv.First.PeakReserved > worst.PeakReserved {
		worst = rv.First
	}
	rv.Peak, rv.Fragmentation = units.Bytes(worst.PeakReserved), units.Bytes(worst.Fragmentation)
	if r.Capacity > 0 && rv.Peak > r.Capacity {
		prog := r.Program
		if worst == rv.First {
			prog = r.FirstProgram
		}
		if rv.Capped, err = allocator.ReplayProgramContext(ctx, prog, cfg, int64(r.Capacity), false); err != nil {
			return nil, err
		}
		rv.FitsOnReserved = !rv.Capped.OOM
	}
	if decide && r.Capacity > 0 {
		rv.DecidesFit = true
		// Over --host-memory the job does not fit, whatever the device's
		// reserved peak.
		r.Fits = rv.FitsOnReserved && r.HostShortfall == 0
		r.Shortfall, r.Headroom = 0, 0
		switch { // the device's shortfall or headroom (the host's is HostShortfall)
		case !rv.FitsOnReserved:
			r.Shortfall = rv.Peak - r.Capacity
		case rv.Peak <= r.Capacity:
			r.Headroom = r.Capacity - rv.Peak
		}
	}
	r.Reserved = rv
	return rv, nil
}

// OutsideAllocator is the device memory the process holds outside the
// caching allocator: Sem.Overhead (the CUDA context and kernel images) and
// Sem.CommOverhead for each parallel group of more than one GPU (NCCL's
// buffers). nvidia-smi shows the reserved peak plus this.
func (s *Spec) OutsideAllocator() units.Bytes {
	b, ok := s.outside()
	if !ok {
		return units.MaxBytes
	}
	return b
}

// outside is OutsideAllocator by units' checked sums, false past
// units.MaxBytes: overheads of 4194303 TiB wrapped the sum negative, and
// a usable memory of millions of TiB fit every job (Validate refuses it).
func (s *Spec) outside() (units.Bytes, bool) {
	comm, ok := units.MulBytes(s.Sem.CommOverhead, int64(s.groups()))
	if !ok {
		return 0, false
	}
	return units.AddBytes(s.Sem.Overhead, comm)
}
