package strategy

import (
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/memplan/memplan/ir"
	"github.com/memplan/memplan/units"
)

// ZeRO rewrites a single-GPU training program into the program of one of DP
// data-parallel ranks under ZeRO (Rajbhandari et al., "ZeRO: Memory
// Optimizations Toward Training Trillion Parameter Models", SC'20, §5) as
// DeepSpeed implements it (deepspeed/runtime/zero/stage_1_and_2.py,
// stage3.py). Stage 3 follows PyTorch FSDP's FULL_SHARD unit by unit (FSDP is
// the same transform under its own name).
//
// Sharding is per tensor: a rank holds ceil(numel/DP) elements of each
// sharded tensor, so padding is at most DP−1 elements per tensor. DeepSpeed
// flattens a parameter group into one buffer and pads that to a multiple of
// DP (at most DP−1 elements per group, plus alignment) and FSDP2 pads each
// parameter's dim 0 to a multiple of DP; the difference is a few elements
// per tensor, far below anything a plan resolves. Sharded tensors get the
// shape of the rank's flat shard, [ceil(numel/DP)], so sim's parameter count
// of a stage-3 program is the rank's share.
//
// What each stage emits:
//
//   - Stage 1: every optimizer-state storage (Cat OptimizerState: moments,
//     fp32 master weights, lazily created state) shrinks to its shard; the
//     optimizer-phase ops run on the partition, so their workspaces and the
//     temporaries they create (the fp32 gradient upcast, foreach's sqrt of
//     the second moment) shrink to 1/DP too. Full gradients stay; one
//     "zero.reduce_scatter(grads)" (Comm ReduceScatter, group "dp") follows
//     the last micro-step's backward, at the gradient-accumulation boundary
//     as DeepSpeed reduces stage-1 gradients. Before zero_grad a
//     "zero.all_gather(params)" (Comm AllGather) redistributes the updated
//     16-bit parameters. Its buffer is the parameter storage itself: DeepSpeed
//     gathers into the flat 16-bit group in place
//     (deepspeed/runtime/utils.py all_gather_into_tensor_dp_groups), so it
//     allocates nothing.
//   - Stage 2: as stage 1, and gradients are sharded. Backward still produces
//     each parameter gradient full-size; gradients are grouped in the order
//     they become ready into buckets of BucketElems elements (DeepSpeed's
//     reduce_bucket_size, default 5e8), and when a bucket fills, a
//     "zero.reduce_scatter(bucket k)" reads its full gradients (their last
//     use, so they are freed) and writes one persistent shard per gradient
//     (Cat Gradient, ceil(numel/DP) elements, freed by zero_grad); a partial
//     bucket is reduced at the end of each micro-step's backward (DeepSpeed's
//     reduction epilogue). The full gradients of a bucket stand for
//     DeepSpeed's ipg bucket buffer, which holds the same bytes while the
//     bucket fills (DeepSpeed keeps that buffer allocated between steps; we
//     do not). Under gradient accumulation DeepSpeed reduces every
//     micro-step and adds into the partition, so every micro-step's backward
//     creates fresh full gradients, and micro-steps after the first
//     accumulate into the existing shards. The optimizer and zero_grad read
//     the shards.
//   - Stage 3 (FSDP FULL_SHARD): as stage 2, and parameters are sharded
//     (resident bytes /DP). Parameters are grouped into units: the block
//     (ir.BlockOf) of the ops that read them, as FSDP's transformer
//     auto-wrap makes each layer a unit; other modules (embeddings, final
//     norm, head) are units of their own, and blocks that share a parameter
//     (tied embeddings) are merged into one unit, as FSDP requires a shared
//     parameter to live in one unit. In each micro-step's forward and
//     backward, "zero3.all_gather(unit)" (Comm AllGather) writes a fresh
//     unsharded flat buffer (Cat Parameter, the unit's full bytes, one view
//     per parameter) that the unit's ops read instead of the parameters, and
//     "zero3.reshard(unit)" after the unit's last op is its last use, so the
//     lifetime analysis frees it there (reshard_after_forward, and after
//     backward). The gather for a unit is issued Prefetch units ahead, at
//     the start of an earlier unit (FSDP's forward_prefetch and
//     BACKWARD_PRE), so the next unit's buffer coexists with the current
//     one. Gradients are reduce-scattered per unit after its backward
//     ("zero3.reduce_scatter(unit)", FSDP's post-backward hook) rather than
//     in DeepSpeed's buckets. The optimizer step reads the sharded
//     parameters.
//   - Stage 3 with Flat is FSDP1 with FlatParameters (use_orig_params=True),
//     as Lightning's FSDPStrategy runs it on torch 2.1 (fsdpflat.go): the
//     modules outside the layers form one root unit, gathered at its
//     forward and kept unsharded until the end of the micro-step's backward;
//     a unit whose FlatParameter requires grad gets a gradient for every
//     weight in it, frozen ones included, concatenated into one unsharded
//     flat gradient that is kept across the micro-steps accumulated under
//     no_sync and reduce-scattered into a sharded flat gradient on the last
//     one, whose views are the gradients the optimizer reads.
//
// Apply refuses DP < 2 and unknown stages.
type ZeRO struct {
	Stage int
	// DP is the data-parallel degree N_d.
	DP int
	// Prefetch is how many units ahead stage 3 issues its all-gathers: 0
	// takes the default 1 (FSDP's BACKWARD_PRE and forward_prefetch,
	// DeepSpeed's prefetch of the next module); negative disables it.
	Prefetch int
	// BucketElems is stage 2's reduce_bucket_size in elements; 0 takes
	// DeepSpeed's default 5e8; 1 reduces each gradient as it is ready.
	BucketElems int64
	// Flat shards stage 3 with FSDP1 FlatParameters (see above); other
	// stages ignore it.
	Flat bool

	name string
}

