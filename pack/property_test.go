package pack

import (
	"fmt"
	"maps"
	"reflect"
	"slices"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/memplan/memplan/hw"
	"github.com/memplan/memplan/units"
)

// genEnvelope draws an envelope that keeps the order every real one keeps
// (context ≤ allocated ≤ cap ≤ peak) with curves under their peaks.
func genEnvelope(t *rapid.T, name string) *Envelope {
	ctx := units.Bytes(rapid.Int64Range(0, 1<<30).Draw(t, "context"))
	alloc := ctx + units.Bytes(rapid.Int64Range(1<<20, 70<<30).Draw(t, "allocated"))
	limit := alloc + units.Bytes(rapid.Int64Range(0, 4<<30).Draw(t, "cache"))
	peak := limit + units.Bytes(rapid.Int64Range(0, 4<<30).Draw(t, "more cache"))
	period := rapid.Float64Range(0.001, 30).Draw(t, "period")
	e := &Envelope{Job: name, Source: "train", Context: ctx, Allocated: alloc, Cap: limit, Peak: peak, Period: period,
		ModelSize: units.Bytes(rapid.Int64Range(0, 40<<30).Draw(t, "model size"))}
	if rapid.Bool().Draw(t, "declared") {
		e.Request = units.Bytes(rapid.Int64Range(1, 80<<30).Draw(t, "request"))
	}
	if rapid.Bool().Draw(t, "no curves") { // a caller that knows only the numbers
		e.Floor = alloc
		return e
	}
	n := rapid.IntRange(1, 12).Draw(t, "samples")
	top := rapid.IntRange(0, n-1).Draw(t, "peak sample")
	e.Floor = alloc
	for k := range n {
		ts := period * float64(k+1) / float64(n)
		live := ctx + units.Bytes(rapid.Int64Range(0, int64(alloc-ctx)).Draw(t, "live"))
		if k == top {
			live = alloc
		}
		e.Floor = min(e.Floor, live)
		e.Curve = append(e.Curve, Sample{ts, live})
		e.Reserved = append(e.Reserved, Sample{ts, max(live, units.Bytes(rapid.Int64Range(int64(live), int64(peak)).Draw(t, "reserved")))})
		e.Capped = append(e.Capped, Sample{ts, units.Bytes(rapid.Int64Range(int64(live), int64(limit)).Draw(t, "capped"))})
	}
	return e
}

func genPool(t *rapid.T) Pool {
	gpus := hw.All()
	g := gpus[rapid.IntRange(0, len(gpus)-1).Draw(t, "gpu")]
	return Pool{GPU: &g, Count: rapid.IntRange(1, 16).Draw(t, "count"), NodeGPUs: rapid.IntRange(0, 8).Draw(t, "GPUs per node")}
}

// genEnvelopes draws jobs of one GPU and, one time in three, of several
// (2 to 8 ranks, each its own envelope as pipeline stages differ, all on
// one node or not): the processes, and the jobs by name as Envelopes gives
// them (rank 0 with the ranks as Members).
func genEnvelopes(t *rapid.T) []*Envelope {
	procs, _ := genJobs(t)
	return procs
}

func genJobs(t *rapid.T) ([]*Envelope, map[string]*Envelope) {
	n := rapid.IntRange(1, 24).Draw(t, "jobs")
	var procs []*Envelope
	byJob := map[string]*Envelope{}
	for i := range n {
		name := fmt.Sprintf("j%d", i)
		ranks := 1
		if rapid.IntRange(0, 2).Draw(t, "gang?") == 0 {
			ranks = rapid.IntRange(2, 8).Draw(t, "ranks")
		}
		if ranks == 1 {
			e := genEnvelope(t, name)
			procs, byJob[name] = append(procs, e), e
			continue
		}
		sameNode := rapid.Bool().Draw(t, "same node")
		var ms []*Envelope
		for r := range ranks {
			e := genEnvelope(t, fmt.Sprintf("%s/%d", name, r))
			e.Gang, e.Rank, e.Ranks, e.SameNode = name, r, ranks, sameNode
			ms = append(ms, e)
		}
		lead := *ms[0]
		lead.Members = ms
		procs, byJob[name] = append(procs, ms...), &lead
	}
	return procs, byJob
}

