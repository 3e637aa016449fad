package cost

import (
	"time"

	"github.com/memplan/memplan/ir"
)

// Topology places a job's ranks on nodes so that collectives whose group
// spans nodes are priced on the inter-node link.
//
// Ranks are numbered as Megatron-LM numbers them: tensor parallel
// innermost, then context, expert and data parallel, pipeline outermost
// (megatron/core/parallel_state.py, initialize_model_parallel's default
// order "tp-cp-ep-dp-pp"; RankGenerator), and filled GPUsPerNode to a node.
// So a group of degree n has stride s (1 for tp, TP for cp, TP·CP for ep and
// dp, TP·CP·DP for pp): its members are ranks 0, s, 2s, … and those on one
// node share its intra-node link.
type Topology struct {
	// GPUsPerNode is the GPUs of one node (at least 1).
	GPUsPerNode int
	// InterNode is each GPU's own link to other nodes (its network adapter
	// in the rail-optimised DGX/HGX layout): bytes/s per direction, and α,
	// the per-step latency of a ring step that crosses nodes.
	InterNode Link
	// TP, CP, DP are the degrees that set the groups' strides (0 means 1).
	TP, CP, DP int
}

// Span is where the ranks of one group sit.
type Span struct {
	// Ranks is the group's size, PerNode the most of its ranks on one node
	// and Nodes the nodes it touches.
	Ranks, PerNode, Nodes int
}

// Stride is the distance between neighbouring ranks of group g in the
// Megatron order (see Topology).
func (t Topology) Stride(g ir.Group) int {
	tp, cp, dp := max(t.TP, 1), max(t.CP, 1), max(t.DP, 1)
	switch g {
	case ir.TensorGroup:
		return 1
	case ir.ContextGroup:
		return tp
	case ir.ExpertGroup, ir.DataGroup:
		return tp * cp
	case ir.PipelineGroup:
		return tp * cp * dp
	}
	return 1
}

// Span places the first group of g with the given ranks: members 0, s, …,
// (ranks−1)·s on nodes of GPUsPerNode. Closed form, not one step per rank:
// a data-parallel group of 2^24 ranks is priced per collective (it took
// seconds per collective counting ranks into a map).
func (t Topology) Span(g ir.Group, ranks int) Span {
	if ranks < 1 || t.GPUsPerNode < 1 {
		return Span{Ranks: ranks, PerNode: ranks, Nodes: 1}
	}
	s, G := max(t.Stride(g), 1), t.GPUsPerNode
	if s >= G { // neighbouring ranks never share a node
		return Span{Ranks: ranks, PerNode: 1, Nodes: ranks}
	}
	// Rank i sits on node ⌊i·s/G⌋, which rises by at most one per rank,
	// so every node up to the last is touched; node n holds ranks
	// ⌈n·G/s⌉ … ⌈(n+1)·G/s⌉−1, a count periodic in n with period
	// s/gcd(s, G). The last node may be cut short by ranks.
	nodes := (ranks-1)*s/G + 1
	first := func(n int) int { return (n*G + s - 1) / s }
	count := func(n int) int { return min(first(n+1), ranks) - first(n) }
	most := count(nodes - 1)
	for n := 0; n < min(nodes, s/gcd(s, G)); n++ {
		most = max(most, count(n))
	}
	return Span{Ranks: ranks, PerNode: most, Nodes: nodes}
}

func gcd(a, b int) int {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// SpanCost prices collective c of bytes over a group placed as sp, with
// intra the intra-node link per rank and inter each GPU's inter-node link.
// A group on one node costs Cost on intra.
//
// A ring across nodes follows NCCL's tuning model (src/graph/tuning.cc,
// ncclTopoTuneModel, NVIDIA/nccl @ 01afd20a): its bus bandwidth is the
// channels times the per-channel inter-node speed, and its latency is
// (steps − inter steps)·α_intra + inter steps·α_inter with 2(nodes−1) inter
// steps for all-reduce and nodes−1 for all-gather and reduce-scatter. With
// one adapter per GPU, the group's PerNode ranks on a node drive PerNode
// channels through PerNode adapters, so the ring's bus bandwidth is
// min(intra, PerNode · inter): the ring is bottlenecked by the inter-node
// link unless a node holds enough of its ranks to outrun the NVLink.
//
// All-to-all (pairwise exchange) sends (PerNode−1)/Ranks of the buffer to
// ranks on its node and (Ranks−PerNode)/Ranks over its own adapter; the two
// run concurrently, so the slower one sets the time, plus one α per peer on
// its link.
//
// Traffic of other groups sharing the adapters at the same time is not
// modelled.
func SpanCost(c Collective, bytes float64, sp Span, intra, inter Link) (time.Duration, error) {
	if sp.Nodes <= 1 {
		return Cost(c, bytes, Network{Ranks: sp.Ranks, Bandwidth: intra.Bandwidth, Latency: intra.Latency})
	}
	if sp.PerNode < 1 || sp.Ranks < sp.Nodes || sp.PerNode > sp.Ranks {
		return 0, invalid("%v on %d ranks over %d nodes with %d on a node: inconsistent placement", c, sp.Ranks, sp.Nodes, sp.PerNode)
	}
	if !finiteNonNeg(bytes) {
		return 0, invalid("%v of %v bytes: must be finite and >= 0", c, bytes)
	}
	for _, l := range []Link{intra, inter} {
		if !positive(l.Bandwidth) || l.Latency < 0 {
			return 0, invalid("network bandwidth %v B/s must be positive and latency %v >= 0", l.Bandwidth, l.Latency)
		}
	}
	n, k, m := sp.Ranks, sp.PerNode, sp.Nodes
	if c == AllToAll {
		in := seconds(float64(k-1) / float64(n) * bytes / intra.Bandwidth)
		out := seconds(float64(n-k) / float64(n) * bytes / inter.Bandwidth)
		lat := addSat(mulSat(intra.Latency, k-1), mulSat(inter.Latency, n-k))
		return addSat(lat, max(in, out)), nil
	}
	bus, steps, ok := c.factors(n)
	if !ok {
		return 0, invalid("unknown collective %d", int(c))
	}
	interSteps := m - 1
	if c == AllReduce {
		interSteps = 2 * (m - 1)
	}
	bw := min(intra.Bandwidth, float64(k)*inter.Bandwidth)
	lat := addSat(mulSat(intra.Latency, steps-interSteps), mulSat(inter.Latency, interSteps))
	return addSat(lat, seconds(bus*bytes/bw)), nil
}

// mulSat is d·n saturating at the largest Duration (n >= 0).
func mulSat(d time.Duration, n int) time.Duration {
	if d <= 0 || n <= 0 {
		return 0
	}
	if d > time.Duration(1<<63-1)/time.Duration(n) {
		return time.Duration(1<<63 - 1)
	}
	return d * time.Duration(n)
}
