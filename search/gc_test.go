package search

import (
	"runtime/debug"
	"testing"
)

// A library search must leave the process's collector as it found it: the
// CLI, which owns the process, tunes it for fit (cli/fit.go).
func TestFitLeavesGCAlone(t *testing.T) {
	t.Setenv("GOGC", "") // unset: the case the search used to tune
	before := debug.SetGCPercent(137)
	defer debug.SetGCPercent(before)
	var during int
	o := Options{GPUs: 2, GlobalBatch: 4, Keep: 1, Progress: func(int, int) {
		during = debug.SetGCPercent(137)
	}}
	if _, err := Fit(baseSpec(t, "gpt2", "h100", 2), o); err != nil {
		t.Fatal(err)
	}
	if during != 137 {
		t.Errorf("the collector ran at %d%% during Fit, want the caller's 137%%", during)
	}
	if after := debug.SetGCPercent(137); after != 137 {
		t.Errorf("after Fit the collector runs at %d%%, want the caller's 137%%", after)
	}
}
