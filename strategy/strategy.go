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

// Chain applies transforms in order and verifies the program after each.
func Chain(p *ir.Program, ts ...Transform) (*ir.Program, error) {
	for _, t := range ts {
		q, err := t.Apply(p)
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

// Clone deep-copies a program so a transform can edit it freely.
func Clone(p *ir.Program) *ir.Program {
	q := &ir.Program{MicroBatches: p.MicroBatches}
	q.Tensors = make([]ir.Tensor, len(p.Tensors))
	for i, t := range p.Tensors {
		t.Shape = append([]int64(nil), t.Shape...)
		q.Tensors[i] = t
	}
	q.Ops = make([]ir.Op, len(p.Ops))
	for i, op := range p.Ops {
		op.In = append([]ir.TensorID(nil), op.In...)
		op.Out = append([]ir.TensorID(nil), op.Out...)
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
