// Package strategy holds memory-saving transforms of an ir.Program:
// activation checkpointing, offload, ZeRO/FSDP sharding, pipeline schedules.
// Each rewrites the program that the same simulator then replays, so every
// strategy shows up in the timeline and is priced by the same cost model;
// none is a separate formula. Strategies that change shapes (tensor and
// sequence parallel, LoRA, QLoRA, expert parallel) are model-builder options
// instead (models/build), because they change the forward graph itself.
package strategy

import (
	"fmt"
	"slices"
	"sort"

	"github.com/memplan/memplan/ir"
)

// Transform rewrites a program. Apply must not modify its input: it returns
// a new program (sharing nothing mutable with the old one) or an error that
// says why the transform does not apply.
type Transform interface {
	Name() string
	Apply(p *ir.Program) (*ir.Program, error)
}

// rewriter is a Transform that can also rewrite a program it owns in place
// (own), sparing the copy.
type rewriter interface {
	apply(p *ir.Program, own bool) (*ir.Program, error)
}

// editable is p itself when the transform owns it, else a Clone.
func editable(p *ir.Program, own bool) *ir.Program {
	if own {
		return p
	}
	return Clone(p)
}

// Chain applies transforms in order and verifies the program after each.
// p is not modified; the programs between transforms are Chain's own, so
// transforms after the first rewrite them in place where they can.
func Chain(p *ir.Program, ts ...Transform) (*ir.Program, error) {
	for i, t := range ts {
		var q *ir.Program
		var err error
		if r, ok := t.(rewriter); ok && i > 0 {
			q, err = r.apply(p, true)
		} else {
			q, err = t.Apply(p)
		}
		if err != nil {
			return nil, err
		}
		if err := q.Verify(); err != nil {
			return nil, fmt.Errorf("strategy: %s produced an invalid program: %w", t.Name(), err)
		}
		p = q
	}
	return p, nil
}

// Clone copies a program so a transform can edit it: its tensors and ops
// are its own, but tensor shapes, operand lists (In, Out) and the Comm and
// Transfer of ops are shared with p. Transforms replace those, never write
// into them (rewriteIn copies an operand list at its first change); each
// shared operand list is capped at its length, so an append reallocates
// instead of writing into p's spare capacity.
func Clone(p *ir.Program) *ir.Program {
	// Room for the tensors and ops a transform adds, so its first add does
	// not copy them all and editor.finish can insert in place.
	return cloneWithRoom(p, len(p.Ops)/4+16, len(p.Tensors)/4+16)
}

// cloneWithRoom is Clone with room for ops more ops and tensors more
// tensors.
func cloneWithRoom(p *ir.Program, ops, tensors int) *ir.Program {
	q := &ir.Program{MicroBatches: p.MicroBatches}
	q.Tensors = tensorPool.get(len(p.Tensors), len(p.Tensors)+tensors)
	copy(q.Tensors, p.Tensors)
	q.Ops = opPool.get(len(p.Ops), len(p.Ops)+ops)
	copy(q.Ops, p.Ops)
	for i := range q.Ops {
		op := &q.Ops[i]
		op.In, op.Out = op.In[:len(op.In):len(op.In)], op.Out[:len(op.Out):len(op.Out)]
	}
	q.Params = append([]ir.TensorID(nil), p.Params...)
	return q
}

// tensorSet is a set of tensor IDs as a dense bitmap over a program's
// tensors (IDs past its end are not members).
type tensorSet []bool

func (s tensorSet) has(t ir.TensorID) bool { return t >= 0 && int(t) < len(s) && s[t] }

// paramSet is the set of p's parameters.
func paramSet(p *ir.Program) tensorSet {
	s := make(tensorSet, len(p.Tensors))
	for _, id := range p.Params {
		s[id] = true
	}
	return s
}

// rewriteIn replaces each operand t of op.In (at position i) by f(i, t).
// Operand lists are shared between programs (Clone), so the list is copied
// at its first change instead of written into.
func rewriteIn(op *ir.Op, f func(i int, t ir.TensorID) ir.TensorID) {
	in := op.In
	copied := false
	for i, t := range in {
		if r := f(i, t); r != t {
			if !copied {
				op.In = slices.Clone(in)
				copied = true
			}
			op.In[i] = r
		}
	}
}

var registry = map[string]func() Transform{}

// Register adds a named constructor; it refuses duplicates (programmer
// error, checked at init).
func Register(name string, f func() Transform) {
	if _, dup := registry[name]; dup {
		panic("strategy: duplicate transform " + name)
	}
	registry[name] = f
}

// Names lists the registered transforms.
func Names() []string {
	out := make([]string, 0, len(registry))
	for n := range registry {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}
