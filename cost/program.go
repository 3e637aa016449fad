package cost

import (
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/memplan/memplan/hw"
	"github.com/memplan/memplan/ir"
	"github.com/memplan/memplan/units"
)

// PriceOptions says how Price turns a program into time. The zero value is
// usable: every default below is an upper bound on speed (ideal roofline,
// wire-rate links, zero latency), never a measured fraction. Supply measured
// efficiencies and latencies to get realistic numbers.
type PriceOptions struct {
	// DType selects the GPU's peak FLOP/s (hw.GPU.PeakFLOPs) used for the
	// ops' rooflines and for MFU/HFU. Zero (units.Invalid) infers it from the
	// program: the output dtype of the ops carrying the most FLOPs (bfloat16
	// for bf16 and amp-bf16 runs, float32 for fp32 runs); bfloat16 when the
	// program has no FLOPs. An op whose output is a wider float dtype than
	// DType runs at that dtype's (lower) peak: a float32 matmul outside
	// autocast's reach in an amp-bf16 program (transformers 5.x's grouped
	// experts: _grouped_mm has no autocast rule) is a float32 GEMM.
	DType units.DType
	// PeakFLOPs, when positive, replaces g.PeakFLOPs(DType) — for example
	// g.TF32 for fp32 matmuls with TF32 enabled.
	PeakFLOPs float64
	// Efficiency scales the roofline's peaks. The zero value means
	// DefaultEfficiency(): the ideal roofline, an upper bound on speed.
	Efficiency Efficiency
	// Networks prices collectives per process group ("dp", "tp", "pp",
	// "ep", "cp"); Bandwidth is per rank and per direction, as in Network.
	// A group without an entry gets the intra-node default: the GPU's NVLink
	// per direction (hw.GPU.NVLinkPerDirection) when g.NVLink > 0, else its
	// PCIe host link per direction (peer traffic then crosses PCIe), with
	// zero latency. Both are wire rates of one node; a group that spans
	// nodes (data parallel across an InfiniBand fabric) must be given here.
	Networks map[ir.Group]Link
	// Topology, when set, places the ranks on nodes: a collective of a
	// group without a Networks entry whose ranks span nodes is priced by
	// SpanCost on the intra-node default and Topology.InterNode; a
	// send/recv between pipeline stages on different nodes crosses
	// InterNode. Nil keeps every group inside one node.
	Topology *Topology
	// Overlap says which groups' collectives run on a separate
	// communication stream, overlapping whatever compute does not depend on
	// them. A group without an entry takes the default: "dp" overlaps (DDP
	// and ZeRO bucket their gradient all-reduces under the backward), every
	// other group is exposed: its collectives run on the compute stream, as
	// Megatron-LM's tensor-parallel all-reduces do without its
	// communication-overlap options.
	Overlap map[ir.Group]bool
	// HostBandwidth is the host DRAM bandwidth that prices ops touching only
	// host memory (a CPU optimizer step). Zero means DefaultHostBandwidth.
	HostBandwidth float64
	// HostLink prices Transfer ops. Zero means the GPU's PCIe link per
	// direction (hw.GPU.HostLink.PerDirection, a wire rate) with zero
	// latency.
	HostLink Link
	// SharedCopyStream puts device→host and host→device copies on one FIFO
	// copy stream (exactly cost.Overlap's model). By default each direction
	// has its own stream, as PCIe is full duplex and GPUs since Kepler have
	// a copy engine per direction.
	SharedCopyStream bool
	// TokensPerStep and SamplesPerStep give Timing's throughputs (0: not
	// reported). For a language model: micro-batch × sequence × micro-steps.
	TokensPerStep, SamplesPerStep float64
	// ModelFLOPs is the FLOPs the model needs per step without recompute,
	// for MFU. Zero means the sum of FLOPs of the program's forward and
	// backward ops that are not recomputation.
	ModelFLOPs float64
	// NoOps leaves Timing.Ops empty: the step's and the phases' times
	// alone, for a caller that reads no op's (56 bytes an op: 114 MB for a
	// deepseek-v3 plan, held as long as its result).
	NoOps bool
	// Micro, when positive, prices the ops of that micro-step alone (with
	// NoOps), each as it runs in the program: what the micro-step adds to
	// the step of a program whose ops all run on the compute stream (no
	// collective or copy to wait for, so no op's time depends on another's).
	Micro int
}

