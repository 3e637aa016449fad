package pack

import (
	"strings"
	"testing"
)

// tinyModel is a GPT-2 of 64 wide, 2 layers and 1000 tokens: its allocated
// peak at seq 64 is about 20 MB, under the limit search's 64 MiB step.
const tinyModel = "../testdata/torch/gpt2_tiny.config.json"

// A job whose whole iteration allocates less than one step of the limit
// search still gets a limit that holds it: the allocator reads a limit of 0
// as none, so a search that rounded down to 0 gave a cap below the
// allocated peak and pack refused the job as inconsistent.
func TestTinyJobEnvelope(t *testing.T) {
	pool := h100Pool(t, 2, 0)
	jobs := []Job{{Name: "a", Train: &Train{Model: tinyModel, Seq: 64}}}
	procs, _, err := Envelopes(jobs, pool)
	if err != nil {
		t.Fatal(err)
	}
	e := procs[0]
	if e.Allocated-e.Context >= limitStep {
		t.Fatalf("allocated %s: not a tiny job any more", e.Allocated-e.Context)
	}
	checkEnvelope(t, e)
	// The curves lie on the step's time axis (each op's end on the
	// roofline), not on op indices: a tiny job's step is far under a second
	// and it has thousands of ops.
	if e.Period <= 0 || e.Period >= 1 {
		t.Errorf("period %g s: the curves are not on the step's time axis", e.Period)
	}
	res, err := PackEnvelopes(procs, pool, Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, pr := range res.Policies {
		if pr.GPUsNeeded != 1 || len(pr.Unplaced) != 0 {
			t.Errorf("%s: %d GPUs, %v unplaced", pr.Policy, pr.GPUsNeeded, pr.Unplaced)
		}
	}
}

// checkEnvelope fails t unless e keeps the order pack relies on and its
// limit is one the allocator enforces (a positive fraction of the GPU).
func checkEnvelope(t interface {
	Helper()
	Fatalf(string, ...any)
}, e *Envelope) {
	t.Helper()
	if err := checkEnvelopes([]*Envelope{e}); err != nil {
		t.Fatalf("%v: context %s, allocated %s, cap %s, peak %s", err, e.Context, e.Allocated, e.Cap, e.Peak)
	}
	if e.Cap <= e.Context || e.Fraction <= 0 || e.Fraction > 1 {
		t.Fatalf("cap %s over context %s, fraction %g: no limit", e.Cap, e.Context, e.Fraction)
	}
}

// A job larger than one GPU gets no fraction to pass (a fraction over 1
// is one torch refuses): its setting says it does not fit, under a
// training job's caching allocator and under vLLM alike.
func TestJobLargerThanGPUHasNoFraction(t *testing.T) {
	h100, l4 := h100Pool(t, 1, 0), Pool{}
	var err error
	if l4, err = ParsePool("l4"); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		job  Job
		pool Pool
	}{
		{Job{Name: "train", Train: &Train{Model: "llama-3-8b", Seq: 2048}}, h100},
		{Job{Name: "vllm", Serve: &Serve{Model: "llama-2-13b", Concurrency: 16, Context: 1024}}, l4},
	} {
		e, err := envelopeOf(&tc.job, tc.pool.GPU)
		if err != nil {
			t.Fatal(err)
		}
		if e.Cap <= tc.pool.Capacity() {
			t.Fatalf("%s: limit %s fits the GPU's %s", tc.job.Name, e.Cap, tc.pool.Capacity())
		}
		if e.Fraction != 0 || !strings.Contains(e.Setting, "does not fit") {
			t.Errorf("%s: limit %s of %s, fraction %g, setting %q", tc.job.Name, e.Cap, tc.pool.Capacity(), e.Fraction, e.Setting)
		}
	}
}

// combine adds a bounded number of peak points: a curve of 1 µs beside one
// of 10 s repeats ten million times over the window, and only 4·grid of
// its repetitions are added (each still the exact sum there).
func TestCombineBoundsRepetitions(t *testing.T) {
	fast := []Sample{{2e-7, 1 << 20}, {1e-6, 1 << 30}}
	slow := []Sample{{5, 4 << 30}, {10, 2 << 30}}
	comb := combine([][]Sample{fast, slow}, []float64{1e-6, 10})
	const grid = 4 * maxSamples
	if n := len(comb); n > grid+1+4*grid+1 {
		t.Fatalf("%d samples", n)
	}
	for _, s := range comb {
		if want := at(fast, 1e-6, s.T) + at(slow, 10, s.T); s.Bytes != want {
			t.Fatalf("at %gs: %s, want %s", s.T, s.Bytes, want)
		}
	}
}