// Under curve no GPU holds a set whose combined curve (the processes under
// their limits) exceeds the capacity less the margin; under curve and
// peaks no GPU is at risk or out of memory; every process is placed once or
// listed as unplaced, under every policy.
func TestPropertyPackPlacesSafely(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		envs, pool := genEnvelopes(t), genPool(t)
		margin := units.Bytes(rapid.Int64Range(0, int64(pool.Capacity())/8).Draw(t, "margin"))
		res, err := PackEnvelopes(envs, pool, Options{Margin: margin})
		if err != nil {
			t.Fatal(err)
		}
		room := pool.Capacity() - margin
		for _, pr := range res.Policies {
			seen := map[string]int{}
			for _, g := range pr.GPUs {
				for _, j := range g.Jobs {
					seen[j]++
				}
				if pr.Policy == Curve || pr.Policy == Peaks {
					if g.Reach > room || g.Status != OK {
						t.Fatalf("%s: GPU %d holds %s of %s (%s)", pr.Policy, g.Index, g.Reach, room, g.Status)
					}
					for _, s := range g.Combined {
						if s.Bytes > room {
							t.Fatalf("%s: GPU %d's combined curve reaches %s at %gs, over %s", pr.Policy, g.Index, s.Bytes, s.T, room)
						}
					}
				}
				if pr.Policy == WholeGPU && len(g.Jobs) != 1 {
					t.Fatalf("whole-gpu put %d jobs on GPU %d", len(g.Jobs), g.Index)
				}
			}
			for _, j := range pr.Unplaced {
				seen[j]++
			}
			for _, e := range envs {
				if seen[e.Job] != 1 {
					t.Fatalf("%s: %s placed %d times", pr.Policy, e.Job, seen[e.Job])
				}
			}
			if pr.Policy == WholeGPU && pr.GPUsNeeded > len(envs) {
				t.Fatalf("whole-gpu needs %d GPUs for %d processes", pr.GPUsNeeded, len(envs))
			}
			checkGangsWhole(t, envs, pr, pool.Node())
			checkNoRoomLeft(t, envs, pr, pool)
		}
		needed := map[Policy]int{}
		for _, pr := range res.Policies {
			needed[pr.Policy] = pr.GPUsNeeded
		}
		// Curve never needs more GPUs than a GPU per process, nor than peaks
		// when peaks places every process curve places (it leaves out those
		// whose peak exceeds a GPU; curve may place them by their limits).
		samePlaced := !slices.ContainsFunc(envs, func(e *Envelope) bool { return e.Cap <= room && e.Peak > room })
		if needed[Curve] > needed[WholeGPU] || samePlaced && needed[Curve] > needed[Peaks] {
			t.Fatalf("curve needs %d GPUs, whole-gpu %d, peaks %d", needed[Curve], needed[WholeGPU], needed[Peaks])
		}
		checkSavings(t, res)
	})
}

// checkSavings: curve's saving against a policy is given exactly when the
// two leave out the same processes as too large (those are a part of
// Unplaced), else why not; a saving given against peaks is never negative.
func checkSavings(t interface{ Fatalf(string, ...any) }, res *Result) {
	c := res.Policies[slices.IndexFunc(res.Policies, func(r PolicyResult) bool { return r.Policy == Curve })]
	for _, r := range res.Policies {
		for _, j := range r.TooLarge {
			if !slices.Contains(r.Unplaced, j) {
				t.Fatalf("%s: %s too large but not unplaced", r.Policy, j)
			}
		}
		if r.Policy == Curve {
			continue
		}
		n, saved := res.Saved[r.Policy.String()]
		why, notCompared := res.NotCompared[r.Policy.String()]
		same := slices.Equal(slices.Sorted(slices.Values(r.TooLarge)), slices.Sorted(slices.Values(c.TooLarge)))
		if saved == notCompared || saved != same || notCompared && why == "" {
			t.Fatalf("%s: saved %d (%v), not compared %q, too large %v against curve's %v", r.Policy, n, saved, why, r.TooLarge, c.TooLarge)
		}
		if saved && r.Policy == Peaks && n < 0 {
			t.Fatalf("curve needs %d more GPUs than peaks for the same processes", -n)
		}
	}
}

// checkNoRoomLeft: a process of no gang is left out only when it is too
// large or no GPU of the pool is empty (an empty GPU admits any process
// that is not too large, under every policy). A gang that straddled the
// pool's end had kept its first ranks' room while left out, and a one-GPU
// job went unplaced beside an empty GPU (service sweep, round 24).
func checkNoRoomLeft(t interface{ Fatalf(string, ...any) }, envs []*Envelope, pr PolicyResult, pool Pool) {
	used := 0
	for _, g := range pr.GPUs {
		if len(g.Jobs) > 0 {
			used++
		}
	}
	if used >= pool.Count {
		return
	}
	for _, e := range envs {
		if e.Gang == "" && slices.Contains(pr.Unplaced, e.Job) && !slices.Contains(pr.TooLarge, e.Job) {
			t.Fatalf("%s: %s unplaced beside %d empty GPUs", pr.Policy, e.Job, pool.Count-used)
		}
	}
}

