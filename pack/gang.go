package pack

import (
	"context"
	"slices"

	"github.com/memplan/memplan/units"
)

// gang is the processes of one job (a job of several GPUs has one per
// rank; a one-GPU job is a gang of one): all of them are placed, on
// distinct GPUs, or none.
type gang struct {
	procs    []int // indices into the envelopes
	sameNode bool
}

// gangsOf groups envs by their gang, in the order of each gang's first
// process.
func gangsOf(envs []*Envelope) []gang {
	var out []gang
	at := map[string]int{}
	for i, e := range envs {
		k, ok := at[e.GangName()]
		if !ok {
			k = len(out)
			at[e.GangName()] = k
			out = append(out, gang{})
		}
		out[k].procs = append(out[k].procs, i)
		out[k].sameNode = out[k].sameNode || e.SameNode
	}
	return out
}

// byNeed orders ms (and their indices) largest need under p first, ties in
// the given order; it returns the needs in that order.
func byNeed(ms []*Envelope, idx []int, p Policy) []units.Bytes {
	order := make([]int, len(ms))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmpBytes(ms[b].Need(p), ms[a].Need(p)) })
	sm, si, needs := slices.Clone(ms), slices.Clone(idx), make([]units.Bytes, len(ms))
	for k, o := range order {
		ms[k], needs[k] = sm[o], sm[o].Need(p)
		if idx != nil {
			idx[k] = si[o]
		}
	}
	return needs
}

// fitGang picks a distinct GPU of 0..n-1 for each need, in order: the
// first GPU that admits it; with sameNode all on one node of node GPUs
// (the first node where every need finds one). nil when they do not fit.
func fitGang(needs []units.Bytes, n, node int, sameNode bool, admits func(g int, need units.Bytes) bool) []int {
	if !sameNode {
		return fitRange(needs, 0, n, admits)
	}
	for lo := 0; lo < n; lo += node {
		if got := fitRange(needs, lo, min(lo+node, n), admits); got != nil {
			return got
		}
	}
	return nil
}

func fitRange(needs []units.Bytes, lo, hi int, admits func(g int, need units.Bytes) bool) []int {
	if len(needs) > hi-lo {
		return nil
	}
	out := make([]int, len(needs))
	// taken marks the GPUs given to the gang's earlier processes: a scan
	// of those for every GPU tried made a try O(ranks² × GPUs) (sweep H,
	// round 25: a 1,024-rank gang on 2,048 GPUs took half a second a try).
	taken := make([]bool, hi-lo)
	for k, need := range needs {
		g := lo
		for ; g < hi; g++ {
			if !taken[g-lo] && admits(g, need) {
				break
			}
		}
		if g == hi {
			return nil
		}
		out[k], taken[g-lo] = g, true
	}
	return out
}

// packer is first-fit decreasing of gangs under one policy over as many
// GPUs as it takes (bins), nodes of node GPUs; ctx stops it.
type packer struct {
	ctx  context.Context
	envs []*Envelope
	p    Policy
	room units.Bytes
	node int
	bins [][]int
	used []units.Bytes
}

// admits says GPU b takes a process of need; a GPU past the open ones is
// empty.
func (k *packer) admits(b int, need units.Bytes) bool {
	if b >= len(k.bins) {
		return k.p == WholeGPU || need <= k.room
	}
	if k.p == WholeGPU {
		return len(k.bins[b]) == 0
	}
	return k.used[b]+need <= k.room
}

// place puts gang g's processes, largest first, each on the first GPU that
// admits it (opening GPUs, a node at a time under sameNode); false when
// one of its processes is larger than a GPU as the policy counts or it
// needs more GPUs than a node has.
func (k *packer) place(g gang) bool {
	ms := make([]*Envelope, len(g.procs))
	for i, pi := range g.procs {
		ms[i] = k.envs[pi]
	}
	idx := slices.Clone(g.procs)
	needs := byNeed(ms, idx, k.p)
	if k.p != WholeGPU && needs[0] > k.room || g.sameNode && len(needs) > k.node {
		return false
	}
	n := len(k.bins) + len(needs)
	if g.sameNode {
		n = ((len(k.bins)+k.node-1)/k.node + 1) * k.node
	}
	at := fitGang(needs, n, k.node, g.sameNode, k.admits)
	if at == nil {
		return false
	}
	for i, b := range at {
		for len(k.bins) <= b {
			k.bins, k.used = append(k.bins, nil), append(k.used, 0)
		}
		k.bins[b] = append(k.bins[b], idx[i])
		k.used[b] += needs[i]
	}
	return true
}

// firstFit is packPolicy's placement under policy p on GPUs of room bytes,
// nodes of node GPUs: the packer and the gangs it left out. Under curve,
// peaks' assignment is tried too and the one of fewer GPUs kept.
func firstFit(ctx context.Context, envs []*Envelope, room units.Bytes, node int, p Policy) (*packer, []gang, error) {
	k := &packer{ctx: ctx, envs: envs, p: p, room: room, node: node}
	left, err := k.placeAll(sortedGangs(envs, p))
	if err != nil || p != Curve {
		return k, left, err
	}
	alt := &packer{ctx: ctx, envs: envs, p: Peaks, room: room, node: node}
	rest, err := alt.placeAll(sortedGangs(envs, Peaks))
	if err != nil {
		return nil, nil, err
	}
	alt.recount(Curve)
	if rest, err = alt.placeAll(rest); err != nil {
		return nil, nil, err
	}
	if alt.needed() < k.needed() {
		return alt, rest, nil
	}
	return k, left, nil
}

// placeAll places gangs gs in order; it returns those it could not, or
// its context's cause, looked at before each gang.
func (k *packer) placeAll(gs []gang) (left []gang, err error) {
	for _, g := range gs {
		if err := context.Cause(k.ctx); err != nil {
			return nil, err
		}
		if !k.place(g) {
			left = append(left, g)
		}
	}
	return left, nil
}

// recount counts the GPUs' processes as policy p does from now on.
func (k *packer) recount(p Policy) {
	k.p = p
	for b, set := range k.bins {
		k.used[b] = 0
		for _, i := range set {
			k.used[b] += k.envs[i].Need(p)
		}
	}
}

// needed is how many GPUs hold a process.
func (k *packer) needed() int {
	n := 0
	for _, set := range k.bins {
		n += min(len(set), 1)
	}
	return n
}

// sortedGangs is envs' gangs, largest process under p first (ties in the
// given order).
func sortedGangs(envs []*Envelope, p Policy) []gang {
	gs := gangsOf(envs)
	slices.SortStableFunc(gs, func(a, b gang) int { return cmpBytes(gangNeed(envs, b, p), gangNeed(envs, a, p)) })
	return gs
}

// gangNeed is what orders gangs: the largest need of a process.
func gangNeed(envs []*Envelope, g gang, p Policy) units.Bytes {
	var n units.Bytes
	for _, i := range g.procs {
		n = max(n, envs[i].Need(p))
	}
	return n
}
