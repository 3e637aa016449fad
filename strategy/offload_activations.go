package strategy

import (
	"slices"

	"github.com/memplan/memplan/internal/chunk"
	"github.com/memplan/memplan/ir"
)

// ActivationOffload is torch.autograd.graph.save_on_cpu: every storage saved
// for backward (Cat Activation, produced by the forward, not resident) is
// copied to pinned host memory right after the forward's last write to it
// ("save_on_cpu.pack", Transfer{ToHost: true}, writing a Host tensor of the
// same bytes, which the host ledger counts), so its device copy lives only
// until its last forward use. Before each backward op that reads it, a
// "save_on_cpu.unpack" (Transfer{ToHost: false}) writes a fresh device copy
// that the op reads instead and that dies with it; the host copy dies at its
// last unpack. Copies are synchronous: the program has no overlap, so the
// device peak never rises.
//
// Parameters are not offloaded. PyTorch's save_on_cpu packs every saved
// tensor, parameters included (a linear saves its weight), which would put a
// second copy of the weights in pinned memory and unpack a device copy of
// each weight in backward while the resident weight is still there;
// torchtune's OffloadActivations skips parameters for exactly that reason,
// and so do we (only Cat Activation is moved: inputs and buffers stay).
// Tensors recomputed in backward (checkpointing) are not offloaded either.
type ActivationOffload struct{}

// Name implements Transform.
func (*ActivationOffload) Name() string { return "offload-activations" }

// Apply implements Transform.
func (x *ActivationOffload) Apply(p *ir.Program) (*ir.Program, error) { return x.apply(p, false) }

func (x *ActivationOffload) apply(p *ir.Program, own bool) (*ir.Program, error) {
	ao := &actOffloader{q: p, e: newEditor(p), nt: len(p.Tensors)}
	last := ao.candidates()
	ao.countPacks(last)
	packOps, unpackOps, tensors := ao.room(last)
	if !own {
		// The copy gets room for what the rewrite adds (a quarter
		// more was too little on a mixture of experts, and finish
		// copied every op again into a larger array).
		ao.q = cloneWithRoom(p, packOps+unpackOps, tensors)
		ao.e.p = ao.q
	} else {
		// Grown once, not doubled by each add (1.2 s of deepseek-v3
		// --pp 8 --accum 16 --offload activations' 13): a shared array
		// is capped at its length, so this copies it.
		p.Tensors = slices.Grow(p.Tensors, tensors)
	}
	ao.packs = make([]ir.Op, 0, packOps)
	if ao.pack(last) == 0 {
		return ao.q, nil
	}
	ao.unpacks, ao.unpackAt = make([]ir.Op, 0, unpackOps), make([]int32, 0, unpackOps)
	for oi := range ao.q.Ops {
		ao.unpack(oi)
	}
	return ao.finish(), nil
}

// actOffloader is one ActivationOffload.apply. Its phases: candidates (the saved activations that qualify),
// pack (a host copy of each, written after the forward's last write to it, one pack op per producing op),
// then unpack per backward op (a fresh device copy of each moved storage it reads, and of the views it reads
// of them).
type actOffloader struct {
	q    *ir.Program
	e    *editor
	nt   int           // tensors before the rewrite
	host []ir.TensorID // storage → its host copy (NoTensor: stays)
	// The names, transfers and remapped operands of the copies, cut from
	// a few large arrays.
	names     chunk.Strings
	transfers chunk.Slices[ir.Transfer]
	ids       chunk.Slices[ir.TensorID]
	remap     []ir.TensorID // pairs (tensor, its device copy) of one backward op
	in, out   []ir.TensorID // one unpack op's operands, before they are cut
	per       []int32       // storages each op's pack copies (its operand lists are cut at that length)
	// The ops inserted, in flat arrays rather than the editor's maps
	// (half a million anchors in deepseek-v3 --pp 8 --accum 16's stage:
	// a map entry and a slice of one op each): at most one pack after an
	// op (packs[packOf[op]-1]) and one unpack before one (unpacks[k]
	// before op unpackAt[k], ascending).
	packs, unpacks []ir.Op
	packOf         []int32
	unpackAt       []int32
	up             ir.Op // the unpack unpack builds
	hasUp          bool
}

