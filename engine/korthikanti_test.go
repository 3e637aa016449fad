package engine

import (
	"math"
	"testing"

	"github.com/memplan/memplan/lower"
	"github.com/memplan/memplan/models/build"
	"github.com/memplan/memplan/ops"
)

// Korthikanti et al., "Reducing Activation Recomputation in Large Transformer
// Models", MLSys 2023, Table 2: the selective-recompute rows (recompute only
// the attention core, QKᵀ → softmax → dropout → ×V) and full recompute,
// through the whole engine. The no-parallelism row is
// TestKorthikantiTable2PerLayer; the tensor(+sequence)-parallel rows are in
// models/build/parallel_test.go.
func TestKorthikantiTable2Recompute(t *testing.T) {
	for _, tc := range []struct{ s, h, a, t int }{
		{1024, 1024, 16, 2}, {2048, 2048, 32, 4}, {1024, 1536, 16, 8},
	} {
		s, b, h, tt := float64(tc.s), 1.0, float64(tc.h), float64(tc.t)
		for _, row := range []struct {
			name string
			sp   bool
			ck   CheckpointPolicy
			want float64
		}{
			{"tensor parallel + selective recompute", false, CheckpointPolicy{Kind: CheckpointSelective}, s * b * h * (10 + 24/tt)},
			{"tensor + sequence parallel + selective recompute", true, CheckpointPolicy{Kind: CheckpointSelective}, 34 * s * b * h / tt},
			{"full recompute", false, CheckpointPolicy{Kind: CheckpointFull}, 2 * s * b * h},
		} {
			arch := gpt2Style(t, tc.s, tc.h, tc.a)
			tp := tc.t
			if row.ck.Kind == CheckpointFull {
				tp = 1
			}
			r := mustPlan(t, Spec{Job: Job{Model: arch, MicroBatch: 1, Seq: tc.s, Precision: ops.FP16, Attention: build.Eager, Optimizer: lower.AdamW}, Parallel: Parallel{TP: tp, SP: row.sp}, Savings: Savings{Checkpoint: row.ck}})
			got := float64(r.Sim.SavedByModule["transformer.h.1"])
			if rel := math.Abs(got-row.want) / row.want; rel > 0.02 {
				t.Errorf("%s, s=%d h=%d a=%d t=%d: %.0f bytes per layer, Table 2 gives %.0f (%.2f%% off)", row.name, tc.s, tc.h, tc.a, tp, got, row.want, 100*rel)
			} else {
				t.Logf("%s, s=%d h=%d t=%d: %+.3f%%", row.name, tc.s, tc.h, tp, 100*(got-row.want)/row.want)
			}
		}
	}
}
