package strategy

import (
	"fmt"
	"slices"
	"strings"

	"github.com/memplan/memplan/ir"
	"github.com/memplan/memplan/units"
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

// OptimizerOffload is ZeRO-Offload (Ren et al., ATC'21; DeepSpeed's
// offload_optimizer with device "cpu"), applicable to a plain or ZeRO-1/2/3
// program: optimizer state and master weights live on the host (Host), the
// step runs on the CPU (its workspaces count on the host, the temporaries it
// creates are host tensors), each gradient the step reads is copied to the
// host right after its last use on the device ("offload.grads_to_host",
// grouped per producing op, so per bucket or unit after a reduce-scatter,
// as DeepSpeed copies each reduced partition), and the parameters the step
// updates get a pinned host mirror that the CPU step writes and
// "offload.params_to_device" (Transfer{ToHost: false}) copies back before
// any all-gather. After a ZeRO-1/2 rewrite only the rank's partition travels
// (the copy-back is sized by the all-gather's ranks).
type OptimizerOffload struct{}

// ParamOffload is ZeRO-3's offload_param / FSDP's
// CPUOffload(offload_params=True) on a ZeRO-3 or FSDP program: the sharded
// parameters live on the host and each unit's all-gather first copies the
// unit's shards to the device ("offload.param_to_device", a fresh device
// tensor per shard that dies with the gather). As in FSDP (and DeepSpeed,
// where offload_param goes with offload_optimizer), the optimizer runs on
// the CPU: it includes OptimizerOffload, so do not chain both.
type ParamOffload struct{}

var (
	_ Transform = (*ActivationOffload)(nil)
	_ Transform = (*OptimizerOffload)(nil)
	_ Transform = (*ParamOffload)(nil)
)

func init() {
	Register("offload-activations", func() Transform { return &ActivationOffload{} })
	Register("offload-optimizer", func() Transform { return &OptimizerOffload{} })
	Register("offload-params", func() Transform { return &ParamOffload{} })
}

// Name implements Transform.
func (*ActivationOffload) Name() string { return "offload-activations" }

// Name implements Transform.
func (*OptimizerOffload) Name() string { return "offload-optimizer" }

// Name implements Transform.
func (*ParamOffload) Name() string { return "offload-params" }

// Apply implements Transform.
func (x *ActivationOffload) Apply(p *ir.Program) (*ir.Program, error) { return x.apply(p, false) }

func (x *ActivationOffload) apply(p *ir.Program, own bool) (*ir.Program, error) {
	q := editable(p, own)
	ao := &actOffloader{q: q, e: newEditor(q), nt: len(q.Tensors)}
	if ao.pack(ao.candidates()) == 0 {
		return q, nil
	}
	for oi := range q.Ops {
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
		t.Name += ".cpu"
		t.Host = true
		h := e.add(t)
		ao.host[i] = h
		moved++
		anchor := &q.Ops[at]
		// One pack op per producing op.
		n := len(e.after[at])
		if n == 0 || e.after[at][n-1].Name != "save_on_cpu.pack" {
			e.after[at] = append(e.after[at], ir.Op{Name: "save_on_cpu.pack", Module: anchor.Module, Phase: ir.Forward, Micro: anchor.Micro, Node: -1, Transfer: &ir.Transfer{ToHost: true}})
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
	remap := map[ir.TensorID]ir.TensorID{}
	var clone func(t ir.TensorID) ir.TensorID
	clone = func(t ir.TensorID) ir.TensorID {
		if r, ok := remap[t]; ok {
			return r
		}
		v := q.Tensors[t]
		v.Name += ".gpu"
		if v.Base == ir.NoTensor {
			if unpack == nil {
				unpack = &ir.Op{Name: "save_on_cpu.unpack", Module: op.Module, Phase: op.Phase, Micro: op.Micro, Node: -1, Transfer: &ir.Transfer{}}
			}
			unpack.In = append(unpack.In, ao.host[t])
			unpack.Transfer.Bytes += v.Bytes
		} else {
			v.Base = clone(v.Base)
		}
		id := e.add(v)
		remap[t] = id
		unpack.Out = append(unpack.Out, id)
		return id
	}
	rewriteIn(op, func(_ int, t ir.TensorID) ir.TensorID {
		if ao.isMoved(t) {
			return clone(t)
		}
		return t
	})
	if unpack != nil {
		e.before[oi] = append(e.before[oi], *unpack)
	}
}

// Apply implements Transform.
func (x *OptimizerOffload) Apply(p *ir.Program) (*ir.Program, error) { return x.apply(p, false) }

func (x *OptimizerOffload) apply(p *ir.Program, own bool) (*ir.Program, error) {
	for i := range p.Ops {
		if p.Ops[i].Name == paramsToDevice {
			return nil, fmt.Errorf("strategy: the optimizer is already offloaded")
		}
	}
	q := editable(p, own)
	if err := offloadOptimizer(q); err != nil {
		return nil, err
	}
	return q, nil
}

const paramsToDevice = "offload.params_to_device"

// offloadOptimizer rewrites q in place (q is already a clone). Its phases: check (there is a step), state to
// the host, the partition the step updates (ranks), the last device use of each storage, then per step op:
// workspaces and the temporaries it creates on the host, gradients read from a host copy made after their last
// device use, parameters through a pinned host mirror; finally one copy of the mirrors back to the device.
func offloadOptimizer(q *ir.Program) error {
	oo := &optOffloader{q: q, e: newEditor(q), firstStep: -1, lastMirror: -1,
		gradHost: map[ir.TensorID]ir.TensorID{}, mirror: map[ir.TensorID]ir.TensorID{}}
	if err := oo.check(); err != nil {
		return err
	}
	oo.stateToHost()
	oo.ranks = stepRanks(q)
	oo.firstWrite = oo.e.firstWriters()
	oo.isParam = paramSet(q)
	oo.lastDeviceUses()
	for oi := range q.Ops {
		op := &q.Ops[oi]
		if op.Phase != ir.Optimizer || op.Comm != nil || op.Transfer != nil {
			continue
		}
		oo.stepOnHost(oi)
	}
	if len(oo.mirrors) > 0 {
		oo.e.after[oo.lastMirror] = append(oo.e.after[oo.lastMirror], ir.Op{Name: paramsToDevice, Phase: ir.Optimizer, Node: -1, In: oo.mirrors, Out: oo.devParams,
			Transfer: &ir.Transfer{Bytes: oo.copyBack}})
	}
	oo.e.finish()
	return nil
}

// optOffloader is one offloadOptimizer.
type optOffloader struct {
	q          *ir.Program
	e          *editor
	ranks      int // ranks sharing the parameters the step updates
	firstWrite []int
	isParam    tensorSet
	lastDev    []int // last op outside the step that touches each storage
	firstStep  int
	lastMirror int // last step op that reads a mirror

	gradHost  map[ir.TensorID]ir.TensorID // gradient → its host copy
	mirror    map[ir.TensorID]ir.TensorID // parameter → its host mirror
	mirrors   []ir.TensorID
	devParams []ir.TensorID
	copyBack  units.Bytes
}

func (oo *optOffloader) check() error {
	for oi := range oo.q.Ops {
		if oo.q.Ops[oi].Phase == ir.Optimizer {
			return nil
		}
	}
	return fmt.Errorf("strategy: optimizer offload needs a training program with an optimizer step")
}

// stateToHost moves every optimizer-state storage to the host.
func (oo *optOffloader) stateToHost() {
	for i := range oo.q.Tensors {
		if t := &oo.q.Tensors[i]; t.Base == ir.NoTensor && t.Cat == ir.OptimizerState {
			t.Host = true
		}
	}
}

// stepRanks is the number of ranks sharing the parameters the step updates: the ZeRO-1/2 all-gather after
// the step says it.
func stepRanks(q *ir.Program) int {
	ranks := 1
	for oi := range q.Ops {
		if c := q.Ops[oi].Comm; q.Ops[oi].Phase == ir.Optimizer && c != nil && c.Kind == ir.AllGather && c.Group == "dp" && c.Ranks > 1 {
			ranks = c.Ranks
		}
	}
	return ranks
}

// lastDeviceUses finds the last op outside the step that touches each storage.
func (oo *optOffloader) lastDeviceUses() {
	q := oo.q
	oo.lastDev = make([]int, len(q.Tensors))
	for i := range oo.lastDev {
		oo.lastDev[i] = -1
	}
	for oi := range q.Ops {
		op := &q.Ops[oi]
		if op.Phase == ir.Optimizer {
			continue
		}
		for _, ts := range [][]ir.TensorID{op.In, op.Out} {
			for _, t := range ts {
				oo.lastDev[oo.e.owner(t)] = oi
			}
		}
	}
}

// stepOnHost runs step op oi on the CPU: its workspace and the storages it creates are on the host, and it
// reads gradients and parameters through their host copies.
func (oo *optOffloader) stepOnHost(oi int) {
	q := oo.q
	op := &q.Ops[oi]
	if oo.firstStep < 0 {
		oo.firstStep = oi
	}
	op.WorkspaceHost += op.Workspace
	op.Workspace = 0
	for _, t := range op.Out {
		if tt := &q.Tensors[t]; oo.firstWrite[t] == oi && tt.Base == ir.NoTensor && !tt.Resident {
			tt.Host = true
		}
	}
	rewriteIn(op, func(_ int, t ir.TensorID) ir.TensorID {
		o := oo.e.owner(t)
		ot := &q.Tensors[o]
		if ot.Host || o != t {
			return t
		}
		switch {
		case ot.Cat == ir.Gradient:
			return oo.hostGrad(o)
		case oo.isParam.has(o) || ot.Cat == ir.Parameter:
			oo.lastMirror = oi
			return oo.hostMirror(o)
		}
		return t
	})
}

// hostGrad is gradient o's host copy, copied right after its last device use (grouped per producing op), or
// before the step when nothing outside it touches o.
func (oo *optOffloader) hostGrad(o ir.TensorID) ir.TensorID {
	if h, ok := oo.gradHost[o]; ok {
		return h
	}
	q, e := oo.q, oo.e
	nt := q.Tensors[o]
	nt.Name += ".cpu"
	nt.Host, nt.Resident, nt.Keep = true, false, false
	h := e.add(nt)
	oo.gradHost[o] = h
	at := oo.lastDev[o]
	tr := ir.Op{Name: "offload.grads_to_host", Phase: ir.Optimizer, Node: -1, In: []ir.TensorID{o}, Out: []ir.TensorID{h},
		Transfer: &ir.Transfer{Bytes: nt.Bytes, ToHost: true}}
	if at < 0 {
		e.before[oo.firstStep] = appendTransfer(e.before[oo.firstStep], tr)
	} else {
		tr.Phase, tr.Micro, tr.Module = q.Ops[at].Phase, q.Ops[at].Micro, q.Ops[at].Module
		e.after[at] = appendTransfer(e.after[at], tr)
	}
	return h
}

// hostMirror is parameter o's pinned host mirror (its partition when ranks share it).
func (oo *optOffloader) hostMirror(o ir.TensorID) ir.TensorID {
	if h, ok := oo.mirror[o]; ok {
		return h
	}
	nt := oo.q.Tensors[o]
	nt.Name += ".cpu"
	nt.Host, nt.Resident = true, true
	if oo.ranks > 1 {
		shardTensor(&nt, oo.ranks)
	}
	h := oo.e.add(nt)
	oo.mirror[o] = h
	oo.mirrors = append(oo.mirrors, h)
	oo.devParams = append(oo.devParams, o)
	oo.copyBack += nt.Bytes
	return h
}

// appendTransfer merges tr into the last op of ops when both are gradient
// copies (one copy per producing op).
func appendTransfer(ops []ir.Op, tr ir.Op) []ir.Op {
	if n := len(ops); n > 0 && ops[n-1].Name == tr.Name {
		last := &ops[n-1]
		last.In = append(last.In, tr.In...)
		last.Out = append(last.Out, tr.Out...)
		last.Transfer.Bytes += tr.Transfer.Bytes
		return ops
	}
	return append(ops, tr)
}

// Apply implements Transform.
func (x *ParamOffload) Apply(p *ir.Program) (*ir.Program, error) { return x.apply(p, false) }

func (x *ParamOffload) apply(p *ir.Program, own bool) (*ir.Program, error) {
	var gathers []int
	for i := range p.Ops {
		op := &p.Ops[i]
		if op.Name == paramsToDevice {
			return nil, fmt.Errorf("strategy: offload-params already offloads the optimizer; drop offload-optimizer")
		}
		if op.Comm != nil && op.Comm.Kind == ir.AllGather && strings.HasPrefix(op.Name, "zero3.all_gather") {
			gathers = append(gathers, i)
		}
	}
	if len(gathers) == 0 {
		return nil, fmt.Errorf("strategy: offload-params needs a ZeRO-3 or FSDP program; apply zero3 or fsdp first")
	}
	q := editable(p, own)
	onHost := make(tensorSet, len(q.Tensors))
	for _, pid := range q.Params {
		if t := &q.Tensors[pid]; t.Base == ir.NoTensor && !t.Host {
			t.Host = true
			onHost[pid] = true
		}
	}
	e := newEditor(q)
	for _, gi := range gathers {
		g := &q.Ops[gi]
		tr := ir.Op{Name: "offload.param_to_device", Module: g.Module, Phase: g.Phase, Micro: g.Micro, Node: -1, Transfer: &ir.Transfer{}}
		rewriteIn(g, func(_ int, t ir.TensorID) ir.TensorID {
			if !onHost.has(t) {
				return t
			}
			d := q.Tensors[t]
			d.Name += ".h2d"
			d.Host, d.Resident, d.Keep = false, false, false
			id := e.add(d)
			tr.In = append(tr.In, t)
			tr.Out = append(tr.Out, id)
			tr.Transfer.Bytes += d.Bytes
			return id
		})
		if len(tr.In) > 0 {
			e.before[gi] = append(e.before[gi], tr)
		}
	}
	for oi := range q.Ops {
		op := &q.Ops[oi]
		if op.Phase == ir.Optimizer || op.Comm != nil || op.Transfer != nil {
			continue
		}
		for _, t := range op.In {
			if onHost.has(e.owner(t)) {
				return nil, fmt.Errorf("strategy: op %d (%s) reads parameter %s outside its unit's all-gather", oi, op.Name, q.Tensors[t].Name)
			}
		}
	}
	q = e.finish()
	if err := offloadOptimizer(q); err != nil {
		return nil, err
	}
	return q, nil
}
