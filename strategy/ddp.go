package strategy

import (
	"fmt"
	"sort"

	"github.com/memplan/memplan/ir"
	"github.com/memplan/memplan/units"
)

// DDP is PyTorch DistributedDataParallel over DP ranks (stage 0: nothing
// sharded). The reducer keeps one flat buffer per gradient bucket, allocated
// at construction (Reducer::initialize_buckets), so DDP holds the gradients'
// bytes a second time: "ddp.bucket[k]" is resident (Cat Gradient). Buckets
// are filled in the order gradients become ready (the order DDP rebuilds
// its buckets in after the first iteration), the first capped at 1 MiB
// (torch.distributed's _DEFAULT_FIRST_BUCKET_BYTES) and the rest at
// BucketMiB (bucket_cap_mb, default 25); a bucket closes once it reaches its
// cap. When a bucket's last gradient is ready, "ddp.all_reduce(bucket k)"
// (Comm AllReduce, group "dp") reads its gradients and buffer (copy in,
// all-reduce, copy back). Under gradient accumulation the micro-steps before
// the last run under no_sync() (as HF Trainer and Accelerate do), so only the
// last one communicates. With GradientAsBucketView the gradients are views
// into the bucket buffers: no second copy, but the gradients then persist
// between iterations (resident) even under zero_grad(set_to_none=True).
type DDP struct {
	DP                   int
	BucketMiB            float64
	GradientAsBucketView bool
}

var _ Transform = (*DDP)(nil)

// Name implements Transform.
func (d *DDP) Name() string { return "ddp" }

// DDP bucket caps (torch/nn/parallel/distributed.py).
const (
	ddpFirstBucket   = units.MiB
	DefaultBucketMiB = 25
)

// Apply implements Transform.
func (d *DDP) Apply(p *ir.Program) (*ir.Program, error) { return d.apply(p, false) }

// Bounded: bucket sizes are sums of gradients' bytes (≤ 2^62 in all,
// engine.checkProgramBytes); BucketMiB is the default unless a caller sets
// it (no flag or switch does).
func (d *DDP) apply(p *ir.Program, own bool) (*ir.Program, error) {
	if d.DP < 2 {
		return nil, fmt.Errorf("DDP needs at least 2 data-parallel ranks; with %d it changes nothing", max(d.DP, 1))
	}
	if d.BucketMiB < 0 {
		return nil, fmt.Errorf("DDP bucket of %g MiB must not be negative", d.BucketMiB)
	}
	capB := units.Bytes(float64(units.MiB) * d.BucketMiB)
	if d.BucketMiB == 0 {
		capB = DefaultBucketMiB * units.MiB
	}
	q := editable(p, own)
	pg, err := pairGrads(q)
	if err != nil {
		return nil, err
	}
	if len(pg.grads) == 0 {
		return nil, fmt.Errorf("DDP needs a training program; this one has no parameter gradients")
	}
	e := newEditor(q)
	m := max(q.MicroBatches, 1) - 1
	self := map[ir.TensorID]ir.TensorID{}
	for _, g := range pg.grads {
		self[g] = g
	}
	order, ready := readyOrder(q, m, pg.grads, self)
	var bucket []ir.TensorID
	var size units.Bytes
	k := 0
	limit := ddpFirstBucket
	flush := func(at int) {
		if len(bucket) == 0 {
			return
		}
		op := ir.Op{Name: fmt.Sprintf("ddp.all_reduce(bucket %d)", k), Phase: ir.Backward, Micro: m, Node: -1,
			In: append([]ir.TensorID(nil), bucket...), Comm: &ir.Comm{Kind: ir.AllReduce, Bytes: size, Group: ir.DataGroup, Ranks: d.DP}}
		if d.GradientAsBucketView {
			for _, g := range bucket {
				q.Tensors[g].Resident = true
			}
		} else {
			dt := q.Tensors[bucket[0]].DType
			buf := e.add(ir.Tensor{Name: fmt.Sprintf("ddp.bucket[%d]", k), Shape: []int64{int64(size) * 8 / int64(max(dt.Bits(), 1))},
				DType: dt, Bytes: size, Base: ir.NoTensor, Cat: ir.Gradient, Resident: true})
			op.In = append(op.In, buf)
		}
		e.after[at] = append(e.after[at], op)
		bucket, size = nil, 0
		k++
		limit = capB
	}
	for _, g := range order {
		bucket = append(bucket, g)
		size += q.Tensors[g].Bytes
		if size >= limit {
			flush(ready[g])
		}
	}
	if len(bucket) > 0 {
		flush(e.lastBackward(m))
	}
	return e.finish(), nil
}

// readyOrder lists the gradients of grads in the order they become ready in
// micro-step m: by the last backward op of m that touches them. key maps a
// touched tensor to the gradient it stands for (a micro-step's fresh copy,
// or the gradient itself). Gradients m never touches are left out. It also
// returns each gradient's ready op.
func readyOrder(q *ir.Program, m int, grads []ir.TensorID, key map[ir.TensorID]ir.TensorID) ([]ir.TensorID, map[ir.TensorID]int) {
	ready := map[ir.TensorID]int{}
	for oi := range q.Ops {
		op := &q.Ops[oi]
		if op.Phase != ir.Backward || op.Micro != m {
			continue
		}
		for _, ts := range [][]ir.TensorID{op.In, op.Out} {
			for _, t := range ts {
				if g, ok := key[t]; ok {
					ready[g] = oi
				}
			}
		}
	}
	var order []ir.TensorID
	for _, g := range grads {
		if _, ok := ready[g]; ok {
			order = append(order, g)
		}
	}
	sort.SliceStable(order, func(i, j int) bool { return ready[order[i]] < ready[order[j]] })
	return order, ready
}
