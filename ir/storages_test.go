package ir

import (
	"slices"
	"testing"
)

// Storages agrees with Storage on every tensor: views of views, and a base
// that is not earlier (which Verify refuses, but Storage walks).
func TestStoragesAgreesWithStorage(t *testing.T) {
	ts := []Tensor{
		{Base: NoTensor}, // 0
		{Base: 0},        // 1: view of 0
		{Base: 1},        // 2: view of a view
		{Base: NoTensor}, // 3
		{Base: 5},        // 4: its base comes later
		{Base: 3},        // 5
	}
	got := Storages(ts)
	want := make([]TensorID, len(ts))
	for i := range ts {
		want[i] = Storage(ts, TensorID(i))
	}
	if !slices.Equal(got, want) || !slices.Equal(got, []TensorID{0, 0, 0, 3, 3, 3}) {
		t.Fatalf("Storages %v, Storage %v", got, want)
	}
}
