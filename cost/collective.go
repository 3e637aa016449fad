package cost

import (
	"time"
)

// Collective costs use the alpha–beta (latency–bandwidth) model of
// Thakur, Rabenseifner & Gropp, "Optimization of Collective Communication
// Operations in MPICH", IJHPCA 19(1), 2005: sending n bytes costs α + n·β
// with β = 1/B. The ring algorithms cost, on N ranks:
//
//	all-reduce      2(N−1)/N · bytes/B + 2(N−1)·α   (reduce-scatter + all-gather)
//	all-gather          (N−1)/N · bytes/B +  (N−1)·α
//	reduce-scatter      (N−1)/N · bytes/B +  (N−1)·α
//	all-to-all          (N−1)/N · bytes/B +  (N−1)·α   (pairwise exchange)
//
// The reduction arithmetic (γ term) is ignored. The bandwidth factors are the
// ones NCCL-tests uses to turn algorithm bandwidth into bus bandwidth
// (github.com/NVIDIA/nccl-tests, doc/PERFORMANCE.md): 2(N−1)/N for
// all-reduce, (N−1)/N for all-gather, reduce-scatter and all-to-all; so
// BusBandwidth of a predicted time with α = 0 gives back B.
//
// Sizes follow NCCL-tests too: bytes is the full buffer per rank — the
// all-reduce buffer, the all-gather output, the reduce-scatter input, the
// all-to-all send buffer.

// Collective names a collective operation.
type Collective int

// Collectives.
const (
	AllReduce Collective = iota + 1
	AllGather
	ReduceScatter
	AllToAll
)

var collectiveNames = map[Collective]string{
	AllReduce: "all-reduce", AllGather: "all-gather",
	ReduceScatter: "reduce-scatter", AllToAll: "all-to-all",
}

// String returns the operation's name ("all-reduce").
func (c Collective) String() string {
	if s, ok := collectiveNames[c]; ok {
		return s
	}
	return "collective(?)"
}

// factors returns NCCL-tests' busbw/algbw factor for n ranks — also the
// number of buffers' worth of bytes a ring pushes through each rank's link —
// and the number of latency (α) terms.
func (c Collective) factors(n int) (bus float64, steps int, ok bool) {
	f := float64(n-1) / float64(n)
	switch c {
	case AllReduce:
		return 2 * f, 2 * (n - 1), true
	case AllGather, ReduceScatter, AllToAll:
		return f, n - 1, true
	}
	return 0, 0, false
}

// Network describes the ranks of one collective.
type Network struct {
	Ranks int
	// Bandwidth is bytes/s per rank, per direction (for NVLink,
	// hw.GPU.NVLinkPerDirection).
	Bandwidth float64
	// Latency is α, the per-step latency.
	Latency time.Duration
}

// Cost is the time of collective c over bytes on net. One rank costs 0.
func Cost(c Collective, bytes float64, net Network) (time.Duration, error) {
	if net.Ranks < 1 {
		return 0, invalid("%v on %d ranks: need at least 1", c, net.Ranks)
	}
	bus, steps, ok := c.factors(net.Ranks)
	if !ok {
		return 0, invalid("unknown collective %d", int(c))
	}
	if !finiteNonNeg(bytes) {
		return 0, invalid("%v of %v bytes: must be finite and >= 0", c, bytes)
	}
	if !positive(net.Bandwidth) || net.Latency < 0 {
		return 0, invalid("network bandwidth %v B/s must be positive and latency %v >= 0", net.Bandwidth, net.Latency)
	}
	if net.Ranks == 1 {
		return 0, nil
	}
	lat := time.Duration(steps) * net.Latency
	if net.Latency > 0 && lat/net.Latency != time.Duration(steps) {
		return 0, invalid("latency %v × %d steps overflows", net.Latency, steps)
	}
	return addSat(lat, seconds(bus*bytes/net.Bandwidth)), nil
}

// BusBandwidth is NCCL-tests' bus bandwidth of collective c that moved bytes
// on ranks in time t: algbw = bytes/t times the factor above. It returns 0
// for t <= 0 or ranks < 1.
func BusBandwidth(c Collective, bytes float64, ranks int, t time.Duration) float64 {
	if t <= 0 || ranks < 1 {
		return 0
	}
	bus, _, ok := c.factors(ranks)
	if !ok {
		return 0
	}
	return bytes / t.Seconds() * bus
}
