package torchtrace

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/memplan/memplan/lower"
)

// hold.trace.json (python/tests/hold_builders.py wide_head, exported on
// torch 1.13 at batch 4): logits [batch, 2048] float32 that cross_entropy
// does not save. The want values are memplan_torch.replay's (hold=...) at
// batch 64, which python/tests/test_hold_outputs.py checks against the CPU
// tracker for each habit; the logits are 524,288 bytes there.
func TestHoldOutputs(t *testing.T) {
	tr, err := Load(filepath.Join(testdata, "hold.trace.json"))
	if err != nil {
		t.Fatal(err)
	}
	if mo := tr.ModelOutput; mo == nil || len(mo.Storages) != 1 || mo.ReturnedAt != 4 {
		t.Fatalf("model_output = %+v", tr.ModelOutput)
	}
	for _, c := range []struct {
		hold          lower.Hold
		steady, first map[string]int64
	}{
		{lower.HoldNone, map[string]int64{"forward": 4368408, "backward": 4933656, "optimizer": 6474768}, map[string]int64{"forward": 2188296, "backward": 2753544, "optimizer": 6474768}},
		{lower.HoldBackward, map[string]int64{"forward": 4368408, "backward": 5457944, "optimizer": 6474768}, map[string]int64{"forward": 2188296, "backward": 3277832, "optimizer": 6474768}},
		{lower.HoldNextForward, map[string]int64{"forward": 4368408, "backward": 5457944, "optimizer": 6999056}, map[string]int64{"forward": 2188296, "backward": 3277832, "optimizer": 6999056}},
	} {
		for _, first := range []bool{false, true} {
			want := c.steady
			if first {
				want = c.first
			}
			p, err := tr.Program(Options{Batch: 64, FirstStep: first, Hold: c.hold})
			if err != nil {
				t.Fatal(err)
			}
			got := phasePeaks(t, p)
			for ph, w := range want {
				if got[ph] != w {
					t.Errorf("hold %d first=%v %s: Go %d, Python %d (%+d)", c.hold, first, ph, got[ph], w, got[ph]-w)
				}
			}
		}
	}
	// With accumulation each micro-step's output is held until the next
	// micro-step's model returns, the last one's through the optimizer step.
	for _, h := range []lower.Hold{lower.HoldBackward, lower.HoldNextForward} {
		p, err := tr.Program(Options{Batch: 16, Accum: 3, Hold: h})
		if err != nil {
			t.Fatal(err)
		}
		phasePeaks(t, p)
	}
}

func TestHoldNeedsModelOutput(t *testing.T) {
	tr, err := Load(filepath.Join(testdata, "lm.trace.json")) // exported before model_output
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tr.Program(Options{Hold: lower.HoldBackward}); !errors.Is(err, ErrOptions) || !strings.Contains(err.Error(), "model_output") {
		t.Fatalf("got %v, want an options error naming model_output", err)
	}
	if _, err := tr.Program(Options{}); err != nil {
		t.Fatal(err)
	}
}

func TestModelOutputBadInput(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(testdata, "hold.trace.json"))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ old, new, want string }{
		{`"returned_at":4`, `"returned_at":99`, "model_output.returned_at: 99 is not the index of a forward event"},
		{`"returned_at":4`, `"returned_at":-2`, "model_output.returned_at: -2 is not the index of a forward event"},
		{`"returned_at":4`, `"returned_at":70`, "model_output.returned_at: 70 is not the index of a forward event"},
		{`"returned_at":4`, `"returned_at":3`, "model_output.storages[0]: storage 20 is not allocated by the forward before event 3"},
		{`"returned_at":4`, `"returned_at":"4"`, `model_output.returned_at: must be an integer, got a string`},
		{`"storages":[`, `"storages":[0,`, "model_output.storages[0]: storage 0 is not allocated by the forward before event 4"},
		{`"model_output":{`, `"model_output":{"hold":"always",`, `model_output.hold: unknown hold "always" (want none, backward or next-forward)`},
		{`"model_output":{`, `"model_output":{"hold":1,`, "model_output.hold: must be a string, got the number 1"},
		{`"model_output":{"storages":[`, `"model_output":{"storages":7,"x":[`, "model_output.storages: must be a list, got the number 7"},
	} {
		s := string(data)
		if !strings.Contains(s, c.old) {
			t.Fatalf("fixture lacks %q", c.old)
		}
		_, err := ParseNamed("hold.trace.json", []byte(strings.Replace(s, c.old, c.new, 1)))
		if err == nil || err.Error() != "hold.trace.json: "+c.want {
			t.Errorf("%s -> %s: got %v, want %q", c.old, c.new, err, c.want)
		}
	}
}
