package pack

import (
	"context"
	"errors"
	"math"
	"testing"

	"github.com/memplan/memplan/internal/ctxtest"
)

// Envelopes stop with their context: a training job's plans, reserved
// replays and limit bisection and a vLLM job's utilization search all look
// at it, and a stopped run returns its cause, not envelopes or a job's
// error.
func TestEnvelopesStop(t *testing.T) {
	file, err := Parse([]byte(`kind: memplan.jobs/v1
jobs:
  - name: t
    train: {model: gpt2, micro-batch: 2, seq: 256, accum: 8, pp: 2}
  - name: s
    serve: {model: qwen2.5-0.5b, concurrency: 8, context: 1024, gen-tokens: 128}
`), "jobs.yaml")
	if err != nil {
		t.Fatal(err)
	}
	pool, err := ParsePool("2xh100")
	if err != nil {
		t.Fatal(err)
	}
	full := ctxtest.StopAt(math.MaxInt64)
	if _, _, err := EnvelopesContext(full, file.Jobs, pool); err != nil {
		t.Fatal(err)
	}
	n := full.Looks()
	if n < 20 {
		t.Fatalf("%d looks at the context", n)
	}
	for at := int64(1); at <= n; at += max(1, n/50) {
		procs, byJob, err := EnvelopesContext(ctxtest.StopAt(at), file.Jobs, pool)
		if !errors.Is(err, context.Canceled) || procs != nil || byJob != nil {
			t.Fatalf("stopped at look %d of %d: %v (%d envelopes)", at, n, err, len(procs))
		}
	}
	t.Logf("%d looks", n)
}

// Packing stops with its context: 1,024 processes (seconds of work under
// serve) stop at once when the context is done, returning its cause, and
// at each of the places it looks (each gang placed, each GPU summed).
func TestPackEnvelopesStops(t *testing.T) {
	pool, err := ParsePool("256xh100")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	stop := errors.New("the request's time is up")
	cancel(stop)
	if res, err := PackEnvelopesContext(ctx, benchEnvelopes(1024), pool, Options{}); !errors.Is(err, stop) || res != nil {
		t.Fatalf("a done context: %v, %v", res, err)
	}
	envs := benchEnvelopes(12)
	n := ctxtest.EveryLook(t, func(ctx context.Context) error {
		_, err := PackEnvelopesContext(ctx, envs, pool, Options{})
		return err
	})
	if n < int64(2*len(envs)) { // a gang and a GPU under each policy at least
		t.Errorf("%d looks for %d processes", n, len(envs))
	}
}