// OpTime is the priced schedule of one op. An op runs its compute part
// (roofline) first, then its collective or its copy if it has one.
type OpTime struct {
	// Compute, Comm and Transfer are the busy times of the op's parts.
	Compute, Comm, Transfer time.Duration
	// Start is when the op's first part starts and End when its last part
	// ends, from the start of the step.
	Start, End time.Duration
	// Stall is how long the compute stream sat idle before this op, waiting
	// for an overlapped collective or copy it depends on.
	Stall time.Duration
	// Async is true when the op's collective or copy ran off the compute
	// stream.
	Async bool
}

// Duration is the op's own busy time: Compute + Comm + Transfer.
func (o OpTime) Duration() time.Duration { return addSat(addSat(o.Compute, o.Comm), o.Transfer) }

// PhaseTime sums the ops of one phase.
type PhaseTime struct {
	// Compute, Comm and Transfer are busy times of the phase's ops.
	Compute, Comm, Transfer time.Duration
	// Wall is the share of the step charged to the phase: its compute-stream
	// time (compute and exposed collectives) plus the stalls before its ops;
	// the idle tail after the last compute-stream op counts to the phase of
	// the program's last op. The phases' Walls sum to Timing.Step.
	Wall time.Duration
	// FLOPs executed in the phase, recomputation included.
	FLOPs float64
}

// Timing is a priced program.
type Timing struct {
	// Idle is time the rank waits that its own ops do not show (AddIdle:
	// the pipeline bubble); it is part of Step.
	Idle time.Duration
	// Ops is aligned with Program.Ops (empty under PriceOptions.NoOps).
	Ops    []OpTime
	Phases [ir.NumPhases]PhaseTime
	// Step is the makespan of the step: Compute + ExposedComm +
	// ExposedTransfer.
	Step time.Duration
	// Compute is the busy time of the compute stream's roofline work.
	Compute time.Duration
	// Comm and Transfer are the total busy times of collectives and of
	// host-link copies; Exposed* are the parts the step waits for:
	// collectives of non-overlapping groups in full, plus the compute
	// stream's stalls (and the tail after its last op), each split between
	// the overlapped ops that were running while it waited — an op that
	// itself waited for another passes that share on.
	Comm, Transfer               time.Duration
	ExposedComm, ExposedTransfer time.Duration
	// Recompute is the busy time of ops with Recompute set; RecomputeFLOPs
	// their FLOPs.
	Recompute      time.Duration
	RecomputeFLOPs float64
	// FLOPs is every FLOP executed (hardware FLOPs); ModelFLOPs those the
	// model needs without recompute (PriceOptions.ModelFLOPs or its
	// default).
	FLOPs, ModelFLOPs float64
	// TokensPerSec and SamplesPerSec are 0 when not asked for or when the
	// step takes no time.
	TokensPerSec, SamplesPerSec float64
	// MFU is ModelFLOPs / (Step × PeakFLOPs) and HFU the same with FLOPs
	// (Chowdhery et al., "PaLM", 2022, appendix B; Korthikanti et al. 2023
	// §6). Both use the unscaled peak; 0 when the step takes no time.
	MFU, HFU float64
	// The settings used: dtype, peak FLOP/s and efficiency.
	DType      units.DType
	PeakFLOPs  float64
	Efficiency Efficiency
}

// Streams of the schedule.
const (
	streamCompute = iota
	streamComm
	streamD2H
	streamH2D
	numStreams
)

// sideOp is one overlapped collective or copy as placed on its stream.
type sideOp struct {
	start, end time.Duration
	comm       bool // a collective, else a copy
	// cause is what the op waited for before it started (a hazard.rec);
	// 0 when it started as soon as it was issued.
	cause int32
}

// hazard is the end of an overlapped op: rec is 1 + its index in
// pricer.side, 0 for none.
type hazard struct {
	end time.Duration
	rec int32
}

func later(a, b hazard) hazard {
	if b.end > a.end {
		return b
	}
	return a
}

