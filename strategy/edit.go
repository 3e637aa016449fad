package strategy

import (
	"cmp"
	"slices"
	"sync/atomic"

	"github.com/memplan/memplan/internal/chunk"
	"github.com/memplan/memplan/ir"
	"github.com/memplan/memplan/units"
)

// The editing toolkit every transform uses. A transform never modifies its input: editable (or cloneWithRoom,
// with room for what it adds) gives it a program of its own, copy-on-write (Clone shares shapes, operand lists
// and the Comm/Transfer of ops, capped, so rewriteIn and substitute replace an op's operands instead of writing
// into them). New tensors go through editor.add; new ops are collected per anchor op in editor.before/after and
// inserted in one pass by editor.finish (splice), so op indices stay those of the input while a transform
// works. Every transform that inserts ops edits this way (Checkpoint, ZeRO/FSDP/DDP, the offloads); activation
// offload, which anchors at most one copy on each side of most ops, keeps its own flat arrays and hands splice
// its anchors in order (spliceAnchors), and Checkpoint of a shared op list keeps its rewired operand lists aside
// (editor.setIn) for spliceCopy to put in place. Pipeline,
// which keeps a subset of the ops in a new order (the schedule's), cannot be said as insertions around anchors:
// it builds its op list in schedule order and compacts the tensors (ppCompact in pipeline.go).

// editable is p itself when the transform owns it, else a Clone.
func editable(p *ir.Program, own bool) *ir.Program {
	if own {
		return p
	}
	return Clone(p)
}

// cloneWithRoom is Clone with room for ops more ops and tensors more
// tensors.
func cloneWithRoom(p *ir.Program, ops, tensors int) *ir.Program {
	q := cloneTensors(p, tensors)
	q.Ops = opPool.get(len(p.Ops), len(p.Ops)+ops)
	copy(q.Ops, p.Ops)
	capOperands(q.Ops)
	return q
}

// cloneTensors is a copy of p whose tensors (with room for tensors more;
// none at all for tensors < 0, which shareTensors then shares) and
// parameter list are its own but whose op list is p's, shared until an
// editor made with sharedOps rebuilds it (finish): a transform that edits
// few ops and inserts some copies the ops once, into their final places,
// instead of cloning them and then moving them aside for the insertions.
func cloneTensors(p *ir.Program, tensors int) *ir.Program {
	q := &ir.Program{MicroBatches: p.MicroBatches, SummedGrads: p.SummedGrads}
	if tensors >= 0 {
		q.Tensors = tensorPool.get(len(p.Tensors), len(p.Tensors)+tensors)
		copy(q.Tensors, p.Tensors)
	}
	q.Ops = p.Ops[:len(p.Ops):len(p.Ops)]
	q.Params = append([]ir.TensorID(nil), p.Params...)
	q.GradOf = p.GradOf // read only: tensor ids stay those of p
	return q
}

// shareTensors is a copy of p that shares p's tensors and op list
// (SharedTensors), with a parameter list of its own: for a transform that
// only inserts ops reading existing tensors, through an editor made with
// sharedOps, which copies the op list once in finish. Copying the tensors
// too was a third of the autocast cache's cost (compare on deepseek-v2:
// 0.85 of 2.0 s, 344 of 2,100 MB allocated).
func shareTensors(p *ir.Program) *ir.Program {
	q := cloneTensors(p, -1)
	q.Tensors, q.SharedTensors = p.Tensors[:len(p.Tensors):len(p.Tensors)], true
	return q
}

// capOperands caps each op's operand lists at their length (copy-on-write:
// an append reallocates instead of writing into a list another program
// shares). It writes only the lists that have spare room: a pointer write
// while the collector marks costs a write barrier.
func capOperands(ops []ir.Op) {
	for i := range ops {
		op := &ops[i]
		if cap(op.In) != len(op.In) {
			op.In = op.In[:len(op.In):len(op.In)]
		}
		if cap(op.Out) != len(op.Out) {
			op.Out = op.Out[:len(op.Out):len(op.Out)]
		}
	}
}

// tensorSet is a set of tensor IDs as a dense bitmap over a program's
// tensors (IDs past its end are not members).
type tensorSet []bool

func (s tensorSet) has(t ir.TensorID) bool { return t >= 0 && int(t) < len(s) && s[t] }

// paramSet is the set of p's parameters.
func paramSet(p *ir.Program) tensorSet {
	s := make(tensorSet, len(p.Tensors))
	for _, id := range p.Params {
		s[id] = true
	}
	return s
}

