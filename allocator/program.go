package allocator

import (
	"errors"
	"fmt"

	"github.com/memplan/memplan/ir"
)

// ProgramResult is what the caching allocator reserves for one of memplan's
// simulated iterations (ReplayProgram).
type ProgramResult struct {
	// PeakReserved is the highest reserved total (segments, or mapped pages
	// of expandable segments); PeakOp the op at it with the most allocated
	// (-1: the resident state before the first op) and PeakPass the pass (0: the first iteration after the resident
	// state was allocated, 1: the next, which starts from its cache).
	PeakReserved     int64
	PeakOp, PeakPass int
	// AllocatedAtPeak is the block bytes handed out at the reserved peak;
	// Fragmentation = PeakReserved − AllocatedAtPeak is the cached and
	// split-off memory no live block uses there.
	AllocatedAtPeak, Fragmentation int64
	// Segments is the number of segments (cudaMalloc calls or mapped runs)
	// at the end of the replay.
	Segments int
	// PeakAllocated is the highest block bytes (requests rounded to blocks)
	// and PeakRequested the highest requested bytes (the simulator's
	// allocated peak, host storages aside).
	PeakAllocated, PeakRequested int64
	// OOM is set when the device could not serve a request even after the
	// cache was released: the op, the pass and the allocator's message.
	OOM            bool
	OOMOp, OOMPass int
	OOMMessage     string
	// Timeline is the reserved bytes at each op's high-water mark during
	// the last pass (nil unless asked for).
	Timeline []int64
}

// capacityDevice hands out segments up to a capacity (0: unlimited), at
// increasing addresses.
type capacityDevice struct {
	next, used, capacity int64
}

func (d *capacityDevice) room(size int64) bool {
	return d.capacity <= 0 || d.used+size <= d.capacity
}

func (d *capacityDevice) Malloc(size int64) (int64, bool) {
	if !d.room(size) {
		return 0, false
	}
	p := d.next
	d.next += size
	d.used += size
	return p, true
}
func (d *capacityDevice) Free(ptr, size int64) { d.used -= size }
func (d *capacityDevice) Reserve(size int64) int64 {
	p := d.next
	d.next += size
	return p
}
func (d *capacityDevice) Map(ptr, size int64) bool {
	if !d.room(size) {
		return false
	}
	d.used += size
	return true
}
func (d *capacityDevice) Unmap(ptr, size int64) { d.used -= size }

