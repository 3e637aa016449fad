package strategy

import "testing"

// TestPoolClasses checks the capacity classes: the class a request takes
// from is the smallest of size ≥ the request, at most a quarter larger (an
// eighth from 2^20 on), and the class an array goes back to is the largest
// of size ≤ its capacity.
func TestPoolClasses(t *testing.T) {
	for _, tc := range []struct{ c, for_, size int }{
		{1, 0, 4}, {4, 0, 4}, {5, 1, 5}, {7, 3, 7}, {8, 4, 8}, {9, 5, 10}, {11, 6, 12},
		{301_600, 65, 327_680}, {470_000, 68, 524_288}, {524_288, 68, 524_288},
		{917_505, 72, 1 << 20}, {1 << 20, 72, 1 << 20}, {1<<20 + 1, 73, 9 << 17}, {2_136_189, 81, 9 << 18},
	} {
		i := classFor(tc.c)
		if i != tc.for_ || classSize(i) != tc.size {
			t.Errorf("classFor(%d) = %d of size %d, want %d of size %d", tc.c, i, classSize(i), tc.for_, tc.size)
		}
	}
	prev := 0
	for i := range fineFrom + 8*20 {
		s, next := classSize(i), classSize(i+1)
		if s <= prev || classOf(s) != i || classFor(s) != i || classOf(next-1) != i || classFor(s+1) != i+1 {
			t.Fatalf("class %d (size %d) is out of order with its neighbours", i, s)
		}
		if i > 0 && 4*s > 5*prev || i > fineFrom && 8*s > 9*prev {
			t.Fatalf("class %d (size %d) is too much larger than class %d (size %d)", i, s, i-1, prev)
		}
		prev = s
	}
}

// TestPoolReusesSameSize checks that a released array serves the next
// request of the same size (an array made at exactly the request's size
// went a class below it and was never taken again) and comes back zeroed
// past the length asked for.
func TestPoolReusesSameSize(t *testing.T) {
	var p pool[int]
	a := p.get(300, 301)
	for i := range a[:cap(a)] {
		a[:cap(a)][i] = i + 1
	}
	p.put(a)
	b := p.get(250, 301)
	if &b[:1][0] != &a[:1][0] {
		t.Fatal("an array of the same size class was not reused")
	}
	for i, v := range b[250:cap(b)] {
		if v != 0 {
			t.Fatalf("element %d past the length is %d, want 0", 250+i, v)
		}
	}
	if c := p.get(301, 301); &c[:1][0] == &a[:1][0] {
		t.Fatal("an array taken from the pool was handed out twice")
	}
}

// An array of 2^20 elements or more goes back to no class: the next
// request of its size gets a new one.
func TestPoolKeepsNoLargeArray(t *testing.T) {
	var p pool[int32]
	a := p.get(1<<20, 1<<20)
	p.put(a)
	if b := p.get(1<<20, 1<<20); &b[0] == &a[0] {
		t.Fatal("an array of 2^20 elements was kept")
	}
	c := p.get(1000, 1000)
	p.put(c)
	if d := p.get(1000, 1000); &d[0] != &c[0] {
		t.Fatal("an array of 1,000 elements was not kept")
	}
}
