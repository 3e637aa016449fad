package report

import (
	"regexp"
	"strings"
	"testing"

	"github.com/memplan/memplan/engine"
	"github.com/memplan/memplan/hw"
	"github.com/memplan/memplan/lower"
	"github.com/memplan/memplan/models"
	"github.com/memplan/memplan/ops"
)

// TestPeakLineMicroStep: the text's peak line names the micro-step of a
// peak in forward or backward, and says a peak in the optimizer comes
// after the last micro-step. Found by issue 15's sweep (cmd/memplan
// TestSweep): plan --model gpt2 --gpu rtx-4090 --seq 1 --accum 2 said "in
// optimizer at _foreach_sqrt(exp_avg_sqs), op 1740 of 1742, micro-step 1 of
// 2": the optimizer's ops carry micro-step 0.
func TestPeakLineMicroStep(t *testing.T) {
	a, err := models.Lookup("gpt2")
	if err != nil {
		t.Fatal(err)
	}
	gpu, err := hw.Lookup("rtx-4090")
	if err != nil {
		t.Fatal(err)
	}
	peakLine := regexp.MustCompile(`(?m)^Peak .*$`)
	for _, c := range []struct {
		seq, accum int
		want       string
	}{
		{1, 2, `in optimizer at _foreach_sqrt\(exp_avg_sqs\), op \d+ of \d+ \(op_index \d+\), after the last of 2 micro-steps$`},
		{1, 9, `in optimizer at _foreach_sqrt\(exp_avg_sqs\), op \d+ of \d+ \(op_index \d+\), after the last of 9 micro-steps$`},
		{1024, 2, `in backward at log_softmax_backward \(loss\), op \d+ of \d+ \(op_index \d+\), micro-step 2 of 2$`},
	} {
		res, err := engine.Plan(engine.Spec{Job: engine.Job{Model: a, MicroBatch: 1, Seq: c.seq, Accum: c.accum, Precision: ops.AMPBF16,
			Optimizer: lower.AdamW}, Target: engine.Target{GPU: gpu}})
		if err != nil {
			t.Fatal(err)
		}
		var b strings.Builder
		if err := WriteText(&b, res, TextOptions{}); err != nil {
			t.Fatal(err)
		}
		if line := peakLine.FindString(b.String()); !regexp.MustCompile(c.want).MatchString(line) {
			t.Errorf("seq %d accum %d: %q, want it to end as %s", c.seq, c.accum, line, c.want)
		}
	}
}
