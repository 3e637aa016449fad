package engine

import (
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/memplan/memplan/ir"
	"github.com/memplan/memplan/strategy"
)

// CheckpointPolicy is what --checkpoint asks for.
type CheckpointPolicy struct {
	// Kind is "", "full", "every", "modules", "selective" or "auto".
	Kind string
	// Every is k for "every": checkpoint blocks 0, k, 2k, ...
	Every int
	// Patterns for "modules".
	Patterns []string
}

// ParseCheckpoint reads none, full, every=K, modules=GLOB[,GLOB...],
// selective and auto.
func ParseCheckpoint(s string) (CheckpointPolicy, error) {
	s = strings.TrimSpace(s)
	switch {
	case s == "" || s == "none":
		return CheckpointPolicy{}, nil
	case s == "full" || s == "selective" || s == "auto":
		return CheckpointPolicy{Kind: s}, nil
	case strings.HasPrefix(s, "every="):
		k, err := strconv.Atoi(strings.TrimPrefix(s, "every="))
		if err != nil || k < 1 {
			return CheckpointPolicy{}, fmt.Errorf("engine: --checkpoint every=K needs a positive integer K, got %q", strings.TrimPrefix(s, "every="))
		}
		return CheckpointPolicy{Kind: "every", Every: k}, nil
	case strings.HasPrefix(s, "modules="):
		var pats []string
		for _, p := range strings.Split(strings.TrimPrefix(s, "modules="), ",") {
			if p = strings.TrimSpace(p); p != "" {
				pats = append(pats, p)
			}
		}
		if len(pats) == 0 {
			return CheckpointPolicy{}, fmt.Errorf("engine: --checkpoint modules= needs at least one module glob, e.g. modules=model.layers.*")
		}
		return CheckpointPolicy{Kind: "modules", Patterns: pats}, nil
	}
	return CheckpointPolicy{}, fmt.Errorf("engine: unknown --checkpoint %q (want none, full, every=K, modules=GLOB, selective or auto)", s)
}

func (c CheckpointPolicy) String() string {
	switch c.Kind {
	case "":
		return "none"
	case "every":
		return "every=" + strconv.Itoa(c.Every)
	case "modules":
		return "modules=" + strings.Join(c.Patterns, ",")
	}
	return c.Kind
}

// Blocks lists the repeated blocks of p (module paths with a layer index,
// e.g. "model.layers.3"), in execution order.
func Blocks(p *ir.Program) []string {
	seen := map[string]bool{}
	var out []string
	for i := range p.Ops {
		op := &p.Ops[i]
		if op.Phase != ir.Forward || op.Micro != 0 {
			continue
		}
		b := ir.BlockOf(op.Module)
		if b == op.Module && !strings.ContainsAny(lastPart(b), "0123456789") {
			continue
		}
		if !seen[b] {
			seen[b] = true
			out = append(out, b)
		}
	}
	return out
}

func lastPart(p string) string {
	if i := strings.LastIndexByte(p, '.'); i >= 0 {
		return p[i+1:]
	}
	return p
}

// checkpointTransform turns a policy into the transform for program p; nil
// when the policy checkpoints nothing.
func checkpointTransform(c CheckpointPolicy, p *ir.Program, blocksChosen []string) (*strategy.Checkpoint, error) {
	switch c.Kind {
	case "":
		return nil, nil
	case "modules":
		return &strategy.Checkpoint{Patterns: c.Patterns}, nil
	case "selective":
		return &strategy.Checkpoint{Patterns: []string{"*.core_attention"}}, nil
	case "auto":
		if len(blocksChosen) == 0 {
			return nil, nil
		}
		return &strategy.Checkpoint{Patterns: blocksChosen}, nil
	}
	blocks := Blocks(p)
	if len(blocks) == 0 {
		return nil, fmt.Errorf("engine: the model has no repeated blocks to checkpoint")
	}
	var pats []string
	for i, b := range blocks {
		if c.Kind == "full" || i%c.Every == 0 {
			pats = append(pats, b)
		}
	}
	sort.Strings(pats)
	return &strategy.Checkpoint{Patterns: pats}, nil
}
