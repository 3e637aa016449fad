package strategy

import (
	"github.com/memplan/memplan/ir"
)

// AutocastCache is torch.autocast's weight-cast cache: the lower-precision
// copy of a trainable float32 parameter (a tensor ops.Builder marks
// ir.Tensor.AutocastCached) is kept in a per-thread cache from its first
// cast until the outermost autocast region exits (pytorch/pytorch@008ec6b1
// aten/src/ATen/autocast_mode.cpp, cached_cast; torch/amp/autocast_mode.py
// at PyTorch 2.14.1, autocast.__exit__: torch.clear_autocast_cache() once
// autocast_decrement_nesting() returns 0). The apply inserts one
// ir.AutocastExit op at the end of every region, reading the cached copies
// the region made, so each lives to its region's end and no longer:
//
//   - a forward region: a run of forward ops of one micro-step (the
//     model's forward and the loss, as transformers' Trainer and plain
//     loops wrap them). On a pipeline stage it is the stage's forward of
//     one micro-batch (each stage is its own process, and each forward
//     step its own region).
//   - a recompute region: torch.utils.checkpoint replays a segment inside
//     backward under a torch.autocast of its own (torch/utils/checkpoint.py
//     at 2.14.1: CheckpointFunction.backward and the non-reentrant
//     recompute_fn enter torch.amp.autocast with the forward's
//     cache_enabled), outside any other region, so a recomputed copy lives
//     until its segment's replay ends. Ops a later transform put between
//     the replayed ops (gathers, reloads: no autograd node) do not end it.
//
// A copy saved for backward (a matmul's weight without checkpointing)
// outlives the exit anyway; the exit matters where the forward saves
// nothing (checkpointing) and for copies nothing saves (biases). Apply it
// last, on the final op order: the strategies before it never see the
// exits. A program without cached copies (fp32, a trace, whose recorded
// frees already hold the cache) is returned unchanged.
type AutocastCache struct{}

var _ Transform = (*AutocastCache)(nil)

// Name implements Transform.
func (*AutocastCache) Name() string { return "autocast-cache" }

// Apply implements Transform.
func (a *AutocastCache) Apply(p *ir.Program) (*ir.Program, error) { return a.apply(p, false) }

func (a *AutocastCache) apply(p *ir.Program, own bool) (*ir.Program, error) {
	exits := autocastExits(p)
	if len(exits) == 0 {
		return p, nil
	}
	var e *editor
	if own {
		e = newInserter(p)
	} else {
		// The ops are copied once, with the exits in place (finish);
		// the exits add no tensor, so the tensors stay p's.
		e = newInserter(shareTensors(p)).sharedOps()
	}
	e.after = map[int][]ir.Op{}
	for _, x := range exits {
		e.after[x.at] = append(e.after[x.at], x.op)
	}
	return e.finish(), nil
}

// regionExit is an exit op to insert after op at.
type regionExit struct {
	at int
	op ir.Op
}

// autocastExits finds the regions of p and the exit of each that made a
// cached copy.
func autocastExits(p *ir.Program) []regionExit {
	var exits []regionExit
	var open *ir.Op // the region's first op
	var cached []ir.TensorID
	last := -1 // the region's last op
	end := func() {
		if len(cached) > 0 {
			exits = append(exits, regionExit{last, ir.Op{Name: ir.AutocastExit, Phase: open.Phase, Micro: open.Micro,
				Recompute: open.Recompute, Node: -1, In: cached}})
		}
		open, cached = nil, nil
	}
	for i := range p.Ops {
		op := &p.Ops[i]
		kind := regionKind(op)
		if open != nil && (kind != regionKind(open) || op.Micro != open.Micro) {
			if kind == inNone && op.Node < 0 && open.Recompute {
				continue // a gather or reload inside a replay
			}
			end()
		}
		if kind == inNone {
			continue
		}
		if open == nil {
			open = op
		}
		last = i
		for _, t := range op.Out {
			if p.Tensors[t].AutocastCached {
				cached = append(cached, t)
			}
		}
	}
	if open != nil {
		end()
	}
	return exits
}

// Region kinds of an op.
const (
	inNone = iota
	inForward
	inRecompute
)

func regionKind(op *ir.Op) int {
	switch {
	case op.Recompute:
		return inRecompute
	case op.Phase == ir.Forward:
		return inForward
	}
	return inNone
}

// WithoutExits is the program AutocastCache made q from — q without its
// ir.AutocastExit ops, which the cache only inserts — as a Clone, for
// ChainOwned: a cache that holds a plan's program in place of the one it
// was made from (engine.LeverCache) makes that one again for the
// transforms that start from it, in one copy.
func WithoutExits(q *ir.Program) *ir.Program {
	return withoutExits(q)
}

// DropExits is WithoutExits made in place, for a caller that owns q (a
// cache's program on its last use): q without its exits.
func DropExits(q *ir.Program) *ir.Program {
	w := 0
	for i := range q.Ops {
		if q.Ops[i].Name != ir.AutocastExit {
			q.Ops[w] = q.Ops[i]
			w++
		}
	}
	clear(q.Ops[w:])
	q.Ops = q.Ops[:w]
	return q
}

func withoutExits(q *ir.Program) *ir.Program {
	p := cloneTensors(q, len(q.Tensors)/4+16)
	// One pass copies the ops between the exits (a Clone and then a
	// delete moved the ops after the first exit twice).
	ops := opPool.get(0, len(q.Ops)+len(q.Ops)/4+16)
	from := 0
	for i := range q.Ops {
		if q.Ops[i].Name == ir.AutocastExit {
			ops = append(ops, q.Ops[from:i]...)
			from = i + 1
		}
	}
	p.Ops = append(ops, q.Ops[from:]...)
	capOperands(p.Ops)
	return p
}