// DefaultReduceBucketElems is DeepSpeed's reduce_bucket_size default
// (deepspeed/runtime/zero/config.py: 5e8 elements).
const DefaultReduceBucketElems = 500_000_000

var (
	_ Transform = (*ZeRO)(nil)
	_ Transform = (*FSDP)(nil)
)

// Name implements Transform ("zero1", "zero2", "zero3").
func (z *ZeRO) Name() string {
	if z.name != "" {
		return z.name
	}
	return fmt.Sprintf("zero%d", z.Stage)
}

// Apply implements Transform.
func (z *ZeRO) Apply(p *ir.Program) (*ir.Program, error) { return z.apply(p, false) }

func (z *ZeRO) apply(p *ir.Program, own bool) (*ir.Program, error) {
	if z.Stage < 1 || z.Stage > 3 {
		return nil, fmt.Errorf("unknown ZeRO stage %d (want 1, 2 or 3)", z.Stage)
	}
	if z.DP < 2 {
		return nil, fmt.Errorf("ZeRO-%d needs at least 2 data-parallel ranks; with %d it changes nothing", z.Stage, max(z.DP, 1))
	}
	if z.Prefetch > 1<<20 {
		return nil, fmt.Errorf("prefetch of %d units is out of range", z.Prefetch)
	}
	if z.BucketElems < 0 {
		return nil, fmt.Errorf("reduce bucket of %d elements must not be negative", z.BucketElems)
	}
	q := editable(p, own)
	pg, err := pairGrads(q)
	if err != nil {
		return nil, err
	}
	if len(pg.grads) == 0 && z.Stage < 3 {
		return nil, fmt.Errorf("ZeRO-%d needs a training program; this one has no parameter gradients", z.Stage)
	}
	e := newEditor(q)
	N := z.DP
	// full: the tensors before sharding, which stage 3's parameter
	// sharding reads: p's own when q is a clone of it (p is only read),
	// else a copy. Copied for every stage, they were 1.2 % of the mixtral
	// fit's CPU.
	var full []ir.Tensor
	if z.Stage == 3 {
		full = p.Tensors
		if own {
			full = append([]ir.Tensor(nil), q.Tensors...)
		}
	}

	// Optimizer state and the step itself run on the rank's partition:
	// paged state (Host: bitsandbytes' unified memory) too, as each rank's
	// optimizer pages the state of the shard it steps.
	for i := range q.Tensors {
		t := &q.Tensors[i]
		if t.Base == ir.NoTensor && t.Cat == ir.OptimizerState {
			shardTensor(t, N, &e.shapes)
		}
	}
	firstWrite := e.firstWriters()
	for oi := range q.Ops {
		op := &q.Ops[oi]
		if op.Phase != ir.Optimizer {
			continue
		}
		op.Workspace = ceilBytes(op.Workspace, N)
		op.WorkspaceHost = ceilBytes(op.WorkspaceHost, N)
		for _, t := range op.Out {
			tt := &q.Tensors[t]
			if firstWrite[t] == oi && tt.Base == ir.NoTensor && !tt.Resident && tt.Cat != ir.OptimizerState {
				shardTensor(tt, N, &e.shapes)
			}
		}
	}
	if z.Stage == 3 {
		if err := z.shardParams(e, pg, full); err != nil {
			return nil, err
		}
	}
	var shards map[ir.TensorID]ir.TensorID
	switch z.Stage {
	case 1:
		z.reduceAtBoundary(e, pg)
	case 2:
		shards = z.reduceBuckets(e, pg)
	case 3:
		shards = e.shardsOf
	}
	if shards != nil {
		for oi := range q.Ops {
			if q.Ops[oi].Phase == ir.Optimizer {
				e.substitute(&q.Ops[oi], shards)
			}
		}
	}
	if z.Stage < 3 {
		z.gatherAfterStep(e, pg)
	}
	return e.finish(), nil
}