// rewriteIn replaces each operand t of op.In (at position i) by f(i, t).
// Operand lists are shared between programs (Clone), so the list is copied
// (cut from ids) at its first change instead of written into.
func rewriteIn(op *ir.Op, ids *chunk.Slices[ir.TensorID], f func(i int, t ir.TensorID) ir.TensorID) {
	in := op.In
	copied := false
	for i, t := range in {
		if r := f(i, t); r != t {
			if !copied {
				op.In = ids.Clone(in)
				copied = true
			}
			op.In[i] = r
		}
	}
}

// reverse inverts a one-to-one map.
func reverse(m map[ir.TensorID]ir.TensorID) map[ir.TensorID]ir.TensorID {
	r := make(map[ir.TensorID]ir.TensorID, len(m))
	for k, v := range m {
		r[v] = k
	}
	return r
}

func containsTensor(ts []ir.TensorID, x ir.TensorID) bool {
	for _, t := range ts {
		if t == x {
			return true
		}
	}
	return false
}

// substitute rewrites op's inputs through m.
func (e *editor) substitute(op *ir.Op, m map[ir.TensorID]ir.TensorID) {
	rewriteIn(op, &e.ids, func(_ int, t ir.TensorID) ir.TensorID {
		if r, ok := m[t]; ok {
			return r
		}
		return t
	})
}

// shardTensor shrinks t to one rank's shard of n: ceil(numel/n) elements
// (its new shape cut from shapes).
func shardTensor(t *ir.Tensor, n int, shapes *chunk.Slices[int64]) {
	numel := t.Numel()
	if numel <= 0 || t.DType.Size(numel) != t.Bytes {
		t.Bytes = ceilBytes(t.Bytes, n)
		return
	}
	s := (numel + int64(n) - 1) / int64(n)
	t.Shape = shapes.One(s)
	t.Bytes = t.DType.Size(s)
}

func ceilBytes(b units.Bytes, n int) units.Bytes {
	return (b + units.Bytes(n) - 1) / units.Bytes(n)
}

// editor collects insertions around the ops of a cloned program and new
// tensors, then rebuilds the op list once.
type editor struct {
	p *ir.Program
	// before and after hold the ops to insert around an op index (sparse:
	// transforms insert around few ops of many).
	before, after map[int][]ir.Op
	owners        []ir.TensorID
	shardsOf      map[ir.TensorID]ir.TensorID // gradient → its shard
	// shared is set (sharedOps) while p.Ops is still the input's
	// (cloneTensors): ops are edited through edit, into edits, and finish
	// copies the op list once with the insertions and edits in place.
	shared bool
	edits  []opEdit // ascending op index
	// ins are operand lists replaced (setIn), in the order made, sorted
	// by finish; inOf is 1 + each op's index in ins (0: none).
	ins  []inEdit
	inOf []int32
	// What the transform adds, cut from shared chunks (ZeRO-3 names and
	// gathers a parameter per micro-step and phase: 3.3 million small
	// allocations in deepseek-v3 --pp 8 --dp 4 --zero 3).
	ids    chunk.Slices[ir.TensorID]
	shapes chunk.Slices[int64]
	names  chunk.Strings
	comms  chunk.Slices[ir.Comm]
}

// opEdit is the edited copy of op at of a shared op list.
type opEdit struct {
	at int
	op ir.Op
}

// inEdit is the operand list op at of a shared op list reads instead of
// its own.
type inEdit struct {
	at int
	in []ir.TensorID
}

// sharedOps marks e's op list as the input's (cloneTensors) and returns e.
func (e *editor) sharedOps() *editor {
	e.shared = true
	return e
}

// edit is op oi to modify: the op itself when the editor owns the op list,
// else a copy that finish puts in its place (valid until the next edit;
// call edit at most once per op, in ascending order).
func (e *editor) edit(oi int) *ir.Op {
	if !e.shared {
		return &e.p.Ops[oi]
	}
	e.edits = append(e.edits, opEdit{at: oi, op: e.p.Ops[oi]})
	return &e.edits[len(e.edits)-1].op
}

// in is the operands op oi reads, as replaced so far (setIn).
func (e *editor) in(oi int) []ir.TensorID {
	if e.inOf != nil {
		if k := e.inOf[oi]; k > 0 {
			return e.ins[k-1].in
		}
	}
	return e.p.Ops[oi].In
}

