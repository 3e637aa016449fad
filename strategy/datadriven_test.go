package strategy_test

import (
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"

	"github.com/memplan/memplan/ir"
	"github.com/memplan/memplan/lower"
	"github.com/memplan/memplan/models"
	"github.com/memplan/memplan/models/build"
	"github.com/memplan/memplan/ops"
	"github.com/memplan/memplan/sim"
	"github.com/memplan/memplan/strategy"
)

// TestTransforms runs the scripts in testdata/transforms, as raft and pebble test their state machines: a
// reviewer reads the rewrite itself, not a total that moved.
//
//	build [layers=2] [accum=1] [optimizer=adamw] [impl=foreach] [precision=fp32] [seq=4] [copies=summed]
//	    lowers a tiny gpt2-style model (hidden 8, 2 heads, vocabulary 16, no dropout) into a training
//	    program and prints its size and its peak by category. Its embedding is tied to its head:
//	    copies=summed sums their gradients as autograd does on one GPU, copies=separate keeps them
//	    apart, one copy per pipeline stage (lower.TrainConfig.SeparateCopies), as pipeline needs.
//	apply TRANSFORM [key=value ...]
//	    applies one transform to the current program through strategy.Chain (which verifies it) and prints
//	    every op of the result that the input did not have as it is (name, phase and micro-step, module,
//	    inputs, outputs with their category), then the peak by category; the result becomes the current
//	    program. TRANSFORM is checkpoint (patterns=a,b), pipeline (stages, stage, schedule, interleave),
//	    zero (stage, dp, prefetch, bucket), fsdp (dp), ddp (dp), offload-activations, offload-optimizer,
//	    offload-params or autocast-cache.
//
// Regenerate with `go test ./strategy -run TestTransforms -rewrite` and read the diff before committing it.
func TestTransforms(t *testing.T) {
	datadriven.Walk(t, "testdata/transforms", func(t *testing.T, path string) {
		var cur *ir.Program
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			switch d.Cmd {
			case "build":
				p, err := ddBuild(d)
				if err != nil {
					return "error: " + err.Error() + "\n"
				}
				cur = p
				return fmt.Sprintf("%d ops, %d tensors\n", len(p.Ops), len(p.Tensors)) + ddPeak(p)
			case "apply":
				if cur == nil {
					d.Fatalf(t, "apply before build")
				}
				tr, err := ddTransform(d)
				if err != nil {
					return "error: " + err.Error() + "\n"
				}
				q, err := strategy.Chain(cur, tr)
				if err != nil {
					return "error: " + err.Error() + "\n"
				}
				out := ddWritten(cur, q) + ddPeak(q)
				cur = q
				return out
			}
			d.Fatalf(t, "unknown command %q", d.Cmd)
			return ""
		})
	})
}

// ddArgs returns the command's key=value arguments and its first bare argument.
func ddArgs(d *datadriven.TestData) (map[string]string, string) {
	kv := map[string]string{}
	bare := ""
	for _, a := range d.CmdArgs {
		if len(a.Vals) == 0 {
			if bare == "" {
				bare = a.Key
			}
			continue
		}
		kv[a.Key] = strings.Join(a.Vals, ",")
	}
	return kv, bare
}

func ddInt(kv map[string]string, key string, def int) (int, error) {
	v, ok := kv[key]
	if !ok {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		return 0, fmt.Errorf("%s=%q is not an integer", key, v)
	}
	return n, nil
}

func ddBuild(d *datadriven.TestData) (*ir.Program, error) {
	kv, _ := ddArgs(d)
	layers, err := ddInt(kv, "layers", 2)
	if err != nil {
		return nil, err
	}
	accum, err := ddInt(kv, "accum", 1)
	if err != nil {
		return nil, err
	}
	seq, err := ddInt(kv, "seq", 4)
	if err != nil {
		return nil, err
	}
	opt, impl, prec := lower.AdamW, lower.Foreach, ops.FP32
	if v, ok := kv["optimizer"]; ok {
		if opt, err = lower.ParseOptimizer(v); err != nil {
			return nil, err
		}
	}
	if v, ok := kv["impl"]; ok {
		if impl, err = lower.ParseImpl(v); err != nil {
			return nil, err
		}
	}
	if v, ok := kv["precision"]; ok {
		if prec, err = ops.ParsePrecision(v); err != nil {
			return nil, err
		}
	}
	a, err := models.Lookup("gpt2")
	if err != nil {
		return nil, err
	}
	a = a.Clone()
	a.Hidden, a.Heads, a.KVHeads, a.HeadDim, a.Intermediate, a.Vocab = 8, 2, 2, 4, 32, 16
	a.MaxPositions, a.Layers = 16, layers
	a.AttnDropout, a.HiddenDropout, a.EmbdDropout = 0, 0, 0
	if err := a.Validate(); err != nil {
		return nil, err
	}
	g, err := build.Graph(a, build.Options{MicroBatch: 1, Seq: seq, Precision: prec, Training: true})
	if err != nil {
		return nil, err
	}
	separate := false
	switch v := kv["copies"]; v {
	case "", "summed":
	case "separate":
		separate = true
	default:
		return nil, fmt.Errorf("copies=%q: want summed or separate", v)
	}
	return lower.Train(g, lower.TrainConfig{Optimizer: opt, Impl: impl, Precision: prec, Accum: accum, WeightDecay: -1, SeparateCopies: separate})
}