// pricer holds the state of one Price call.
type pricer struct {
	p     *ir.Program
	g     *hw.GPU
	o     PriceOptions
	peak  float64
	roots []ir.TensorID
	mark  []int32 // storage dedup stamp per op (estimateBytesHost)

	// Hazards of overlapped ops, by storage (nil until the first one).
	writeEnd, readEnd []hazard
	side              []sideOp

	// The schedule so far (run).
	t     *Timing
	ready time.Duration      // end of the compute stream
	free  [numStreams]hazard // last op of each side stream
	model float64            // FLOPs of forward and backward, recompute excluded
}

// Price prices one iteration of p on g: the compute ops under the roofline,
// collectives under the ring model (Cost) on each group's network, and
// host-link copies (Transfer), scheduled on a compute stream, a
// communication stream and one copy stream per direction.
//
// Schedule. Compute ops, and collectives of groups that do not overlap, run
// in program order on the compute stream. An overlapped collective or a copy
// is issued when every earlier compute-stream op has finished (the event a
// side stream waits on) and runs FIFO on its stream; it also waits for
// overlapped ops on other streams that touched its storages (a reload waits
// for the offload that wrote its host copy). A compute-stream op waits for
// the overlapped ops it conflicts with: for a collective, any op that reads
// or writes its buffers (collectives are treated as writing every buffer
// they name, since all-reduce works in place); for a copy, ops that read its
// output (a reload must finish before the op that reads what it loads) or
// overwrite its input. An offload nobody waits for runs under later compute;
// only the end of the step waits for it. With copies only and
// SharedCopyStream, this is exactly Overlap's two-stream schedule.
//
// Op times. A compute op costs Roofline(FLOPs, MemBytes), rounded up to the
// nanosecond so that no step beats the roofline (MFU ≤ 1). Ops without
// MemBytes (the optimizer's foreach ops, the batch load, the loss seed, a
// trace's ops, whose matrix products carry FLOPs alone) are charged the
// bytes of the distinct device storages they read and write (ir.Storage,
// Tensor.Bytes) as DRAM traffic — a lower bound, since an in-place op
// writes inputs that the IR does not list as outputs.
// Four kinds of op launch no kernel and cost nothing: ops without FLOPs whose
// outputs are all views (view, reshape, transpose and their backward),
// zero_grad(set_to_none=True), release (a dropped reference) and autocast.exit (autocast's cache cleared,
// ir.AutocastExit). A collective costs Cost(kind, Comm.Bytes,
// {Comm.Ranks, group link}), Comm.Bytes being NCCL-tests' per-rank buffer
// (the all-reduce buffer, the all-gather output, the reduce-scatter input,
// the all-to-all send buffer); a send/recv costs Transfer(Comm.Bytes, link)
// and nothing on one rank. A copy costs Transfer(Transfer.Bytes, host link).
func Price(p *ir.Program, g *hw.GPU, o PriceOptions) (*Timing, error) {
	if p == nil || g == nil {
		return nil, invalid("need a program and a GPU")
	}
	if o.Efficiency == (Efficiency{}) {
		o.Efficiency = DefaultEfficiency()
	}
	if err := o.Efficiency.Validate(); err != nil {
		return nil, err
	}
	for _, f := range []struct {
		what string
		v    float64
	}{{"tokens per step", o.TokensPerStep}, {"samples per step", o.SamplesPerStep}, {"model FLOPs", o.ModelFLOPs}, {"peak FLOP/s", o.PeakFLOPs}} {
		if !finiteNonNeg(f.v) {
			return nil, invalid("%s %v must be finite and >= 0", f.what, f.v)
		}
	}
	if o.DType == units.Invalid {
		o.DType = inferDType(p)
	}
	if o.HostBandwidth <= 0 {
		o.HostBandwidth = DefaultHostBandwidth
	}
	if o.HostLink == (Link{}) {
		o.HostLink = Link{Bandwidth: g.HostLink.PerDirection}
	}
	if t := o.Topology; t != nil && (t.GPUsPerNode < 1 || !positive(t.InterNode.Bandwidth) || t.InterNode.Latency < 0 || t.TP < 0 || t.CP < 0 || t.DP < 0) {
		return nil, invalid("topology: %d GPUs per node, inter-node link %v B/s with latency %v: need at least 1 GPU, a positive bandwidth, a latency >= 0", t.GPUsPerNode, t.InterNode.Bandwidth, t.InterNode.Latency)
	}
	pr := &pricer{p: p, g: g, o: o, peak: o.PeakFLOPs}
	if pr.peak == 0 {
		pr.peak = g.PeakFLOPs(o.DType)
	}
	if !positive(pr.peak) {
		return nil, invalid("%s has no %s peak: price it in a dtype the GPU computes in, or give its peak FLOP rate", g.Name, o.DType)
	}
	if err := pr.storages(); err != nil {
		return nil, err
	}
	return pr.run()
}