// reduceAtBoundary emits stage 1's reduce-scatter of the full gradients
// after the last micro-step's backward.
func (z *ZeRO) reduceAtBoundary(e *editor, pg *paramGrads) {
	last := e.lastBackward(e.p.MicroBatches - 1)
	if last < 0 {
		return
	}
	var b units.Bytes
	for _, g := range pg.grads {
		b += e.p.Tensors[g].Bytes
	}
	op := e.p.Ops[last]
	e.after[last] = append(e.after[last], ir.Op{Name: "zero.reduce_scatter(grads)", Phase: op.Phase, Micro: op.Micro, Node: -1,
		In: append([]ir.TensorID(nil), pg.grads...), Comm: &ir.Comm{Kind: ir.ReduceScatter, Bytes: b, Group: ir.DataGroup, Ranks: z.DP}})
}

// gatherAfterStep emits stages 1–2's all-gather of the updated parameters,
// in place, before zero_grad (or after the last optimizer op).
func (z *ZeRO) gatherAfterStep(e *editor, pg *paramGrads) {
	q := e.p
	at, before := -1, false
	for oi := range q.Ops {
		if q.Ops[oi].Phase != ir.Optimizer {
			continue
		}
		at = oi
		if strings.HasPrefix(q.Ops[oi].Name, "zero_grad") {
			before = true
			break
		}
	}
	if at < 0 {
		return
	}
	var params []ir.TensorID
	var b units.Bytes
	for _, g := range pg.grads {
		params = append(params, pg.param[g])
		b += q.Tensors[pg.param[g]].Bytes
	}
	op := ir.Op{Name: "zero.all_gather(params)", Phase: ir.Optimizer, Node: -1, In: params, Out: append([]ir.TensorID(nil), params...),
		Comm: &ir.Comm{Kind: ir.AllGather, Bytes: b, Group: ir.DataGroup, Ranks: z.DP}}
	if before {
		e.before[at] = append(e.before[at], op)
	} else {
		e.after[at] = append(e.after[at], op)
	}
}

// freshGrads gives every micro-step after the first its own full gradients:
// the backward op that used to accumulate into a parameter's gradient now
// writes a new one (DeepSpeed stage 2 and FSDP free the full gradient after
// reducing it). It returns, per micro-step, the gradient tensor that stands
// for each original gradient.
func (e *editor) freshGrads(pg *paramGrads) []map[ir.TensorID]ir.TensorID {
	q := e.p
	per := make([]map[ir.TensorID]ir.TensorID, max(q.MicroBatches, 1))
	for m := range per {
		per[m] = map[ir.TensorID]ir.TensorID{}
	}
	for _, g := range pg.grads {
		per[0][g] = g
	}
	at := make([]string, len(per)) // "@m"
	for m := 1; m < len(at); m++ {
		at[m] = "@" + strconv.Itoa(m)
	}
	var outs []ir.TensorID
	for oi := range q.Ops {
		op := &q.Ops[oi]
		if op.Phase == ir.Optimizer || op.Micro == 0 || op.Micro >= len(per) {
			continue
		}
		reads := false
		for _, t := range op.In {
			if pg.isGrad(t) {
				reads = true
				break
			}
		}
		if !reads {
			continue
		}
		cur := per[op.Micro]
		in := e.ids.Make(len(op.In))[:0] // op.In may be shared (Clone)
		outs = outs[:0]
		for _, t := range op.In {
			if !pg.isGrad(t) {
				in = append(in, t)
				continue
			}
			if g, ok := cur[t]; ok {
				in = append(in, g)
				continue
			}
			nt := q.Tensors[t]
			nt.Name = e.names.Join(nt.Name, at[op.Micro])
			nt.Resident, nt.Keep = false, false
			g := e.add(nt)
			cur[t] = g
			outs = append(outs, g)
			op.Workspace = max(op.Workspace-nt.Bytes, 0) // no separate new gradient to add in
		}
		op.In = in[:len(in):len(in)]
		if len(outs) > 0 {
			out := e.ids.Make(len(op.Out) + len(outs))
			copy(out[copy(out, op.Out):], outs)
			op.Out = out
		}
	}
	return per
}

