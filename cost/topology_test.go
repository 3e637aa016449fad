package cost_test

import (
	"testing"
	"time"

	"github.com/memplan/memplan/cost"
	"github.com/memplan/memplan/ir"
)

func TestTopologySpan(t *testing.T) {
	for _, c := range []struct {
		name      string
		topo      cost.Topology
		g         ir.Group
		ranks     int
		per, node int
	}{
		{"tp8 in a node", cost.Topology{GPUsPerNode: 8, TP: 8}, ir.TensorGroup, 8, 8, 1},
		{"tp16 over two nodes", cost.Topology{GPUsPerNode: 8, TP: 16}, ir.TensorGroup, 16, 8, 2},
		{"dp4 after tp8: one rank a node", cost.Topology{GPUsPerNode: 8, TP: 8, DP: 4}, ir.DataGroup, 4, 1, 4},
		{"dp8 after tp2: four a node", cost.Topology{GPUsPerNode: 8, TP: 2, DP: 8}, ir.DataGroup, 8, 4, 2},
		{"dp4 after tp2 in a node", cost.Topology{GPUsPerNode: 8, TP: 2, DP: 4}, ir.DataGroup, 4, 4, 1},
		{"pp4 after tp2 dp4", cost.Topology{GPUsPerNode: 8, TP: 2, DP: 4}, ir.PipelineGroup, 4, 1, 4},
		{"pp2 after tp2 dp2", cost.Topology{GPUsPerNode: 8, TP: 2, DP: 2}, ir.PipelineGroup, 2, 2, 1},
		{"ep8 strides as dp", cost.Topology{GPUsPerNode: 8, TP: 2, DP: 8}, ir.ExpertGroup, 8, 4, 2},
		{"6 GPUs a node, tp4 dp3", cost.Topology{GPUsPerNode: 6, TP: 4, DP: 3}, ir.DataGroup, 3, 2, 2},
	} {
		sp := c.topo.Span(c.g, c.ranks)
		if sp.Ranks != c.ranks || sp.PerNode != c.per || sp.Nodes != c.node {
			t.Errorf("%s: %+v, want %d a node over %d nodes", c.name, sp, c.per, c.node)
		}
	}
}

// commProgram is one all-reduce of 1e9 bytes of group g on ranks.
func commProgram(g ir.Group, ranks int, _ float64) *ir.Program {
	var b progBuilder
	x := b.tensor("x", 1e6, true, false)
	b.op(ir.Op{Name: "all_reduce", Phase: ir.Forward, In: ids(x), Out: ids(x), Comm: &ir.Comm{Kind: ir.AllReduce, Bytes: 1e9, Group: g, Ranks: ranks}})
	return &b.p
}

// TP=8 inside a node against TP=16 over two nodes: the same all-reduce
// costs the ring factors' ratio times the links' ratio, NVLink per
// direction over min(NVLink, 8 × the adapter) (cost.SpanCost).
func TestTopologyTensorParallelAcrossNodes(t *testing.T) {
	g := toyGPU() // NVLink 100 GB/s per direction
	for _, c := range []struct {
		name string
		nic  float64 // per GPU per direction
		bw   float64 // the ring's bus bandwidth over two nodes
	}{
		{"8 × 25 GB/s adapters outrun NVLink", 25e9, 100e9},
		{"8 × 10 GB/s adapters", 10e9, 80e9},
		{"8 × 1 GB/s adapters", 1e9, 8e9},
	} {
		topo := &cost.Topology{GPUsPerNode: 8, InterNode: cost.Link{Bandwidth: c.nic}, TP: 16}
		in, err := cost.Price(commProgram(ir.TensorGroup, 8, 1e9), g, cost.PriceOptions{Topology: topo})
		if err != nil {
			t.Fatal(err)
		}
		across, err := cost.Price(commProgram(ir.TensorGroup, 16, 1e9), g, cost.PriceOptions{Topology: topo})
		if err != nil {
			t.Fatal(err)
		}
		wantIn := time.Duration(2 * 7.0 / 8 * 1e9 / 100e9 * 1e9)
		wantAcross := time.Duration(2 * 15.0 / 16 * 1e9 / c.bw * 1e9)
		if in.Step != wantIn || across.Step != wantAcross {
			t.Errorf("%s: step %v in a node, %v over two; want %v, %v", c.name, in.Step, across.Step, wantIn, wantAcross)
		}
		ratio := float64(across.Step) / float64(in.Step)
		if want := (15.0 / 16) / (7.0 / 8) * 100e9 / c.bw; ratio < want*0.999 || ratio > want*1.001 {
			t.Errorf("%s: ratio %.4f, want %.4f", c.name, ratio, want)
		}
	}
}

// A data-parallel all-reduce over 4 nodes after TP=8 has one rank on each
// node: a ring on the inter-node link alone, 2·3/4·bytes/adapter, with
// 2·(4−1) steps crossing nodes.
func TestTopologyDataParallelOverFourNodes(t *testing.T) {
	g := toyGPU()
	topo := &cost.Topology{GPUsPerNode: 8, InterNode: cost.Link{Bandwidth: 50e9, Latency: 5 * time.Microsecond}, TP: 8, DP: 4}
	tm, err := cost.Price(commProgram(ir.DataGroup, 4, 1e9), g, cost.PriceOptions{Topology: topo, Overlap: map[ir.Group]bool{ir.DataGroup: false}})
	if err != nil {
		t.Fatal(err)
	}
	want := 6*5*time.Microsecond + time.Duration(2*3.0/4*1e9/50e9*1e9)
	if tm.Step != want || tm.Comm != want {
		t.Errorf("step %v comm %v, want %v", tm.Step, tm.Comm, want)
	}
	// Without a topology the same group is priced on NVLink.
	flat, err := cost.Price(commProgram(ir.DataGroup, 4, 1e9), g, cost.PriceOptions{Overlap: map[ir.Group]bool{ir.DataGroup: false}})
	if err != nil {
		t.Fatal(err)
	}
	if w := time.Duration(2 * 3.0 / 4 * 1e9 / 100e9 * 1e9); flat.Step != w {
		t.Errorf("flat %v, want %v", flat.Step, w)
	}
}

