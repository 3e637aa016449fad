// Package ctxtest is a context for tests that stop work at each of the
// places it looks at its context in turn (engine, search and pack's stop
// tests): run once with StopAt(math.MaxInt64) to count the looks, then
// stop at each.
package ctxtest

import (
	"context"
	"sync/atomic"
)

// Countdown is a context done from its at-th look on (a call of Err, which
// context.Cause makes for a context of its own type). Done is never
// closed: the code under test looks, it does not wait.
type Countdown struct {
	context.Context
	looks atomic.Int64
	at    int64
}

// StopAt is a Countdown done from its at-th look on.
func StopAt(at int64) *Countdown { return &Countdown{Context: context.Background(), at: at} }

// Err is context.Canceled from the at-th call on.
func (c *Countdown) Err() error {
	if c.looks.Add(1) >= c.at {
		return context.Canceled
	}
	return nil
}

// Looks is how many times the context was looked at.
func (c *Countdown) Looks() int64 { return c.looks.Load() }