// newShard adds the persistent shard of gradient g.
func (e *editor) newShard(g ir.TensorID, n int) ir.TensorID {
	t := e.p.Tensors[g]
	t.Name = e.names.Join(t.Name, ".shard")
	t.Resident, t.Keep = false, false
	shardTensor(&t, n, &e.shapes)
	id := e.add(t)
	e.shardsOf[g] = id
	return id
}

// reduceScatter builds the reduce-scatter of the full gradients fulls
// (standing, in micro-step m, for the original gradients orig) into their
// shards: the first micro-step creates the shards, later ones add into them.
func (e *editor) reduceScatter(name string, orig []ir.TensorID, fulls []ir.TensorID, m int, phase ir.Phase, module string, n int) ir.Op {
	var b units.Bytes
	made := 0 // shards made here
	for i, g := range orig {
		b += e.p.Tensors[fulls[i]].Bytes
		if _, ok := e.shardsOf[g]; !ok {
			made++
		}
	}
	op := ir.Op{Name: name, Module: module, Phase: phase, Micro: m, Node: -1,
		In: e.ids.Make(len(fulls) + len(orig) - made)[:0], Out: e.ids.Make(made)[:0],
		Comm: e.comms.New(ir.Comm{Kind: ir.ReduceScatter, Bytes: b, Group: ir.DataGroup, Ranks: n})}
	op.In = append(op.In, fulls...)
	for _, g := range orig {
		if s, ok := e.shardsOf[g]; ok {
			op.In = append(op.In, s)
		} else {
			op.Out = append(op.Out, e.newShard(g, n))
		}
	}
	if made == 0 {
		op.Out = nil
	}
	return op
}

// reduceBuckets emits stage 2's bucketed reduce-scatters and returns the
// shard of each gradient.
func (z *ZeRO) reduceBuckets(e *editor, pg *paramGrads) map[ir.TensorID]ir.TensorID {
	q := e.p
	per := e.freshGrads(pg)
	limit := z.BucketElems
	if limit == 0 {
		limit = DefaultReduceBucketElems
	}
	for m := range per {
		end := e.lastBackward(m)
		if end < 0 {
			continue
		}
		order, ready := readyOrder(q, m, pg.grads, reverse(per[m]))
		var bucket []ir.TensorID
		var elems int64
		k := 0
		flush := func(at int) {
			if len(bucket) == 0 {
				return
			}
			fulls := make([]ir.TensorID, len(bucket))
			for i, g := range bucket {
				fulls[i] = per[m][g]
			}
			op := e.reduceScatter(fmt.Sprintf("zero.reduce_scatter(bucket %d)", k), bucket, fulls, m, ir.Backward, "", z.DP)
			e.after[at] = append(e.after[at], op)
			bucket, elems = nil, 0
			k++
		}
		for _, g := range order {
			bucket = append(bucket, g)
			elems += q.Tensors[g].Numel()
			if elems >= limit {
				flush(ready[g])
			}
		}
		flush(end)
	}
	return e.shardsOf
}

// unit is one FSDP unit: the parameters gathered together.
type unit struct {
	name   string
	params []ir.TensorID
}

