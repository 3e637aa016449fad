package cli

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/memplan/memplan/engine"
	"github.com/memplan/memplan/workload"
)

// applyWorkload makes s the job of a workload file, the same file
// memplan_torch measures, through workload.Spec, the path validate
// predicts with: prediction and measurement cannot drift apart. A flag (or
// --set switch) given explicitly that sets what the file sets and disagrees
// with it is refused, naming the file's field; what the file does not set
// (the mode among them) stays as the flags gave it, so the trace's own
// refusals apply as without --workload.
func (f *planFlags) applyWorkload(s *engine.Spec) error {
	w, err := workload.Load(f.workloadPath)
	if err != nil {
		return err
	}
	ws, err := w.Spec(s.Trace, *s)
	if err != nil {
		return fmt.Errorf("%s: %w", f.workloadPath, err)
	}
	seq, seqField := 0, "no seq_len"
	if w.SeqLen != nil {
		seq, seqField = *w.SeqLen, fmt.Sprintf("seq_len: %d", *w.SeqLen)
	}
	foreach := "null"
	if w.Foreach != nil {
		foreach = strconv.FormatBool(*w.Foreach)
	}
	hold, holdSet := f.setValue("loop.hold-outputs")
	for _, c := range []struct {
		given       bool
		flag, field string
		same        bool
	}{
		{f.changed("micro-batch"), "--micro-batch", fmt.Sprintf("batch: %d, strategy.accumulation: %d", w.Batch, w.Strategy.Accumulation), f.microBatch == ws.MicroBatch},
		{f.changed("accum"), "--accum", fmt.Sprintf("strategy.accumulation: %d", w.Strategy.Accumulation), f.accum == ws.Accum},
		{f.changed("seq"), "--seq", seqField, f.seq == seq},
		{f.changed("optimizer"), "--optimizer", "optimizer: " + w.Optimizer, s.Optimizer == ws.Optimizer},
		{f.changed("optimizer-impl"), "--optimizer-impl", "foreach: " + foreach, s.Impl == ws.Impl},
		{f.changed("checkpoint"), "--checkpoint", fmt.Sprintf("strategy.checkpoint: %s", w.Strategy.Checkpoint), s.Checkpoint == ws.Checkpoint},
		{f.changed("offload"), "--offload", fmt.Sprintf("strategy.offload: %s", w.Strategy.Offload), s.Offload.Activations == ws.Offload.Activations},
		{f.changed("kernels"), "--kernels", fmt.Sprintf("device: %s", w.Device), s.Device == ws.Device},
		{holdSet, "--set loop.hold-outputs=" + hold, "hold_outputs: " + w.HoldOutputs, s.Sem.Hold == ws.Sem.Hold},
	} {
		if c.given && !c.same {
			return fmt.Errorf("%s disagrees with %s (%s); drop the flag or edit the workload", c.flag, f.workloadPath, c.field)
		}
	}
	*s = ws
	return nil
}

// setValue is the value the last --set of key gives, and whether one does
// (spaces around key and value trimmed, as recipe.Set reads them).
func (f *planFlags) setValue(key string) (string, bool) {
	for i := len(f.sets) - 1; i >= 0; i-- {
		if k, v, ok := strings.Cut(f.sets[i], "="); ok && strings.TrimSpace(k) == key {
			return strings.TrimSpace(v), true
		}
	}
	return "", false
}
