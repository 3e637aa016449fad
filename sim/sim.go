// Package sim replays a Program as allocation and free events and reports the
// memory ledger, the timeline, the peak and where it happens. It does no I/O
// and is deterministic: the same Program gives the same Result.
package sim

import (
	"fmt"
	"sort"
	"sync"

	"github.com/memplan/memplan/ir"
	"github.com/memplan/memplan/units"
)

// Ledger is bytes by category.
type Ledger [ir.NumCategories]units.Bytes

// Total sums the categories.
func (l *Ledger) Total() units.Bytes {
	var s units.Bytes
	for _, b := range l {
		s += b
	}
	return s
}

// Point is the memory at the high-water mark of one op: what is live after
// the op's outputs are allocated and while its workspace is held.
type Point struct {
	Op    int // index into Program.Ops
	Phase ir.Phase
	Micro int
	Total units.Bytes
	Cat   Ledger
	// Host is host-memory bytes live at the same moment (offload).
	Host units.Bytes
}

// Result is what one iteration needs.
type Result struct {
	Timeline []Point
	// Totals is each op's device total (Point.Total), when Options.Totals
	// asked for it instead of the timeline.
	Totals []units.Bytes
	// Peak is the highest Point of the iteration.
	Peak Point
	// PeakOp names the op at Peak, with its module in parentheses when it
	// has one: readable once the program is dropped (a caller that keeps
	// only numbers, engine.Options.NumbersOnly).
	PeakOp string
	// PhasePeak is the highest Point in each phase; Op is -1 for a phase the
	// program does not have.
	PhasePeak [ir.NumPhases]Point
	// ModelStates are the largest parameter, gradient and optimizer-state
	// totals seen during the iteration.
	ModelStates struct {
		Parameters, Gradients, OptimizerState units.Bytes
	}
	// SavedTotal is the bytes saved for backward that are live at the end of
	// the first micro-step's forward; SavedByModule splits it by the block
	// (ir.BlockOf) of the op that produced each storage.
	SavedTotal    units.Bytes
	SavedByModule map[string]units.Bytes
	// HostPeak is the highest host-memory total.
	HostPeak units.Bytes
	// Params is the number of parameter elements.
	Params int64
	// Allocs and Frees count storage events; every non-resident storage that
	// is allocated is freed once.
	Allocs, Frees int
	// EndLive is the device memory live after the last op (resident state).
	EndLive units.Bytes
}

// Options of RunWith.
type Options struct {
	// NoTimeline leaves Result.Timeline empty (the peaks are still
	// found): for callers that only need the peak, such as a search.
	NoTimeline bool
	// Totals fills Result.Totals with each op's device total: for callers
	// that read the curve's height alone, a twelfth of a timeline's bytes
	// (a search's in-flight extrapolation of a pipeline's first stage,
	// 5.4 of the 102 GiB the mixtral-8x7b fit probe allocated).
	Totals bool
}

// Run simulates p. It fails only on a malformed program.
func Run(p *ir.Program) (*Result, error) { return RunWith(p, Options{}) }

// scratch holds RunWith's working arrays, reused across calls (a search
// simulates thousands of programs).
type scratch struct {
	owner, frees          []ir.TensorID
	last, freeStart, fill []int32
	producer              []int32
	live                  []bool
}

var scratchPool = sync.Pool{New: func() any { return new(scratch) }}

// sized is s resized to n zeroed elements, reusing its array when it can.
func sized[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	s = s[:n]
	clear(s)
	return s
}

// RunWith is Run with options. It replays p in phases: owners (each tensor's storage), lastUses (the last op
// touching each storage), freeLists (the storages each op frees, bucketed), residents (what exists before the
// iteration), then walk (per op: allocate its outputs, record the point, free what it last used).
func RunWith(p *ir.Program, opt Options) (*Result, error) {
	sc := scratchPool.Get().(*scratch)
	defer scratchPool.Put(sc)
	rp := replay{p: p, sc: sc, opt: opt}
	if err := rp.owners(); err != nil {
		return nil, err
	}
	if err := rp.lastUses(); err != nil {
		return nil, err
	}
	rp.freeLists()
	rp.residents()
	rp.walk()
	if i := rp.r.Peak.Op; i >= 0 && i < len(p.Ops) {
		rp.r.PeakOp = p.Ops[i].Label()
	}
	return rp.r, nil
}

// replay is one RunWith: the program, the working arrays, and the live ledgers.
type replay struct {
	p   *ir.Program
	sc  *scratch
	opt Options
	r   *Result

	dev            Ledger
	devTotal, host units.Bytes // devTotal is dev.Total(), kept as dev changes
}

// owners maps each tensor to its storage (the tensor at the root of its Base chain).
func (rp *replay) owners() error {
	p, sc := rp.p, rp.sc
	sc.owner = sized(sc.owner, len(p.Tensors))
	owner := sc.owner
	for i := range p.Tensors {
		b := p.Tensors[i].Base
		if b == ir.NoTensor {
			owner[i] = ir.TensorID(i)
			continue
		}
		if b < 0 || int(b) >= i {
			return fmt.Errorf("tensor %d (%s) has bad base %d", i, p.Tensors[i].Name, b)
		}
		owner[i] = owner[b]
	}
	return nil
}

