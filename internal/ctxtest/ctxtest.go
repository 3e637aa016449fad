// Package ctxtest is a context for tests that stop work at each of the
// places it looks at its context in turn (engine, search and pack's stop
// tests): run once with StopAt(math.MaxInt64) to count the looks, then
// stop at each.
package ctxtest

import (
	"context"
	"errors"
	"math"
	"sync/atomic"
	"testing"
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

// EveryLook runs run once to count its looks at its context, then once
// stopped at each of them in turn, and fails t when a stopped run does not
// return context.Canceled or the full one fails. It returns the looks.
func EveryLook(t testing.TB, run func(context.Context) error) int64 {
	t.Helper()
	full := StopAt(math.MaxInt64)
	if err := run(full); err != nil {
		t.Fatal(err)
	}
	n := full.Looks()
	for at := int64(1); at <= n; at++ {
		if err := run(StopAt(at)); !errors.Is(err, context.Canceled) {
			t.Errorf("stopped at look %d of %d: %v", at, n, err)
		}
	}
	return n
}