// shardParams is stage 3: shard the parameters, gather them per unit around each use, and reduce-scatter each
// unit's gradients after its backward. Its phases: units (and the parameters sharded), fresh gradients per
// micro-step (and FSDP's flat units), the unit each gradient stands for per micro-step, the spans of each unit
// per (micro-step, phase), then per (micro-step, phase) the units in order of first use, each gathered
// (prefetched Prefetch units ahead), resharded after its last use and, in backward, its gradients reduced.
func (z *ZeRO) shardParams(e *editor, pg *paramGrads, full []ir.Tensor) error {
	q := e.p
	sh := &sharder{z: z, e: e, pg: pg, full: full, N: z.DP, prefetch: max(z.Prefetch, 0), spans: map[spanKey]*span{}}
	if z.Prefetch == 0 {
		sh.prefetch = 1
	}
	sh.us, sh.unitOf = buildUnits(q, z.Flat, e.owner)
	for _, pid := range q.Params {
		if q.Tensors[pid].Base == ir.NoTensor && !q.Tensors[pid].Host {
			shardTensor(&q.Tensors[pid], sh.N, &e.shapes)
		}
	}
	sh.per = e.freshGrads(pg)
	if z.Flat {
		sh.fl = e.newFlatUnits(pg, sh.us, sh.unitOf, sh.per, full, sh.N)
	}
	sh.gradUnits()
	sh.findSpans()
	for _, g := range sh.groups() {
		sh.gatherGroup(g)
	}
	if sh.fl != nil {
		sh.fl.finish(e)
	}
	// Gradients of parameters no unit owns (never happens for lowered
	// programs: a gradient comes from an op that reads its parameter).
	for _, g := range pg.grads {
		if _, ok := e.shardsOf[g]; !ok {
			return fmt.Errorf("ZeRO-3 found no unit for the gradient %s", q.Tensors[g].Name)
		}
	}
	return nil
}

// spanKey is one unit's use in one (micro-step, phase).
type spanKey struct {
	m     int
	phase ir.Phase
	u     int
}

// span is where a unit is used in one (micro-step, phase).
type span struct {
	first, last int
	reads       []int // ops that read the unit's parameters
}

// spanGroup is one (micro-step, phase) and its units' spans, in order of first use.
type spanGroup struct {
	m     int
	phase ir.Phase
	keys  []spanKey
}

// sharder is one ZeRO.shardParams.
type sharder struct {
	z        *ZeRO
	e        *editor
	pg       *paramGrads
	full     []ir.Tensor
	N        int // ranks
	prefetch int // units gathered ahead

	us         []unit
	unitOf     []int32
	per        []map[ir.TensorID]ir.TensorID // each micro-step's fresh gradient of each original
	fl         *flatUnits                    // FSDP's flat parameters, or nil
	gradUnit   []int32                       // unit of each original gradient (-1: none)
	gradUnitAt [][]int32                     // [m][t]: the unit gradient t stands for in micro-step m (-1: none)

	spans map[spanKey]*span
	keys  []spanKey // in order of first note

	orig, fulls []ir.TensorID // reduce's scratch
}

// gradUnits finds the unit of each gradient, overall and per micro-step.
func (sh *sharder) gradUnits() {
	nt := len(sh.e.p.Tensors)
	sh.gradUnit = make([]int32, nt)
	for i := range sh.gradUnit {
		sh.gradUnit[i] = -1
	}
	for _, g := range sh.pg.grads {
		sh.gradUnit[g] = sh.unitOf[sh.pg.param[g]]
	}
	sh.gradUnitAt = make([][]int32, len(sh.per))
	for m := range sh.per {
		at := make([]int32, nt)
		for i := range at {
			at[i] = -1
		}
		for g, gm := range sh.per[m] {
			at[gm] = sh.gradUnit[g]
		}
		if sh.fl != nil {
			for g, u := range sh.fl.frozen[m] {
				at[g] = u
			}
		}
		sh.gradUnitAt[m] = at
	}
}

// note extends unit k's span to op oi (a read of its parameters when reads).
func (sh *sharder) note(k spanKey, oi int, reads bool) {
	s, ok := sh.spans[k]
	if !ok {
		s = &span{first: oi}
		sh.spans[k] = s
		sh.keys = append(sh.keys, k)
	}
	s.last = oi
	if reads && (len(s.reads) == 0 || s.reads[len(s.reads)-1] != oi) {
		s.reads = append(s.reads, oi)
	}
}

// findSpans finds each unit's span per (micro-step, phase): the ops reading its parameters and, in backward,
// the ops touching its gradients.
func (sh *sharder) findSpans() {
	q, unitOf := sh.e.p, sh.unitOf
	for oi := range q.Ops {
		op := &q.Ops[oi]
		if op.Phase == ir.Optimizer {
			continue
		}
		for _, t := range op.In {
			if o := sh.e.owner(t); int(o) < len(unitOf) && unitOf[o] >= 0 {
				sh.note(spanKey{op.Micro, op.Phase, int(unitOf[o])}, oi, true)
			}
		}
		if op.Phase != ir.Backward || op.Micro >= len(sh.per) {
			continue
		}
		at := sh.gradUnitAt[op.Micro]
		for _, ts := range [2][]ir.TensorID{op.In, op.Out} {
			for _, t := range ts {
				if int(t) < len(at) && at[t] >= 0 {
					sh.note(spanKey{op.Micro, op.Phase, int(at[t])}, oi, false)
				}
			}
		}
	}
}

