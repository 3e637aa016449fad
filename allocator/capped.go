package allocator

import (
	"context"
	"errors"

	"github.com/memplan/memplan/snapshot"
)

// CappedResult is a snapshot's trace replayed on a device of smaller
// capacity (ReplayCapped).
type CappedResult struct {
	// OOM: a request failed even after the allocator freed its cache;
	// Event is its trace index (-1: the memory alive before recording does
	// not fit), Size the request, Message the allocator's.
	OOM     bool
	Event   int
	Size    int64
	Message string
	// Reserved and Allocated are the model's totals when it failed (at the
	// end of the trace when it did not).
	Reserved, Allocated int64
}

// ReplayCapped replays device dev's recorded allocations and frees through
// the caching allocator, with the settings the snapshot recorded, on a device
// of capacity bytes: the blocks alive before recording first (in address
// order), then every alloc and free of the trace in order. The model makes
// its own segments, so the trace's segment events are not consulted; a
// block is freed at free_completed (at free_requested in traces without
// free_completed). It says where a run with this allocation order would
// have stopped with "CUDA out of memory".
func ReplayCapped(s *snapshot.Snapshot, dev, capacity int64) (*CappedResult, error) {
	return ReplayCappedContext(context.Background(), s, dev, capacity)
}

// ReplayCappedContext is ReplayCapped stopped by ctx, as
// ReplayDeviceContext is.
func ReplayCappedContext(ctx context.Context, s *snapshot.Snapshot, dev, capacity int64) (*CappedResult, error) {
	r, err := ReplayDeviceContext(ctx, s, dev)
	if err != nil {
		return nil, err
	}
	var trace []snapshot.Event
	if dev >= 0 && int(dev) < len(s.Traces) {
		trace = s.Traces[dev]
	}
	completes := false
	for _, e := range trace {
		if e.Action == snapshot.FreeCompleted {
			completes = true
			break
		}
	}
	a := New(ConfigOf(s.Settings), &capacityDevice{capacity: capacity})
	res := &CappedResult{Event: -1}
	ptr := map[int64]int64{} // recorded address -> the model's block
	fail := func(ev int, size int64, err error) (*CappedResult, error) {
		if !errors.Is(err, ErrOOM) {
			return nil, err
		}
		res.OOM, res.Event, res.Size, res.Message = true, ev, size, err.Error()
		res.Reserved, res.Allocated = a.Reserved, a.Allocated
		return res, nil
	}
	for _, pb := range r.PreExisting {
		b, err := a.Malloc(pb.Requested, pb.Stream)
		if err != nil {
			return fail(-1, pb.Requested, err)
		}
		ptr[pb.Addr] = b.Ptr
	}
	for i, e := range trace {
		if i%stopEvery == 0 && ctx.Err() != nil {
			return nil, context.Cause(ctx)
		}
		switch {
		case e.Action == snapshot.Alloc:
			b, err := a.Malloc(e.Size, e.Stream)
			if err != nil {
				return fail(i, e.Size, err)
			}
			ptr[e.Addr] = b.Ptr
		case e.Action == snapshot.FreeCompleted || !completes && e.Action == snapshot.FreeRequested:
			q, ok := ptr[e.Addr]
			if !ok {
				continue // a block the trace never handed out (the reader's replay already refused real inconsistencies)
			}
			delete(ptr, e.Addr)
			if err := a.Free(q); err != nil {
				return nil, err
			}
		}
	}
	res.Reserved, res.Allocated = a.Reserved, a.Allocated
	return res, nil
}
