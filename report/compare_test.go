package report

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/memplan/memplan/engine"
	"github.com/memplan/memplan/hw"
	"github.com/memplan/memplan/lower"
	"github.com/memplan/memplan/models"
	"github.com/memplan/memplan/ops"
)

// compare reads each row into the report and compacts its plan before the
// next is planned (cli's compare): the JSON and the text must be what the
// whole rows give, baseline included, although the baseline is compacted
// first and read again for every later row.
func TestCompareRowByRowEqualsWholeRows(t *testing.T) {
	for _, tc := range []struct {
		model, gpu string
		dp         int
		allow      engine.Allow
	}{
		{"gpt2", "t4", 1, engine.Allow{}},
		{"llama-3.2-1b", "rtx-4090", 4, engine.Allow{LoRA: true, EightBit: true}},
		{"mixtral-8x7b", "", 1, engine.Allow{}},
	} {
		a, err := models.Lookup(tc.model)
		if err != nil {
			t.Fatal(err)
		}
		a = a.Clone()
		a.Layers = 2
		s := engine.Spec{Job: engine.Job{Model: a, MicroBatch: 4, Seq: 256, Precision: ops.FP32, Optimizer: lower.AdamW}}
		s.FirstStep = true
		s.DP = tc.dp
		if tc.gpu != "" {
			if s.GPU, err = hw.Lookup(tc.gpu); err != nil {
				t.Fatal(err)
			}
		}
		rows, err := engine.Compare(s, tc.allow)
		if err != nil {
			t.Fatal(err)
		}
		wholeFull, wholeText := NewCompare(true), NewCompare(false)
		for _, r := range rows {
			wholeFull.Add(r)
			wholeText.Add(r)
		}
		var wantText bytes.Buffer
		if err := wholeText.WriteText(&wantText); err != nil {
			t.Fatal(err)
		}
		want, _ := json.Marshal(wholeFull.JSON())

		full, text := NewCompare(true), NewCompare(false)
		err = engine.CompareEach(s, tc.allow, func(r engine.Row) error {
			full.Add(r)
			text.Add(r)
			r.Result.Compact()
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		got, _ := json.Marshal(full.JSON())
		if !bytes.Equal(got, want) {
			t.Errorf("%s: row by row, the JSON differs from the whole rows'", tc.model)
		}
		var gotText bytes.Buffer
		if err := text.WriteText(&gotText); err != nil {
			t.Fatal(err)
		}
		if gotText.String() != wantText.String() {
			t.Errorf("%s: row by row, the text\n%s\nwhole rows\n%s", tc.model, gotText.String(), wantText.String())
		}
	}
}
