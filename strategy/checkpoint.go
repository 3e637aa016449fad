package strategy

import (
	"fmt"
	"path"
	"strings"

	"github.com/memplan/memplan/ir"
)

// Checkpoint is activation checkpointing with torch.utils.checkpoint's
// non-reentrant semantics applied to every module whose path matches one of
// Patterns (path.Match syntax over dotted module paths: "model.layers.*",
// "*.core_attention", or exact paths). For each matching module (the
// outermost one when patterns nest) the forward saves nothing inside the
// module but keeps the module's inputs; when backward first needs the
// module's saved tensors, its forward is replayed (ops with Recompute set,
// in the backward phase) up to the last op whose output backward needs
// (non-reentrant checkpoint's early stop), and the module's backward ops
// read the recomputed tensors, which die as they are consumed.
type Checkpoint struct {
	Patterns []string
	// Save, when set, makes the checkpoint selective at the op level
	// (torch.utils.checkpoint's selective activation checkpointing, SAC):
	// inside a segment, the ops it picks keep their outputs from the
	// forward and are not replayed; the rest are recomputed as above.
	Save *SavePolicy
}

// SavePolicy picks the ops whose outputs a selective checkpoint keeps:
// every op of a kind in Kinds, and of the kind Alternate (a matmul) only
// every other one in each segment, the first, third, ... (torchtitan's
// _save_list policy: "recompute every other mm").
type SavePolicy struct {
	Kinds     []string
	Alternate string
}

// saved lists the segment's ops (indices into ops) the policy keeps.
func (sp *SavePolicy) saved(p *ir.Program, ops []int) map[int]bool {
	out := map[int]bool{}
	if sp == nil {
		return out
	}
	n := 0
	for _, oi := range ops {
		name := p.Ops[oi].Name
		if name == sp.Alternate {
			n++
			if n%2 == 1 {
				out[oi] = true
			}
			continue
		}
		for _, k := range sp.Kinds {
			if name == k {
				out[oi] = true
			}
		}
	}
	return out
}

var _ Transform = (*Checkpoint)(nil)

// Name implements Transform.
func (c *Checkpoint) Name() string { return "checkpoint" }

// segmenter finds segment keys: the shortest dotted prefix of a module
// path that matches one of the patterns. Literal patterns (block names, as
// the engine's policies give) are looked up; only globs are matched.
type segmenter struct {
	literal map[string]bool
	globs   []string
}