// lastUses finds the last op touching each storage.
func (rp *replay) lastUses() error {
	p, sc := rp.p, rp.sc
	nt := len(p.Tensors)
	sc.last = sized(sc.last, nt)
	last, owner := sc.last, sc.owner
	for i := range last {
		last[i] = -1
	}
	for oi := range p.Ops {
		op := &p.Ops[oi]
		for _, t := range op.In {
			if t < 0 || int(t) >= nt {
				return fmt.Errorf("op %d (%s) reads tensor %d out of range", oi, op.Name, t)
			}
			last[owner[t]] = int32(oi)
		}
		for _, t := range op.Out {
			if t < 0 || int(t) >= nt {
				return fmt.Errorf("op %d (%s) writes tensor %d out of range", oi, op.Name, t)
			}
			last[owner[t]] = int32(oi)
		}
	}
	return nil
}

// freed reports whether storage i is freed after its last use.
func (rp *replay) freed(i int) bool {
	t := &rp.p.Tensors[i]
	return t.Base == ir.NoTensor && !t.Resident && !t.Keep && rp.sc.last[i] >= 0
}

// freeLists buckets the storages freed at each op by a counting sort into one array: op oi frees
// frees[freeStart[oi]:freeStart[oi+1]].
func (rp *replay) freeLists() {
	p, sc := rp.p, rp.sc
	last := sc.last
	sc.freeStart = sized(sc.freeStart, len(p.Ops)+1)
	freeStart := sc.freeStart
	for i := range p.Tensors {
		if rp.freed(i) {
			freeStart[last[i]+1]++
		}
	}
	for oi := range p.Ops {
		freeStart[oi+1] += freeStart[oi]
	}
	sc.frees = sized(sc.frees, int(freeStart[len(p.Ops)]))
	sc.fill = append(sc.fill[:0], freeStart[:len(p.Ops)]...)
	frees, fill := sc.frees, sc.fill
	for i := range p.Tensors {
		if rp.freed(i) {
			frees[fill[last[i]]] = ir.TensorID(i)
			fill[last[i]]++
		}
	}
}

// residents starts the result and the ledgers with the storages that exist before the iteration.
func (rp *replay) residents() {
	p, sc := rp.p, rp.sc
	r := &Result{SavedByModule: map[string]units.Bytes{}}
	rp.r = r
	if !rp.opt.NoTimeline {
		r.Timeline = make([]Point, 0, len(p.Ops))
	}
	if rp.opt.Totals {
		r.Totals = make([]units.Bytes, 0, len(p.Ops))
	}
	for i := range r.PhasePeak {
		r.PhasePeak[i].Op = -1
	}
	r.Peak.Op = -1
	nt := len(p.Tensors)
	sc.live, sc.producer = sized(sc.live, nt), sized(sc.producer, nt)
	for i := range p.Tensors {
		t := &p.Tensors[i]
		if t.Resident && t.Base == ir.NoTensor {
			sc.live[i] = true
			sc.producer[i] = -1
			rp.add(t, 1)
		}
	}
	for _, id := range p.Params {
		r.Params += p.Tensors[id].Numel()
	}
}

// add counts storage t in (sign 1) or out (sign -1) of its ledger.
func (rp *replay) add(t *ir.Tensor, sign units.Bytes) {
	if t.Host {
		rp.host += sign * t.Bytes
	} else {
		rp.dev[t.Cat] += sign * t.Bytes
		rp.devTotal += sign * t.Bytes
	}
}

// walk replays the ops: each allocates the storages it writes first, is recorded at its high-water mark, and
// frees the storages it used last.
func (rp *replay) walk() {
	p, sc, r := rp.p, rp.sc, rp.r
	owner, live, producer := sc.owner, sc.live, sc.producer
	frees, freeStart := sc.frees, sc.freeStart
	endFwd := lastForwardOfFirstMicro(p)
	for oi := range p.Ops {
		op := &p.Ops[oi]
		for _, t := range op.Out {
			o := owner[t]
			if live[o] {
				continue
			}
			live[o] = true
			producer[o] = int32(oi)
			r.Allocs++
			rp.add(&p.Tensors[o], 1)
		}
		rp.record(oi, op)
		if oi == endFwd {
			rp.saved()
		}
		for _, o := range frees[freeStart[oi]:freeStart[oi+1]] {
			if !live[o] {
				continue
			}
			live[o] = false
			r.Frees++
			rp.add(&p.Tensors[o], -1)
		}
	}
	r.EndLive = rp.dev.Total()
}

