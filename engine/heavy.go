package engine

import (
	"context"
	"sync/atomic"

	"github.com/memplan/memplan/hw"
)

// HeavyWork is the work (Work) past which a plan takes the process's one
// heavy turn (HeavyTurn): every deepseek-v3 job (0.5 million ops at one
// micro-step, 1.4 million at three or more). Two deepseek-v3 plans at once
// held twice the memory of one: 2.98 GB of RSS for two plans posted at
// once to memplan serve (--accum 4 and 5), 1.5 GB each alone; package
// pack's jobs of the same size held as much.
const HeavyWork = 400_000

// Work is about how many ops planning s builds: per micro-step 84 a layer
// and 30 more per expert of a mixture-of-experts layer (gpt2 to
// deepseek-v3 within a tenth), times the micro-steps the engine lays out,
// at most 3 (the first, a middle one standing for the rest, the last); a
// pipeline's, PipelineWork (each stage built with its own micro-steps,
// priced or not as priced says, whatever s.GPU). 0 for a job without a
// model.
func Work(s *Spec, priced bool) int64 {
	if s.Model == nil {
		return 0
	}
	if s.PP <= 1 || s.Validate() != nil {
		return int64(s.Model.Layers) * (84 + 30*int64(s.Model.NumExperts)) * int64(min(max(s.Accum, 1), 3))
	}
	q := *s
	q.GPU = nil
	if priced {
		q.GPU = &hw.GPU{} // only whether there is one is read
	}
	return PipelineWork(&q)
}

// heavyTurn is the process's one turn for heavy work; heavyWaiting counts
// the callers waiting for it.
var (
	heavyTurn    = make(chan struct{}, 1)
	heavyWaiting atomic.Int64
)

// HeavyWaiting is how many callers wait for the heavy turn now.
func HeavyWaiting() int64 { return heavyWaiting.Load() }

// HeavyTurn waits for the process's one turn for heavy work (a plan past
// HeavyWork, a search) and returns the function that gives it back; or
// ctx's cause, once ctx ends first. One heavy computation at a time runs
// beside any number of light ones: what bounds a process that computes
// several requests at once (memplan serve, pack's jobs) to about one heavy
// plan's memory, not one per request.
func HeavyTurn(ctx context.Context) (func(), error) {
	if ctx == nil {
		ctx = context.Background()
	}
	if done, ok := TryHeavyTurn(); ok {
		return done, nil
	}
	heavyWaiting.Add(1)
	defer heavyWaiting.Add(-1)
	select {
	case heavyTurn <- struct{}{}:
		return giveBackHeavyTurn, nil
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
}

func giveBackHeavyTurn() { <-heavyTurn }

// TryHeavyTurn takes the heavy turn when it is free, and returns the
// function that gives it back; ok is false when another holds it.
func TryHeavyTurn() (done func(), ok bool) {
	select {
	case heavyTurn <- struct{}{}:
		return giveBackHeavyTurn, true
	default:
		return nil, false
	}
}

// Heavy says whether planning s is heavy work: past HeavyWork.
func Heavy(s *Spec) bool { return Work(s, s.GPU != nil) > HeavyWork }
