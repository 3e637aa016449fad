package strategy

import (
	"fmt"
	"strings"

	"github.com/memplan/memplan/ir"
)

// ParamOffload is ZeRO-3's offload_param / FSDP's
// CPUOffload(offload_params=True) on a ZeRO-3 or FSDP program: the sharded
// parameters live on the host and each unit's all-gather first copies the
// unit's shards to the device ("offload.param_to_device", a fresh device
// tensor per shard that dies with the gather). As in FSDP (and DeepSpeed,
// where offload_param goes with offload_optimizer), the optimizer runs on
// the CPU: it includes OptimizerOffload, so do not chain both.
type ParamOffload struct{}

// Name implements Transform.
func (*ParamOffload) Name() string { return "offload-params" }

// Apply implements Transform.
func (x *ParamOffload) Apply(p *ir.Program) (*ir.Program, error) { return x.apply(p, false) }

func (x *ParamOffload) apply(p *ir.Program, own bool) (*ir.Program, error) {
	var gathers []int
	for i := range p.Ops {
		op := &p.Ops[i]
		if op.Name == paramsToDevice {
			return nil, fmt.Errorf("offload-params already offloads the optimizer; drop offload-optimizer")
		}
		if op.Comm != nil && op.Comm.Kind == ir.AllGather && strings.HasPrefix(op.Name, "zero3.all_gather") {
			gathers = append(gathers, i)
		}
	}
	if len(gathers) == 0 {
		return nil, fmt.Errorf("offload-params needs a ZeRO-3 or FSDP program; apply zero3 or fsdp first")
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
		rewriteIn(g, &e.ids, func(_ int, t ir.TensorID) ir.TensorID {
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
				return nil, fmt.Errorf("op %d (%s) reads parameter %s outside its unit's all-gather", oi, op.Name, q.Tensors[t].Name)
			}
		}
	}
	q = e.finish()
	if err := offloadOptimizer(q, false); err != nil {
		return nil, err
	}
	return q, nil
}