// checkGangsWhole: every gang is placed whole on distinct GPUs (one node
// when it says so) or left out whole.
func checkGangsWhole(t interface{ Fatalf(string, ...any) }, envs []*Envelope, pr PolicyResult, node int) {
	gpu := placement(pr)
	for _, g := range gangsOf(envs) {
		var at []int
		for _, i := range g.procs {
			at = append(at, gpu[envs[i].Job])
		}
		left := slices.Index(at, -1) >= 0
		for _, b := range at {
			if left != (b == -1) {
				t.Fatalf("%s: gang %s split: GPUs %v", pr.Policy, envs[g.procs[0]].GangName(), at)
			}
			if !left && g.sameNode && b/node != at[0]/node {
				t.Fatalf("%s: same-node gang %s on GPUs %v, nodes of %d", pr.Policy, envs[g.procs[0]].GangName(), at, node)
			}
		}
		if !left && len(slices.Compact(slices.Sorted(slices.Values(at)))) != len(at) {
			t.Fatalf("%s: gang %s shares a GPU: %v", pr.Policy, envs[g.procs[0]].GangName(), at)
		}
	}
}

// The combined curve is the sum of the curves: at every sample time it
// equals the sum of each process's curve there, and it reaches the sum of
// the curves' values at each curve's own peak time.
func TestPropertyCombineIsTheSum(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		envs := genEnvelopes(t)
		var curves [][]Sample
		var periods []float64
		for _, e := range envs {
			curves, periods = append(curves, e.liveCurve()), append(periods, e.Period)
		}
		comb := combine(curves, periods)
		for _, s := range comb {
			var want units.Bytes
			for _, e := range envs {
				want += e.Live(s.T)
			}
			if s.Bytes != want {
				t.Fatalf("combined %s at %gs, sum %s", s.Bytes, s.T, want)
			}
		}
	})
}

// genSimulation draws jobs (by name), a pool and the job names in order,
// for an arrival trace.
func genSimulation(t *rapid.T) (map[string]*Envelope, Pool, []string) {
	_, byJob := genJobs(t)
	pool := genPool(t)
	names := slices.Sorted(maps.Keys(byJob))
	return byJob, pool, names
}

// The simulation: deterministic; curve, peaks and whole-gpu never start a
// job into an OOM (whole-gpu only when a job alone exceeds the GPU); every
// arrival is started or left queued; a started job that did not run out of
// memory completes.
func TestPropertySimulate(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		byJob, pool, names := genSimulation(t)
		seed := rapid.Uint64().Draw(t, "seed")
		tr := GenerateArrivals(seed, rapid.IntRange(1, 60).Draw(t, "arrivals"), names,
			time.Duration(rapid.IntRange(1, 120).Draw(t, "gap minutes"))*time.Minute,
			time.Duration(rapid.IntRange(1, 600).Draw(t, "duration minutes"))*time.Minute)
		a, err := Simulate(byJob, tr, pool, Options{})
		if err != nil {
			t.Fatal(err)
		}
		b, err := Simulate(byJob, tr, pool, Options{})
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(a, b) {
			t.Fatal("two runs differ")
		}
		// Under whole-gpu a job too large for a GPU runs out of memory once
		// it starts; a gang starts only when the pool (a node, for
		// same-node) has as many GPUs as it has ranks.
		tooBig, never := 0, 0
		for _, ar := range tr.Arrivals {
			e := byJob[ar.Job]
			ms := e.members()
			switch {
			case len(ms) > pool.Count || e.SameNode && len(ms) > min(pool.Node(), pool.Count):
				never++
			case slices.ContainsFunc(ms, func(e *Envelope) bool { return e.Allocated > pool.Capacity() }):
				tooBig++
			}
		}
		for _, p := range a.Policies {
			if p.Started+p.Queued != len(tr.Arrivals) {
				t.Fatalf("%s: %d started + %d queued of %d", p.Policy, p.Started, p.Queued, len(tr.Arrivals))
			}
			if p.Completed != p.Started-p.OOM {
				t.Fatalf("%s: %d completed of %d started, %d OOM", p.Policy, p.Completed, p.Started, p.OOM)
			}
			switch p.Policy {
			case Curve, Peaks:
				if p.OOM != 0 || p.AtRisk != 0 {
					t.Fatalf("%s: %d OOM, %d at risk", p.Policy, p.OOM, p.AtRisk)
				}
			case WholeGPU:
				if p.Queued != never {
					t.Fatalf("whole-gpu: %d never placed, %d gangs larger than the pool or a node", p.Queued, never)
				}
				if p.OOM != tooBig {
					t.Fatalf("whole-gpu: %d OOM, %d arrivals larger than the GPU", p.OOM, tooBig)
				}
			}
			if p.Utilisation < 0 || p.Utilisation > 1 || p.Busy < 0 || p.Busy > float64(pool.Count)+1e-9 {
				t.Fatalf("%s: utilisation %g, busy %g", p.Policy, p.Utilisation, p.Busy)
			}
			if p.MeanWait < 0 || p.P95Wait > p.MaxWait {
				t.Fatalf("%s: waits %g %g %g", p.Policy, p.MeanWait, p.P95Wait, p.MaxWait)
			}
		}
	})
}

