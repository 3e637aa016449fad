package cost

import (
	"time"
)

// Link is a point-to-point copy path such as the host link (PCIe) of a GPU.
type Link struct {
	// Bandwidth is bytes/s in the direction of the copy
	// (hw.GPU.HostLink.PerDirection for PCIe).
	Bandwidth float64
	// Latency is the fixed cost of one copy (launch and setup); 0 when
	// unknown.
	Latency time.Duration
}

// Transfer is the time to copy bytes over link: Latency + bytes/Bandwidth.
// A copy of 0 bytes costs nothing.
func Transfer(bytes float64, link Link) (time.Duration, error) {
	if !finiteNonNeg(bytes) {
		return 0, invalid("transfer of %v bytes: must be finite and >= 0", bytes)
	}
	if !positive(link.Bandwidth) || link.Latency < 0 {
		return 0, invalid("link bandwidth %v B/s must be positive and latency %v >= 0", link.Bandwidth, link.Latency)
	}
	if bytes == 0 {
		return 0, nil
	}
	return addSat(link.Latency, seconds(bytes/link.Bandwidth)), nil
}

// Copy is one item on the copy stream of a two-stream schedule.
type Copy struct {
	Duration time.Duration
	// IssueAt is the compute item at whose readiness the copy is issued: the
	// copy may start once compute items 0..IssueAt-1 have finished
	// (0 = at the start of the step, len(compute) = after all compute).
	IssueAt int
	// NeededBy is the compute item that waits for the copy to finish before
	// it starts; len(compute) means only the end of the step waits (e.g. an
	// offload of an activation to host memory). NeededBy >= IssueAt.
	NeededBy int
}

// Schedule is the outcome of a two-stream schedule.
type Schedule struct {
	// Total is the makespan: when both streams are done.
	Total time.Duration
	// Compute and Transfer are the busy times of the two streams.
	Compute, Transfer time.Duration
	// Exposed is the transfer time not hidden behind compute:
	// Total - Compute.
	Exposed time.Duration
}

// Overlap runs compute items in order on one stream and copies in order
// (FIFO, one at a time) on a second stream, as with one CUDA compute stream
// and one copy-engine stream. Copy k starts at the later of its issue time
// and the end of copy k-1; compute item j starts at the later of the end of
// item j-1 and the end of every copy with NeededBy == j. Copies must be
// listed in non-decreasing IssueAt order (FIFO issue).
//
// The result satisfies max(ΣCompute, ΣTransfer) <= Total <= ΣCompute +
// ΣTransfer: at every instant before Total at least one stream is busy.
func Overlap(compute []time.Duration, copies []Copy) (Schedule, error) {
	n := len(compute)
	var s Schedule
	for j, d := range compute {
		if d < 0 {
			return Schedule{}, invalid("compute item %d has negative duration %v", j, d)
		}
		s.Compute = addSat(s.Compute, d)
	}
	for k, c := range copies {
		switch {
		case c.Duration < 0:
			return Schedule{}, invalid("copy %d has negative duration %v", k, c.Duration)
		case c.IssueAt < 0 || c.IssueAt > n || c.NeededBy < c.IssueAt || c.NeededBy > n:
			return Schedule{}, invalid("copy %d: need 0 <= IssueAt (%d) <= NeededBy (%d) <= %d", k, c.IssueAt, c.NeededBy, n)
		case k > 0 && c.IssueAt < copies[k-1].IssueAt:
			return Schedule{}, invalid("copy %d issued at item %d after copy %d issued at item %d: copies must be in issue order", k, c.IssueAt, k-1, copies[k-1].IssueAt)
		}
		s.Transfer = addSat(s.Transfer, c.Duration)
	}

	var (
		ready     time.Duration                // end of the last compute item placed
		copyFree  time.Duration                // end of the last copy placed
		next      int                          // next copy to place
		waitUntil = make([]time.Duration, n+1) // latest end of copies needed by item j
	)
	for j := 0; j <= n; j++ {
		// Place every copy issued at item j; its issue time is `ready`.
		for ; next < len(copies) && copies[next].IssueAt == j; next++ {
			c := copies[next]
			start := max(copyFree, ready)
			copyFree = addSat(start, c.Duration)
			waitUntil[c.NeededBy] = max(waitUntil[c.NeededBy], copyFree)
		}
		if j == n {
			break
		}
		start := max(ready, waitUntil[j])
		ready = addSat(start, compute[j])
	}
	s.Total = max(ready, copyFree, waitUntil[n])
	s.Exposed = s.Total - s.Compute
	return s, nil
}

// Prefetch is the common case of Overlap in which transfer[i] is needed by
// compute[i] and is issued depth items ahead: at the readiness of item
// max(0, i-depth). depth = 0 issues each copy just before the item that
// needs it (fully exposed); depth >= len(compute) issues all at the start.
func Prefetch(compute, transfer []time.Duration, depth int) (Schedule, error) {
	if len(compute) != len(transfer) {
		return Schedule{}, invalid("prefetch of %d transfers for %d compute items: lengths differ", len(transfer), len(compute))
	}
	if depth < 0 {
		return Schedule{}, invalid("prefetch depth %d must be >= 0", depth)
	}
	copies := make([]Copy, len(transfer))
	for i, d := range transfer {
		copies[i] = Copy{Duration: d, IssueAt: max(0, i-depth), NeededBy: i}
	}
	return Overlap(compute, copies)
}
