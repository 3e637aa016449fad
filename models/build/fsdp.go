package build

import (
	"strings"

	"github.com/memplan/memplan/ir"
	"github.com/memplan/memplan/models"
)

// FSDP1 FlatParameters under LoRA (Options.FSDPFlat).
//
// FSDP1 with use_orig_params=True flattens the parameters of each wrapped
// unit (a decoder layer under litgpt's auto_wrap_policy={Block}) into one
// FlatParameter, which requires grad when any of them does (torch 2.1
// distributed/fsdp/flat_param.py L740-741, mixed requires_grad allowed with
// use_orig_params, L715-732). In forward the original parameters are
// replaced by plain views of the unsharded FlatParameter
// (_use_unsharded_views(as_params=False), L1785-1835, views from
// torch.split, L1729-1782), so inside a unit that holds a LoRA adapter the
// frozen base weights are read through tensors that require grad: every
// linear keeps its input and autograd computes a gradient for every weight
// of the unit. The root unit (embedding, final norm, head) holds no adapter
// and keeps plain frozen weights.
//
// The graph models this by building those weights as parameters that
// require grad (so the op rules keep what their gradients need, and the
// hidden state of the first layer requires grad even over a frozen
// embedding) and then marking the parameters themselves frozen again: they
// get no optimizer state, and strategy.ZeRO{Flat: true} adds their
// gradients, per micro-step, to the backward op that computes them.

// flatView reports whether a base weight registered now is read through a
// view of a FlatParameter that requires grad: FSDPFlat training with LoRA,
// inside an indexed block (a layer) not left out.
func (m *builder) flatView() bool {
	if !m.o.FSDPFlat || !m.o.Training || m.lora == nil || m.o.QLoRA {
		return false
	}
	blk := ir.BlockOf(m.b.Module())
	return indexedBlock(blk) && !m.flatSkip[blk]
}

// indexedBlock reports whether blk (an ir.BlockOf result) ends in a list
// index: a layer of a stack, which FSDP wraps as a unit of its own.
func indexedBlock(blk string) bool {
	return ir.IsIndex(blk[strings.LastIndexByte(blk, '.')+1:])
}

// flatGraph finishes an FSDPFlat graph g built by m: layers that turned out
// to hold no trainable parameter (a LoRA target naming other layers) are
// built again with plain frozen weights, and the flat views' parameters are
// marked frozen.
func flatGraph(a *models.Arch, o Options, g *ir.Graph, m *builder) (*ir.Graph, error) {
	view := make(map[ir.TensorID]bool, len(m.flatViews))
	for _, id := range m.flatViews {
		view[id] = true
	}
	trains := map[string]bool{}
	for _, id := range g.Params {
		if t := &g.Tensors[id]; t.RequiresGrad && !view[id] {
			trains[ir.BlockOf(t.Name)] = true
		}
	}
	skip := map[string]bool{}
	for _, id := range m.flatViews {
		if blk := ir.BlockOf(g.Tensors[id].Name); !trains[blk] {
			skip[blk] = true
		}
	}
	if len(skip) > 0 {
		var err error
		if g, m, err = graph(a, o, skip); err != nil {
			return nil, err
		}
	}
	for _, id := range m.flatViews {
		g.Tensors[id].RequiresGrad = false
	}
	return g, nil
}
