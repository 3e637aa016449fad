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
