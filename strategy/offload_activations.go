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
	if !own {
		// The copy gets room for what the rewrite adds (a quarter
		// more was too little on a mixture of experts, and finish
		// copied every op again into a larger array).
		ops, tensors := ao.room(last)
		ao.q = cloneWithRoom(p, ops, tensors)
		ao.e.p = ao.q
	}
	if ao.pack(last) == 0 {
		return ao.q, nil
	}
	for oi := range ao.q.Ops {
		ao.unpack(oi)
	}
	return ao.e.finish(), nil
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

// room bounds the ops and tensors the rewrite adds, from the candidates
// (lastFwdWrite, counted per op by countPacks): a pack op per producing op and a host copy per storage,
// an unpack op per backward op that reads a moved storage and a device
// copy per tensor it reads (each view of a moved storage brings its base).
func (ao *actOffloader) room(lastFwdWrite []int) (ops, tensors int) {
	for _, n := range ao.per {
		if n > 0 {
			ops++
			tensors += int(n)
		}
	}
	for i := range ao.q.Ops {
		op := &ao.q.Ops[i]
		if op.Phase != ir.Backward {
			continue
		}
		if slices.ContainsFunc(op.In, func(t ir.TensorID) bool { return lastFwdWrite[ao.e.owner(t)] >= 0 }) {
			ops++
			tensors += 2 * len(op.In)
		}
	}
	return ops, tensors
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
		anchor := &q.Ops[at]
		// One pack op per producing op.
		n := len(e.after[at])
		if n == 0 || e.after[at][n-1].Name != "save_on_cpu.pack" {
			e.after[at] = append(e.after[at], ir.Op{Name: "save_on_cpu.pack", Module: anchor.Module, Phase: ir.Forward, Micro: anchor.Micro, Node: -1,
				In: ao.ids.Make(int(ao.per[at]))[:0], Out: ao.ids.Make(int(ao.per[at]))[:0], Transfer: ao.transfers.New(ir.Transfer{ToHost: true})})
			n++
		}
		pk := &e.after[at][n-1]
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
	q, e := ao.q, ao.e
	op := &q.Ops[oi]
	if op.Phase != ir.Backward || !slices.ContainsFunc(op.In, ao.isMoved) {
		return
	}
	var unpack *ir.Op
	ao.remap, ao.in, ao.out = ao.remap[:0], ao.in[:0], ao.out[:0]
	var clone func(t ir.TensorID) ir.TensorID
	clone = func(t ir.TensorID) ir.TensorID {
		for k := 0; k < len(ao.remap); k += 2 {
			if ao.remap[k] == t {
				return ao.remap[k+1]
			}
		}
		v := q.Tensors[t]
		v.Name = ao.names.Join(v.Name, ".gpu")
		if v.Base == ir.NoTensor {
			if unpack == nil {
				unpack = &ir.Op{Name: "save_on_cpu.unpack", Module: op.Module, Phase: op.Phase, Micro: op.Micro, Node: -1, Transfer: ao.transfers.New(ir.Transfer{})}
			}
			ao.in = append(ao.in, ao.host[t])
			unpack.Transfer.Bytes += v.Bytes
		} else {
			v.Base = clone(v.Base)
		}
		id := e.add(v)
		ao.remap = append(ao.remap, t, id)
		ao.out = append(ao.out, id)
		return id
	}
	rewriteIn(op, func(_ int, t ir.TensorID) ir.TensorID {
		if ao.isMoved(t) {
			return clone(t)
		}
		return t
	})
	if unpack != nil {
		unpack.In, unpack.Out = ao.ids.Clone(ao.in), ao.ids.Clone(ao.out)
		e.before[oi] = append(e.before[oi], *unpack)
	}
}