// setIn makes op oi read in (a list of its own) instead: in place when
// the editor owns the op list, else as an edit that finish puts in the copy
// (ops in any order, again and again: Checkpoint rewires each segment's
// backward ops, and segments run backward in reverse). Only the operand
// list is kept aside, not the op: under full checkpointing nearly every
// backward op is rewired, and copies of whole ops (editor.edit) cost more
// than cloning the list and splicing it (plan deepseek-v3 --accum 4
// --checkpoint auto). A transform replaces operand lists this way or edits
// ops through edit, not both.
func (e *editor) setIn(oi int, in []ir.TensorID) {
	if !e.shared {
		e.p.Ops[oi].In = in
		return
	}
	if e.inOf == nil {
		e.inOf = make([]int32, len(e.p.Ops))
	}
	if k := e.inOf[oi]; k > 0 {
		e.ins[k-1].in = in
		return
	}
	e.ins = append(e.ins, inEdit{at: oi, in: in})
	e.inOf[oi] = int32(len(e.ins))
}

func newEditor(q *ir.Program) *editor {
	e := &editor{p: q, before: map[int][]ir.Op{}, after: map[int][]ir.Op{}, shardsOf: map[ir.TensorID]ir.TensorID{}}
	e.owners = ir.Storages(q.Tensors)
	return e
}

// newInserter is an editor for a transform that only inserts ops and adds tensors (Checkpoint): it builds no
// owner table (owner resolves a tensor on demand) and no shard map, which a search's thousands of plans would pay
// for on every apply.
func newInserter(q *ir.Program) *editor {
	return &editor{p: q, before: map[int][]ir.Op{}}
}

// owner returns the storage of t (tensors added later resolve on demand).
func (e *editor) owner(t ir.TensorID) ir.TensorID {
	if int(t) < len(e.owners) {
		return e.owners[t]
	}
	return ir.Storage(e.p.Tensors, t)
}

func (e *editor) add(t ir.Tensor) ir.TensorID {
	e.p.Tensors = append(e.p.Tensors, t)
	return ir.TensorID(len(e.p.Tensors) - 1)
}

// firstWriters maps each tensor to the first op that writes it (-1: none).
func (e *editor) firstWriters() []int {
	fw := make([]int, len(e.p.Tensors))
	for i := range fw {
		fw[i] = -1
	}
	for oi := range e.p.Ops {
		for _, t := range e.p.Ops[oi].Out {
			if fw[t] < 0 {
				fw[t] = oi
			}
		}
	}
	return fw
}

// lastBackward is the index of micro-step m's last backward op, or -1.
func (e *editor) lastBackward(m int) int {
	last := -1
	for oi := range e.p.Ops {
		if op := &e.p.Ops[oi]; op.Phase == ir.Backward && op.Micro == m {
			last = oi
		}
	}
	return last
}

// finish splices the insertions into the op list.
func (e *editor) finish() *ir.Program {
	if e.shared {
		slices.SortFunc(e.ins, func(a, b inEdit) int { return cmp.Compare(a.at, b.at) })
		e.p.Ops = spliceCopy(e.p.Ops, e.before, e.after, e.edits, e.ins)
		e.shared, e.edits, e.ins, e.inOf = false, nil, nil, nil
		return e.p
	}
	e.p.Ops = splice(e.p.Ops, e.before, e.after)
	return e.p
}

// moves counts the op lists splice and spliceCopy moved into a new array.
var moves atomic.Int64

// Moves is how many times an edit moved a whole op list into a new array
// (a copy of a shared list, or an insertion without room): tests check
// that a program made for one plan is checkpointed and given autocast's
// exits in place.
func Moves() int64 { return moves.Load() }

// spliceRoom is the spare capacity spliceCopy leaves after n ops: room for
// the autocast cache's exits that Chain's last transform inserts in place
// (one per region, and a region is many ops), without the quarter more
// that Clone leaves for transforms that may add an op per op. A transform
// that needs more still gets it: splice then copies into a larger array.
func spliceRoom(n int) int { return n/64 + 16 }

// anchor is an op index with the ops inserted before and after it.
type anchor struct {
	i             int
	before, after []ir.Op
}

