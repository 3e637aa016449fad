package ckpt

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Block is one element of the chain (a transformer layer, a ResNet stage):
// the unit torch.utils.checkpoint is applied to.
type Block struct {
	// Name labels the block in messages; it plays no part in the model.
	Name string
	// Input is the size in bytes of the block's input activation (the
	// previous block's output). A checkpointed block keeps only this between
	// its forward and its backward: torch.utils.checkpoint saves the inputs.
	Input int64
	// Saved is everything the block holds between its forward and its
	// backward when it is NOT checkpointed, in bytes, its input included
	// (autograd saves the input for the block's first op, so Saved ≥ Input).
	// It is also what a checkpointed block rematerialises when its backward
	// runs. The block's output is not part of Saved: it is the next block's
	// Input (the last block's output belongs to the loss, outside the chain).
	Saved int64
	// Forward is the cost of running the block's forward once: the price of
	// recomputing it when it is checkpointed (seconds, FLOPs; any unit used
	// consistently across the chain).
	Forward float64
	// Peak is the transient memory of the block's backward beyond Saved
	// (kernel workspaces, the incoming output gradient and the input gradient
	// being produced), in bytes. It is live only while the block's backward
	// runs.
	Peak int64
}

// Policy says, per block, whether the block is checkpointed: Policy[i] is
// true when block i runs under torch.utils.checkpoint. Its length equals the
// chain's.
type Policy []bool

// Count is the number of checkpointed blocks.
func (p Policy) Count() int {
	c := 0
	for _, b := range p {
		if b {
			c++
		}
	}
	return c
}

// Indices lists the checkpointed blocks in increasing order.
func (p Policy) Indices() []int {
	out := make([]int, 0, p.Count())
	for i, b := range p {
		if b {
			out = append(out, i)
		}
	}
	return out
}

// String renders the policy one character per block: 'C' for checkpointed,
// '.' for kept.
func (p Policy) String() string {
	var sb strings.Builder
	sb.Grow(len(p))
	for _, b := range p {
		if b {
			sb.WriteByte('C')
		} else {
			sb.WriteByte('.')
		}
	}
	return sb.String()
}

// ErrInfeasible is returned (wrapped) when no policy keeps the peak within
// the budget, i.e. when even checkpointing every block exceeds it. The
// message carries the minimum achievable peak.
var ErrInfeasible = errors.New("budget infeasible")

// ErrInvalid is returned (wrapped) for a malformed chain.
var ErrInvalid = errors.New("invalid chain")

// ErrTooLarge is returned (wrapped) when a solver's state would exceed its
// configured limit (Options.MaxCells, OptimalExact's frontier limit).
var ErrTooLarge = errors.New("problem too large")

// maxTotal bounds the sum of all Saved and Peak bytes so that every prefix
// sum and budget difference in this package stays far from int64 overflow.
const maxTotal = math.MaxInt64 / 4

// Validate checks that every size is non-negative, Saved ≥ Input, Forward is
// finite and non-negative, and the totals are far from int64 overflow.
func Validate(blocks []Block) error {
	var total int64
	for i, b := range blocks {
		switch {
		case b.Input < 0 || b.Saved < 0 || b.Peak < 0:
			return fmt.Errorf("%w: block %s has a negative size", ErrInvalid, label(blocks, i))
		case b.Saved < b.Input:
			return fmt.Errorf("%w: block %s: Saved (%d) < Input (%d); Saved includes the input", ErrInvalid, label(blocks, i), b.Saved, b.Input)
		case math.IsNaN(b.Forward) || math.IsInf(b.Forward, 0) || b.Forward < 0:
			return fmt.Errorf("%w: block %s: Forward %v is not a finite non-negative cost", ErrInvalid, label(blocks, i), b.Forward)
		}
		if b.Saved > maxTotal-total || b.Peak > maxTotal-total-b.Saved {
			return fmt.Errorf("%w: sizes overflow at block %s", ErrInvalid, label(blocks, i))
		}
		total += b.Saved + b.Peak
	}
	return nil
}

func label(blocks []Block, i int) string {
	if blocks[i].Name != "" {
		return strconv.Itoa(i) + " (" + blocks[i].Name + ")"
	}
	return strconv.Itoa(i)
}

// Evaluate is the memory model of the package (see the package
// documentation), the single source of truth the solvers and tests are
// checked against. It returns the peak
//
//	max over i of  Σ_{j<i} held_j + Saved_i + Peak_i,   held_j = Input_j if p[j] else Saved_j,
//
// and the recompute Σ Forward_i over checkpointed blocks (summed in block
// order). An empty chain has peak 0. It panics when len(p) != len(blocks);
// it does not validate the blocks.
func Evaluate(blocks []Block, p Policy) (peak int64, recompute float64) {
	if len(p) != len(blocks) {
		panic(fmt.Sprintf("ckpt.Evaluate: policy has %d entries for %d blocks", len(p), len(blocks)))
	}
	var held int64
	for i, b := range blocks {
		if v := held + b.Saved + b.Peak; v > peak {
			peak = v
		}
		if p[i] {
			held += b.Input
			recompute += b.Forward
		} else {
			held += b.Saved
		}
	}
	return peak, recompute
}

// MinPeak is the smallest peak any policy reaches: the peak of checkpointing
// every block.
func MinPeak(blocks []Block) int64 {
	peak, _ := Evaluate(blocks, All(len(blocks)))
	return peak
}

// All checkpoints every block of an n-block chain.
func All(n int) Policy {
	p := make(Policy, n)
	for i := range p {
		p[i] = true
	}
	return p
}

// None checkpoints no block (plain training).
func None(n int) Policy { return make(Policy, n) }

// infeasible builds the ErrInfeasible error for a budget below MinPeak.
// check is the solvers' common entry: the chain must be valid and the
// budget at least the peak with every block checkpointed. An empty chain
// passes (its policy is empty).
func check(blocks []Block, budget int64) error {
	if err := Validate(blocks); err != nil {
		return err
	}
	if budget < 0 || (len(blocks) > 0 && MinPeak(blocks) > budget) {
		return infeasible(blocks, budget)
	}
	return nil
}

func infeasible(blocks []Block, budget int64) error {
	return fmt.Errorf("%w: budget %d B is below the minimum achievable peak %d B (every block checkpointed)",
		ErrInfeasible, budget, MinPeak(blocks))
}
