package allocator

import (
	"context"
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
	return ReplayProgramContext(context.Background(), p, cfg, capacity, timeline)
}

// stopEvery is how many ops ReplayProgramContext replays between looks at
// its context: a look is a few ns, 65,536 ops a few ms.
const stopEvery = 1 << 16

// ReplayProgramContext is ReplayProgram stopped by ctx: every stopEvery
// ops it returns ctx's cause once ctx is done (deepseek-v3 --accum 8's
// replays of 1.4 million ops took 3 s each, the longest step of a plan).
func ReplayProgramContext(ctx context.Context, p *ir.Program, cfg Config, capacity int64, timeline bool) (*ProgramResult, error) {
	if ctx == nil {
		ctx = context.Background()
	}
	pr := &programReplayer{p: p, res: &ProgramResult{PeakOp: -1, OOMOp: -1}}
	if err := pr.owners(); err != nil {
		return nil, err
	}
	if err := pr.lastUses(); err != nil {
		return nil, err
	}
	pr.freeLists()
	pr.carried()
	pr.a = newUnindexed(cfg, &capacityDevice{capacity: capacity})
	pr.blk, pr.live = make([]*Block, len(p.Tensors)), make([]bool, len(p.Tensors))
	if ok, err := pr.residents(); err != nil || !ok {
		return pr.res, err
	}
	pr.note(-1, 0)
	const passes = 2
	if timeline {
		pr.res.Timeline = make([]int64, len(p.Ops))
	}
	for pass := range passes {
		for oi := range p.Ops {
			if oi%stopEvery == 0 {
				if err := context.Cause(ctx); err != nil {
					return nil, err
				}
			}
			if ok, err := pr.step(oi, pass, timeline && pass == passes-1); err != nil || !ok {
				return pr.res, err
			}
		}
	}
	pr.res.Fragmentation = pr.res.PeakReserved - pr.res.AllocatedAtPeak
	pr.res.Segments = pr.a.segmentCount()
	return pr.res, nil
}

// programReplayer is one ReplayProgram. Its phases: owners (each tensor's
// storage), lastUses (each storage's last op), freeLists (the storages each
// op frees), carried (the Keep storages a Carried storage stands for), then
// on the allocator residents, and step for each op of each pass.
type programReplayer struct {
	p       *ir.Program
	a       *Allocator
	res     *ProgramResult
	owner   []ir.TensorID
	last    []int32 // each storage's last op (-1: none)
	start   []int32 // frees[start[oi]:start[oi+1]] are the storages op oi frees
	frees   []ir.TensorID
	carries [ir.NumCategories][]ir.TensorID // the Keep storages a Carried storage of category c stands for
	blk     []*Block                        // each live storage's block (nil: none)
	live    []bool
}

// owners resolves each tensor to its storage (bases come first).
func (pr *programReplayer) owners() error {
	p := pr.p
	pr.owner = make([]ir.TensorID, len(p.Tensors))
	for i := range p.Tensors {
		b := p.Tensors[i].Base
		if b == ir.NoTensor {
			pr.owner[i] = ir.TensorID(i)
			continue
		}
		if b < 0 || int(b) >= i {
			return fmt.Errorf("tensor %d (%s) has bad base %d", i, p.Tensors[i].Name, b)
		}
		pr.owner[i] = pr.owner[b]
	}
	return nil
}

// lastUses finds the last op that reads or writes each storage.
func (pr *programReplayer) lastUses() error {
	p, nt := pr.p, len(pr.p.Tensors)
	pr.last = make([]int32, nt)
	for i := range pr.last {
		pr.last[i] = -1
	}
	for oi := range p.Ops {
		op := &p.Ops[oi]
		for _, ts := range [2][]ir.TensorID{op.In, op.Out} {
			for _, t := range ts {
				if t < 0 || int(t) >= nt {
					return fmt.Errorf("op %d (%s) uses tensor %d out of range", oi, op.Name, t)
				}
				pr.last[pr.owner[t]] = int32(oi)
			}
		}
	}
	return nil
}

// freed says whether storage i is freed after its last use.
func (pr *programReplayer) freed(i int) bool {
	t := &pr.p.Tensors[i]
	return t.Base == ir.NoTensor && !t.Resident && !t.Keep && pr.last[i] >= 0
}

// freeLists lists, per op, the storages it frees (a counting sort by last
// use).
func (pr *programReplayer) freeLists() {
	p, last := pr.p, pr.last
	pr.start = make([]int32, len(p.Ops)+1)
	for i := range p.Tensors {
		if pr.freed(i) {
			pr.start[last[i]+1]++
		}
	}
	for oi := range p.Ops {
		pr.start[oi+1] += pr.start[oi]
	}
	pr.frees = make([]ir.TensorID, pr.start[len(p.Ops)])
	fill := append([]int32(nil), pr.start[:len(p.Ops)]...)
	for i := range p.Tensors {
		if pr.freed(i) {
			pr.frees[fill[last[i]]] = ir.TensorID(i)
			fill[last[i]]++
		}
	}
}

