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
	e := newEditor(q)
	nt := len(q.Tensors)
	// Which storages qualify: saved activations written only by forward ops
	// and read by at least one backward op, by nothing in the optimizer.
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
	host := make([]ir.TensorID, nt) // storage → its host copy (NoTensor: stays)
	moved := 0
	for i := range host {
		host[i] = ir.NoTensor
	}
	for i := 0; i < nt; i++ {
		if !ok[i] || !bwdRead[i] || lastFwdWrite[i] < 0 {
			continue
		}
		t := q.Tensors[i]
		t.Name += ".cpu"
		t.Host = true
		h := e.add(t)
		host[i] = h
		moved++
		at := lastFwdWrite[i]
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
	if moved == 0 {
		return q, nil
	}
	isMoved := func(t ir.TensorID) bool {
		o := e.owner(t)
		return int(o) < nt && host[o] != ir.NoTensor
	}
	for oi := range q.Ops {
		op := &q.Ops[oi]
		if op.Phase != ir.Backward || !slices.ContainsFunc(op.In, isMoved) {
			continue
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
				unpack.In = append(unpack.In, host[t])
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
			if isMoved(t) {
				return clone(t)
			}
			return t
		})
		if unpack != nil {
			e.before[oi] = append(e.before[oi], *unpack)
		}
	}
	return e.finish(), nil
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

// offloadOptimizer rewrites q in place (q is already a clone).
func offloadOptimizer(q *ir.Program) error {
	e := newEditor(q)
	hasStep := false
	for oi := range q.Ops {
		if q.Ops[oi].Phase == ir.Optimizer {
			hasStep = true
		}
	}
	if !hasStep {
		return fmt.Errorf("strategy: optimizer offload needs a training program with an optimizer step")
	}
	for i := range q.Tensors {
		if t := &q.Tensors[i]; t.Base == ir.NoTensor && t.Cat == ir.OptimizerState {
			t.Host = true
		}
	}
	// The ZeRO-1/2 all-gather after the step says how many ranks share the
	// parameters the step updates.
	ranks := 1
	for oi := range q.Ops {
		if c := q.Ops[oi].Comm; q.Ops[oi].Phase == ir.Optimizer && c != nil && c.Kind == ir.AllGather && c.Group == "dp" && c.Ranks > 1 {
			ranks = c.Ranks
		}
	}
	firstWrite := e.firstWriters()
	isParam := paramSet(q)
	// Last op outside the step that touches each storage.
	lastDev := make([]int, len(q.Tensors))
	for i := range lastDev {
		lastDev[i] = -1
	}
	for oi := range q.Ops {
		op := &q.Ops[oi]
		if op.Phase == ir.Optimizer {
			continue
		}
		for _, ts := range [][]ir.TensorID{op.In, op.Out} {
			for _, t := range ts {
				lastDev[e.owner(t)] = oi
			}
		}
	}
	firstStep, lastMirror := -1, -1
	gradHost := map[ir.TensorID]ir.TensorID{}
	mirror := map[ir.TensorID]ir.TensorID{}
	var mirrors, devParams []ir.TensorID
	var copyBack units.Bytes
	for oi := range q.Ops {
		op := &q.Ops[oi]
		if op.Phase != ir.Optimizer || op.Comm != nil || op.Transfer != nil {
			continue
		}
		if firstStep < 0 {
			firstStep = oi
		}
		op.WorkspaceHost += op.Workspace
		op.Workspace = 0
		for _, t := range op.Out {
			if tt := &q.Tensors[t]; firstWrite[t] == oi && tt.Base == ir.NoTensor && !tt.Resident {
				tt.Host = true
			}
		}
		rewriteIn(op, func(_ int, t ir.TensorID) ir.TensorID {
			o := e.owner(t)
			ot := &q.Tensors[o]
			if ot.Host || o != t {
				return t
			}
			switch {
			case ot.Cat == ir.Gradient:
				h, ok := gradHost[o]
				if !ok {
					nt := *ot
					nt.Name += ".cpu"
					nt.Host, nt.Resident, nt.Keep = true, false, false
					h = e.add(nt)
					gradHost[o] = h
					at := lastDev[o]
					tr := ir.Op{Name: "offload.grads_to_host", Phase: ir.Optimizer, Node: -1, In: []ir.TensorID{o}, Out: []ir.TensorID{h},
						Transfer: &ir.Transfer{Bytes: nt.Bytes, ToHost: true}}
					if at < 0 {
						e.before[firstStep] = appendTransfer(e.before[firstStep], tr)
					} else {
						tr.Phase, tr.Micro, tr.Module = q.Ops[at].Phase, q.Ops[at].Micro, q.Ops[at].Module
						e.after[at] = appendTransfer(e.after[at], tr)
					}
				}
				return h
			case isParam.has(o) || ot.Cat == ir.Parameter:
				h, ok := mirror[o]
				if !ok {
					nt := *ot
					nt.Name += ".cpu"
					nt.Host, nt.Resident = true, true
					if ranks > 1 {
						shardTensor(&nt, ranks)
					}
					h = e.add(nt)
					mirror[o] = h
					mirrors = append(mirrors, h)
					devParams = append(devParams, o)
					copyBack += nt.Bytes
				}
				lastMirror = oi
				return h
			}
			return t
		})
	}
	if len(mirrors) > 0 {
		e.after[lastMirror] = append(e.after[lastMirror], ir.Op{Name: paramsToDevice, Phase: ir.Optimizer, Node: -1, In: mirrors, Out: devParams,
			Transfer: &ir.Transfer{Bytes: copyBack}})
	}
	e.finish()
	return nil
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
