package strategy

import (
	"fmt"
	"slices"

	"github.com/memplan/memplan/ir"
)

// UntieTraceGrads rewrites a trace's program (no op has an autograd node)
// for a pipeline: a trainable parameter that forward ops of two parts of
// the model read (parts as Pipeline places a trace's ops: a block, or a
// module outside the blocks; a tied input embedding and output layer) gets
// a gradient per part, as Megatron-LM holds a copy of it per stage with its
// own gradient and all-reduces them (Pipeline's pp.tied_grad_all_reduce).
//
// The trace records autograd summing both parts' contributions into the
// one gradient (torch/csrc/autograd/input_buffer.cpp): in micro-step 0 an
// op of one part (the embedding's, which runs last in backward) writes
// the gradient from its own contribution and the other part's; from
// micro-step 1 on it adds both into it. Here that op reads its own part's
// contribution only; the other part's contribution of micro-step 0 becomes
// that part's gradient (AccumulateGrad steals a gradient nothing else
// holds, torch/csrc/autograd/functions/accumulate_grad.h), and each later
// one is added into it in place by an "accumulate_grad" op of that part,
// after the last op of the part that reads it. The optimizer step reads
// both gradients (a stage keeps its own). Without the rewrite the cut put
// the sum on the first stage and sent the head's gradient there as an
// activation every micro-step, leaving the last stage none.
//
// p is returned unchanged when it has no such parameter or no gradient
// pairing (Program.GradOf); an error says why a sum does not look as
// recorded (another shape would be cut wrongly).
func UntieTraceGrads(p *ir.Program) (*ir.Program, error) {
	if p.GradOf == nil || !isTrace(p) {
		return p, nil
	}
	tied := tiedTraceParams(p)
	if len(tied) == 0 {
		return p, nil
	}
	q := Clone(p)
	q.GradOf = make(map[ir.TensorID]ir.TensorID, len(p.GradOf)+len(tied))
	for g, par := range p.GradOf {
		q.GradOf[g] = par
	}
	u := &untier{q: q, writer: newInserter(q).firstWriters()}
	pars := make([]ir.TensorID, 0, len(tied))
	for par := range tied {
		pars = append(pars, par)
	}
	slices.Sort(pars)
	for _, par := range pars {
		if err := u.untie(par, tied[par]); err != nil {
			return nil, err
		}
	}
	q.Ops = splice(q.Ops, nil, u.after)
	return q, nil
}

// untier is one UntieTraceGrads.
type untier struct {
	q      *ir.Program
	writer []int           // first op writing each tensor, or -1
	after  map[int][]ir.Op // accumulate_grad ops to insert after an op
}

// tiedTraceParams are the parameters with a gradient (GradOf) that forward
// ops of two parts or more read, each with the parts that read it.
func tiedTraceParams(p *ir.Program) map[ir.TensorID]map[string]bool {
	hasGrad := map[ir.TensorID]bool{}
	for _, par := range p.GradOf {
		hasGrad[par] = true
	}
	readers := map[ir.TensorID]map[string]bool{}
	for i := range p.Ops {
		op := &p.Ops[i]
		if op.Phase != ir.Forward || op.Recompute {
			continue
		}
		for _, t := range op.In {
			if s := ir.Storage(p.Tensors, t); hasGrad[s] {
				if readers[s] == nil {
					readers[s] = map[string]bool{}
				}
				readers[s][partOf(op.Module)] = true
			}
		}
	}
	for par, parts := range readers {
		if len(parts) < 2 {
			delete(readers, par)
		}
	}
	return readers
}

// partOf is the part of the model an op of module runs in: its block, or
// the module itself outside the blocks.
func partOf(module string) string {
	if b, ok := ppBlock(module); ok {
		return b
	}
	return module
}

