package pack

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/memplan/memplan/engine"
	"github.com/memplan/memplan/hw"
	"github.com/memplan/memplan/units"
)

// envelopeOf is job j's first process on g (one-GPU jobs' only one).
func envelopeOf(j *Job, g *hw.GPU) (*Envelope, error) {
	es, err := envelopesOf(context.Background(), j, g)
	if err != nil {
		return nil, err
	}
	return es[0], nil
}

// proc is a process of need GiB under every policy (allocated = cap = peak
// = need, no context), of gang g (none: a one-GPU job).
func proc(name string, need float64, g string, rank, ranks int, sameNode bool) *Envelope {
	b := units.Bytes(need * (1 << 30))
	return &Envelope{Job: name, Source: "train", Allocated: b, Cap: b, Peak: b, ModelSize: b / 4, Period: 1,
		Gang: g, Rank: rank, Ranks: ranks, SameNode: sameNode}
}

// gangOf is n processes of need GiB each (the needs list: one per rank).
func gangOf(name string, sameNode bool, needs ...float64) []*Envelope {
	var out []*Envelope
	for r, n := range needs {
		out = append(out, proc(fmt.Sprintf("%s/%d", name, r), n, name, r, len(needs), sameNode))
	}
	return out
}

func h100Pool(t *testing.T, n, node int) Pool {
	t.Helper()
	p, err := ParsePool(fmt.Sprintf("%dxh100", n))
	if err != nil {
		t.Fatal(err)
	}
	p.NodeGPUs = node
	return p
}

// placement maps each process to its GPU in pr (-1: unplaced).
func placement(pr PolicyResult) map[string]int {
	out := map[string]int{}
	for _, g := range pr.GPUs {
		for _, j := range g.Jobs {
			out[j] = g.Index
		}
	}
	for _, j := range pr.Unplaced {
		out[j] = -1
	}
	return out
}

// Jobs of several GPUs are placed whole on distinct GPUs, within a node
// when they say so, or left out whole.
func TestPackGangs(t *testing.T) {
	cat := func(ls ...[]*Envelope) []*Envelope { return slices.Concat(ls...) }
	for _, tc := range []struct {
		name   string
		envs   []*Envelope
		pool   [2]int // GPUs, GPUs per node
		policy Policy
		want   map[string]int // process → GPU, -1 unplaced
		needed int
	}{
		{"a tp-4 gang takes four GPUs, a single shares the first", cat(gangOf("tp4", false, 40, 40, 40, 40), []*Envelope{proc("one", 30, "", 0, 0, false)}),
			[2]int{8, 8}, Curve, map[string]int{"tp4/0": 0, "tp4/1": 1, "tp4/2": 2, "tp4/3": 3, "one": 0}, 4},
		{"ranks of one gang never share a GPU", gangOf("small", false, 10, 10, 10), [2]int{8, 8}, Curve,
			map[string]int{"small/0": 0, "small/1": 1, "small/2": 2}, 3},
		{"pipeline stages of different sizes: largest first", gangOf("pp", false, 20, 60, 30), [2]int{8, 8}, Peaks,
			map[string]int{"pp/1": 0, "pp/2": 1, "pp/0": 2}, 3},
		{"whole-gpu gives every rank a GPU", cat(gangOf("dp2", false, 10, 10), []*Envelope{proc("one", 5, "", 0, 0, false)}), [2]int{8, 8}, WholeGPU,
			map[string]int{"dp2/0": 0, "dp2/1": 1, "one": 2}, 3},
		{"a same-node gang skips a node without room for all", cat([]*Envelope{proc("big", 70, "", 0, 0, false), proc("big2", 70, "", 0, 0, false)}, gangOf("tp4", true, 30, 30, 30, 30)),
			[2]int{8, 4}, Curve, map[string]int{"big": 0, "big2": 1, "tp4/0": 4, "tp4/1": 5, "tp4/2": 6, "tp4/3": 7}, 6},
		{"without same-node the gang fills the first node's room", cat([]*Envelope{proc("big", 70, "", 0, 0, false), proc("big2", 70, "", 0, 0, false)}, gangOf("tp4", false, 30, 30, 30, 30)),
			[2]int{8, 4}, Curve, map[string]int{"big": 0, "big2": 1, "tp4/0": 2, "tp4/1": 3, "tp4/2": 4, "tp4/3": 5}, 6},
		{"a same-node gang larger than a node is left out whole", gangOf("tp8", true, 10, 10, 10, 10, 10, 10, 10, 10), [2]int{8, 4}, Curve,
			map[string]int{"tp8/0": -1, "tp8/1": -1, "tp8/2": -1, "tp8/3": -1, "tp8/4": -1, "tp8/5": -1, "tp8/6": -1, "tp8/7": -1}, 0},
		{"a gang with a rank larger than a GPU is left out whole", gangOf("pp", false, 10, 90), [2]int{8, 8}, Curve,
			map[string]int{"pp/0": -1, "pp/1": -1}, 0},
		{"a gang reaching past the pool is left out whole, its ranks in the pool too", cat([]*Envelope{proc("a", 70, "", 0, 0, false), proc("b", 70, "", 0, 0, false)}, gangOf("g", false, 50, 50)),
			[2]int{3, 8}, Curve, map[string]int{"a": 0, "b": 1, "g/0": -1, "g/1": -1}, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := PackEnvelopes(tc.envs, h100Pool(t, tc.pool[0], tc.pool[1]), Options{Policies: []Policy{tc.policy}})
			if err != nil {
				t.Fatal(err)
			}
			pr := res.Policies[0]
			if got := placement(pr); !mapsEqual(got, tc.want) {
				t.Errorf("placed %v, want %v", got, tc.want)
			}
			if pr.GPUsNeeded != tc.needed {
				t.Errorf("%d GPUs needed, want %d", pr.GPUsNeeded, tc.needed)
			}
		})
	}
}