// DefaultHostBandwidth is the peak DRAM bandwidth of one server socket with
// eight channels of DDR5-4800 (JEDEC JESD79-5: 4800 MT/s × 8 bytes × 8
// channels = 307.2 GB/s), the memory of current GPU servers' hosts. Like
// the GPU rooflines it is an upper bound on speed.
const DefaultHostBandwidth = 4800e6 * 8 * 8

// DefaultNetwork is the link Price uses for a group without an entry in
// PriceOptions.Networks: NVLink per direction when the GPU has NVLink, else
// its PCIe host link per direction; zero latency.
func DefaultNetwork(g *hw.GPU) Link {
	if g.NVLink > 0 {
		return Link{Bandwidth: g.NVLinkPerDirection()}
	}
	return Link{Bandwidth: g.HostLink.PerDirection}
}

// Overlaps reports whether collectives of group run on a separate stream
// under o: o.Overlap[group] when set, else true for "dp" only.
func (o PriceOptions) Overlaps(group ir.Group) bool {
	if v, ok := o.Overlap[group]; ok {
		return v
	}
	return group == ir.DataGroup
}

// inferDType returns the float output dtype carrying the most FLOPs, or
// bfloat16. Ties go to the lower dtype code, for determinism.
func inferDType(p *ir.Program) units.DType {
	var by [256]float64
	for i := range p.Ops {
		op := &p.Ops[i]
		if op.FLOPs <= 0 || len(op.Out) == 0 {
			continue
		}
		t := op.Out[0]
		if t < 0 || int(t) >= len(p.Tensors) {
			continue
		}
		switch dt := p.Tensors[t].DType; dt {
		case units.F32, units.F16, units.BF16, units.FP8:
			by[dt] += op.FLOPs
		}
	}
	best, bestF := units.BF16, 0.0
	for dt, f := range by {
		if f > bestF {
			best, bestF = units.DType(dt), f
		}
	}
	return best
}

// storages maps every tensor to its storage owner, checking that views point
// to earlier tensors (so the walk ends).
func (pr *pricer) storages() error {
	ts := pr.p.Tensors
	pr.roots = make([]ir.TensorID, len(ts))
	for i := range ts {
		b := ts[i].Base
		switch {
		case b == ir.NoTensor:
			pr.roots[i] = ir.TensorID(i)
		case b < 0 || int(b) >= i:
			return invalid("tensor %d (%s): base %d is not an earlier tensor", i, ts[i].Name, b)
		default:
			pr.roots[i] = pr.roots[b]
		}
	}
	return nil
}

// root is t's storage owner, false when t is out of range (outOfRange says
// so); small enough to inline on the per-tensor path.
func (pr *pricer) root(t ir.TensorID) (ir.TensorID, bool) {
	if uint(t) < uint(len(pr.roots)) {
		return pr.roots[t], true
	}
	return 0, false
}

func (pr *pricer) outOfRange(oi int, t ir.TensorID) error {
	return invalid("op %d (%s): tensor %d out of range", oi, pr.p.Ops[oi].Name, t)
}

// noKernel reports ops that launch no kernel: views (no FLOPs, every output
// aliases another storage), zero_grad(set_to_none=True), release and
// autocast.exit.
func (pr *pricer) noKernel(oi int) (bool, error) {
	op := &pr.p.Ops[oi]
	if op.FLOPs > 0 {
		return false, nil
	}
	if strings.HasPrefix(op.Name, "zero_grad(set_to_none=True)") || op.Name == "release" || op.Name == ir.AutocastExit {
		return true, nil // release: a Python reference dropped (ops.Builder.Release); autocast's cache cleared
	}
	if len(op.Out) == 0 {
		return false, nil
	}
	for _, t := range op.Out {
		if _, ok := pr.root(t); !ok {
			return false, pr.outOfRange(oi, t)
		}
		if pr.p.Tensors[t].Base == ir.NoTensor {
			return false, nil
		}
	}
	return true, nil
}