func ddTransform(d *datadriven.TestData) (strategy.Transform, error) {
	kv, name := ddArgs(d)
	ints := map[string]int{}
	for _, k := range []string{"stages", "stage", "interleave", "dp", "prefetch", "bucket"} {
		n, err := ddInt(kv, k, 0)
		if err != nil {
			return nil, err
		}
		ints[k] = n
	}
	switch name {
	case "checkpoint":
		return &strategy.Checkpoint{Patterns: strings.Split(kv["patterns"], ",")}, nil
	case "pipeline":
		sched, err := strategy.ParseSchedule(kv["schedule"])
		if err != nil {
			return nil, err
		}
		return &strategy.Pipeline{Stages: ints["stages"], Stage: ints["stage"], Schedule: sched, Interleave: ints["interleave"]}, nil
	case "zero":
		return &strategy.ZeRO{Stage: ints["stage"], DP: ints["dp"], Prefetch: ints["prefetch"], BucketElems: int64(ints["bucket"])}, nil
	case "fsdp":
		return &strategy.FSDP{DP: ints["dp"]}, nil
	case "ddp":
		return &strategy.DDP{DP: ints["dp"]}, nil
	case "offload-activations":
		return &strategy.ActivationOffload{}, nil
	case "offload-optimizer":
		return &strategy.OptimizerOffload{}, nil
	case "offload-params":
		return &strategy.ParamOffload{}, nil
	case "autocast-cache":
		return &strategy.AutocastCache{}, nil
	}
	return nil, fmt.Errorf("unknown transform %q", name)
}

// ddKey identifies an op by what a reader sees: tensor names, not ids (a transform renumbers tensors).
func ddKey(p *ir.Program, op *ir.Op) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s|%s|%s|%d|%v|", op.Name, op.Module, op.Phase, op.Micro, op.Recompute)
	for _, t := range op.In {
		b.WriteString(p.Tensors[t].Name + ",")
	}
	b.WriteByte('|')
	for _, t := range op.Out {
		b.WriteString(p.Tensors[t].Name + ",")
	}
	return b.String()
}

// ddWritten prints the ops of q that p does not have (as a multiset), in q's order.
func ddWritten(p, q *ir.Program) string {
	have := map[string]int{}
	for i := range p.Ops {
		have[ddKey(p, &p.Ops[i])]++
	}
	var b strings.Builder
	kept := 0
	var lines []string
	for i := range q.Ops {
		op := &q.Ops[i]
		if k := ddKey(q, op); have[k] > 0 {
			have[k]--
			kept++
			continue
		}
		lines = append(lines, ddOp(q, i))
	}
	fmt.Fprintf(&b, "wrote %d ops; kept %d of the input's %d unchanged\n", len(lines), kept, len(p.Ops))
	for _, l := range lines {
		b.WriteString(l)
	}
	return b.String()
}

// ddOp prints one op: index, phase/micro-step, name, module, inputs, outputs (with category; "host" when on
// the host), and its collective or copy.
func ddOp(q *ir.Program, i int) string {
	op := &q.Ops[i]
	var b strings.Builder
	fmt.Fprintf(&b, "%3d %s/%d ", i, op.Phase, op.Micro)
	if op.Recompute {
		b.WriteString("recompute ")
	}
	b.WriteString(op.Name)
	if op.Module != "" {
		fmt.Fprintf(&b, " [%s]", op.Module)
	}
	names := func(ts []ir.TensorID, cat bool) string {
		var s []string
		for _, t := range ts {
			tt := &q.Tensors[t]
			n := tt.Name
			if cat && tt.Base == ir.NoTensor {
				n += ":" + tt.Cat.String()
				if tt.Host {
					n += ":host"
				}
			}
			s = append(s, n)
		}
		return strings.Join(s, " ")
	}
	if len(op.In) > 0 {
		fmt.Fprintf(&b, " in(%s)", names(op.In, false))
	}
	if len(op.Out) > 0 {
		fmt.Fprintf(&b, " out(%s)", names(op.Out, true))
	}
	if c := op.Comm; c != nil {
		fmt.Fprintf(&b, " %v %s×%d %dB", c.Kind, c.Group, c.Ranks, int64(c.Bytes))
	}
	if tr := op.Transfer; tr != nil {
		dir := "to device"
		if tr.ToHost {
			dir = "to host"
		}
		fmt.Fprintf(&b, " copy %s %dB", dir, int64(tr.Bytes))
	}
	b.WriteByte('\n')
	return b.String()
}

// ddPeak prints the device peak by category and the host peak.
func ddPeak(p *ir.Program) string {
	r, err := sim.Run(p)
	if err != nil {
		return "error: " + err.Error() + "\n"
	}
	var b strings.Builder
	op := &p.Ops[r.Peak.Op]
	fmt.Fprintf(&b, "peak %d at %d %s/%d %s:", int64(r.Peak.Total), r.Peak.Op, r.Peak.Phase, r.Peak.Micro, op.Name)
	for c := ir.Category(0); c < ir.NumCategories; c++ {
		if v := r.Peak.Cat[c]; v != 0 {
			fmt.Fprintf(&b, " %s %d", c, int64(v))
		}
	}
	fmt.Fprintf(&b, "; host %d\n", int64(r.HostPeak))
	return b.String()
}