func TestSpanCost(t *testing.T) {
	intra := cost.Link{Bandwidth: 100e9, Latency: time.Microsecond}
	inter := cost.Link{Bandwidth: 10e9, Latency: 10 * time.Microsecond}
	// All-gather over 2 nodes × 4: 7 steps, 1 crossing; bus 7/8 of 1e9 at min(100, 40) GB/s.
	d, err := cost.SpanCost(cost.AllGather, 1e9, cost.Span{Ranks: 8, PerNode: 4, Nodes: 2}, intra, inter)
	if want := 6*time.Microsecond + 10*time.Microsecond + time.Duration(7.0/8*1e9/40e9*1e9); err != nil || d != want {
		t.Errorf("all-gather %v %v, want %v", d, err, want)
	}
	// All-to-all: 3/8 inside at 100 GB/s, 4/8 across at 10 GB/s; 3 intra and 4 inter α.
	d, err = cost.SpanCost(cost.AllToAll, 8e9, cost.Span{Ranks: 8, PerNode: 4, Nodes: 2}, intra, inter)
	if want := 3*time.Microsecond + 40*time.Microsecond + time.Duration(4e9/10e9*1e9); err != nil || d != want {
		t.Errorf("all-to-all %v %v, want %v", d, err, want)
	}
	// One node: the plain ring.
	d, _ = cost.SpanCost(cost.AllReduce, 1e9, cost.Span{Ranks: 4, PerNode: 4, Nodes: 1}, intra, inter)
	if want, _ := cost.Cost(cost.AllReduce, 1e9, cost.Network{Ranks: 4, Bandwidth: 100e9, Latency: time.Microsecond}); d != want {
		t.Errorf("one node %v, want %v", d, want)
	}
	for _, bad := range []struct {
		sp           cost.Span
		bytes        float64
		intra, inter cost.Link
	}{
		{cost.Span{Ranks: 2, PerNode: 1, Nodes: 3}, 1, intra, inter},
		{cost.Span{Ranks: 4, PerNode: 0, Nodes: 2}, 1, intra, inter},
		{cost.Span{Ranks: 4, PerNode: 2, Nodes: 2}, -1, intra, inter},
		{cost.Span{Ranks: 4, PerNode: 2, Nodes: 2}, 1, intra, cost.Link{}},
		{cost.Span{Ranks: 4, PerNode: 2, Nodes: 2}, 1, intra, cost.Link{Bandwidth: 1, Latency: -1}},
	} {
		if _, err := cost.SpanCost(cost.AllReduce, bad.bytes, bad.sp, bad.intra, bad.inter); err == nil {
			t.Errorf("%+v: no error", bad)
		}
	}
	if _, err := cost.Price(commProgram(ir.TensorGroup, 16, 1e9), toyGPU(), cost.PriceOptions{Topology: &cost.Topology{GPUsPerNode: 8}}); err == nil {
		t.Error("a topology without an inter-node link priced")
	}
}

// Pipeline stages on different nodes send over the inter-node link.
func TestTopologyPipelineSendAcrossNodes(t *testing.T) {
	var b progBuilder
	x := b.tensor("x", 1e6, true, false)
	b.op(ir.Op{Name: "send", Phase: ir.Forward, In: ids(x), Comm: &ir.Comm{Kind: ir.SendRecv, Bytes: 1e9, Group: ir.PipelineGroup, Ranks: 2}})
	topo := &cost.Topology{GPUsPerNode: 8, InterNode: cost.Link{Bandwidth: 50e9}, TP: 8}
	tm, err := cost.Price(&b.p, toyGPU(), cost.PriceOptions{Topology: topo})
	if err != nil {
		t.Fatal(err)
	}
	if want := 20 * time.Millisecond; tm.Comm != want {
		t.Errorf("send %v, want %v", tm.Comm, want)
	}
}

// TestSpanClosedForm: Span's closed form equals counting the ranks node by
// node, for strides that do and do not divide the node, groups that end
// mid-node, and one rank.
func TestSpanClosedForm(t *testing.T) {
	for G := 1; G <= 12; G++ {
		for s := 1; s <= 2*G+1; s++ {
			for ranks := 1; ranks <= 40; ranks++ {
				per := map[int]int{}
				most := 0
				for i := 0; i < ranks; i++ {
					per[i*s/G]++
					most = max(most, per[i*s/G])
				}
				want := cost.Span{Ranks: ranks, PerNode: most, Nodes: len(per)}
				topo := cost.Topology{GPUsPerNode: G, TP: s}
				if got := topo.Span(ir.ContextGroup, ranks); got != want {
					t.Fatalf("G %d stride %d ranks %d: got %+v, want %+v", G, s, ranks, got, want)
				}
			}
		}
	}
}
