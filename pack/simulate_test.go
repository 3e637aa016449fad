package pack

import (
	"context"
	"errors"
	"fmt"
	"math"
	"reflect"
	"testing"
	"time"

	"github.com/memplan/memplan/internal/ctxtest"
	"github.com/memplan/memplan/units"
	"pgregory.net/rapid"
)

// queueTrace is n arrivals of jobs, a second apart, each running for
// 1000 h: on a small pool nearly all of them wait, and the queue is as
// long as the trace (the adversarial trace that made the simulation
// quadratic and kept the service's slot for a minute).
func queueTrace(n int, jobs []string) *Trace {
	tr := &Trace{Kind: ArrivalsKind}
	for i := range n {
		a := Arrival{At: (time.Duration(i) * time.Second).String(), Duration: "1000h", Job: jobs[i%len(jobs)]}
		a.at, a.dur = float64(i), 1000*3600
		tr.Arrivals = append(tr.Arrivals, a)
	}
	return tr
}

// queueJobs are four one-GPU jobs of the benchmark's shapes by name.
func queueJobs() (map[string]*Envelope, []string) {
	byJob := map[string]*Envelope{}
	var names []string
	for _, e := range benchEnvelopes(4) {
		byJob[e.Job] = e
		names = append(names, e.Job)
	}
	return byJob, names
}

// The simulation is the queue rescanned in arrival order at every event:
// on random jobs (gangs, same-node gangs, jobs larger than a GPU), pools
// and traces, with short and with long runs (long queues), it gives what
// the first, rescanning simulator gave, every count and wait exactly; the
// memory utilisation, integrated from a running sum instead of process by
// process, to 1e-9.
func TestPropertySimulateAsRescan(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		byJob, pool, names := genSimulation(t)
		tr := GenerateArrivals(rapid.Uint64().Draw(t, "seed"), rapid.IntRange(1, 200).Draw(t, "arrivals"), names,
			time.Duration(rapid.IntRange(0, 60).Draw(t, "gap minutes"))*time.Minute,
			time.Duration(rapid.IntRange(1, 6000).Draw(t, "duration minutes"))*time.Minute)
		margin := pool.Capacity() / 100 * units.Bytes(rapid.IntRange(0, 20).Draw(t, "margin %"))
		got, err := Simulate(byJob, tr, pool, Options{Margin: margin})
		if err != nil {
			t.Fatal(err)
		}
		for i, p := range Policies() {
			want := refSimulate(byJob, tr.Arrivals, pool, margin, p)
			g := got.Policies[i]
			if math.Abs(g.Utilisation-want.Utilisation) > 1e-9*max(want.Utilisation, 1e-300) {
				t.Fatalf("%s: utilisation %v, rescanning %v", p, g.Utilisation, want.Utilisation)
			}
			g.Utilisation = want.Utilisation
			if !reflect.DeepEqual(g, want) {
				t.Fatalf("%s:\n%+v\nrescanning:\n%+v", p, g, want)
			}
		}
	})
}

// A simulation stops with its context: a trace of the most arrivals, all
// queued for 1000 h (a minute's work before the simulation was linear),
// stops at once when its context is done, returning the cause, and at
// each of the places it looks.
func TestSimulateStops(t *testing.T) {
	byJob, names := queueJobs()
	pool, err := ParsePool("8xh100")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	start := time.Now()
	res, err := SimulateContext(ctx, byJob, queueTrace(maxArrivals, names), pool, Options{})
	if !errors.Is(err, context.Canceled) || res != nil {
		t.Fatalf("a done context: %v, %v", res, err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("a done context stopped after %s", d)
	}
	tr := queueTrace(3000, names)
	full := ctxtest.StopAt(math.MaxInt64)
	if _, err := SimulateContext(full, byJob, tr, pool, Options{}); err != nil {
		t.Fatal(err)
	}
	n := full.Looks()
	if n < 4 { // a look per policy at least
		t.Fatalf("%d looks", n)
	}
	for at := int64(1); at <= n; at += max(1, n/40) {
		if res, err := SimulateContext(ctxtest.StopAt(at), byJob, tr, pool, Options{}); !errors.Is(err, context.Canceled) || res != nil {
			t.Fatalf("stopped at look %d of %d: %v", at, n, err)
		}
	}
}

// The simulation's time is linear in the arrivals: 10,000 and the most,
// 100,000, queued for 1000 h on 8 H100s (the rescanning simulator took
// 1.4 s and over 30 s for the command).
func BenchmarkSimulateQueue(b *testing.B) {
	byJob, names := queueJobs()
	pool, _ := ParsePool("8xh100")
	for _, n := range []int{10000, maxArrivals} {
		tr := queueTrace(n, names)
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			for b.Loop() {
				if _, err := Simulate(byJob, tr, pool, Options{}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
