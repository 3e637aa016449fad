package cli

import (
	"fmt"

	"github.com/memplan/memplan/engine"
	"github.com/memplan/memplan/workload"
)

// applyWorkload makes s the job of a workload file, the same file
// memplan_torch measures, through workload.Spec, the path validate
// predicts with: prediction and measurement cannot drift apart. A flag
// given explicitly that disagrees with the file is refused.
func (f *planFlags) applyWorkload(s *engine.Spec) error {
	w, err := workload.Load(f.workloadPath)
	if err != nil {
		return err
	}
	ws, err := w.Spec(s.Trace, *s)
	if err != nil {
		return fmt.Errorf("%s: %w", f.workloadPath, err)
	}
	seq := 0
	if w.SeqLen != nil {
		seq = *w.SeqLen
	}
	for _, c := range []struct {
		flag string
		same bool
	}{
		{"micro-batch", f.microBatch == ws.MicroBatch}, {"accum", f.accum == ws.Accum}, {"seq", f.seq == seq},
		{"optimizer", s.Optimizer == ws.Optimizer}, {"optimizer-impl", s.Impl == ws.Impl},
		{"checkpoint", s.Checkpoint == ws.Checkpoint}, {"offload", s.Offload.Activations == ws.Offload.Activations},
		{"kernels", s.Device == ws.Device},
	} {
		if f.changed(c.flag) && !c.same {
			return fmt.Errorf("--%s disagrees with %s; drop the flag or edit the workload", c.flag, f.workloadPath)
		}
	}
	*s = ws
	return nil
}