// anchors are the ops that before or after insert around, by ascending
// index, with their insertions, and the number of ops after the splice. The
// maps are walked, not looked up: activation offload anchors a pack or an
// unpack at most ops, and a lookup per anchor into maps that large (0.6 s
// of compare deepseek-v3's) missed the cache each time. Many anchors among
// n ops are put in order by their index (byIndex), not sorted: sorting
// activation offload's half a million anchors, 56 bytes each, took 1.3 s of
// deepseek-v3 --pp 8 --accum 16 --offload activations' plan.
func anchors(n int, before, after map[int][]ir.Op) ([]anchor, int) {
	at := make([]anchor, 0, len(before)+len(after))
	total := n
	for i, ops := range before {
		total += len(ops)
		at = append(at, anchor{i: i, before: ops})
	}
	for i, ops := range after {
		total += len(ops)
		at = append(at, anchor{i: i, after: ops})
	}
	if len(at) >= n/16 {
		return byIndex(at, n), total
	}
	slices.SortFunc(at, func(a, b anchor) int { return cmp.Compare(a.i, b.i) })
	// An op with insertions on both sides is two entries, now side by side,
	// one from each map.
	w := 0
	for _, a := range at {
		if w > 0 && at[w-1].i == a.i {
			if len(a.before) > 0 {
				at[w-1].before = a.before
			}
			if len(a.after) > 0 {
				at[w-1].after = a.after
			}
			continue
		}
		at[w] = a
		w++
	}
	return at[:w], total
}

// byIndex is anchors at (indices in [0, n), each at most twice: once with
// insertions before, once after) merged by index and in its order, through
// a table of the n indices.
func byIndex(at []anchor, n int) []anchor {
	slot := make([]int32, n) // 1 + the entry of at holding index i, or 0
	for k, a := range at {
		if j := slot[a.i]; j > 0 {
			at[j-1].after = a.after // the second entry of an index is after's
			continue
		}
		slot[a.i] = int32(k + 1)
	}
	out := make([]anchor, 0, len(at))
	for _, j := range slot {
		if j > 0 {
			out = append(out, at[j-1])
		}
	}
	return out
}

// spliceCopy is splice of a shared op list (old, which it leaves alone)
// into a new one, with edits (ascending) in place of the ops they edit. Its
// operand lists are capped, as Clone's. It leaves room (spliceRoom) for
// the ops a later transform of a chain inserts in place.
func spliceCopy(old []ir.Op, before, after map[int][]ir.Op, edits []opEdit, ins []inEdit) []ir.Op {
	moves.Add(1)
	at, n := anchors(len(old), before, after)
	ops := opPool.get(0, n+spliceRoom(n))
	// old[:next] is copied, edits[:k] and ins[:m] placed; put copies
	// old[next:end] with the edits among them in place, run copies
	// old[from:to] with the operand lists of ins among them.
	next, k, m := 0, 0, 0
	run := func(from, to int) {
		base := len(ops) - from
		ops = append(ops, old[from:to]...)
		for ; m < len(ins) && ins[m].at < to; m++ {
			ops[base+ins[m].at].In = ins[m].in
		}
	}
	put := func(end int) {
		for ; k < len(edits) && edits[k].at < end; k++ {
			run(next, edits[k].at)
			ops = append(ops, edits[k].op)
			next = edits[k].at + 1
		}
		run(next, end)
		next = end
	}
	for _, a := range at {
		put(a.i)
		ops = append(ops, a.before...)
		put(a.i + 1)
		ops = append(ops, a.after...)
	}
	put(len(old))
	capOperands(ops)
	return ops
}

// splice inserts before[i] before and after[i] after op i of old, which
// the caller owns (a transform's copy) and must not use afterwards. It
// works in place when old has the room (Clone leaves some).
func splice(old []ir.Op, before, after map[int][]ir.Op) []ir.Op {
	at, n := anchors(len(old), before, after)
	return spliceAnchors(old, at, n)
}

// spliceAnchors is splice of the insertions at (ascending indices), n ops
// in all after it.
func spliceAnchors(old []ir.Op, at []anchor, n int) []ir.Op {
	if n == len(old) {
		return old
	}
	if cap(old) >= n {
		// From the back, each op moves right by the insertions before it,
		// which never overwrites an op not yet moved.
		ops := old[:n]
		w, r := n, len(old) // ops[w:] is final; old[:r] not yet moved
		for j := len(at) - 1; j >= 0; j-- {
			a := &at[j]
			i := a.i
			w -= copy(ops[w-(r-i-1):w], old[i+1:r])
			w -= copy(ops[w-len(a.after):w], a.after)
			w--
			ops[w] = old[i]
			w -= copy(ops[w-len(a.before):w], a.before)
			r = i
		}
		return ops
	}
	moves.Add(1)
	ops := opPool.get(0, n)
	next := 0 // first op not yet copied
	for _, a := range at {
		ops = append(ops, old[next:a.i]...)
		ops = append(ops, a.before...)
		ops = append(ops, old[a.i])
		ops = append(ops, a.after...)
		next = a.i + 1
	}
	ops = append(ops, old[next:]...)
	opPool.put(old) // the caller's own (a transform's copy), now replaced
	return ops
}
