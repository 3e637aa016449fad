package k8s

import (
	"testing"

	"github.com/memplan/memplan/hw"
	"github.com/memplan/memplan/pack"
)

// A pod whose workload runs on several GPUs is one rank of it: judged as
// the rank that holds the most (a pipeline's largest stage), not rank 0.
func TestWorkloadOfSeveralGPUsIsItsLargestRank(t *testing.T) {
	g, err := hw.Lookup("h100")
	if err != nil {
		t.Fatal(err)
	}
	wl, err := ParseWorkload("train: {model: gpt2, micro-batch: 2, seq: 512, pp: 2, accum: 4}", "team-a/pp", "")
	if err != nil {
		t.Fatal(err)
	}
	got, err := (&Planner{}).Envelope(wl, g)
	if err != nil {
		t.Fatal(err)
	}
	ranks, _, err := pack.Envelopes([]pack.Job{*wl.Job}, pack.Pool{GPU: g, Count: 1})
	if err != nil {
		t.Fatal(err)
	}
	if len(ranks) != 2 || ranks[0].Peak == ranks[1].Peak {
		t.Fatalf("%d ranks", len(ranks))
	}
	want := max(ranks[0].Peak, ranks[1].Peak)
	if got.Peak != want || got.Job != wl.Job.Name {
		t.Errorf("judged at %s (%s), want the larger stage's %s", got.Peak, got.Job, want)
	}
}