// record keeps op oi's point in the timeline and the peaks. The point is built in full only where it is kept
// (the timeline, a new peak); its total is the running one plus the workspace.
func (rp *replay) record(oi int, op *ir.Op) {
	r := rp.r
	total, hostNow := rp.devTotal+op.Workspace, rp.host+op.WorkspaceHost
	point := func() Point {
		pt := Point{Op: oi, Phase: op.Phase, Micro: op.Micro, Cat: rp.dev, Host: hostNow, Total: total}
		pt.Cat[ir.Temporary] += op.Workspace
		return pt
	}
	if !rp.opt.NoTimeline {
		r.Timeline = append(r.Timeline, point())
	}
	if rp.opt.Totals {
		r.Totals = append(r.Totals, total)
	}
	if total > r.Peak.Total || r.Peak.Op < 0 {
		r.Peak = point()
	}
	if pp := &r.PhasePeak[op.Phase]; pp.Op < 0 || total > pp.Total {
		*pp = point()
	}
	if hostNow > r.HostPeak {
		r.HostPeak = hostNow
	}
	ms := &r.ModelStates
	ms.Parameters = max(ms.Parameters, rp.dev[ir.Parameter])
	ms.Gradients = max(ms.Gradients, rp.dev[ir.Gradient])
	ms.OptimizerState = max(ms.OptimizerState, rp.dev[ir.OptimizerState])
}

// saved records the activations live at the end of the first micro-step's forward, by the block of the op
// that produced each.
func (rp *replay) saved() {
	p, r := rp.p, rp.r
	live, producer := rp.sc.live, rp.sc.producer
	// Tensors come in runs made by one module: its block is found, and
	// the map added to, once per run (a sum of the same integers).
	var module, block string
	var sum units.Bytes
	run := false
	for i := range p.Tensors {
		t := &p.Tensors[i]
		if !live[i] || t.Cat != ir.Activation || t.Host || producer[i] < 0 {
			continue
		}
		r.SavedTotal += t.Bytes
		if m := p.Ops[producer[i]].Module; !run || m != module {
			if run {
				r.SavedByModule[block] += sum
			}
			module, block, sum, run = m, ir.BlockOf(m), 0, true
		}
		sum += t.Bytes
	}
	if run {
		r.SavedByModule[block] += sum
	}
}

// lastForwardOfFirstMicro is the index of the last forward op of micro-step
// 0, or -1.
func lastForwardOfFirstMicro(p *ir.Program) int {
	end := -1
	for i := range p.Ops {
		if p.Ops[i].Micro != 0 {
			break
		}
		if p.Ops[i].Phase == ir.Forward && !p.Ops[i].Recompute {
			end = i
		}
	}
	return end
}

// ModuleBytes is one row of a by-module breakdown.
type ModuleBytes struct {
	Module string
	Bytes  units.Bytes
}

// SortedSaved returns SavedByModule in execution order of the blocks' first
// appearance in p, so "model.layers.10" follows "model.layers.9".
func (r *Result) SortedSaved(p *ir.Program) []ModuleBytes {
	order := map[string]int{}
	for i := range p.Ops {
		b := ir.BlockOf(p.Ops[i].Module)
		if _, ok := order[b]; !ok {
			order[b] = i
		}
	}
	out := make([]ModuleBytes, 0, len(r.SavedByModule))
	for m, b := range r.SavedByModule {
		out = append(out, ModuleBytes{m, b})
	}
	sort.Slice(out, func(i, j int) bool {
		oi, iok := order[out[i].Module]
		oj, jok := order[out[j].Module]
		if iok != jok {
			return iok
		}
		if oi != oj {
			return oi < oj
		}
		return out[i].Module < out[j].Module
	})
	return out
}

// Check verifies r, the simulation of p with its timeline, against the
// ledger's invariants: categories add up at every event and none (nor the
// host total) goes negative; every storage allocated during the iteration
// is freed once unless it is kept; the iteration ends with only resident
// and kept device memory live. Property tests call it on every program they
// draw.
func Check(p *ir.Program, r *Result) error {
	for i, pt := range r.Timeline {
		if pt.Cat.Total() != pt.Total {
			return fmt.Errorf("event %d: categories sum to %d, total %d", i, pt.Cat.Total(), pt.Total)
		}
		for c, v := range pt.Cat {
			if v < 0 {
				return fmt.Errorf("event %d: %s is negative (%d)", i, ir.Category(c), v)
			}
		}
		if pt.Host < 0 {
			return fmt.Errorf("event %d: host memory is negative", i)
		}
	}
	keepN := 0
	var end units.Bytes
	for _, t := range p.Tensors {
		if t.Base != ir.NoTensor {
			continue
		}
		if t.Keep {
			keepN++
		}
		if (t.Keep || t.Resident) && !t.Host {
			end += t.Bytes
		}
	}
	if r.Allocs != r.Frees+keepN {
		return fmt.Errorf("%d allocations, %d frees, %d kept", r.Allocs, r.Frees, keepN)
	}
	if r.EndLive != end {
		return fmt.Errorf("the iteration ends with %d live, want resident + kept %d", r.EndLive, end)
	}
	return nil
}
