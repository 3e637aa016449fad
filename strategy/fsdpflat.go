package strategy

import (
	"strconv"
	"strings"

	"github.com/memplan/memplan/ir"
	"github.com/memplan/memplan/units"
)

// FSDP1 FlatParameters (ZeRO.Flat), as torch 2.1's FullyShardedDataParallel
// runs them with use_orig_params=True under Lightning's FSDPStrategy
// (lightning src/lightning/fabric/strategies/fsdp.py @71aed751 L173-175):
//
//   - A unit's parameters live in one FlatParameter that requires grad when
//     any of them does (torch/distributed/fsdp/flat_param.py L740-741). The
//     original parameters are views of it (L1729-1835), so autograd
//     computes a gradient for every weight of such a unit, frozen ones
//     included: newFlatUnits gives the backward op of each node that reads
//     a frozen weight of the unit a gradient output (models/build's
//     Options.FSDPFlat has already made the node keep what that gradient
//     needs). The views' gradients wait in the input buffer of the split's
//     backward until the last of them is ready, which concatenates them
//     into one unsharded flat gradient of the unit's full size
//     ("fsdp.flat_grad"), and AccumulateGrad adds that into the
//     FlatParameter's gradient ("fsdp.accumulate_grad"; the first
//     micro-step's becomes it).
//   - Under no_sync (every micro-step but the last of an optimizer step:
//     Lightning's no_backward_sync), _post_backward_hook reshards the
//     parameters and returns with the unsharded gradient kept
//     (torch/distributed/fsdp/_runtime_utils.py L721-790), so every unit's
//     unsharded flat gradient lives across the accumulated micro-steps. On
//     the last micro-step it is reduce-scattered into a sharded flat
//     gradient (_get_reduce_scatter_tensors, L883-895:
//     "fsdp.reduce_scatter"), covering the frozen entries too; the
//     trainable parameters' gradients are views of it (flat_param.py
//     _use_sharded_grad_views, L2003-2060), which the optimizer and
//     zero_grad read. It lives until the next root pre-forward
//     (_reset_flat_param_grad_info_if_needed, L2270-2297); here until
//     zero_grad, with nothing allocated in between.
//   - The root unit (the modules outside the wrapped layers) is not
//     resharded after forward (_post_forward_reshard frees the unsharded
//     parameter only when not state._is_root, _runtime_utils.py L522-536):
//     its forward gather serves its backward too, and it is resharded at
//     the end of the micro-step's backward (_catch_all_reshard in the final
//     callback).
type flatUnits struct {
	n, last int // data-parallel degree, last micro-step
	us      []unit
	root    int // the root unit (-1: none)
	// requires: the unit's FlatParameter requires grad; bytes, numel, dt
	// size it (full, unsharded).
	requires []bool
	bytes    []units.Bytes
	numel    []int64
	dt       []units.DType
	// planGrads are the gradients the lowering made for the unit's
	// trainable parameters; grads[m][u] every gradient of the unit's
	// parameters in micro-step m; frozen[m] the gradients added for frozen
	// weights, with their unit.
	planGrads [][]ir.TensorID
	grads     [][][]ir.TensorID
	frozen    []map[ir.TensorID]int32
	// flat is each unit's unsharded flat gradient (NoTensor before its
	// first micro-step); rootRemap the root's forward gather per
	// micro-step; late the root reshards, inserted after everything else
	// at the end of a backward.
	flat      []ir.TensorID
	rootRemap map[int]map[ir.TensorID]ir.TensorID
	late      map[int][]ir.Op
}