// countPacks counts, per op, the candidates (lastFwdWrite) it last writes:
// the storages its pack op copies.
func (ao *actOffloader) countPacks(lastFwdWrite []int) {
	ao.per = make([]int32, len(ao.q.Ops))
	for _, at := range lastFwdWrite {
		if at >= 0 {
			ao.per[at]++
		}
	}
}

// room bounds what the rewrite adds, from the candidates (lastFwdWrite,
// counted per op by countPacks): a pack op per producing op (packs) and a
// host copy per storage, an unpack op per backward op that reads a moved
// storage (unpacks) and a device copy per tensor it reads (each view of a
// moved storage brings its base).
func (ao *actOffloader) room(lastFwdWrite []int) (packs, unpacks, tensors int) {
	for _, n := range ao.per {
		if n > 0 {
			packs++
			tensors += int(n)
		}
	}
	for i := range ao.q.Ops {
		op := &ao.q.Ops[i]
		if op.Phase != ir.Backward {
			continue
		}
		if slices.ContainsFunc(op.In, func(t ir.TensorID) bool { return lastFwdWrite[ao.e.owner(t)] >= 0 }) {
			unpacks++
			tensors += 2 * len(op.In)
		}
	}
	return packs, unpacks, tensors
}

// candidates returns, per storage, the forward op that writes it last when it qualifies (-1 otherwise): a saved
// activation written only by forward ops and read by at least one backward op, by nothing in the optimizer.
func (ao *actOffloader) candidates() []int {
	q, e, nt := ao.q, ao.e, ao.nt
	lastFwdWrite := make([]int, nt)
	ok := make([]bool, nt)
	bwdRead := make([]bool, nt)
	for i := range q.Tensors {
		t := &q.Tensors[i]
		lastFwdWrite[i] = -1
		ok[i] = t.Base == ir.NoTensor && t.Cat == ir.Activation && !t.Resident && !t.Host && !t.Keep && t.Bytes > 0
	}
	for oi := range q.Ops {
		op := &q.Ops[oi]
		fwd := op.Phase == ir.Forward && !op.Recompute
		for _, t := range op.Out {
			o := e.owner(t)
			if fwd {
				lastFwdWrite[o] = oi
			} else {
				ok[o] = false
			}
		}
		for _, t := range op.In {
			o := e.owner(t)
			switch {
			case op.Phase == ir.Backward:
				bwdRead[o] = true
			case op.Phase == ir.Optimizer:
				ok[o] = false
			}
		}
	}
	for i := range lastFwdWrite {
		if !ok[i] || !bwdRead[i] {
			lastFwdWrite[i] = -1
		}
	}
	return lastFwdWrite
}

// pack gives each candidate a host copy written by a pack op after its last forward write, and returns how
// many storages moved.
func (ao *actOffloader) pack(lastFwdWrite []int) int {
	q, e := ao.q, ao.e
	ao.host = make([]ir.TensorID, ao.nt)
	ao.packOf = make([]int32, len(q.Ops))
	moved := 0
	for i := range ao.host {
		ao.host[i] = ir.NoTensor
	}
	for i := 0; i < ao.nt; i++ {
		at := lastFwdWrite[i]
		if at < 0 {
			continue
		}
		t := q.Tensors[i]
		t.Name = ao.names.Join(t.Name, ".cpu")
		t.Host = true
		h := e.add(t)
		ao.host[i] = h
		moved++
		// One pack op per producing op.
		k := ao.packOf[at]
		if k == 0 {
			anchor := &q.Ops[at]
			ao.packs = append(ao.packs, ir.Op{Name: "save_on_cpu.pack", Module: anchor.Module, Phase: ir.Forward, Micro: anchor.Micro, Node: -1,
				In: ao.ids.Make(int(ao.per[at]))[:0], Out: ao.ids.Make(int(ao.per[at]))[:0], Transfer: ao.transfers.New(ir.Transfer{ToHost: true})})
			k = int32(len(ao.packs))
			ao.packOf[at] = k
		}
		pk := &ao.packs[k-1]
		pk.In = append(pk.In, ir.TensorID(i))
		pk.Out = append(pk.Out, h)
		pk.Transfer.Bytes += t.Bytes
	}
	return moved
}