// groups lists the (micro-step, phase) groups in order of first note, each with its units by first use.
func (sh *sharder) groups() []*spanGroup {
	type gk struct {
		m     int
		phase ir.Phase
	}
	byKey := map[gk]*spanGroup{}
	var gs []*spanGroup
	for _, k := range sh.keys {
		g, ok := byKey[gk{k.m, k.phase}]
		if !ok {
			g = &spanGroup{m: k.m, phase: k.phase}
			byKey[gk{k.m, k.phase}] = g
			gs = append(gs, g)
		}
		g.keys = append(g.keys, k)
	}
	for _, g := range gs {
		ks := g.keys
		sort.SliceStable(ks, func(i, j int) bool { return sh.spans[ks[i]].first < sh.spans[ks[j]].first })
	}
	return gs
}

// gatherGroup gathers each unit of g before its span (prefetch units early), points its reads at the gathered
// parameters, reshards it after its span and, in backward, reduces its gradients.
func (sh *sharder) gatherGroup(g *spanGroup) {
	e, fl := sh.e, sh.fl
	suffix := g.phase.String()
	if g.m > 0 {
		suffix = fmt.Sprintf("%s@%d", g.phase, g.m)
	}
	for j, k := range g.keys {
		u := &sh.us[k.u]
		s := sh.spans[k]
		if fl != nil && fl.keepRoot(e, sh.unitOf, k.u, g.m, g.phase, s.reads, s.last) {
			continue
		}
		gather, remap := e.gatherUnit(u, sh.full, s.reads, suffix, g.m, g.phase, sh.N)
		at := sh.spans[g.keys[max(j-sh.prefetch, 0)]].first
		e.before[at] = append(e.before[at], gather)
		for _, oi := range s.reads {
			e.substitute(&e.p.Ops[oi], remap)
		}
		flat := gather.Out[0]
		if fl != nil && fl.rootGathered(e, k.u, g.m, g.phase, remap, flat) {
			continue
		}
		if fl != nil && g.phase == ir.Backward {
			e.after[s.last] = append(e.after[s.last], fl.accumulate(e, k.u, g.m)...)
		}
		e.after[s.last] = append(e.after[s.last], ir.Op{Name: e.names.Join("zero3.reshard(", u.name, ")"), Module: u.name, Phase: g.phase, Micro: g.m, Node: -1, In: e.ids.One(flat)})
		if g.phase != ir.Backward || g.m >= len(sh.per) {
			continue
		}
		sh.reduce(k.u, g.m, s.last)
	}
}

// reduce reduce-scatters unit u's gradients of micro-step m after op last (FSDP: its flat gradient).
func (sh *sharder) reduce(u, m, last int) {
	e := sh.e
	if sh.fl != nil {
		e.after[last] = append(e.after[last], sh.fl.reduce(e, u, m)...)
		return
	}
	orig, fulls := sh.orig[:0], sh.fulls[:0] // reduceScatter copies them
	for _, gr := range sh.pg.grads {
		if int(sh.gradUnit[gr]) == u {
			if gm, ok := sh.per[m][gr]; ok {
				orig, fulls = append(orig, gr), append(fulls, gm)
			}
		}
	}
	sh.orig, sh.fulls = orig, fulls
	if len(orig) > 0 {
		name := sh.us[u].name
		e.after[last] = append(e.after[last], e.reduceScatter(e.names.Join("zero3.reduce_scatter(", name, ")"), orig, fulls, m, ir.Backward, name, sh.N))
	}
}

