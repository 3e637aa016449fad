package engine

import (
	"errors"
	"strings"
	"testing"
)

// TestLearnedPositionsMessage: a prompt and generated tokens past a model's
// learned positions are refused as the sum they are. Found by issue 15's
// sweep (cmd/memplan TestSweep): plan --model gpt2-large --mode infer --seq
// 1024 --gen-tokens 64 said "--seq 1088 exceeds gpt2-large's 1024 learned
// positions", a --seq nobody gave.
func TestLearnedPositionsMessage(t *testing.T) {
	a := lookup(t, "gpt2-large")
	for _, c := range []struct {
		s    Spec
		want string
	}{
		{Spec{Job: Job{Model: a, Mode: Infer, Seq: 1024, GenTokens: 64}}, "1024 + generated tokens 64 = 1088 tokens exceed gpt2-large's 1024 learned positions"},
		{Spec{Job: Job{Model: a, Seq: 4096}}, "4096 exceeds gpt2-large's 1024 learned positions"},
	} {
		err := c.s.Validate()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("seq %d, gen-tokens %d: %v, want %q", c.s.Seq, c.s.GenTokens, err, c.want)
		}
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Field != FieldSeq {
			t.Errorf("seq %d, gen-tokens %d: %v is not about the sequence", c.s.Seq, c.s.GenTokens, err)
		}
	}
}