// estimateBytesHost is the bytes of the distinct device storages op oi
// reads or writes, and of the host storages.
func (pr *pricer) estimateBytesHost(oi int) (float64, float64, error) {
	if pr.mark == nil {
		pr.mark = make([]int32, len(pr.p.Tensors))
	}
	op := &pr.p.Ops[oi]
	stamp := int32(oi + 1)
	var sum, host float64
	for _, list := range [2][]ir.TensorID{op.In, op.Out} {
		for _, t := range list {
			s, ok := pr.root(t)
			if !ok {
				return 0, 0, pr.outOfRange(oi, t)
			}
			if pr.mark[s] == stamp {
				continue
			}
			pr.mark[s] = stamp
			if pr.p.Tensors[s].Host {
				host += float64(pr.p.Tensors[s].Bytes)
			} else {
				sum += float64(pr.p.Tensors[s].Bytes)
			}
		}
	}
	return sum, host, nil
}

// opPeak is the peak FLOP/s op computes at: the priced dtype's, or a wider
// float output dtype's where the GPU's peak in it is lower (PriceOptions.DType).
// A given PeakFLOPs applies to every op.
func (pr *pricer) opPeak(op *ir.Op) float64 {
	if pr.o.PeakFLOPs > 0 || len(op.Out) == 0 || op.Out[0] < 0 || int(op.Out[0]) >= len(pr.p.Tensors) {
		return pr.peak
	}
	switch dt := pr.p.Tensors[op.Out[0]].DType; dt {
	case units.F32, units.F16, units.BF16:
		if p := pr.g.PeakFLOPs(dt); dt.Bits() > pr.o.DType.Bits() && positive(p) && p < pr.peak {
			return p
		}
	}
	return pr.peak
}

// roofline is Roofline at peak FLOP/s, rounded up to the nanosecond.
func (pr *pricer) roofline(flops, bytes, peak float64) (time.Duration, error) {
	eff := pr.o.Efficiency
	d, err := Roofline(flops, bytes, peak, pr.g.MemBandwidth, eff)
	if err != nil || d == math.MaxInt64 {
		return d, err
	}
	exact := 0.0
	if flops > 0 {
		exact = flops / (peak * eff.Compute)
	}
	if bytes > 0 {
		exact = math.Max(exact, bytes/(pr.g.MemBandwidth*eff.Memory))
	}
	if float64(d) < exact*1e9 {
		d++
	}
	return d, nil
}

var commKinds = [...]Collective{ir.AllReduce: AllReduce, ir.AllGather: AllGather, ir.ReduceScatter: ReduceScatter, ir.AllToAll: AllToAll}

// commTime prices a collective on its group's network.
func (pr *pricer) commTime(c *ir.Comm) (time.Duration, error) {
	link, ok := pr.o.Networks[c.Group]
	span := Span{Ranks: c.Ranks, PerNode: c.Ranks, Nodes: 1}
	if !ok {
		link = DefaultNetwork(pr.g)
		if t := pr.o.Topology; t != nil {
			span = t.Span(c.Group, c.Ranks)
		}
	}
	if c.Bytes < 0 {
		return 0, invalid("%v of %d bytes", c.Kind, c.Bytes)
	}
	if span.Nodes > 1 && c.Kind == ir.SendRecv {
		// The pipeline's stage boundary that crosses nodes paces it.
		return Transfer(float64(c.Bytes), pr.o.Topology.InterNode)
	}
	if span.Nodes > 1 {
		if int(c.Kind) >= len(commKinds) {
			return 0, invalid("unknown collective %v", c.Kind)
		}
		return SpanCost(commKinds[c.Kind], float64(c.Bytes), span, link, pr.o.Topology.InterNode)
	}
	if c.Kind == ir.SendRecv {
		if c.Ranks < 1 {
			return 0, invalid("send/recv on %d ranks: need at least 1", c.Ranks)
		}
		if c.Ranks == 1 {
			return 0, nil
		}
		return Transfer(float64(c.Bytes), link)
	}
	if int(c.Kind) >= len(commKinds) {
		return 0, invalid("unknown collective %v", c.Kind)
	}
	return Cost(commKinds[c.Kind], float64(c.Bytes), Network{Ranks: c.Ranks, Bandwidth: link.Bandwidth, Latency: link.Latency})
}