// gatherUnit builds the all-gather of unit u for one (micro-step, phase):
// the flat unsharded buffer, a view per parameter, and clones of any views
// of parameters the ops read. It returns the op and the tensor remapping.
func (e *editor) gatherUnit(u *unit, full []ir.Tensor, reads []int, suffix string, m int, phase ir.Phase, n int) (ir.Op, map[ir.TensorID]ir.TensorID) {
	q := e.p
	var bytes units.Bytes
	var numel int64
	for _, pid := range u.params {
		bytes += full[pid].Bytes
		numel += full[pid].Numel()
	}
	dt := full[u.params[0]].DType
	flat := e.add(ir.Tensor{Name: e.names.Join(u.name, ".unsharded.", suffix), Shape: e.shapes.One(numel), DType: dt, Bytes: bytes, Base: ir.NoTensor, Cat: ir.Parameter})
	op := ir.Op{Name: e.names.Join("zero3.all_gather(", u.name, ")"), Module: u.name, Phase: phase, Micro: m, Node: -1,
		In: e.ids.Clone(u.params), Out: e.ids.Make(1 + len(u.params)),
		Comm: e.comms.New(ir.Comm{Kind: ir.AllGather, Bytes: bytes, Group: ir.DataGroup, Ranks: n})}
	op.Out[0] = flat
	remap := make(map[ir.TensorID]ir.TensorID, len(u.params))
	for i, pid := range u.params {
		v := full[pid]
		v.Name = e.names.Join(v.Name, ".unsharded.", suffix)
		v.Base, v.Bytes, v.Resident, v.Keep, v.Host = flat, 0, false, false, false
		id := e.add(v)
		remap[pid] = id
		op.Out[1+i] = id
	}
	// Views of parameters read directly (rare): clone them onto the flat
	// buffer, bases first (a base always has a smaller id).
	var views []ir.TensorID
	seen := map[ir.TensorID]bool{}
	for _, oi := range reads {
		for _, t := range q.Ops[oi].In {
			if _, ok := remap[t]; !ok && !seen[t] && q.Tensors[t].Base != ir.NoTensor {
				if _, in := remap[e.owner(t)]; in {
					seen[t] = true
					views = append(views, t)
				}
			}
		}
	}
	sort.Slice(views, func(i, j int) bool { return views[i] < views[j] })
	var clone func(t ir.TensorID) ir.TensorID
	clone = func(t ir.TensorID) ir.TensorID {
		if r, ok := remap[t]; ok {
			return r
		}
		v := q.Tensors[t]
		v.Base = clone(v.Base)
		v.Name = e.names.Join(v.Name, ".unsharded.", suffix)
		id := e.add(v)
		remap[t] = id
		op.Out = append(op.Out, id)
		return id
	}
	for _, t := range views {
		clone(t)
	}
	return op, remap
}

// buildUnits groups the parameters read by forward and backward ops into
// units: one per block (ir.BlockOf of the reading op's module), merging
// blocks that share a parameter. With root, the modules outside any indexed
// block form one unit, "root" (FSDP's root module under a wrap policy of
// layers). owner is each tensor's storage (the editor's table: walking each
// view's chain through the tensor array, 0.4 s of deepseek-v3 --pp 8
// --accum 16 --dp 4 --zero 3's plan, missed the cache). It returns the
// units in order of first use and each tensor's unit (-1: none).
func buildUnits(q *ir.Program, root bool, owner func(ir.TensorID) ir.TensorID) ([]unit, []int32) {
	isParam := paramSet(q)
	parent := map[string]string{}
	var find func(string) string
	find = func(b string) string {
		if parent[b] == b {
			return b
		}
		r := find(parent[b])
		parent[b] = r
		return r
	}
	var blockOrder []string
	firstBlock := make([]string, len(q.Tensors))
	seen := make([]bool, len(q.Tensors))
	var paramOrder []ir.TensorID
	module, b := "", ""
	for oi := range q.Ops {
		op := &q.Ops[oi]
		if op.Phase == ir.Optimizer {
			continue
		}
		if op.Module != module || oi == 0 {
			module, b = op.Module, ir.BlockOf(op.Module)
			if root && !indexedBlock(b) {
				b = ""
			}
		}
		for _, t := range op.In {
			o := owner(t)
			if !isParam.has(o) || q.Tensors[o].Host {
				continue
			}
			if _, ok := parent[b]; !ok {
				parent[b] = b
				blockOrder = append(blockOrder, b)
			}
			if seen[o] {
				ra, rb := find(firstBlock[o]), find(b)
				if ra != rb {
					parent[rb] = ra
				}
			} else {
				seen[o], firstBlock[o] = true, b
				paramOrder = append(paramOrder, o)
			}
		}
	}
	idx := map[string]int{}
	var us []unit
	for _, b := range blockOrder {
		r := find(b)
		if _, ok := idx[r]; !ok {
			idx[r] = len(us)
			us = append(us, unit{name: r})
		}
	}
	unitOf := make([]int32, len(q.Tensors))
	for i := range unitOf {
		unitOf[i] = -1
	}
	for _, pid := range paramOrder {
		u := idx[find(firstBlock[pid])]
		unitOf[pid] = int32(u)
		us[u].params = append(us[u].params, pid)
	}
	for i := range us {
		if us[i].name == "" {
			us[i].name = "root"
		}
	}
	return us, unitOf
}

