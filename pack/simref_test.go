package pack

import (
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/memplan/memplan/units"
)

// The simulation as it was written first, rescanning the queue and every
// running process at each event (quadratic in the arrivals): the reference
// TestPropertySimulateAsRescan holds simulate to.

// refSimulator is one policy's run over the arrivals: an event loop over
// arrival and end times; at each time it ends jobs, queues arrivals, then
// places every queued job (in arrival order) that the policy admits on the
// first GPU that admits it; a job of several GPUs (a gang) starts when
// every one of its processes has a GPU of its own that admits it (within
// one node when it says so), and waits whole until then; a placed job one
// of whose GPUs' allocated peaks then exceed the capacity runs out of
// memory and leaves at once, every process of it.
type refSimulator struct {
	envs   map[string]*Envelope
	arr    []Arrival
	pool   Pool
	room   units.Bytes
	policy Policy
	gpus   [][]running
	used   []units.Bytes // what the policy counts on each GPU
	queue  []int
	env    []*Envelope // of each arrival (a gang's leader)
	// sorted is each job's processes largest need first, and the needs.
	sorted map[*Envelope]sortedGang
	// minNeed is the smallest of the arrivals' largest process needs: with
	// less room everywhere, nothing queued can start.
	minNeed units.Bytes
	waits   []float64
	res     SimPolicy
	// integrals for utilisation: ∫ memory dt and ∫ busy GPUs dt.
	mem, busy, last float64
}

func refSimulate(envs map[string]*Envelope, arr []Arrival, pool Pool, margin units.Bytes, p Policy) SimPolicy {
	s := &refSimulator{envs: envs, arr: arr, pool: pool, room: pool.Capacity() - margin, policy: p, sorted: map[*Envelope]sortedGang{},
		gpus: make([][]running, pool.Count), used: make([]units.Bytes, pool.Count), res: SimPolicy{Policy: p}, minNeed: math.MaxInt64}
	for _, a := range arr {
		e := envs[a.Job]
		s.env = append(s.env, e)
		if _, ok := s.sorted[e]; !ok {
			ms := slices.Clone(e.members())
			s.sorted[e] = sortedGang{ms, byNeed(ms, nil, p)}
		}
		var top units.Bytes
		for _, m := range e.members() {
			top = max(top, m.Need(p))
		}
		s.minNeed = min(s.minNeed, top)
	}
	if p == WholeGPU {
		s.minNeed = 0
	}
	order := make([]int, len(arr))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmpFloat(arr[a].at, arr[b].at) })
	next := 0
	for next < len(order) || s.runningJobs() > 0 {
		t := math.Inf(1)
		if next < len(order) {
			t = arr[order[next]].at
		}
		t = min(t, s.nextEnd())
		s.advance(t)
		s.endJobs(t)
		for next < len(order) && arr[order[next]].at <= t {
			s.queue = append(s.queue, order[next])
			next++
		}
		s.place(t)
		if next == len(order) && s.runningJobs() == 0 {
			break
		}
	}
	s.res.Queued = len(s.queue)
	s.finish()
	return s.res
}

func (s *refSimulator) runningJobs() int {
	n := 0
	for _, g := range s.gpus {
		n += len(g)
	}
	return n
}

func (s *refSimulator) nextEnd() float64 {
	t := math.Inf(1)
	for _, g := range s.gpus {
		for _, r := range g {
			t = min(t, r.end)
		}
	}
	return t
}

// advance accumulates the utilisation integrals up to t.
func (s *refSimulator) advance(t float64) {
	dt := t - s.last
	if dt <= 0 || math.IsInf(t, 1) {
		return
	}
	for _, g := range s.gpus {
		if len(g) > 0 {
			s.busy += dt
		}
		for _, r := range g {
			s.mem += dt * float64(r.mean)
		}
	}
	s.last = t
}

