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
	"strings"
	"testing"

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

// Chain applies transforms in order and verifies the program they make
// (after each under test, verifyEach).
// p is not modified; the programs between transforms are Chain's own, so
// transforms after the first rewrite them in place where they can (not one
// whose tensors are another's, ir.Program.SharedTensors).
func Chain(p *ir.Program, ts ...Transform) (*ir.Program, error) {
	return chain(p, false, ts)
}

// ChainOwned is Chain on a program the caller owns and hands over (a copy
// made for it): the first transform too rewrites it in place where it can.
func ChainOwned(p *ir.Program, ts ...Transform) (*ir.Program, error) {
	return chain(p, true, ts)
}

func chain(p *ir.Program, own bool, ts []Transform) (*ir.Program, error) {
	for i, t := range ts {
		var q *ir.Program
		var err error
		if r, ok := t.(rewriter); ok && (i > 0 || own) && !p.SharedTensors {
			q, err = r.apply(p, true)
		} else {
			q, err = t.Apply(p)
		}
		if err != nil {
			return nil, err
		}
		if verifyEach || i == len(ts)-1 {
			if err := q.Verify(); err != nil {
				return nil, fmt.Errorf("%s produced an invalid program: %w", chainNames(ts[:i+1], verifyEach), err)
			}
		}
		p = q
	}
	return p, nil
}

// verifyEach says whether chain verifies the program after each transform
// (tests: an invalid program is blamed on the transform that made it) or
// only after the last (Verify after each was 0.62 s of the 17.8 s of CPU of
// deepseek-v3 --pp 8 --accum 16 --dp 4 --zero 3's plan).
var verifyEach = testing.Testing()

// chainNames names the transforms an invalid program may come from: the
// last of ts when each was verified, else all of them.
func chainNames(ts []Transform, each bool) string {
	if each {
		ts = ts[len(ts)-1:]
	}
	names := make([]string, len(ts))
	for i, t := range ts {
		names[i] = t.Name()
	}
	return strings.Join(names, " or ")
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

var (
	_ Transform = (*ActivationOffload)(nil)
	_ Transform = (*OptimizerOffload)(nil)
	_ Transform = (*ParamOffload)(nil)
)