// dep is the latest overlapped op that an access conflicts with: a read
// waits for writers, a write for readers and writers.
func (pr *pricer) dep(oi int, reads, writes []ir.TensorID, h hazard) (hazard, error) {
	if pr.writeEnd == nil {
		return h, nil
	}
	for _, t := range reads {
		s, ok := pr.root(t)
		if !ok {
			return h, pr.outOfRange(oi, t)
		}
		h = later(h, pr.writeEnd[s])
	}
	for _, t := range writes {
		s, ok := pr.root(t)
		if !ok {
			return h, pr.outOfRange(oi, t)
		}
		h = later(later(h, pr.writeEnd[s]), pr.readEnd[s])
	}
	return h, nil
}

// record notes an overlapped op's accesses ending at end.
func (pr *pricer) record(oi int, reads, writes []ir.TensorID, h hazard) error {
	if pr.writeEnd == nil {
		pr.writeEnd = make([]hazard, len(pr.p.Tensors))
		pr.readEnd = make([]hazard, len(pr.p.Tensors))
	}
	for _, t := range reads {
		s, ok := pr.root(t)
		if !ok {
			return pr.outOfRange(oi, t)
		}
		pr.readEnd[s] = later(pr.readEnd[s], h)
	}
	for _, t := range writes {
		s, ok := pr.root(t)
		if !ok {
			return pr.outOfRange(oi, t)
		}
		pr.writeEnd[s] = later(pr.writeEnd[s], h)
	}
	return nil
}

// run schedules the ops in order (check, then the compute part, then the collective or copy part, then the
// phase's and the step's totals), drains the side streams and derives the throughputs.
func (pr *pricer) run() (*Timing, error) {
	p, o := pr.p, pr.o
	pr.t = &Timing{DType: o.DType, PeakFLOPs: pr.peak, Efficiency: o.Efficiency}
	if !o.NoOps {
		pr.t.Ops = make([]OpTime, len(p.Ops))
	}
	var scratch OpTime // each op's, under NoOps
	for oi := range p.Ops {
		op := &p.Ops[oi]
		if o.Micro > 0 && op.Micro != o.Micro {
			continue
		}
		if !priceable(op) {
			return nil, pr.check(oi)
		}
		ot, ph := &scratch, &pr.t.Phases[op.Phase]
		if !o.NoOps {
			ot = &pr.t.Ops[oi]
		} else {
			scratch = OpTime{}
		}
		ot.Start = -1
		if err := pr.compute(oi, ot, ph); err != nil {
			return nil, err
		}
		var err error
		switch {
		case op.Comm != nil:
			err = pr.collective(oi, ot, ph)
		case op.Transfer != nil:
			err = pr.copy(oi, ot)
		}
		if err != nil {
			return nil, err
		}
		if ot.Start < 0 { // no kernel
			ot.Start, ot.End = pr.ready, pr.ready
		}
		pr.account(op, ot, ph)
	}
	// The step ends when every stream has drained.
	tail := later(later(pr.free[streamComm], pr.free[streamD2H]), pr.free[streamH2D])
	if len(p.Ops) > 0 {
		var last OpTime
		pr.stall(&last, &pr.t.Phases[p.Ops[len(p.Ops)-1].Phase], tail)
	}
	pr.t.Step = pr.ready
	if err := pr.rates(); err != nil {
		return nil, err
	}
	return pr.t, nil
}

// priceable is check's test, small enough to inline in run's loop
// (v >= 0 && v <= MaxFloat64 is finiteNonNeg: NaN and +Inf fail it).
func priceable(op *ir.Op) bool {
	return op.Phase < ir.NumPhases && (op.Comm == nil || op.Transfer == nil) &&
		op.FLOPs >= 0 && op.FLOPs <= math.MaxFloat64 && op.MemBytes >= 0 && op.MemBytes <= math.MaxFloat64
}