// untie gives par's other part a gradient of its own.
func (u *untier) untie(par ir.TensorID, parts map[string]bool) error {
	q := u.q
	var g ir.TensorID = ir.NoTensor
	for gr, pp := range q.GradOf {
		if pp == par && (g == ir.NoTensor || gr < g) {
			g = gr
		}
	}
	if g == ir.NoTensor {
		return nil
	}
	if u.after == nil {
		u.after = map[int][]ir.Op{}
	}
	own := ir.NoTensor // the other part's gradient: its micro-step 0 contribution
	for i := range q.Ops {
		op := &q.Ops[i]
		if op.Phase != ir.Backward || !(slices.Contains(op.In, g) || slices.Contains(op.Out, g)) {
			continue
		}
		foreign := u.foreign(i, g, parts)
		switch {
		case len(foreign) == 0:
			continue
		case len(foreign) > 1:
			return fmt.Errorf("the sum of %s's gradient (op %d, %s) adds contributions of %d other parts of the model; a pipeline can untie two", q.Tensors[par].Name, i, op.Name, len(foreign)+1)
		}
		c := foreign[0]
		op.In = slices.DeleteFunc(slices.Clone(op.In), func(t ir.TensorID) bool { return t == c })
		if ir.Storage(q.Tensors, c) == ir.Storage(q.Tensors, g) {
			return fmt.Errorf("%s's gradient is summed in place into another part's contribution (op %d, %s)", q.Tensors[par].Name, i, op.Name)
		}
		if own == ir.NoTensor {
			if !slices.Contains(op.Out, g) {
				return fmt.Errorf("%s's gradient is summed (op %d, %s) before any op writes it", q.Tensors[par].Name, i, op.Name)
			}
			own = c
			q.Tensors[c].Cat = ir.Gradient
			q.GradOf[c] = par
			u.steal(op, g)
			continue
		}
		if n := len(op.In) - 1; n == 1 && slices.Contains(op.In, g) {
			// One contribution left: AccumulateGrad adds it into the
			// gradient in place, with no InputBuffer sum beside it.
			op.Workspace = 0
		}
		w := u.writer[c]
		at := u.lastReader(c, w, i)
		t := &q.Tensors[c]
		u.after[at] = append(u.after[at], ir.Op{Name: "accumulate_grad", Module: q.Ops[w].Module, Phase: ir.Backward, Micro: op.Micro,
			In: []ir.TensorID{own, c}, Node: -1, FLOPs: float64(t.Bytes) / float64(max(t.DType.Size(1), 1)), MemBytes: 3 * float64(t.Bytes)})
	}
	if own == ir.NoTensor {
		return nil
	}
	for i := range q.Ops {
		// Beside g, so that a foreach op's lists stay aligned
		// (assocByPosition reads the two as one).
		if op := &q.Ops[i]; op.Phase == ir.Optimizer {
			if at := slices.Index(op.In, g); at >= 0 {
				op.In = slices.Insert(slices.Clone(op.In), at+1, own)
			}
		}
	}
	return nil
}

// steal makes the gradient g that op writes from one contribution e of its
// own part alone that contribution itself, as AccumulateGrad steals a
// gradient nothing else holds: the op that wrote e writes g, every read
// of e reads g, and op only reads it (a sum of one operand allocated a
// second buffer of the parameter's size for nothing).
func (u *untier) steal(op *ir.Op, g ir.TensorID) {
	q := u.q
	var rest []ir.TensorID
	for _, t := range op.In {
		if t != g {
			rest = append(rest, t)
		}
	}
	if len(rest) != 1 || len(op.Out) != 1 || op.Out[0] != g || q.Tensors[g].Base != ir.NoTensor {
		return
	}
	e := rest[0]
	et, gt := &q.Tensors[e], &q.Tensors[g]
	w := u.writer[e]
	if w < 0 || et.Base != ir.NoTensor || et.Bytes != gt.Bytes || et.DType != gt.DType || et.Resident || et.Keep {
		return
	}
	for j := range q.Ops {
		o := &q.Ops[j]
		if slices.Contains(o.In, e) {
			o.In = slices.Clone(o.In)
			for k, t := range o.In {
				if t == e {
					o.In[k] = g
				}
			}
		}
	}
	wo := &q.Ops[w]
	wo.Out = slices.Clone(wo.Out)
	wo.Out[slices.Index(wo.Out, e)] = g
	op.In, op.Out = []ir.TensorID{g}, nil
	op.Workspace, op.FLOPs, op.MemBytes = 0, 0, 0
	u.writer[g] = w
}

// foreign are the operands of op i (g aside) that are contributions to
// g of another part: as large as g, in its dtype, written in backward by
// an op of another part that reads the parameter in forward (parts). A
// trace's op also reads what dies at it (the loss's scalars beside the
// embedding's sum), which are no contribution.
func (u *untier) foreign(i int, g ir.TensorID, parts map[string]bool) []ir.TensorID {
	q := u.q
	op := &q.Ops[i]
	mine := partOf(op.Module)
	gt := &q.Tensors[g]
	var out []ir.TensorID
	for _, t := range op.In {
		s := ir.Storage(q.Tensors, t)
		if t == g || s != t || q.Tensors[t].Bytes != gt.Bytes || q.Tensors[t].DType != gt.DType {
			continue
		}
		w := u.writer[s]
		if w < 0 || q.Ops[w].Phase != ir.Backward {
			continue
		}
		if part := partOf(q.Ops[w].Module); part != mine && parts[part] {
			out = append(out, t)
		}
	}
	return out
}

// lastReader is the last op before op end, from op w on, that reads c or a
// view of it (w itself when none does).
func (u *untier) lastReader(c ir.TensorID, w, end int) int {
	q := u.q
	last := w
	for j := w + 1; j < end; j++ {
		for _, t := range q.Ops[j].In {
			if ir.Storage(q.Tensors, t) == c {
				last = j
				break
			}
		}
	}
	return last
}
