package build

import (
	"strings"
	"testing"
)

// ParseLoss reads each form once: a chunked loss takes one size and one
// upcast, so two of either (a contradiction, or the same given twice) are
// refused naming both rather than the last one winning; options follow a
// colon; an unknown option is named as a key; an unknown loss is told
// every accepted form (LossForms, the loss switch's list too).
func TestParseLoss(t *testing.T) {
	for _, c := range []struct {
		in   string
		want Loss
		err  string // a refusal containing it
	}{
		{in: "", want: Loss{}},
		{in: "fp32-logits", want: Loss{}},
		{in: "HF", want: Loss{}},
		{in: "native", want: Loss{Kind: LossNative}},
		{in: "fused-linear", want: Loss{Kind: LossFusedLinear}},
		{in: "liger", want: Loss{Kind: LossFusedLinear}},
		{in: "chunked", want: Loss{Kind: LossChunked, Chunks: 8}},
		{in: "chunked:fp32", want: Loss{Kind: LossChunked, Chunks: 8, Upcast: UpcastChunk}},
		{in: "chunked:chunks=8,fp32", want: Loss{Kind: LossChunked, Chunks: 8, Upcast: UpcastChunk}},
		{in: "chunked:fp32-outputs,tokens=128", want: Loss{Kind: LossChunked, ChunkTokens: 128, Upcast: UpcastOutputs}},
		{in: " chunked:rows=128,fp32-outputs ", want: Loss{Kind: LossChunked, Rows: 128, Upcast: UpcastOutputs}},
		{in: "chunked:chunks=8,fp32,fp32-outputs", err: `loss "chunked:chunks=8,fp32,fp32-outputs": fp32 and fp32-outputs contradict: a chunked loss upcasts in one place`},
		{in: "chunked:chunks=8,fp32-outputs,fp32", err: "fp32-outputs and fp32 contradict"},
		{in: "chunked:fp32,fp32", err: "fp32 and fp32: fp32 is given twice"},
		{in: "chunked:chunks=8,tokens=16", err: "chunks=8 and tokens=16 contradict: a chunked loss takes one of tokens, chunks, rows"},
		{in: "chunked:rows=4,chunks=4", err: "rows=4 and chunks=4 contradict"},
		{in: "chunked:chunks=8,chunks=4", err: "chunks=8 and chunks=4: chunks is given twice"},
		{in: "chunkedtokens=4", err: `unknown loss "chunkedtokens=4"`},
		{in: "chunked,fp32", err: `unknown loss "chunked,fp32"`},
		{in: "chunked:", err: `loss "chunked:": an empty option`},
		{in: "chunked:chunks=8,,fp32", err: "an empty option"},
		{in: "chunked:foo", err: `loss "chunked:foo": unknown key "foo" (want tokens=N, chunks=N, rows=N, fp32 or fp32-outputs)`},
		{in: "chunked:foo=3", err: `unknown key "foo"`},
		{in: "chunked:fp32=1", err: "fp32 takes no value"},
		{in: "chunked:tokens=0", err: "tokens must be a positive integer"},
		{in: "chunked:rows=-1", err: "rows must be a positive integer"},
		{in: "chunked:chunks", err: "chunks must be a positive integer"},
		{in: "chunked:tokens=4294967296", err: "tokens must be a positive integer"},
		{in: "bogus", err: `unknown loss "bogus"`},
	} {
		got, err := ParseLoss(c.in)
		switch {
		case c.err == "" && err != nil:
			t.Errorf("%q: %v", c.in, err)
		case c.err == "" && got != c.want:
			t.Errorf("%q: %+v, want %+v", c.in, got, c.want)
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("%q: %v, want an error containing %q", c.in, err, c.err)
		case strings.Contains(c.err, "unknown loss") && !strings.HasSuffix(err.Error(), "(want "+LossForms()+")"):
			t.Errorf("%q: %v does not list the forms", c.in, err)
		}
		if err == nil {
			if back, err := ParseLoss(got.String()); err != nil || back != got {
				t.Errorf("%q: String %q reads back as %+v, %v", c.in, got.String(), back, err)
			}
		}
	}
	// Every form the list names is accepted as written with a size.
	for _, f := range []string{"fp32-logits", "native", "fused-linear", "chunked[:", "tokens=N", "chunks=N", "rows=N", "fp32", "fp32-outputs"} {
		if !strings.Contains(LossForms(), f) {
			t.Errorf("the accepted forms %q omit %s", LossForms(), f)
		}
	}
}
