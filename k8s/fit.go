package k8s

import (
	"cmp"
	"fmt"
	"slices"

	"github.com/memplan/memplan/units"
)

// Proc is a process already on a node: what the policy counts for it and
// the GPU it is pinned to (-1: not known, placed as pack places it).
type Proc struct {
	Name string
	Need units.Bytes
	GPU  int
}

// Placement is where a new process lands on a node.
type Placement struct {
	Fits bool
	// GPU is the GPU it lands on; Used what that GPU's processes then
	// hold as the policy counts them, Room what it may hold (capacity
	// less the margin).
	GPU        int
	Used, Room units.Bytes
	// Reason says why it does not fit.
	Reason string
}

// Score is the placement's score from 0 to max: how full its GPU is then,
// so that the tightest fit scores highest; 0 when it does not fit.
func (p Placement) Score(max int64) int64 {
	if !p.Fits || p.Room <= 0 {
		return 0
	}
	return int64(float64(max)*float64(p.Used)/float64(p.Room) + 0.5)
}

// Place puts a process needing need on count GPUs of capacity c beside
// procs (and whole GPUs held by pods outside memplan), keeping margin free
// on each GPU. Pinned processes sit on their GPU; the others go first-fit
// largest first, as pack places them (a process with no GPU left with room
// goes on the emptiest: it runs there already); the new one goes best-fit.
func Place(c units.Bytes, count int, whole int64, margin units.Bytes, procs []Proc, need units.Bytes) Placement {
	room := c - margin
	free := int64(count) - whole
	if free <= 0 {
		return Placement{GPU: -1, Room: room, Reason: fmt.Sprintf("all %d GPUs are held whole by pods that limit %s", count, GPUResource)}
	}
	used := make([]units.Bytes, count)
	// Whole GPUs: the highest-indexed GPUs no pinned process names.
	held := make([]bool, count)
	for _, p := range procs {
		if p.GPU >= 0 && p.GPU < count {
			used[p.GPU] += p.Need
		}
	}
	for g := count - 1; g >= 0 && whole > 0; g-- {
		if used[g] == 0 {
			held[g], whole = true, whole-1
		}
	}
	open := func(g int) bool { return !held[g] }
	loose := slices.Clone(procs)
	loose = slices.DeleteFunc(loose, func(p Proc) bool { return p.GPU >= 0 && p.GPU < count })
	slices.SortStableFunc(loose, func(a, b Proc) int { return cmp.Compare(b.Need, a.Need) })
	for _, p := range loose {
		g := -1
		for i := range used {
			if open(i) && used[i]+p.Need <= room {
				g = i
				break
			}
		}
		if g < 0 {
			for i := range used {
				if open(i) && (g < 0 || used[i] < used[g]) {
					g = i
				}
			}
		}
		if g >= 0 {
			used[g] += p.Need
		}
	}
	best, most := -1, units.Bytes(-1)
	for i := range used {
		if !open(i) {
			continue
		}
		if used[i]+need <= room && used[i] > most {
			best, most = i, used[i]
		}
	}
	if best < 0 {
		largest := units.Bytes(0)
		for i := range used {
			if open(i) {
				largest = max(largest, room-used[i])
			}
		}
		return Placement{GPU: -1, Room: room, Reason: fmt.Sprintf("needs %s on one GPU; the most any of its %d free GPUs has left is %s", need, free, max(largest, 0))}
	}
	return Placement{Fits: true, GPU: best, Used: used[best] + need, Room: room}
}