func (c *Checkpoint) segmenter() *segmenter {
	sg := &segmenter{literal: map[string]bool{}}
	for _, pat := range c.Patterns {
		if strings.ContainsAny(pat, `*?[\`) {
			sg.globs = append(sg.globs, pat)
		} else {
			sg.literal[pat] = true
		}
	}
	return sg
}

func (sg *segmenter) key(module string) string {
	if module == "" {
		return ""
	}
	for i := 0; i <= len(module); i++ {
		if i < len(module) && module[i] != '.' {
			continue
		}
		prefix := module[:i]
		if sg.literal[prefix] {
			return prefix
		}
		for _, pat := range sg.globs {
			if ok, _ := path.Match(pat, prefix); ok {
				return prefix
			}
		}
	}
	return ""
}

type segment struct {
	key   string
	micro int
	ops   []int // forward op indices
}

// Apply implements Transform.
func (c *Checkpoint) Apply(p *ir.Program) (*ir.Program, error) { return c.apply(p, false) }

func (c *Checkpoint) apply(p *ir.Program, own bool) (*ir.Program, error) {
	if err := c.check(); err != nil {
		return nil, err
	}
	ck := &checkpointer{c: c, touched: map[ir.TensorID]bool{}}
	if err := ck.segments(p); err != nil {
		return nil, err
	}
	ck.copy(p, own)
	ck.e = newInserter(ck.q)
	ck.backwardOfSegments()
	for _, s := range ck.segs {
		ck.recompute(s)
	}
	ck.q = ck.e.finish()
	recategorize(ck.q, ck.touched)
	return ck.q, nil
}

// check rejects a checkpoint without patterns or with a malformed one.
func (c *Checkpoint) check() error {
	if len(c.Patterns) == 0 {
		return fmt.Errorf("checkpoint needs at least one module pattern")
	}
	for _, pat := range c.Patterns {
		if _, err := path.Match(pat, ""); err != nil {
			return fmt.Errorf("bad checkpoint pattern %q: %v", pat, err)
		}
	}
	return nil
}

// segID names a segment's backward: its key in one micro-step.
type segID struct {
	key   string
	micro int
}

// checkpointer is one Checkpoint.apply. Its phases: segments (runs of consecutive forward ops under one
// matched module, per micro-step), copy (the program it rewrites, with room for the recompute), backward of
// segments (each backward op under its segment's key), then recompute per segment (clones of the forward ops
// up to the last one whose output backward reads, inserted before the segment's first backward op, which
// reads the clones), and finally the editor's finish and recategorize.
type checkpointer struct {
	c       *Checkpoint
	q       *ir.Program
	segs    []segment
	bwdOf   map[segID][]int      // backward ops of each segment, in order
	e       *editor              // the recompute ops go before the first backward op of their segment
	touched map[ir.TensorID]bool // storages whose category recategorize decides
}

// segments finds the runs of consecutive forward ops whose module falls under one pattern's match.
func (ck *checkpointer) segments(p *ir.Program) error {
	sgm := ck.c.segmenter()
	keys := map[string]string{} // module path → segment key, memoised
	segs := ck.segs
	for i := range p.Ops {
		op := &p.Ops[i]
		if op.Phase != ir.Forward || op.Recompute {
			continue
		}
		key, ok := keys[op.Module]
		if !ok {
			key = sgm.key(op.Module)
			keys[op.Module] = key
		}
		if key == "" {
			continue
		}
		if n := len(segs); n > 0 && segs[n-1].key == key && segs[n-1].micro == op.Micro && segs[n-1].ops[len(segs[n-1].ops)-1] == i-1 {
			segs[n-1].ops = append(segs[n-1].ops, i)
			continue
		}
		segs = append(segs, segment{key: key, micro: op.Micro, ops: []int{i}})
	}
	if len(segs) == 0 {
		return fmt.Errorf("no module matches checkpoint patterns %s", strings.Join(ck.c.Patterns, ", "))
	}
	ck.segs = segs
	return nil
}

// copy is the program to rewrite: p when the caller owns it, else a clone with room for the recompute ops and
// their outputs (at most one per segment op and output).
func (ck *checkpointer) copy(p *ir.Program, own bool) {
	ck.q = p
	if own {
		return
	}
	ops, outs := 0, 0
	for _, sg := range ck.segs {
		ops += len(sg.ops)
		for _, oi := range sg.ops {
			outs += len(p.Ops[oi].Out)
		}
	}
	ck.q = cloneWithRoom(p, ops, outs)
}

// backwardOfSegments finds the backward ops of each segment in one pass: a backward op belongs to the segment
// whose key prefixes its module (the longest), in the same micro-step.
func (ck *checkpointer) backwardOfSegments() {
	ck.bwdOf = map[segID][]int{}
	prefixKey := map[string]string{} // module → the segment key it falls under
	segKeys := map[string]bool{}
	for _, sg := range ck.segs {
		segKeys[sg.key] = true
	}
	keyUnder := func(module string) string {
		if k, ok := prefixKey[module]; ok {
			return k
		}
		k := ""
		for m := module; ; {
			if segKeys[m] {
				k = m
			}
			i := strings.LastIndexByte(m, '.')
			if i < 0 {
				break
			}
			m = m[:i]
		}
		prefixKey[module] = k
		return k
	}
	for j := range ck.q.Ops {
		op := &ck.q.Ops[j]
		if op.Phase != ir.Backward || op.Recompute {
			continue
		}
		if k := keyUnder(op.Module); k != "" {
			id := segID{k, op.Micro}
			ck.bwdOf[id] = append(ck.bwdOf[id], j)
		}
	}
}

// recompute replays segment s inside backward, when backward reads anything it produced.
func (ck *checkpointer) recompute(s segment) {
	q := ck.q
	produced := map[ir.TensorID]bool{}
	for _, oi := range s.ops {
		for _, t := range q.Ops[oi].Out {
			produced[t] = true
		}
	}
	var bwd []int
	for _, j := range ck.bwdOf[segID{s.key, s.micro}] {
		if j > s.ops[len(s.ops)-1] {
			bwd = append(bwd, j)
		}
	}
	lastNeeded := ck.lastNeeded(s, bwd, produced)
	if lastNeeded < 0 {
		return
	}
	rmap := map[ir.TensorID]ir.TensorID{}
	var clones []ir.Op
	keep := ck.c.Save.saved(q, s.ops)
	for _, oi := range s.ops[:lastNeeded+1] {
		if keep[oi] {
			// Saved by the policy: backward and the replay read the
			// forward's outputs, which stay alive until then.
			for _, t := range q.Ops[oi].Out {
				ck.touched[ir.Storage(q.Tensors, t)] = true
			}
			continue
		}
		clones = append(clones, ck.clone(oi, rmap, produced))
	}
	for t := range produced {
		ck.touched[ir.Storage(q.Tensors, t)] = true
	}
	for _, j := range bwd {
		substitute(&q.Ops[j], rmap)
	}
	ck.e.before[bwd[0]] = append(ck.e.before[bwd[0]], clones...)
}

// lastNeeded is the index in s.ops of the last op whose output the segment's backward ops read, or -1.
func (ck *checkpointer) lastNeeded(s segment, bwd []int, produced map[ir.TensorID]bool) int {
	q := ck.q
	needed := map[ir.TensorID]bool{}
	for _, j := range bwd {
		for _, t := range q.Ops[j].In {
			if produced[t] {
				needed[t] = true
			}
		}
	}
	if len(needed) == 0 {
		return -1
	}
	lastNeeded := -1
	for k, oi := range s.ops {
		for _, t := range q.Ops[oi].Out {
			if needed[t] {
				lastNeeded = k
			}
		}
	}
	return lastNeeded
}

// clone is forward op oi recomputed in backward: it reads the clones of what the segment produced (rmap) and
// the segment's inputs, which the checkpoint keeps, and writes fresh "@recompute" tensors.
func (ck *checkpointer) clone(oi int, rmap map[ir.TensorID]ir.TensorID, produced map[ir.TensorID]bool) ir.Op {
	q := ck.q
	op := q.Ops[oi]
	cl := op
	cl.Phase = ir.Backward
	cl.Recompute = true
	cl.In = make([]ir.TensorID, len(op.In))
	for k, t := range op.In {
		if r, ok := rmap[t]; ok {
			cl.In[k] = r
		} else {
			cl.In[k] = t
			if !produced[t] {
				ck.touched[ir.Storage(q.Tensors, t)] = true // a segment input the checkpoint keeps
			}
		}
	}
	cl.Out = make([]ir.TensorID, len(op.Out))
	for k, t := range op.Out {
		nt := q.Tensors[t]
		nt.Name += "@recompute"
		if nt.Base != ir.NoTensor {
			if r, ok := rmap[nt.Base]; ok {
				nt.Base = r
			}
		}
		id := ck.e.add(nt)
		rmap[t] = id
		cl.Out[k] = id
		ck.touched[id] = true
	}
	return cl
}

// recategorize sets the category of the touched storages that are
// activations or temporaries: a storage produced by a forward or recompute
// op is an activation (saved for backward) when a backward op reads it or a
// view of it — a checkpoint's recompute reading a forward tensor keeps it
// saved too — else a temporary.
func recategorize(p *ir.Program, touched map[ir.TensorID]bool) {
	producedFwd := make([]bool, len(p.Tensors))  // by a forward or recompute op
	producedOrig := make([]bool, len(p.Tensors)) // by a forward op (not recompute)
	for i := range p.Ops {
		op := &p.Ops[i]
		if op.Phase == ir.Forward || op.Recompute {
			for _, t := range op.Out {
				producedFwd[ir.Storage(p.Tensors, t)] = true
				if !op.Recompute {
					producedOrig[ir.Storage(p.Tensors, t)] = true
				}
			}
		}
	}
	// Saved: read by a backward op, or kept by a checkpoint for its
	// recompute (a forward tensor a recompute op reads).
	saved := make([]bool, len(p.Tensors))
	for i := range p.Ops {
		op := &p.Ops[i]
		if op.Phase != ir.Backward {
			continue
		}
		for _, t := range op.In {
			s := ir.Storage(p.Tensors, t)
			if !op.Recompute || producedOrig[s] {
				saved[s] = true
			}
		}
	}
	for t := range touched {
		tt := &p.Tensors[t]
		if tt.Base != ir.NoTensor || tt.Resident || (tt.Cat != ir.Activation && tt.Cat != ir.Temporary) || !producedFwd[t] {
			continue
		}
		if saved[t] {
			tt.Cat = ir.Activation
		} else {
			tt.Cat = ir.Temporary
		}
	}
}