// isMoved reports whether t is (a view of) a storage with a host copy.
func (ao *actOffloader) isMoved(t ir.TensorID) bool {
	o := ao.e.owner(t)
	return int(o) < ao.nt && ao.host[o] != ir.NoTensor
}

// unpack makes backward op oi read fresh device copies of the moved storages (and views) it reads, written by
// one unpack op placed before it.
func (ao *actOffloader) unpack(oi int) {
	op := &ao.q.Ops[oi]
	if op.Phase != ir.Backward || !slices.ContainsFunc(op.In, ao.isMoved) {
		return
	}
	ao.remap, ao.in, ao.out, ao.hasUp = ao.remap[:0], ao.in[:0], ao.out[:0], false
	in := ao.ids.Clone(op.In) // copy-on-write: the list may be shared
	for i, t := range in {
		if ao.isMoved(t) {
			in[i] = ao.clone(t, op)
		}
	}
	op.In = in
	if ao.hasUp {
		ao.up.In, ao.up.Out = ao.ids.Clone(ao.in), ao.ids.Clone(ao.out)
		ao.unpacks = append(ao.unpacks, ao.up)
		ao.unpackAt = append(ao.unpackAt, int32(oi))
	}
}

// clone is the device copy of moved tensor t that backward op op reads
// (one per tensor per op: remap), its base's too for a view; a storage's
// copy is written by the op's unpack (up).
func (ao *actOffloader) clone(t ir.TensorID, op *ir.Op) ir.TensorID {
	for k := 0; k < len(ao.remap); k += 2 {
		if ao.remap[k] == t {
			return ao.remap[k+1]
		}
	}
	v := ao.q.Tensors[t]
	v.Name = ao.names.Join(v.Name, ".gpu")
	if v.Base == ir.NoTensor {
		if !ao.hasUp {
			ao.up = ir.Op{Name: "save_on_cpu.unpack", Module: op.Module, Phase: op.Phase, Micro: op.Micro, Node: -1, Transfer: ao.transfers.New(ir.Transfer{})}
			ao.hasUp = true
		}
		ao.in = append(ao.in, ao.host[t])
		ao.up.Transfer.Bytes += v.Bytes
	} else {
		v.Base = ao.clone(v.Base, op)
	}
	id := ao.e.add(v)
	ao.remap = append(ao.remap, t, id)
	ao.out = append(ao.out, id)
	return id
}

// finish splices the unpacks and packs in around their ops, in op order
// (no map to walk, nothing to sort).
func (ao *actOffloader) finish() *ir.Program {
	at := make([]anchor, 0, len(ao.packs)+len(ao.unpacks))
	u := 0
	for oi, k := range ao.packOf {
		a := anchor{i: oi}
		if u < len(ao.unpackAt) && int(ao.unpackAt[u]) == oi {
			a.before = ao.unpacks[u : u+1 : u+1]
			u++
		}
		if k > 0 {
			a.after = ao.packs[k-1 : k : k]
		}
		if a.before != nil || a.after != nil {
			at = append(at, a)
		}
	}
	q := ao.e.p
	q.Ops = spliceAnchors(q.Ops, at, len(q.Ops)+len(ao.packs)+len(ao.unpacks))
	return q
}
