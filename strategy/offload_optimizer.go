package strategy

import (
	"fmt"

	"github.com/memplan/memplan/internal/chunk"
	"github.com/memplan/memplan/ir"
	"github.com/memplan/memplan/units"
)

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
// (the copy-back is sized by the all-gather's ranks). That holds for the
// gradients too: ZeRO-2/3's step reads the reduce-scattered shards, but
// ZeRO-1's reads the full gradients that "zero.reduce_scatter(grads)" reduced
// in place, of which the rank steps only its partition; their host copy is
// that partition (ceil(numel/DP) elements), as DeepSpeed stage 1 with
// offload_optimizer copies only the rank's reduced partition into its
// partition-sized fp32 gradient buffer on the CPU
// (deepspeed/runtime/zero/stage_1_and_2.py at microsoft/DeepSpeed commit
// 022f223: initialize_optimizer_states sizes
// single_partition_of_fp32_groups[i].grad to partition_size on the CPU
// under cpu_offload, and async_inplace_copy_grad_to_fp32_buffer_from_gpu
// copies each gradient's slice in the partition into it). The full gradient
// stays on the device until that copy, after the reduce-scatter.
type OptimizerOffload struct{}

// Name implements Transform.
func (*OptimizerOffload) Name() string { return "offload-optimizer" }

// Apply implements Transform.
func (x *OptimizerOffload) Apply(p *ir.Program) (*ir.Program, error) { return x.apply(p, false) }

func (x *OptimizerOffload) apply(p *ir.Program, own bool) (*ir.Program, error) {
	for i := range p.Ops {
		if p.Ops[i].Name == paramsToDevice {
			return nil, fmt.Errorf("the optimizer is already offloaded")
		}
	}
	q := p
	if !own {
		// Tensors of its own; the ops are copied once, by finish, with the
		// edited step ops and the inserted copies in place.
		q = cloneTensors(p, len(p.Tensors)/4+16)
	}
	if err := offloadOptimizer(q, !own); err != nil {
		return nil, err
	}
	return q, nil
}

const paramsToDevice = "offload.params_to_device"

// offloadOptimizer rewrites q in place (q is already a clone; shared: its op list is still the input's, see
// cloneTensors). Its phases: check (there is a step), state to
// the host, the partition the step updates (ranks), the last device use of each storage, then per step op:
// workspaces and the temporaries it creates on the host, gradients read from a host copy made after their last
// device use, parameters through a pinned host mirror; finally one copy of the mirrors back to the device.
func offloadOptimizer(q *ir.Program, shared bool) error {
	oo := &optOffloader{q: q, e: newEditor(q), firstStep: -1, lastMirror: -1, host: make([]ir.TensorID, len(q.Tensors))}
	if shared {
		oo.e.sharedOps()
	}
	if err := oo.check(); err != nil {
		return err
	}
	oo.stateToHost()
	oo.ranks = stepRanks(q)
	oo.reducedInPlace = reducedInPlace(q, oo.e)
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
	q     *ir.Program
	e     *editor
	ranks int // ranks sharing the parameters the step updates
	// reducedInPlace is, per storage a data-parallel reduce-scatter reads
	// and none writes (ZeRO-1's full gradients), its ranks; else 0.
	reducedInPlace map[ir.TensorID]int
	firstWrite     []int
	isParam        tensorSet
	lastDev        []int // last op outside the step that touches each storage
	firstStep      int
	lastMirror     int // last step op that reads a mirror

	// host is, per storage of the input, 1 + its host copy (a gradient) or
	// mirror (a parameter), 0 before it has one: dense, as the step reads
	// most of them.
	host      []ir.TensorID
	mirrors   []ir.TensorID
	devParams []ir.TensorID
	copyBack  units.Bytes

	ids       chunk.Slices[ir.TensorID]
	ops       chunk.Slices[ir.Op]
	names     chunk.Strings
	transfers chunk.Slices[ir.Transfer]
}