// carried collects the device Keep storages of each category.
func (pr *programReplayer) carried() {
	for i := range pr.p.Tensors {
		if t := &pr.p.Tensors[i]; t.Keep && t.Base == ir.NoTensor && !t.Host && int(t.Cat) < len(pr.carries) {
			pr.carries[t.Cat] = append(pr.carries[t.Cat], ir.TensorID(i))
		}
	}
}

// standsFor is the Keep storages a Carried storage o stands for (nil: o is
// not carried, or no Keep storage has its category).
func (pr *programReplayer) standsFor(o ir.TensorID) []ir.TensorID {
	if t := &pr.p.Tensors[o]; t.Carried && int(t.Cat) < len(pr.carries) {
		return pr.carries[t.Cat]
	}
	return nil
}

// malloc allocates size bytes for op oi of pass pass; ok is false at an
// out-of-memory, which it records in the result.
func (pr *programReplayer) malloc(size int64, oi, pass int) (*Block, bool, error) {
	if size <= 0 {
		return nil, true, nil // PyTorch hands out no block for an empty tensor
	}
	b, err := pr.a.Malloc(size, 0)
	if err != nil {
		if errors.Is(err, ErrOOM) {
			res := pr.res
			res.OOM, res.OOMOp, res.OOMPass, res.OOMMessage = true, oi, pass, err.Error()
			return nil, false, nil
		}
		return nil, false, err
	}
	return b, true, nil
}

func (pr *programReplayer) free(b *Block) error {
	if b == nil {
		return nil
	}
	return pr.a.freeBlock(b)
}

// note tracks the peaks after op oi of pass pass: the reserved peak and,
// among the ops at it, the one with the most allocated (so Fragmentation is
// what the peak itself leaves unused, as explain reports a snapshot's).
func (pr *programReplayer) note(oi, pass int) {
	a, res := pr.a, pr.res
	if a.Reserved > res.PeakReserved || a.Reserved == res.PeakReserved && (a.Allocated > res.AllocatedAtPeak || res.PeakOp < 0) {
		res.PeakReserved, res.PeakOp, res.PeakPass = a.Reserved, oi, pass
		res.AllocatedAtPeak = a.Allocated
	}
	res.PeakAllocated = max(res.PeakAllocated, a.Allocated)
	res.PeakRequested = max(res.PeakRequested, a.Requested)
}

// residents allocates the resident device storages in tensor order (host
// ones are live without a block).
func (pr *programReplayer) residents() (bool, error) {
	for i := range pr.p.Tensors {
		t := &pr.p.Tensors[i]
		if !t.Resident || t.Base != ir.NoTensor {
			continue
		}
		pr.live[i] = true
		if t.Host {
			continue
		}
		q, ok, err := pr.malloc(int64(t.Bytes), -1, 0)
		if err != nil || !ok {
			return false, err
		}
		pr.blk[i] = q
	}
	return true, nil
}

// step runs op oi of pass pass: its outputs' storages, its workspace, the
// peaks (and the timeline when record), then the workspace and the storages
// whose last use it is are freed.
func (pr *programReplayer) step(oi, pass int, record bool) (bool, error) {
	op := &pr.p.Ops[oi]
	for _, t := range op.Out {
		if ok, err := pr.allocOutput(pr.owner[t], oi, pass); err != nil || !ok {
			return false, err
		}
	}
	var ws *Block
	if op.Workspace > 0 {
		q, ok, err := pr.malloc(int64(op.Workspace), oi, pass)
		if err != nil || !ok {
			return false, err
		}
		ws = q
	}
	pr.note(oi, pass)
	if record {
		pr.res.Timeline[oi] = pr.a.Reserved
	}
	if err := pr.free(ws); err != nil {
		return false, err
	}
	for _, o := range pr.frees[pr.start[oi]:pr.start[oi+1]] {
		if err := pr.freeStorage(o); err != nil {
			return false, err
		}
	}
	return true, nil
}

// allocOutput allocates storage o when op oi first writes it: a host
// storage gets no block, a Carried one the blocks of the Keep storages it
// stands for that are not alive.
func (pr *programReplayer) allocOutput(o ir.TensorID, oi, pass int) (bool, error) {
	if pr.live[o] {
		return true, nil
	}
	pr.live[o] = true
	pr.blk[o] = nil
	if pr.p.Tensors[o].Host {
		return true, nil
	}
	if prev := pr.standsFor(o); len(prev) > 0 {
		for _, k := range prev {
			if pr.live[k] {
				continue
			}
			q, ok, err := pr.malloc(int64(pr.p.Tensors[k].Bytes), oi, pass)
			if err != nil || !ok {
				return false, err
			}
			pr.blk[k], pr.live[k] = q, true
		}
		return true, nil
	}
	q, ok, err := pr.malloc(int64(pr.p.Tensors[o].Bytes), oi, pass)
	if err != nil || !ok {
		return false, err
	}
	pr.blk[o] = q
	return true, nil
}

// freeStorage frees storage o after its last use, with the Keep storages a
// Carried one stands for.
func (pr *programReplayer) freeStorage(o ir.TensorID) error {
	if !pr.live[o] {
		return nil
	}
	pr.live[o] = false
	for _, k := range pr.standsFor(o) {
		if pr.live[k] {
			pr.live[k] = false
			if err := pr.free(pr.blk[k]); err != nil {
				return err
			}
		}
	}
	return pr.free(pr.blk[o])
}
