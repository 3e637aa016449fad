package chunk

import (
	"slices"
	"strings"
	"testing"
)

// TestSlicesAreIndependent: each slice holds what it was given, its
// capacity is its length (an append copies), and slices never overlap, in
// one chunk or across several, whatever the sizes asked for.
func TestSlicesAreIndependent(t *testing.T) {
	var a Slices[int32]
	var got [][]int32
	var want [][]int32
	for i := range 40000 {
		n := i % 7
		if i%9999 == 0 {
			n = 20000 // past a chunk
		}
		w := make([]int32, n)
		for j := range w {
			w[j] = int32(i*31 + j)
		}
		s := a.Clone(w)
		if s == nil || len(s) != n || cap(s) != n {
			t.Fatalf("slice %d: nil %v, len %d, cap %d; want non-nil, %d, %d", i, s == nil, len(s), cap(s), n, n)
		}
		got, want = append(got, s), append(want, w)
	}
	// An append past one slice does not write into the next.
	got[1] = append(got[1], -1)
	want[1] = append(want[1], -1)
	for i := range got {
		if !slices.Equal(got[i], want[i]) {
			t.Fatalf("slice %d changed: %v, want %v", i, got[i], want[i])
		}
	}
	if one := a.One(7); len(one) != 1 || cap(one) != 1 || one[0] != 7 {
		t.Errorf("One(7) = %v (cap %d)", one, cap(one))
	}
	p, q := a.New(1), a.New(2)
	if *p != 1 || *q != 2 || p == q {
		t.Errorf("New: %d, %d (same pointer %v)", *p, *q, p == q)
	}
}

// TestStringsJoin: each string is its parts' concatenation and stays so
// while later strings fill the chunk and the next.
func TestStringsJoin(t *testing.T) {
	var n Strings
	var got, want []string
	for i := range 20000 {
		parts := []string{"model.layers.", strings.Repeat("x", i%13), ".grad"}
		if i%5000 == 0 {
			parts = append(parts, strings.Repeat("y", 70000)) // past a chunk
		}
		got, want = append(got, n.Join(parts...)), append(want, strings.Join(parts, ""))
	}
	if e := n.Join(); e != "" {
		t.Errorf("Join() = %q", e)
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("string %d = %q, want %q", i, got[i], want[i])
		}
	}
}
