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
func Chain(p *ir.Program, ts ...Transform) (*ir.Program, error) { return chain(p, false, ts) }

// ChainOwned is Chain for a program the caller hands over: the first
// transform may rewrite p itself, which must not be used afterwards.
func ChainOwned(p *ir.Program, ts ...Transform) (*ir.Program, error) { return chain(p, true, ts) }

func chain(p *ir.Program, own bool, ts []Transform) (*ir.Program, error) {
	for i, t := range ts {
		var q *ir.Program
		var err error
		if r, ok := t.(rewriter); ok && (i > 0 || own) {
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

// Clone copies a program so a transform can edit it freely. Shapes are
// shared: transforms replace a tensor's Shape, never write into it.
// Operand lists are carved from one backing array (each capped at its
// length, so appending to one reallocates it instead of overwriting its
// neighbour): a handful of allocations instead of two per op.
func Clone(p *ir.Program) *ir.Program {
	q := &ir.Program{MicroBatches: p.MicroBatches}
	// Room for the tensors a transform adds, so its first add does not copy
	// them all.
	q.Tensors = make([]ir.Tensor, len(p.Tensors), len(p.Tensors)+len(p.Tensors)/4+16)
	copy(q.Tensors, p.Tensors)
	q.Ops = make([]ir.Op, len(p.Ops))
	ids := 0
	for i := range p.Ops {
		ids += len(p.Ops[i].In) + len(p.Ops[i].Out)
	}
	operands := make([]ir.TensorID, ids)
	carve := func(s []ir.TensorID) []ir.TensorID {
		if s == nil {
			return nil
		}
		n := copy(operands, s)
		s, operands = operands[:n:n], operands[n:]
		return s
	}
	for i, op := range p.Ops {
		op.In = carve(op.In)
		op.Out = carve(op.Out)
		if op.Comm != nil {
			c := *op.Comm
			op.Comm = &c
		}
		if op.Transfer != nil {
			tr := *op.Transfer
			op.Transfer = &tr
		}
		q.Ops[i] = op
	}
	q.Params = append([]ir.TensorID(nil), p.Params...)
	return q
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
