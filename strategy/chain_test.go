package strategy

import (
	"strings"
	"testing"

	"github.com/memplan/memplan/ir"
)

// breaker is a transform that makes an invalid program: an op reading a
// tensor out of range.
type breaker struct{}

func (breaker) Name() string { return "breaker" }
func (breaker) Apply(p *ir.Program) (*ir.Program, error) {
	q := Clone(p)
	q.Ops = append(q.Ops, ir.Op{Name: "bad", Node: -1, In: []ir.TensorID{ir.TensorID(len(q.Tensors))}})
	return q, nil
}

// TestChainVerifies: an invalid program made anywhere in a chain is
// refused, naming the transform that made it when each is verified (tests)
// and every transform it may come from when only the last result is (the
// binary).
func TestChainVerifies(t *testing.T) {
	p := AutocastTestProgram(t)
	defer func(old bool) { verifyEach = old }(verifyEach)
	for _, each := range []bool{true, false} {
		verifyEach = each
		_, err := Chain(p, breaker{}, &AutocastCache{})
		if err == nil {
			t.Fatalf("verifyEach %v: a chain making an invalid program passed", each)
		}
		want := "breaker produced an invalid program"
		if !each {
			want = "breaker or " + (&AutocastCache{}).Name() + " produced an invalid program"
		}
		if !strings.Contains(err.Error(), want) {
			t.Errorf("verifyEach %v: %v, want it to say %q", each, err, want)
		}
		if _, err := Chain(p, &AutocastCache{}); err != nil {
			t.Errorf("verifyEach %v: a valid chain: %v", each, err)
		}
	}
}