func (oo *optOffloader) check() error {
	for oi := range oo.q.Ops {
		if oo.q.Ops[oi].Phase == ir.Optimizer {
			return nil
		}
	}
	return fmt.Errorf("optimizer offload needs a training program with an optimizer step")
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
		if c := q.Ops[oi].Comm; q.Ops[oi].Phase == ir.Optimizer && c != nil && c.Kind == ir.AllGather && c.Group == ir.DataGroup && c.Ranks > 1 {
			ranks = c.Ranks
		}
	}
	return ranks
}

// reducedInPlace finds the storages that a data-parallel reduce-scatter reads and no reduce-scatter writes:
// ZeRO-1's full gradients, reduced in place, of which each rank owns (and steps) a 1/ranks partition. ZeRO-2/3
// write shards (later micro-steps read them too, to add into them), which are the rank's already.
func reducedInPlace(q *ir.Program, e *editor) map[ir.TensorID]int {
	var in map[ir.TensorID]int
	written := map[ir.TensorID]bool{}
	for oi := range q.Ops {
		c := q.Ops[oi].Comm
		if c == nil || c.Kind != ir.ReduceScatter || c.Group != ir.DataGroup || c.Ranks < 2 {
			continue
		}
		if in == nil {
			in = map[ir.TensorID]int{}
		}
		for _, t := range q.Ops[oi].In {
			in[e.owner(t)] = c.Ranks
		}
		for _, t := range q.Ops[oi].Out {
			written[e.owner(t)] = true
		}
	}
	for t := range written {
		delete(in, t)
	}
	return in
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
	op := oo.e.edit(oi)
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
	rewriteIn(op, &oo.ids, func(_ int, t ir.TensorID) ir.TensorID {
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
// before the step when nothing outside it touches o. A gradient reduced in place (ZeRO-1) is copied as the
// rank's partition only.
func (oo *optOffloader) hostGrad(o ir.TensorID) ir.TensorID {
	if h := oo.host[o]; h > 0 {
		return h - 1
	}
	q, e := oo.q, oo.e
	nt := q.Tensors[o]
	nt.Name = oo.names.Join(nt.Name, ".cpu")
	nt.Host, nt.Resident, nt.Keep = true, false, false
	if n := oo.reducedInPlace[o]; n > 1 {
		shardTensor(&nt, n, &e.shapes)
	}
	h := e.add(nt)
	oo.host[o] = h + 1
	at := oo.lastDev[o]
	tr := ir.Op{Name: "offload.grads_to_host", Phase: ir.Optimizer, Node: -1, In: oo.ids.One(o), Out: oo.ids.One(h),
		Transfer: oo.transfers.New(ir.Transfer{Bytes: nt.Bytes, ToHost: true})}
	if at < 0 {
		e.before[oo.firstStep] = appendTransfer(e.before[oo.firstStep], tr)
	} else {
		tr.Phase, tr.Micro, tr.Module = q.Ops[at].Phase, q.Ops[at].Micro, q.Ops[at].Module
		if ops := e.after[at]; len(ops) > 0 {
			e.after[at] = appendTransfer(ops, tr)
		} else {
			e.after[at] = oo.ops.One(tr) // most anchors get one copy
		}
	}
	return h
}

// hostMirror is parameter o's pinned host mirror (its partition when ranks share it).
func (oo *optOffloader) hostMirror(o ir.TensorID) ir.TensorID {
	if h := oo.host[o]; h > 0 {
		return h - 1
	}
	nt := oo.q.Tensors[o]
	nt.Name = oo.names.Join(nt.Name, ".cpu")
	nt.Host, nt.Resident = true, true
	if oo.ranks > 1 {
		shardTensor(&nt, oo.ranks, &oo.e.shapes)
	}
	h := oo.e.add(nt)
	oo.host[o] = h + 1
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