func (s *refSimulator) endJobs(t float64) {
	for gi, g := range s.gpus {
		kept := g[:0]
		for _, r := range g {
			if r.end <= t {
				if r.lead {
					s.res.Completed++
				}
				s.used[gi] -= r.need
				continue
			}
			kept = append(kept, r)
		}
		s.gpus[gi] = kept
	}
}

// place starts every queued job the policy admits somewhere. A job whose
// largest process is larger than the most room any GPU has is passed over
// without trying each GPU (a long queue would otherwise cost queue × GPUs
// at every event).
func (s *refSimulator) place(t float64) {
	free := s.mostRoom()
	if free < s.minNeed {
		return
	}
	kept := s.queue[:0]
	for _, ai := range s.queue {
		sg := s.sorted[s.env[ai]]
		ms, needs := sg.ms, sg.needs
		var at []int
		if needs[0] <= free {
			at = fitGang(needs, len(s.gpus), s.pool.Node(), s.env[ai].SameNode, s.admits)
		}
		if at == nil {
			kept = append(kept, ai)
			continue
		}
		s.start(at, ai, t, ms, needs)
		free = s.mostRoom()
	}
	s.queue = kept
}

// mostRoom is the largest need some GPU admits now (whole-gpu: any need
// when a GPU is empty, none otherwise).
func (s *refSimulator) mostRoom() units.Bytes {
	var most units.Bytes = -1
	for gi := range s.gpus {
		if s.policy == WholeGPU {
			if len(s.gpus[gi]) == 0 {
				return math.MaxInt64
			}
			continue
		}
		most = max(most, s.room-s.used[gi])
	}
	return most
}

func (s *refSimulator) admits(g int, need units.Bytes) bool {
	if s.policy == WholeGPU {
		return len(s.gpus[g]) == 0
	}
	return s.used[g]+need <= s.room
}

// start places arrival ai's processes ms on GPUs at (one each) at t,
// judging each GPU as the policy runs its processes: the job runs out of
// memory when one of them does.
func (s *refSimulator) start(at []int, ai int, t float64, ms []*Envelope, needs []units.Bytes) {
	a := &s.arr[ai]
	s.res.Started++
	s.waits = append(s.waits, t-a.at)
	c, risky := s.pool.Capacity(), false
	for k, g := range at {
		allocated, reach := ms[k].Allocated, s.reach(ms[k])
		for _, r := range s.gpus[g] {
			allocated += r.env.Allocated
			reach += s.reach(r.env)
		}
		if allocated > c {
			s.res.OOM++
			s.res.OOMJobs = append(s.res.OOMJobs, fmt.Sprintf("%s@%s", a.Job, time.Duration(a.at*float64(time.Second))))
			return
		}
		risky = risky || reach > c
	}
	if risky {
		s.res.AtRisk++
	}
	for k, g := range at {
		s.gpus[g] = append(s.gpus[g], running{arrival: ai, end: t + a.dur, env: ms[k], mean: mean(ms[k]), need: needs[k], lead: k == 0})
		s.used[g] += needs[k]
	}
}

func (s *refSimulator) reach(e *Envelope) units.Bytes {
	if s.policy == Curve {
		return e.Cap
	}
	return e.Peak
}

func (s *refSimulator) finish() {
	s.res.Makespan = s.last
	if s.last > 0 {
		s.res.Utilisation = s.mem / (s.last * float64(s.pool.Count) * float64(s.pool.Capacity()))
		s.res.Busy = s.busy / s.last
	}
	if len(s.waits) == 0 {
		return
	}
	w := slices.Clone(s.waits)
	slices.Sort(w)
	var sum float64
	for _, x := range w {
		sum += x
	}
	s.res.MeanWait = sum / float64(len(w))
	s.res.MaxWait = w[len(w)-1]
	s.res.P95Wait = w[min(len(w)-1, int(math.Ceil(0.95*float64(len(w))))-1)]
}