// newFlatUnits sizes the units and adds the gradients of frozen weights in
// units whose FlatParameter requires grad. per is freshGrads' map of each
// micro-step; full the tensors before sharding. Bounded: a unit's bytes
// and elements are sums over its parameters (≤ 2^62 bytes in all,
// engine.checkProgramBytes).
func (e *editor) newFlatUnits(pg *paramGrads, us []unit, unitOf []int32, per []map[ir.TensorID]ir.TensorID, full []ir.Tensor, n int) *flatUnits {
	q := e.p
	nu := len(us)
	f := &flatUnits{n: n, last: len(per) - 1, us: us, root: -1, requires: make([]bool, nu), bytes: make([]units.Bytes, nu),
		numel: make([]int64, nu), dt: make([]units.DType, nu), planGrads: make([][]ir.TensorID, nu),
		grads: make([][][]ir.TensorID, len(per)), frozen: make([]map[ir.TensorID]int32, len(per)), flat: make([]ir.TensorID, nu),
		rootRemap: map[int]map[ir.TensorID]ir.TensorID{}, late: map[int][]ir.Op{}}
	for i := range us {
		if us[i].name == "root" {
			f.root = i
		}
		for _, pid := range us[i].params {
			f.bytes[i] += full[pid].Bytes
			f.numel[i] += full[pid].Numel()
			f.requires[i] = f.requires[i] || full[pid].RequiresGrad
		}
		if len(us[i].params) > 0 {
			f.dt[i] = full[us[i].params[0]].DType
		}
		f.flat[i] = ir.NoTensor
	}
	hasGrad := map[ir.TensorID]bool{}
	for _, g := range pg.grads {
		p := pg.param[g]
		hasGrad[p] = true
		if int(p) < len(unitOf) && unitOf[p] >= 0 {
			u := unitOf[p]
			f.planGrads[u] = append(f.planGrads[u], g)
			f.requires[u] = true
		}
	}
	for m := range per {
		f.grads[m] = make([][]ir.TensorID, nu)
		f.frozen[m] = map[ir.TensorID]int32{}
		for u := range us {
			for _, g := range f.planGrads[u] {
				if gm, ok := per[m][g]; ok {
					f.grads[m][u] = append(f.grads[m][u], gm)
				}
			}
		}
	}
	// A node's backward computes the gradients of the frozen weights its
	// forward read, in the first micro-step's backward op of that node.
	fwd, micros := forwardOps(q)
	given := make([]map[ir.TensorID]bool, len(per))
	for m := range given {
		given[m] = map[ir.TensorID]bool{}
	}
	for oi := range q.Ops {
		op := &q.Ops[oi]
		m := op.Micro
		if op.Phase != ir.Backward || op.Recompute || op.Node < 0 || m < 0 || m >= len(per) {
			continue
		}
		fi := fwd[int(op.Node)*micros+m]
		if fi < 0 {
			continue
		}
		for _, t := range q.Ops[fi].In {
			o := e.owner(t)
			if int(o) >= len(unitOf) || unitOf[o] < 0 || hasGrad[o] || given[m][o] || !f.requires[unitOf[o]] {
				continue
			}
			given[m][o] = true
			gt := full[o]
			gt.Name += ".grad"
			if m > 0 {
				gt.Name += "@" + strconv.Itoa(m)
			}
			gt.Shape = append([]int64(nil), gt.Shape...)
			gt.Base, gt.Cat, gt.Resident, gt.Keep, gt.Host, gt.RequiresGrad = ir.NoTensor, ir.Gradient, false, false, false, false
			id := e.add(gt)
			op.Out = append(op.Out, id) // op.Out may be shared (Clone caps it, so append copies)
			u := unitOf[o]
			f.frozen[m][id] = u
			f.grads[m][u] = append(f.grads[m][u], id)
		}
	}
	return f
}

// accumulate is the end of unit u's backward in micro-step m: the views'
// gradients concatenated into the unsharded flat gradient, which the first
// micro-step keeps and later ones add into it.
func (f *flatUnits) accumulate(e *editor, u, m int) []ir.Op {
	gs := f.grads[m][u]
	if !f.requires[u] || len(gs) == 0 {
		return nil
	}
	name := f.us[u].name
	t := ir.Tensor{Name: name + ".flat_param.grad", Shape: []int64{f.numel[u]}, DType: f.dt[u], Bytes: f.bytes[u], Base: ir.NoTensor, Cat: ir.Gradient}
	cat := ir.Op{Name: "fsdp.flat_grad(" + name + ")", Module: name, Phase: ir.Backward, Micro: m, Node: -1, In: append([]ir.TensorID(nil), gs...)}
	if f.flat[u] == ir.NoTensor {
		f.flat[u] = e.add(t)
		cat.Out = []ir.TensorID{f.flat[u]}
		return []ir.Op{cat}
	}
	t.Name += "@" + strconv.Itoa(m)
	tmp := e.add(t)
	cat.Out = []ir.TensorID{tmp}
	return []ir.Op{cat, {Name: "fsdp.accumulate_grad(" + name + ")", Module: name, Phase: ir.Backward, Micro: m, Node: -1,
		In: []ir.TensorID{tmp, f.flat[u]}}}
}