// paramGrads pairs parameter gradients with their parameters.
type paramGrads struct {
	grads []ir.TensorID               // gradient storages in creation order
	param map[ir.TensorID]ir.TensorID // gradient → parameter
	grad  tensorSet                   // the gradients
}

func (pg *paramGrads) isGrad(t ir.TensorID) bool { return pg.grad.has(t) }

// pairGrads finds each parameter's gradient: the backward op of a node
// creates the gradients of the parameters its forward op reads that have
// none yet, in input order (plan's lowering; accumulation into an existing
// gradient reads it instead).
func pairGrads(q *ir.Program) (*paramGrads, error) {
	isParam := paramSet(q)
	fwd, micros := forwardOps(q)
	pg := &paramGrads{param: map[ir.TensorID]ir.TensorID{}, grad: make(tensorSet, len(q.Tensors))}
	hasGrad := make([]bool, len(q.Tensors))
	var fresh, cands []ir.TensorID // per op, reused
	for oi := range q.Ops {
		op := &q.Ops[oi]
		if op.Phase != ir.Backward {
			continue
		}
		fresh = fresh[:0]
		for _, t := range op.Out {
			tt := &q.Tensors[t]
			if tt.Cat == ir.Gradient && tt.Base == ir.NoTensor && !tt.Host {
				if !pg.grad[t] {
					fresh = append(fresh, t)
				}
			}
		}
		if len(fresh) == 0 {
			continue
		}
		cands = cands[:0]
		if q.GradOf != nil {
			var err error
			if cands, err = recordedParams(q, oi, fresh, hasGrad); err != nil {
				return nil, err
			}
		} else {
			fi := int32(-1)
			if op.Node >= 0 && op.Micro >= 0 {
				fi = fwd[int(op.Node)*micros+op.Micro]
			}
			if fi < 0 {
				return nil, fmt.Errorf("cannot tell which parameters op %d (%s) computes gradients for", oi, op.Name)
			}
			for _, t := range q.Ops[fi].In {
				if isParam.has(t) && q.Tensors[t].RequiresGrad && !hasGrad[t] && !containsTensor(cands, t) {
					cands = append(cands, t)
				}
			}
		}
		if len(cands) != len(fresh) {
			return nil, fmt.Errorf("op %d (%s) creates %d gradients for %d parameters", oi, op.Name, len(fresh), len(cands))
		}
		for i, g := range fresh {
			pg.param[g] = cands[i]
			pg.grad[g] = true
			hasGrad[cands[i]] = true
			pg.grads = append(pg.grads, g)
		}
	}
	return pg, nil
}

// recordedParams are the parameters of the gradients fresh that op oi
// creates, from the program's recorded pairing (Program.GradOf: a trace's
// param_grads).
func recordedParams(q *ir.Program, oi int, fresh []ir.TensorID, hasGrad []bool) ([]ir.TensorID, error) {
	out := make([]ir.TensorID, len(fresh))
	for i, g := range fresh {
		p, ok := q.GradOf[g]
		if !ok || p < 0 || int(p) >= len(q.Tensors) {
			return nil, fmt.Errorf("gradient %s of op %d (%s) belongs to no recorded parameter", q.Tensors[g].Name, oi, q.Ops[oi].Name)
		}
		if hasGrad[p] {
			return nil, fmt.Errorf("parameter %s has two gradients (%s, of op %d, is the second)", q.Tensors[p].Name, q.Tensors[g].Name, oi)
		}
		out[i] = p
	}
	return out, nil
}

// forwardOps indexes the first forward op of each node in each micro-step:
// fwd[node*micros+micro] (-1: none). Bounded: nodes × micros is about the
// program's op count (every node has ops in each of ≤ 1024 micro-steps).
func forwardOps(q *ir.Program) (fwd []int32, micros int) {
	nodes := 0
	micros = 1
	for oi := range q.Ops {
		nodes, micros = max(nodes, int(q.Ops[oi].Node)+1), max(micros, q.Ops[oi].Micro+1)
	}
	fwd = make([]int32, nodes*micros)
	for i := range fwd {
		fwd[i] = -1
	}
	for oi := range q.Ops {
		op := &q.Ops[oi]
		if op.Phase == ir.Forward && !op.Recompute && op.Node >= 0 {
			if k := int(op.Node)*micros + op.Micro; fwd[k] < 0 {
				fwd[k] = int32(oi)
			}
		}
	}
	return fwd, micros
}