func mapsEqual(a, b map[string]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// In the simulation a gang waits until all its GPUs are free at once (on
// one node when it says so), and its job completes once.
func TestSimulateGangWaits(t *testing.T) {
	single := proc("one", 50, "", 0, 0, false)
	tp4 := gangOf("tp4", false, 50, 50, 50, 50)
	lead := *tp4[0]
	lead.Members = tp4
	node := gangOf("node4", true, 50, 50, 50, 50)
	nlead := *node[0]
	nlead.Members = node
	envs := map[string]*Envelope{"one": single, "tp4": &lead, "node4": &nlead}
	fill := func() []Arrival {
		a := Arrival{At: "0s", Duration: "2h", Job: "one"}
		return []Arrival{a, a, a, a, {At: "0s", Duration: "1h", Job: "one"}}
	}
	for _, tc := range []struct {
		name     string
		pool     [2]int
		arrivals []Arrival
		wait     float64 // the last arrival's, seconds
	}{
		{"a gang of 4 on 4 GPUs waits for the single to end", [2]int{4, 4},
			[]Arrival{{At: "0s", Duration: "1h", Job: "one"}, {At: "10m", Duration: "1h", Job: "tp4"}}, 3000},
		{"on 5 GPUs it starts at once", [2]int{5, 8},
			[]Arrival{{At: "0s", Duration: "1h", Job: "one"}, {At: "10m", Duration: "1h", Job: "tp4"}}, 0},
		// Four 2-hour jobs fill node 0, the 1-hour one GPU 4: five GPUs are
		// free, three on node 1 and two on node 2.
		{"same-node: five free GPUs on two nodes do not do", [2]int{10, 4}, append(fill(), Arrival{At: "10m", Duration: "1h", Job: "node4"}), 3000},
		{"without same-node they do", [2]int{10, 4}, append(fill(), Arrival{At: "10m", Duration: "1h", Job: "tp4"}), 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := &Trace{Kind: ArrivalsKind, Arrivals: tc.arrivals}
			res, err := Simulate(envs, tr, h100Pool(t, tc.pool[0], tc.pool[1]), Options{Policies: []Policy{Peaks}})
			if err != nil {
				t.Fatal(err)
			}
			p := res.Policies[0]
			if p.Started != len(tc.arrivals) || p.Completed != len(tc.arrivals) || p.OOM != 0 {
				t.Fatalf("%+v", p)
			}
			if p.MaxWait != tc.wait {
				t.Errorf("the gang waited %gs, want %gs", p.MaxWait, tc.wait)
			}
		})
	}
}