// ReplayProgram runs the allocations and frees of p, in the order the
// simulator (package sim) makes them, through the caching allocator with
// configuration cfg on a device of capacity bytes (0: unlimited):
//
//   - resident storages (parameters, buffers, steady-state optimizer state)
//     are allocated first, in tensor order, as a model and its optimizer
//     state are created before the first step;
//   - each op allocates the storages it writes first, then its workspace;
//     the workspace is freed when the op ends and every storage after its
//     last use; Keep storages (lazily created optimizer state) are never
//     freed; host storages never reach the device allocator;
//   - the iteration runs twice: the second starts from the cache the first
//     left, as every step after the first does (reserved memory only grows
//     without torch.cuda.empty_cache, so two passes show the steady peak);
//   - a Carried storage (what the previous iteration left alive) is the
//     previous pass's Keep storages of its category, block by block: its op
//     allocates those not alive (the first pass: the iteration before it),
//     and its free frees them, so the next backward allocates them anew
//     (gradients zeroed after the forward are the previous step's until
//     zero_grad sets them to None). Without Keep storages of its category
//     it is one block of its size.
//
// Every request is on one stream (the default stream: autograd runs backward
// on the stream of the forward); NCCL's own buffers are not allocations of
// the caching allocator and are not in p.
func ReplayProgram(p *ir.Program, cfg Config, capacity int64, timeline bool) (*ProgramResult, error) {
	nt := len(p.Tensors)
	owner := make([]ir.TensorID, nt)
	for i := range p.Tensors {
		b := p.Tensors[i].Base
		if b == ir.NoTensor {
			owner[i] = ir.TensorID(i)
			continue
		}
		if b < 0 || int(b) >= i {
			return nil, fmt.Errorf("tensor %d (%s) has bad base %d", i, p.Tensors[i].Name, b)
		}
		owner[i] = owner[b]
	}
	last := make([]int32, nt)
	for i := range last {
		last[i] = -1
	}
	for oi := range p.Ops {
		op := &p.Ops[oi]
		for _, ts := range [2][]ir.TensorID{op.In, op.Out} {
			for _, t := range ts {
				if t < 0 || int(t) >= nt {
					return nil, fmt.Errorf("op %d (%s) uses tensor %d out of range", oi, op.Name, t)
				}
				last[owner[t]] = int32(oi)
			}
		}
	}
	// frees[start[oi]:start[oi+1]] are the storages op oi frees.
	start := make([]int32, len(p.Ops)+1)
	freed := func(i int) bool {
		t := &p.Tensors[i]
		return t.Base == ir.NoTensor && !t.Resident && !t.Keep && last[i] >= 0
	}
	for i := range p.Tensors {
		if freed(i) {
			start[last[i]+1]++
		}
	}
	for oi := range p.Ops {
		start[oi+1] += start[oi]
	}
	frees := make([]ir.TensorID, start[len(p.Ops)])
	fill := append([]int32(nil), start[:len(p.Ops)]...)
	for i := range p.Tensors {
		if freed(i) {
			frees[fill[last[i]]] = ir.TensorID(i)
			fill[last[i]]++
		}
	}

	// carries[c] are the Keep storages a Carried storage of category c
	// stands for.
	var carries [ir.NumCategories][]ir.TensorID
	for i := range p.Tensors {
		if t := &p.Tensors[i]; t.Keep && t.Base == ir.NoTensor && !t.Host && int(t.Cat) < len(carries) {
			carries[t.Cat] = append(carries[t.Cat], ir.TensorID(i))
		}
	}
	standsFor := func(o ir.TensorID) []ir.TensorID {
		if t := &p.Tensors[o]; t.Carried && int(t.Cat) < len(carries) {
			return carries[t.Cat]
		}
		return nil
	}

	dev := &capacityDevice{capacity: capacity}
	a := New(cfg, dev)
	res := &ProgramResult{PeakOp: -1, OOMOp: -1}
	ptr := make([]int64, nt)
	live := make([]bool, nt)
	malloc := func(size int64, oi, pass int) (int64, bool, error) {
		if size <= 0 {
			return -1, true, nil // PyTorch hands out no block for an empty tensor
		}
		b, err := a.Malloc(size, 0)
		if err != nil {
			if errors.Is(err, ErrOOM) {
				res.OOM, res.OOMOp, res.OOMPass, res.OOMMessage = true, oi, pass, err.Error()
				return 0, false, nil
			}
			return 0, false, err
		}
		return b.Ptr, true, nil
	}
	free := func(q int64) error {
		if q < 0 {
			return nil
		}
		return a.Free(q)
	}
	note := func(oi, pass int) {
		// The reserved peak; among the ops at it, the one with the most
		// allocated (so Fragmentation is what the peak itself leaves
		// unused, as explain reports a snapshot's).
		if a.Reserved > res.PeakReserved || a.Reserved == res.PeakReserved && (a.Allocated > res.AllocatedAtPeak || res.PeakOp < 0) {
			res.PeakReserved, res.PeakOp, res.PeakPass = a.Reserved, oi, pass
			res.AllocatedAtPeak = a.Allocated
		}
		res.PeakAllocated = max(res.PeakAllocated, a.Allocated)
		res.PeakRequested = max(res.PeakRequested, a.Requested)
	}
	for i := range p.Tensors {
		t := &p.Tensors[i]
		if t.Resident && t.Base == ir.NoTensor && !t.Host {
			q, ok, err := malloc(int64(t.Bytes), -1, 0)
			if err != nil || !ok {
				return res, err
			}
			ptr[i], live[i] = q, true
		} else if t.Resident && t.Base == ir.NoTensor {
			live[i] = true
		}
	}
	note(-1, 0)
	const passes = 2
	if timeline {
		res.Timeline = make([]int64, len(p.Ops))
	}
	for pass := range passes {
		for oi := range p.Ops {
			op := &p.Ops[oi]
			for _, t := range op.Out {
				o := owner[t]
				if live[o] {
					continue
				}
				live[o] = true
				ptr[o] = -1
				if p.Tensors[o].Host {
					continue
				}
				if prev := standsFor(o); len(prev) > 0 {
					for _, k := range prev {
						if live[k] {
							continue
						}
						q, ok, err := malloc(int64(p.Tensors[k].Bytes), oi, pass)
						if err != nil || !ok {
							return res, err
						}
						ptr[k], live[k] = q, true
					}
					continue
				}
				q, ok, err := malloc(int64(p.Tensors[o].Bytes), oi, pass)
				if err != nil || !ok {
					return res, err
				}
				ptr[o] = q
			}
			ws := int64(-1)
			if op.Workspace > 0 {
				q, ok, err := malloc(int64(op.Workspace), oi, pass)
				if err != nil || !ok {
					return res, err
				}
				ws = q
			}
			note(oi, pass)
			if timeline && pass == passes-1 {
				res.Timeline[oi] = a.Reserved
			}
			if err := free(ws); err != nil {
				return res, err
			}
			for _, o := range frees[start[oi]:start[oi+1]] {
				if !live[o] {
					continue
				}
				live[o] = false
				for _, k := range standsFor(o) {
					if live[k] {
						live[k] = false
						if err := free(ptr[k]); err != nil {
							return res, err
						}
					}
				}
				if err := free(ptr[o]); err != nil {
					return res, err
				}
			}
		}
	}
	res.Fragmentation = res.PeakReserved - res.AllocatedAtPeak
	res.Segments = len(a.Segments())
	return res, nil
}
