package strategy

import (
	"fmt"
	"path"
	"slices"
	"strings"

	"github.com/memplan/memplan/internal/chunk"
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
	ck := &checkpointer{c: c}
	if err := ck.segments(p); err != nil {
		return nil, err
	}
	ck.copy(p, own)
	ck.dense(len(p.Tensors))
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
	c        *Checkpoint
	q        *ir.Program
	segs     []segment
	bwdOf    map[segID]int // index in bwdLists of each segment's backward ops
	bwdLists [][]int       // backward ops of a segment, in order
	e        *editor       // the recompute ops go before the first backward op of their segment
	touched  tensorSet     // storages whose category recategorize decides (grows with the clones)
	// Per segment, by the tensors of the input program (dense, where maps
	// per segment were a fifth of the transform's time on deepseek-v2):
	// the segment's mark in seg when a tensor is its output (produced), in
	// need when backward reads it, and its recomputed copy in clone.
	mark      int32
	seg, need []int32
	clone     []ir.TensorID
	// The clones' operand lists and names, cut from a few large arrays.
	ids   chunk.Slices[ir.TensorID]
	names chunk.Strings
}

// backwardOf is segment s's backward ops, in order.
func (ck *checkpointer) backwardOf(s segment) []int {
	if l, ok := ck.bwdOf[segID{s.key, s.micro}]; ok {
		return ck.bwdLists[l]
	}
	return nil
}

// dense sizes the per-tensor tables for n tensors.
func (ck *checkpointer) dense(n int) {
	ck.touched = make(tensorSet, n, n+n/4)
	ck.seg, ck.need = make([]int32, n), make([]int32, n)
	ck.clone = make([]ir.TensorID, n)
}

// touch marks storage t for recategorize.
func (ck *checkpointer) touch(t ir.TensorID) {
	for int(t) >= len(ck.touched) {
		ck.touched = append(ck.touched, false)
	}
	ck.touched[t] = true
}

// produced reports whether t is an output of the current segment.
func (ck *checkpointer) produced(t ir.TensorID) bool {
	return int(t) < len(ck.seg) && ck.seg[t] == ck.mark
}

// cloneOf is t's recomputed copy in the current segment, if it has one.
func (ck *checkpointer) cloneOf(t ir.TensorID) (ir.TensorID, bool) {
	if ck.produced(t) && ck.clone[t] != ir.NoTensor {
		return ck.clone[t], true
	}
	return t, false
}