// check rejects an op the schedule cannot price (the error for an op that
// is not priceable).
func (pr *pricer) check(oi int) error {
	op := &pr.p.Ops[oi]
	if op.Phase >= ir.NumPhases {
		return invalid("op %d (%s): phase %d", oi, op.Name, op.Phase)
	}
	if op.Comm != nil && op.Transfer != nil {
		return invalid("op %d (%s) is both a collective and a copy", oi, op.Name)
	}
	if !finiteNonNeg(op.FLOPs) || !finiteNonNeg(op.MemBytes) {
		return invalid("op %d (%s): %v FLOPs and %v bytes must be finite and >= 0", oi, op.Name, op.FLOPs, op.MemBytes)
	}
	return nil
}

// stall moves the compute stream up to h.end. The wait is charged by walking back the chain of overlapped ops
// that h ended: each op's busy time inside the wait goes to its kind, the time it spent waiting goes to what it
// waited for. Stalls are disjoint, so no op is charged more than its duration: Exposed* <= Comm, Transfer.
func (pr *pricer) stall(ot *OpTime, ph *PhaseTime, h hazard) {
	if h.end <= pr.ready {
		return
	}
	w := h.end - pr.ready
	ot.Stall += w
	ph.Wall = addSat(ph.Wall, w)
	for e, r := h.end, h.rec; r > 0 && e > pr.ready; {
		so := &pr.side[r-1]
		if busy := e - max(so.start, pr.ready); busy > 0 {
			if so.comm {
				pr.t.ExposedComm += busy
			} else {
				pr.t.ExposedTransfer += busy
			}
		}
		e, r = so.start, so.cause
	}
	pr.ready = h.end
}

// async places a side-stream item issued now and returns its span.
func (pr *pricer) async(oi int, s int, d time.Duration, reads, writes []ir.TensorID, comm bool) (start, end time.Duration, err error) {
	h, err := pr.dep(oi, reads, writes, later(hazard{end: pr.ready}, pr.free[s]))
	if err != nil {
		return 0, 0, err
	}
	start, end = h.end, addSat(h.end, d)
	pr.side = append(pr.side, sideOp{start: start, end: end, comm: comm, cause: h.rec})
	pr.free[s] = hazard{end: end, rec: int32(len(pr.side))}
	return start, end, pr.record(oi, reads, writes, pr.free[s])
}

// compute runs an op's kernel on the compute stream, after the overlapped ops it conflicts with: at the
// roofline, or at the host's DRAM bandwidth for an op on host memory only (the CPU optimizer step of
// ZeRO-Offload). Ops that only communicate or copy, and ops that launch no kernel, have no compute part.
func (pr *pricer) compute(oi int, ot *OpTime, ph *PhaseTime) error {
	op := &pr.p.Ops[oi]
	if !(op.FLOPs > 0 || op.MemBytes > 0 || (op.Comm == nil && op.Transfer == nil)) {
		return nil
	}
	var err error
	if op.FLOPs <= 0 { // an op with FLOPs launches a kernel
		skip, err := pr.noKernel(oi)
		if err != nil || skip {
			return err
		}
	}
	bytes := op.MemBytes
	var host float64
	if bytes == 0 {
		// An op that gives no traffic (a trace's: its matrix products
		// carry FLOPs, not bytes) is charged the storages it touches.
		if bytes, host, err = pr.estimateBytesHost(oi); err != nil {
			return err
		}
	}
	var d time.Duration
	if bytes == 0 && host > 0 && op.FLOPs == 0 {
		d = time.Duration(math.Ceil(host / pr.o.HostBandwidth * 1e9))
	} else if d, err = pr.roofline(op.FLOPs, bytes, pr.opPeak(op)); err != nil {
		return fmt.Errorf("%w (op %d, %s)", err, oi, op.Name)
	}
	if pr.writeEnd != nil { // else nothing overlapped yet: no hazard, no stall
		h, err := pr.dep(oi, op.In, op.Out, hazard{})
		if err != nil {
			return err
		}
		pr.stall(ot, ph, h)
	}
	ot.Start, ot.Compute = pr.ready, d
	pr.ready = addSat(pr.ready, d)
	ot.End = pr.ready
	ph.Wall = addSat(ph.Wall, d)
	pr.t.Compute = addSat(pr.t.Compute, d)
	return nil
}