// reduce is the reduce-scatter of unit u's unsharded flat gradient on the
// last micro-step (none under no_sync): it writes the sharded flat gradient
// and, as views of it, the shard of each trainable parameter's gradient.
func (f *flatUnits) reduce(e *editor, u, m int) []ir.Op {
	if !f.requires[u] || m != f.last || f.flat[u] == ir.NoTensor {
		return nil
	}
	name := f.us[u].name
	st := ir.Tensor{Name: name + ".flat_param.grad.shard", Shape: []int64{f.numel[u]}, DType: f.dt[u], Bytes: f.bytes[u], Base: ir.NoTensor, Cat: ir.Gradient}
	shardTensor(&st, f.n, &e.shapes)
	shard := e.add(st)
	op := ir.Op{Name: "fsdp.reduce_scatter(" + name + ")", Module: name, Phase: ir.Backward, Micro: m, Node: -1,
		In: []ir.TensorID{f.flat[u]}, Out: []ir.TensorID{shard}, Comm: &ir.Comm{Kind: ir.ReduceScatter, Bytes: f.bytes[u], Group: ir.DataGroup, Ranks: f.n}}
	for _, g := range f.planGrads[u] {
		v := e.p.Tensors[g]
		shardTensor(&v, f.n, &e.shapes)
		v.Name += ".shard"
		v.Base, v.Bytes, v.Resident, v.Keep = shard, 0, false, false
		id := e.add(v)
		e.shardsOf[g] = id
		op.Out = append(op.Out, id)
	}
	return []ir.Op{op}
}

// rootGathered keeps the root's forward gather (remap, buffer flat) until
// the end of micro-step m's backward; it reports whether u is the root in
// a forward with a backward to reach.
func (f *flatUnits) rootGathered(e *editor, u, m int, phase ir.Phase, remap map[ir.TensorID]ir.TensorID, flat ir.TensorID) bool {
	if u != f.root || phase != ir.Forward {
		return false
	}
	end := e.endOfBackward(m)
	if end < 0 {
		return false
	}
	f.rootRemap[m] = remap
	name := f.us[u].name
	f.late[end] = append(f.late[end], ir.Op{Name: "zero3.reshard(" + name + ")", Module: name, Phase: ir.Backward, Micro: m, Node: -1, In: []ir.TensorID{flat}})
	return true
}

// keepRoot serves the root's backward reads in micro-step m from its
// forward gather (and ends its backward with its gradients, when it
// trains); it reports whether it did. It does not when a read needs a view
// of a parameter the forward did not gather.
func (f *flatUnits) keepRoot(e *editor, unitOf []int32, u, m int, phase ir.Phase, reads []int, last int) bool {
	if u != f.root || phase != ir.Backward {
		return false
	}
	r, ok := f.rootRemap[m]
	if !ok {
		return false
	}
	for _, oi := range reads {
		for _, t := range e.p.Ops[oi].In {
			if o := e.owner(t); int(o) < len(unitOf) && int(unitOf[o]) == u {
				if _, ok := r[t]; !ok {
					return false
				}
			}
		}
	}
	for _, oi := range reads {
		e.substitute(&e.p.Ops[oi], r)
	}
	e.after[last] = append(e.after[last], f.accumulate(e, u, m)...)
	e.after[last] = append(e.after[last], f.reduce(e, u, m)...)
	return true
}

// finish inserts the root reshards after everything else at the end of
// their backward.
func (f *flatUnits) finish(e *editor) {
	for at, ops := range f.late {
		e.after[at] = append(e.after[at], ops...)
	}
}

// endOfBackward is micro-step m's last autograd op (a node's backward, not
// the loop's release of its outputs), or -1.
func (e *editor) endOfBackward(m int) int {
	end := -1
	for oi := range e.p.Ops {
		if op := &e.p.Ops[oi]; op.Phase == ir.Backward && op.Micro == m && (op.Node >= 0 || end < 0) {
			end = oi
		}
	}
	return end
}

// indexedBlock reports whether blk (an ir.BlockOf result) ends in a list
// index: a layer of a stack, which a wrap policy of layers makes a unit.
func indexedBlock(blk string) bool {
	return ir.IsIndex(blk[strings.LastIndexByte(blk, '.')+1:])
}