// segments finds the runs of consecutive forward ops whose module falls under one pattern's match.
func (ck *checkpointer) segments(p *ir.Program) error {
	sgm := ck.c.segmenter()
	// Consecutive forward ops mostly share their module, which is keyed
	// once per run (a map memoising the key by module was slower: a
	// mixture of experts has as many modules as runs).
	var lastModule, key string
	segs := ck.segs
	for i := range p.Ops {
		op := &p.Ops[i]
		if op.Phase != ir.Forward || op.Recompute {
			continue
		}
		if op.Module != lastModule {
			key, lastModule = sgm.key(op.Module), op.Module
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
		return &NoMatchError{Patterns: ck.c.Patterns}
	}
	ck.segs = segs
	return nil
}

// copy is the program to rewrite and its editor: p when the caller owns it, else a copy of its tensors with
// room for the recompute outputs (at most one per segment op and output) that shares p's op list until finish
// copies it once, the insertions and rewired backward ops in place (editor.sharedOps): cloned with room and
// then spliced, the list was copied twice (0.6 s of diagnose deepseek-v3 --pp 4 --accum 8 --checkpoint
// full's 9.6, with the collector's write barriers).
func (ck *checkpointer) copy(p *ir.Program, own bool) {
	ck.q = p
	if own {
		ck.e = newInserter(ck.q)
		return
	}
	outs := 0
	for _, sg := range ck.segs {
		for _, oi := range sg.ops {
			outs += len(p.Ops[oi].Out)
		}
	}
	ck.q = cloneTensors(p, outs)
	ck.e = newInserter(ck.q).sharedOps()
}

// backwardOfSegments finds the backward ops of each segment in one pass: a backward op belongs to the segment
// whose key prefixes its module (the longest), in the same micro-step.
func (ck *checkpointer) backwardOfSegments() {
	ck.bwdOf = map[segID]int{}
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
	// Consecutive backward ops mostly share their module and micro-step:
	// the last one's list is kept at hand rather than hashed again.
	var last struct {
		module string
		micro  int
		list   int // index in ck.bwdLists, -1: no segment
	}
	last.list = -1
	for j := range ck.q.Ops {
		op := &ck.q.Ops[j]
		if op.Phase != ir.Backward || op.Recompute {
			continue
		}
		if op.Module != last.module || op.Micro != last.micro {
			last.module, last.micro, last.list = op.Module, op.Micro, -1
			if k := keyUnder(op.Module); k != "" {
				id := segID{k, op.Micro}
				l, ok := ck.bwdOf[id]
				if !ok {
					l = len(ck.bwdLists)
					ck.bwdOf[id] = l
					ck.bwdLists = append(ck.bwdLists, nil)
				}
				last.list = l
			}
		}
		if last.list >= 0 {
			ck.bwdLists[last.list] = append(ck.bwdLists[last.list], j)
		}
	}
}

// recompute replays segment s inside backward, when backward reads anything it produced.
func (ck *checkpointer) recompute(s segment) {
	q := ck.q
	ck.mark++
	for _, oi := range s.ops {
		for _, t := range q.Ops[oi].Out {
			ck.seg[t], ck.clone[t] = ck.mark, ir.NoTensor
		}
	}
	var bwd []int
	for _, j := range ck.backwardOf(s) {
		if j > s.ops[len(s.ops)-1] {
			bwd = append(bwd, j)
		}
	}
	lastNeeded := ck.lastNeeded(s, bwd)
	if lastNeeded < 0 {
		return
	}
	clones := make([]ir.Op, 0, lastNeeded+1)
	keep := ck.c.Save.saved(q, s.ops)
	for _, oi := range s.ops[:lastNeeded+1] {
		if keep[oi] {
			// Saved by the policy: backward and the replay read the
			// forward's outputs, which stay alive until then.
			for _, t := range q.Ops[oi].Out {
				ck.touch(ir.Storage(q.Tensors, t))
			}
			continue
		}
		clones = append(clones, ck.cloneOp(oi))
	}
	for _, oi := range s.ops {
		for _, t := range q.Ops[oi].Out {
			ck.touch(ir.Storage(q.Tensors, t))
		}
	}
	for _, j := range bwd {
		in := ck.e.in(j)
		if !slices.ContainsFunc(in, func(t ir.TensorID) bool { _, ok := ck.cloneOf(t); return ok }) {
			continue
		}
		in = ck.ids.Clone(in) // copy-on-write: the list may be shared
		for i, t := range in {
			in[i], _ = ck.cloneOf(t)
		}
		ck.e.setIn(j, in)
	}
	if b := ck.e.before[bwd[0]]; len(b) > 0 {
		clones = append(b, clones...)
	}
	ck.e.before[bwd[0]] = clones
}

// lastNeeded is the index in s.ops of the last op whose output the segment's backward ops read, or -1.
func (ck *checkpointer) lastNeeded(s segment, bwd []int) int {
	q := ck.q
	needed := false
	for _, j := range bwd {
		for _, t := range q.Ops[j].In {
			if ck.produced(t) {
				ck.need[t], needed = ck.mark, true
			}
		}
	}
	if !needed {
		return -1
	}
	lastNeeded := -1
	for k, oi := range s.ops {
		for _, t := range q.Ops[oi].Out {
			if ck.need[t] == ck.mark {
				lastNeeded = k
			}
		}
	}
	return lastNeeded
}

// cloneOp is forward op oi recomputed in backward: it reads the clones of what the segment produced and
// the segment's inputs, which the checkpoint keeps, and writes fresh "@recompute" tensors.
func (ck *checkpointer) cloneOp(oi int) ir.Op {
	q := ck.q
	op := q.Ops[oi]
	cl := op
	cl.Phase = ir.Backward
	cl.Recompute = true
	cl.In = ck.ids.Make(len(op.In))
	for k, t := range op.In {
		r, ok := ck.cloneOf(t)
		cl.In[k] = r
		if !ok && !ck.produced(t) {
			ck.touch(ir.Storage(q.Tensors, t)) // a segment input the checkpoint keeps
		}
	}
	cl.Out = ck.ids.Make(len(op.Out))
	for k, t := range op.Out {
		nt := q.Tensors[t]
		nt.Name = ck.names.Join(nt.Name, "@recompute")
		if nt.Base != ir.NoTensor {
			nt.Base, _ = ck.cloneOf(nt.Base)
		}
		id := ck.e.add(nt)
		ck.clone[t] = id
		cl.Out[k] = id
		ck.touch(id)
	}
	return cl
}

// recategorize sets the category of the touched storages that are
// activations or temporaries: a storage produced by a forward or recompute
// op is an activation (saved for backward) when a backward op reads it or a
// view of it — a checkpoint's recompute reading a forward tensor keeps it
// saved too — else a temporary.
//
// Each operand's storage comes from one table (ir.Storages): walking each
// view's chain through the tensor array per operand missed the cache (0.46
// s of diagnose deepseek-v3 --pp 4 --accum 8 --checkpoint full's 9.6).
func recategorize(p *ir.Program, touched tensorSet) {
	owner := ir.Storages(p.Tensors)
	producedFwd := make([]bool, len(p.Tensors))  // by a forward or recompute op
	producedOrig := make([]bool, len(p.Tensors)) // by a forward op (not recompute)
	for i := range p.Ops {
		op := &p.Ops[i]
		if op.Phase == ir.Forward || op.Recompute {
			for _, t := range op.Out {
				producedFwd[owner[t]] = true
				if !op.Recompute {
					producedOrig[owner[t]] = true
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
			s := owner[t]
			if !op.Recompute || producedOrig[s] {
				saved[s] = true
			}
		}
	}
	for t, ok := range touched {
		if !ok {
			continue
		}
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

// NoMatchError is a checkpoint whose patterns match no module of the
// program. Its message lists at most maxListedPatterns of them (20,000
// patterns made one line of 149 KB); the CLI names the flag before it.
type NoMatchError struct {
	Patterns []string
}

// maxListedPatterns is how many patterns a NoMatchError repeats.
const maxListedPatterns = 8

func (e *NoMatchError) Error() string {
	var b strings.Builder
	b.WriteString("no module matches the checkpoint patterns ")
	for i, s := range e.Patterns[:min(len(e.Patterns), maxListedPatterns)] {
		if i > 0 {
			b.WriteString(", ")
		}
		if r := []rune(s); len(r) > 64 {
			s = string(r[:64]) + "…"
		}
		b.WriteString(s)
	}
	if n := len(e.Patterns) - maxListedPatterns; n > 0 {
		fmt.Fprintf(&b, " and %d more", n)
	}
	return b.String()
}