// A gang that runs out of memory on one of its GPUs dies whole: static
// counts the 5 GiB each rank declares beside a 70 GiB job on each GPU.
func TestSimulateGangOOM(t *testing.T) {
	big := proc("big", 70, "", 0, 0, false)
	big.Request = 70 << 30
	g := gangOf("tp2", false, 50, 50)
	for _, e := range g {
		e.Request = 5 << 30
	}
	lead := *g[0]
	lead.Members = g
	tr := &Trace{Kind: ArrivalsKind, Arrivals: []Arrival{{At: "0s", Duration: "1h", Job: "big"}, {At: "0s", Duration: "1h", Job: "big"}, {At: "1m", Duration: "1h", Job: "tp2"}}}
	res, err := Simulate(map[string]*Envelope{"big": big, "tp2": &lead}, tr, h100Pool(t, 2, 2), Options{Policies: []Policy{Static, Peaks}})
	if err != nil {
		t.Fatal(err)
	}
	st, pk := res.Policies[0], res.Policies[1]
	if st.OOM != 1 || st.Completed != 2 || len(st.OOMJobs) != 1 || !strings.HasPrefix(st.OOMJobs[0], "tp2@") {
		t.Errorf("static: %+v", st)
	}
	if pk.OOM != 0 || pk.Completed != 3 || pk.MaxWait != 3540 {
		t.Errorf("peaks: %+v", pk)
	}
}

// A job of several GPUs becomes one process per rank: a pipeline's ranks
// carry their own stage's plan (the engine's per-stage result, not a copy
// of the worst), the ranks of a stage are alike, a vLLM service of tp 2
// holds half the weights per GPU.
func TestGangEnvelopesFromEngine(t *testing.T) {
	if testing.Short() {
		t.Skip("plans pipeline stages")
	}
	pool := h100Pool(t, 8, 8)
	jobs := []Job{
		{Name: "pp2dp2", SameNode: true, Train: &Train{Model: "gpt2-medium", MicroBatch: 2, Seq: 512, Accum: 4, PP: 2, DP: 2}},
		{Name: "chat-tp2", Serve: &Serve{Model: "llama-3-8b", Concurrency: 16, Context: 1024, TP: 2}},
		{Name: "chat-tp1", Serve: &Serve{Model: "llama-3-8b", Concurrency: 16, Context: 1024}},
	}
	procs, byJob, err := Envelopes(jobs, pool)
	if err != nil {
		t.Fatal(err)
	}
	if len(procs) != 4+2+1 || len(byJob["pp2dp2"].Members) != 4 || len(byJob["chat-tp2"].Members) != 2 || byJob["chat-tp1"].Members != nil {
		t.Fatalf("%d processes", len(procs))
	}
	s, err := jobs[0].Train.Spec()
	if err != nil {
		t.Fatal(err)
	}
	s.GPU = pool.GPU
	whole, err := engine.Plan(s)
	if err != nil {
		t.Fatal(err)
	}
	ms := byJob["pp2dp2"].Members
	for r, e := range ms {
		stage := r / 2 // stage-major: ranks 0, 1 run stage 0
		if e.Stage != stage || e.Rank != r || e.Ranks != 4 || e.Gang != "pp2dp2" || !e.SameNode || e.Job != fmt.Sprintf("pp2dp2/%d", r) {
			t.Errorf("rank %d: %+v", r, e)
		}
		// The allocated peak in whole blocks holds the stage's simulated peak.
		if live := e.Allocated - e.Context; live < whole.StagePeaks[stage] || float64(live) > 1.1*float64(whole.StagePeaks[stage]) {
			t.Errorf("rank %d: allocated %s, stage %d's peak %s", r, live, stage, whole.StagePeaks[stage])
		}
	}
	if ms[0].Allocated == ms[2].Allocated || ms[0].Allocated != ms[1].Allocated || ms[0].Period != ms[2].Period {
		t.Errorf("stages: %s %s %s, periods %g %g", ms[0].Allocated, ms[1].Allocated, ms[2].Allocated, ms[0].Period, ms[2].Period)
	}
	tp2, tp1 := byJob["chat-tp2"].Members[0], byJob["chat-tp1"]
	if tp2.Allocated >= tp1.Allocated || tp2.Ranks != 2 {
		t.Errorf("tp 2 holds %s per GPU, tp 1 %s", tp2.Allocated, tp1.Allocated)
	}
	res, err := PackEnvelopes(procs, pool, Options{Policies: []Policy{WholeGPU, Curve}})
	if err != nil {
		t.Fatal(err)
	}
	if res.Policies[0].GPUsNeeded != 7 || res.Policies[1].GPUsNeeded > 7 || len(res.Policies[1].Unplaced) != 0 {
		t.Errorf("whole-gpu %d GPUs, curve %d (%v left)", res.Policies[0].GPUsNeeded, res.Policies[1].GPUsNeeded, res.Policies[1].Unplaced)
	}
	if _, _, err := Envelopes([]Job{{Name: "odd", Train: &Train{Model: "gpt2", TP: 5}}}, pool); err == nil || !strings.Contains(err.Error(), `job "odd"`) {
		t.Errorf("tp 5 on 12 heads: %v", err)
	}
}