// Inconsistent envelopes and pools are refused, not packed.
func TestPackRefusesInconsistentInput(t *testing.T) {
	pool, err := ParsePool("2xh100")
	if err != nil {
		t.Fatal(err)
	}
	good := &Envelope{Job: "a", Context: 1, Allocated: 2, Cap: 3, Peak: 4, Period: 1}
	for _, tc := range []struct {
		name string
		envs []*Envelope
		pool Pool
		opt  Options
	}{
		{"no jobs", nil, pool, Options{}},
		{"nil envelope", []*Envelope{nil}, pool, Options{}},
		{"cap above peak", []*Envelope{{Job: "b", Allocated: 2, Cap: 5, Peak: 4, Period: 1}}, pool, Options{}},
		{"allocated above cap", []*Envelope{{Job: "b", Allocated: 6, Cap: 5, Peak: 7, Period: 1}}, pool, Options{}},
		{"no period", []*Envelope{{Job: "b", Allocated: 2, Cap: 3, Peak: 4}}, pool, Options{}},
		{"no GPU", []*Envelope{good}, Pool{Count: 2}, Options{}},
		{"no GPUs", []*Envelope{good}, Pool{GPU: pool.GPU}, Options{}},
		{"negative margin", []*Envelope{good}, pool, Options{Margin: -1}},
		{"margin over the GPU", []*Envelope{good}, pool, Options{Margin: pool.Capacity()}},
		{"unknown policy", []*Envelope{good}, pool, Options{Policies: []Policy{numPolicies}}},
		{"a policy twice", []*Envelope{good}, pool, Options{Policies: []Policy{Curve, Peaks, Curve}}},
	} {
		if _, err := PackEnvelopes(tc.envs, tc.pool, tc.opt); err == nil {
			t.Errorf("%s: packed", tc.name)
		}
	}
	for _, s := range []string{"", "0xh100", "-2xh100", "8xnone", "100001xh100", "x"} {
		if _, err := ParsePool(s); err == nil {
			t.Errorf("ParsePool(%q) accepted", s)
		}
	}
	for _, tc := range []struct {
		in   string
		n    int
		name string
	}{{"8xh100", 8, "h100-sxm"}, {"h100", 1, "h100-sxm"}, {"rtx-4090", 1, "rtx-4090"}, {"2xrtx-4090", 2, "rtx-4090"}, {"4×a100-80gb", 4, "a100-80gb"}} {
		if p, err := ParsePool(tc.in); err != nil || p.Count != tc.n || p.GPU.Name != tc.name {
			t.Errorf("%s: %+v %v", tc.in, p, err)
		}
	}
}

// Every training job's envelope keeps context ≤ allocated ≤ cap ≤ peak
// with a real limit, whatever its peak: below, at and above the limit
// search's step (tiny GPT-2s, micro-batch and sequence drawn).
func TestPropertyEnvelopeConsistent(t *testing.T) {
	pool, err := ParsePool("h100")
	if err != nil {
		t.Fatal(err)
	}
	rapid.Check(t, func(t *rapid.T) {
		j := Job{Name: "tiny", Train: &Train{Model: tinyModel,
			MicroBatch: rapid.IntRange(1, 64).Draw(t, "micro-batch"),
			Seq:        rapid.IntRange(1, 128).Draw(t, "seq")}}
		e, err := envelopeOf(&j, pool.GPU)
		if err != nil {
			t.Fatalf("%v", err)
		}
		checkEnvelope(t, e)
	})
}