// collective runs an op's collective: on the communication stream when its group overlaps, otherwise on the
// compute stream, exposed.
func (pr *pricer) collective(oi int, ot *OpTime, ph *PhaseTime) error {
	op := &pr.p.Ops[oi]
	d, err := pr.commTime(op.Comm)
	if err != nil {
		return fmt.Errorf("%w (op %d, %s)", err, oi, op.Name)
	}
	ot.Comm = d
	pr.t.Comm = addSat(pr.t.Comm, d)
	touched := append(op.In[:len(op.In):len(op.In)], op.Out...)
	if pr.o.Overlaps(op.Comm.Group) {
		ot.Async = true
		start, end, err := pr.async(oi, streamComm, d, nil, touched, true)
		if err != nil {
			return err
		}
		if ot.Start < 0 {
			ot.Start = start
		}
		ot.End = end
		return nil
	}
	h, err := pr.dep(oi, nil, touched, hazard{})
	if err != nil {
		return err
	}
	pr.stall(ot, ph, h)
	if ot.Start < 0 {
		ot.Start = pr.ready
	}
	pr.ready = addSat(pr.ready, d)
	ot.End = pr.ready
	ph.Wall = addSat(ph.Wall, d)
	pr.t.ExposedComm = addSat(pr.t.ExposedComm, d)
	return nil
}

// copy runs an op's host-link copy on its direction's copy stream (one shared stream with SharedCopyStream).
func (pr *pricer) copy(oi int, ot *OpTime) error {
	op := &pr.p.Ops[oi]
	if op.Transfer.Bytes < 0 {
		return invalid("op %d (%s): copy of %d bytes", oi, op.Name, op.Transfer.Bytes)
	}
	d, err := Transfer(float64(op.Transfer.Bytes), pr.o.HostLink)
	if err != nil {
		return fmt.Errorf("%w (op %d, %s)", err, oi, op.Name)
	}
	ot.Transfer, ot.Async = d, true
	pr.t.Transfer = addSat(pr.t.Transfer, d)
	s := streamD2H
	if !op.Transfer.ToHost && !pr.o.SharedCopyStream {
		s = streamH2D
	}
	start, end, err := pr.async(oi, s, d, op.In, op.Out, false)
	if err != nil {
		return err
	}
	if ot.Start < 0 {
		ot.Start = start
	}
	ot.End = end
	return nil
}

// account adds an op's times and FLOPs to its phase and the step.
func (pr *pricer) account(op *ir.Op, ot *OpTime, ph *PhaseTime) {
	t := pr.t
	ph.Compute = addSat(ph.Compute, ot.Compute)
	ph.Comm = addSat(ph.Comm, ot.Comm)
	ph.Transfer = addSat(ph.Transfer, ot.Transfer)
	ph.FLOPs += op.FLOPs
	t.FLOPs += op.FLOPs
	if op.Recompute {
		t.Recompute = addSat(t.Recompute, ot.Duration())
		t.RecomputeFLOPs += op.FLOPs
	} else if op.Phase == ir.Forward || op.Phase == ir.Backward {
		pr.model += op.FLOPs
	}
}

// rates derives the model FLOPs, throughputs and utilisations from the step.
func (pr *pricer) rates() error {
	t, o := pr.t, pr.o
	t.ModelFLOPs = o.ModelFLOPs
	if t.ModelFLOPs == 0 {
		t.ModelFLOPs = pr.model
	}
	if t.Step <= 0 {
		return nil
	}
	var err error
	if t.TokensPerSec, err = TokensPerSecond(o.TokensPerStep, t.Step); err != nil {
		return err
	}
	if t.SamplesPerSec, err = SamplesPerSecond(o.SamplesPerStep, t.Step); err != nil {
		return err
	}
	if t.MFU, err = MFU(t.ModelFLOPs, t.Step, pr.peak); err != nil {
		return err
	}
	t.HFU, err = MFU(t.FLOPs, t.Step, pr.peak)
	return err
}

// AddIdle adds idle time the per-rank program cannot show — a pipeline's
// bubble, when this rank waits for the other stages — to the step, and
// scales the throughputs and utilisations to the longer step.
func (t *Timing) AddIdle(d time.Duration) {
	if d <= 0 || t.Step <= 0 {
		return
	}
	f := float64(t.Step) / float64(t.Step+d)
	t.Idle += d
	t.Step += d
	t.TokensPerSec *= f
	t.SamplesPerSec *= f
	t.MFU *= f
	t.HFU *= f
}
