// Package chunk hands out many small slices and strings cut from a few
// large arrays, instead of one allocation each: lowering a 470,000-op
// mixture of experts makes about a million operand lists, names and shapes,
// and optimizer offload one host copy per parameter, which the collector
// would otherwise allocate and mark one by one (lower and strategy use it).
package chunk

import (
	"strings"
	"unsafe"
)

// bytesPerChunk is the size of each shared array.
const bytesPerChunk = 64 << 10

// Slices hands out slices of T cut from shared chunks, each with its
// capacity equal to its length, so an append to one copies it first and
// never writes into its neighbour. The zero value is ready to use.
type Slices[T any] struct{ buf []T }

// Make is a slice of n zero values, never nil (even when n is 0).
func (a *Slices[T]) Make(n int) []T {
	if a.buf == nil || cap(a.buf)-len(a.buf) < n {
		var zero T
		per := max(1, bytesPerChunk/int(max(1, unsafe.Sizeof(zero))))
		a.buf = make([]T, 0, max(n, per))
	}
	k := len(a.buf)
	a.buf = a.buf[:k+n]
	return a.buf[k : k+n : k+n]
}

// Clone is a copy of s, never nil.
func (a *Slices[T]) Clone(s []T) []T {
	out := a.Make(len(s))
	copy(out, s)
	return out
}

// One is the slice of v alone.
func (a *Slices[T]) One(v T) []T {
	out := a.Make(1)
	out[0] = v
	return out
}

// New is a pointer to a copy of v (a chunk's element: it lives as long as
// any element of its chunk is referenced).
func (a *Slices[T]) New(v T) *T { return &a.One(v)[0] }

// Strings builds strings into shared chunks: a strings.Builder never
// changes the bytes it has written, so each string is a slice of the
// chunk's String() and a full chunk is simply left to its strings. The
// zero value is ready to use.
type Strings struct{ b strings.Builder }

// Join is the concatenation of parts.
func (n *Strings) Join(parts ...string) string {
	size := 0
	for _, p := range parts {
		size += len(p)
	}
	if n.b.Cap()-n.b.Len() < size {
		n.b = strings.Builder{}
		n.b.Grow(max(size, bytesPerChunk))
	}
	k := n.b.Len()
	for _, p := range parts {
		n.b.WriteString(p)
	}
	return n.b.String()[k:]
}