const (
	gangsFile         = "../testdata/pack/gangs.yaml"
	gangsArrivalsFile = "../testdata/pack/gangs-arrivals.yaml"
)

// The documented mix with jobs of several GPUs (README): on 16 H100s,
// curve places every gang whole (same-node ones on one node of 8) in fewer
// GPUs than a GPU per process and no more than peaks, with no GPU at risk;
// static model_size (spread over each job's GPUs) packs GPUs that run out
// of memory, and in the simulation its starts die of OOM while curve's and
// peaks' do not.
func TestMustShowGangs(t *testing.T) {
	if testing.Short() {
		t.Skip("plans the gang mix")
	}
	f, err := ReadFile(gangsFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := h100Pool(t, 16, 0)
	procs, byJob, err := Envelopes(f.Jobs, pool)
	if err != nil {
		t.Fatal(err)
	}
	res, err := PackEnvelopes(procs, pool, Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, pr := range res.Policies {
		t.Logf("pack %-9s GPUs needed %2d, unplaced %2d, oom GPUs %d, at-risk GPUs %d", pr.Policy, pr.GPUsNeeded, len(pr.Unplaced), pr.OOMGPUs, pr.AtRisk)
		checkGangsWhole(t, procs, pr, pool.Node())
	}
	curve, whole, static, peaks := policyOf(t, res, Curve), policyOf(t, res, WholeGPU), policyOf(t, res, Static), policyOf(t, res, Peaks)
	if curve.OOMGPUs+curve.AtRisk != 0 || len(curve.Unplaced) != 0 || curve.GPUsNeeded >= whole.GPUsNeeded || curve.GPUsNeeded > peaks.GPUsNeeded {
		t.Errorf("curve: %d GPUs (whole-gpu %d, peaks %d), %d oom, %d at risk, unplaced %v", curve.GPUsNeeded, whole.GPUsNeeded, peaks.GPUsNeeded, curve.OOMGPUs, curve.AtRisk, curve.Unplaced)
	}
	if static.OOMGPUs == 0 {
		t.Errorf("static model_size packed no GPU that runs out of memory")
	}
	tr, err := ParseArrivals(mustRead(t, gangsArrivalsFile), gangsArrivalsFile, f.Jobs)
	if err != nil {
		t.Fatal(err)
	}
	sim, err := Simulate(byJob, tr, pool, Options{})
	if err != nil {
		t.Fatal(err)
	}
	by := map[Policy]SimPolicy{}
	for _, p := range sim.Policies {
		by[p.Policy] = p
		t.Logf("simulate %-9s started %3d completed %3d OOM %3d at-risk %d never %d; wait mean %.2fh p95 %.2fh max %.2fh; memory %.1f%%, busy %.2f GPUs, makespan %.1fh",
			p.Policy, p.Started, p.Completed, p.OOM, p.AtRisk, p.Queued, p.MeanWait/3600, p.P95Wait/3600, p.MaxWait/3600, 100*p.Utilisation, p.Busy, p.Makespan/3600)
	}
	if by[Static].OOM == 0 {
		t.Errorf("the simulation shows no OOM under static model_size")
	}
	for _, p := range []Policy{Curve, Peaks, WholeGPU} {
		if by[p].OOM != 0 || by[p].AtRisk != 0 || by[p].Queued != 0 || by[p].Completed != len(tr.Arrivals) {
			t.Errorf("%s: %+v", p, by[p])
		}
	}
	if by[Curve].MeanWait >= by[WholeGPU].MeanWait {
		t.Errorf("curve waits %.0fs on average, whole-gpu %.0fs", by[Curve].MeanWait, by[WholeGPU].MeanWait)
	}
}

// The gang mix's arrival trace is what GenerateArrivals makes from its
// seed, the documented mix's settings (go test ./pack -run
// TestGangsArrivalsFileIsGenerated -update rewrites it).
func TestGangsArrivalsFileIsGenerated(t *testing.T) {
	checkArrivalsGenerated(t, gangsFile, gangsArrivalsFile, "TestGangsArrivalsFileIsGenerated")
}

// Curve's savings compare GPUs needed only where both policies count the
// same processes: a process left out as larger than a GPU (or a gang as
// larger than a node) is in neither's GPUs needed, so a policy that leaves
// out what the other places is not compared, and why is said. Processes
// past the pool's end are counted in GPUs needed and compare.
func TestSavedComparesTheSameProcesses(t *testing.T) {
	declared := proc("declared", 30, "", 0, 0, false)
	declared.Request = 100 << 30
	for _, tc := range []struct {
		name        string
		envs        []*Envelope
		saved       map[string]int
		notCompared map[string]string // policy → a process its reason names
	}{
		{"a process larger than a GPU: curve places nothing whole-gpu and static count", []*Envelope{proc("a", 100, "", 0, 0, false), proc("b", 30, "", 0, 0, false)},
			map[string]int{"peaks": 0}, map[string]string{"whole-gpu": "a", "static": "a"}},
		{"the pool is too small, but every process fits a GPU", []*Envelope{proc("a", 30, "", 0, 0, false), proc("b", 30, "", 0, 0, false), proc("c", 30, "", 0, 0, false)},
			map[string]int{"whole-gpu": 1, "static": -1, "peaks": 0}, nil},
		{"static leaves out a declared size larger than a GPU", []*Envelope{declared, proc("b", 30, "", 0, 0, false)},
			map[string]int{"whole-gpu": 1, "peaks": 0}, map[string]string{"static": "declared"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := PackEnvelopes(tc.envs, h100Pool(t, 1, 0), Options{})
			if err != nil {
				t.Fatal(err)
			}
			if !mapsEqual(res.Saved, tc.saved) {
				t.Errorf("saved %v, want %v", res.Saved, tc.saved)
			}
			if len(res.NotCompared) != len(tc.notCompared) {
				t.Errorf("not compared %v, want %v", res.NotCompared, tc.notCompared)
			}
			for p, job := range tc.notCompared {
				if why := res.NotCompared[p]; !strings.Contains(why, job) {
					t.Errorf("%s not compared because %q, want it to name %s", p, why, job)
				}
			}
		})
	}
}

// A node holds at most the pool's GPUs: a pool of 2 H100s is one node of
// 2, not of the catalog server's 8, as --node-gpus 2 would say (and
// --node-gpus refuses more than the pool); the result reports that node.
func TestPoolNode(t *testing.T) {
	for _, tc := range []struct {
		pool       string
		node, want int
	}{
		{"2xh100", 0, 2}, {"h100", 0, 1}, {"16xh100", 0, 8}, {"16xh100", 4, 4}, {"2xh100", 8, 2}, {"3xrtx-4090", 0, 3},
	} {
		p, err := ParsePool(tc.pool)
		if err != nil {
			t.Fatal(err)
		}
		p.NodeGPUs = tc.node
		res, err := PackEnvelopes([]*Envelope{proc("a", 1, "", 0, 0, false)}, p, Options{})
		if err != nil {
			t.Fatal(err)
		}
		if p.Node() != tc.want || res.NodeGPUs != tc.want {
			t.Errorf("%s, node %d: Node() %d, reported %d; want %d", tc.pool, tc.node, p.Node(), res.NodeGPUs, tc.want)
		}
	}
}
