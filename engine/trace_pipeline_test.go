package engine

import (
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/memplan/memplan/importer/torchtrace"
	"github.com/memplan/memplan/ir"
	"github.com/memplan/memplan/units"
)

// traceBlocks is the number of repeated block modules of each committed
// trace, counted from its forward events' module paths by hand
// (python3: the distinct prefixes up to the first list index or
// <name>_<index> component): lm's layers.0-3, gpt2_tiny's and
// gpt2_2l_tied's (and gpt2_tiny_flops') transformer.h.0-1, resnet18's layer1.0 … layer4.1, mobilenet_v2's
// features.0-18 and classifier.0-1, vit_tiny's
// encoder.layers.encoder_layer_0-3, the nn.Sequential children 0-2 of hold
// and replace_state; gru (embed, gru, head) and three_events have none.
var traceBlocks = map[string]int{
	"gpt2_2l_tied": 2, "gpt2_tiny": 2, "gpt2_tiny_flops": 2, "gru": 0, "hold": 3, "lm": 4, "lm_sgd": 4, "mobilenet_v2": 21,
	"replace_state": 3, "resnet18": 8, "three_events": 0, "vit_tiny": 4,
}

func loadTrace(t testing.TB, name string) *torchtrace.Trace {
	t.Helper()
	tr, err := torchtrace.Load(filepath.Join(catalogTestdata, name+".trace.json"))
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

// paramBytes is the bytes of p's parameters by name (a trace names each
// "parameter#<storage id>", the same on every stage).
func paramBytes(p *ir.Program) map[string]units.Bytes {
	m := map[string]units.Bytes{}
	for _, id := range p.Params {
		m[p.Tensors[id].Name] = p.Tensors[id].Bytes
	}
	return m
}

// Every committed trace under --pp 1, 2 and 4 either plans, every stage
// holding its own parameters (together the whole trace's: a parameter two
// stages read, a tied embedding, is on both, as in Megatron, and counted
// once), or is refused about --pp because it has fewer blocks than stages.
func TestTracePipelineStages(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(catalogTestdata, "*.trace.json"))
	if err != nil || len(files) != len(traceBlocks) {
		t.Fatalf("%d traces in %s (%v), the table has %d: count the new one's blocks", len(files), catalogTestdata, err, len(traceBlocks))
	}
	for _, f := range files {
		name := strings.TrimSuffix(filepath.Base(f), ".trace.json")
		blocks, ok := traceBlocks[name]
		if !ok {
			t.Fatalf("%s is not in traceBlocks", name)
		}
		tr := loadTrace(t, name)
		whole := tracePipelineParams(t, tr, 1)
		for _, pp := range []int{2, 4} {
			s := Spec{Job: Job{Trace: tr, Accum: 4}, Parallel: Parallel{PP: pp}}
			if blocks < pp {
				_, err := Plan(s)
				var fe *FieldError
				if !errors.As(err, &fe) || fe.Field != FieldPP || !strings.Contains(fe.Msg, "{pp}") || strings.Contains(err.Error(), "\n") {
					t.Errorf("%s --pp %d (%d blocks): got %v, want a one-line refusal about {pp}", name, pp, blocks, err)
				}
				continue
			}
			got := tracePipelineParams(t, tr, pp)
			for n, b := range whole {
				if got[n] != b {
					t.Errorf("%s --pp %d: parameter %s is %d bytes on its stages, %d in the trace", name, pp, n, got[n], b)
				}
			}
			if len(got) != len(whole) {
				t.Errorf("%s --pp %d: %d parameters on the stages, %d in the trace", name, pp, len(got), len(whole))
			}
		}
	}
}

// tracePipelineParams plans every stage of tr under --pp pp on its own,
// checks each has parameters and a peak, and returns the parameters of all
// stages (each name once) after checking that a parameter on several
// stages is one several of them read.
func tracePipelineParams(t *testing.T, tr *torchtrace.Trace, pp int) map[string]units.Bytes {
	t.Helper()
	all, stages := map[string]units.Bytes{}, map[string]int{}
	var sum, once units.Bytes
	for st := 0; st < pp; st++ {
		res, err := PlanWith(Spec{Job: Job{Trace: tr, Accum: 4}, Parallel: Parallel{PP: pp}}, Options{Stages: []int{st}})
		if err != nil {
			t.Fatalf("%s --pp %d stage %d: %v", tr.Name, pp, st, err)
		}
		ps := paramBytes(res.Program)
		if len(ps) == 0 || res.Sim.Peak.Total <= 0 {
			t.Errorf("%s --pp %d stage %d: %d parameters, peak %d", tr.Name, pp, st, len(ps), res.Sim.Peak.Total)
		}
		for n, b := range ps {
			sum += b
			if _, seen := all[n]; !seen {
				once += b
			}
			all[n] = b
			stages[n]++
		}
	}
	shared := sharedParams(tr)
	for n, k := range stages {
		if k > 1 && !shared[n] {
			t.Errorf("%s --pp %d: %s is on %d stages, but only one part of the model reads it", tr.Name, pp, n, k)
		}
	}
	if pp > 1 {
		t.Logf("%s --pp %d: stages hold %d parameter bytes, %d once each (%d parameters shared by parts of the model)", tr.Name, pp, sum, once, len(shared))
	}
	return all
}

// sharedParams are the parameters ("parameter#<storage id>") of tr that
// forward events of several parts of the model read (parts: blocks, and
// modules outside them), such as a tied input and output embedding.
func sharedParams(tr *torchtrace.Trace) map[string]bool {
	param := map[int]bool{}
	for i := range tr.Initial {
		if s := &tr.Initial[i]; s.Category == torchtrace.CatParameter && !s.Buffer {
			param[s.ID] = true
		}
	}
	owner := map[int]string{}
	shared := map[string]bool{}
	for i := range tr.Events {
		e := &tr.Events[i]
		if e.Phase != torchtrace.PhaseForward {
			continue
		}
		part := e.Module
		if b := traceBlockPrefix(e.Module); b != "" {
			part = b
		}
		for _, id := range e.Inputs {
			if o, seen := owner[id]; param[id] && seen && o != part {
				shared[fmt.Sprintf("parameter#%d", id)] = true
			} else if param[id] && !seen {
				owner[id] = part
			}
		}
	}
	return shared
}

// traceBlockPrefix is the path of module up to its first list index or
// <name>_<index> component ("" when it has none).
func traceBlockPrefix(module string) string {
	parts := strings.Split(module, ".")
	for i, c := range parts {
		u := strings.LastIndexByte(c, '_')
		if isDigits(c) || (u > 0 && isDigits(c[u+1:])) {
			return strings.Join(parts[:i+1], ".")
		}
	}
	return ""
}

func isDigits(s string) bool {
	_, err := strconv.Atoi(s)
	return err == nil && !strings.ContainsAny(s, "+-")
}

// Under 1F1B the first of p stages holds p micro-batches' activations in
// flight at its peak, the last one (Narayanan et al. SC'21 §2.2; the
// catalog path's strategy.TestPipelineInFlightActivations): on lm, cut
// after layers.1, stage 0's activation peak is twice what one micro-step
// of its own saves, the last stage's once; the layer output crossing the
// cut is sent at its size.
func TestTracePipelineInFlight(t *testing.T) {
	tr := loadTrace(t, "lm")
	const pp, m = 2, 4
	var inFlight [pp]float64
	for st := 0; st < pp; st++ {
		res, err := PlanWith(Spec{Job: Job{Trace: tr, Accum: m}, Parallel: Parallel{PP: pp}}, Options{Stages: []int{st}})
		if err != nil {
			t.Fatal(err)
		}
		var peak units.Bytes
		for _, pt := range res.Sim.Timeline {
			peak = max(peak, pt.Cat[ir.Activation])
		}
		inFlight[st] = float64(peak) / float64(res.Sim.SavedTotal)
		t.Logf("stage %d: activation peak %s = %.3f× one micro-step's saved %s", st, peak, inFlight[st], res.Sim.SavedTotal)
	}
	// What crosses the cut after layers.1 is its output, one [batch, seq,
	// d_model] fp32 tensor per micro-step each way (the activation forward,
	// its gradient backward): lm was traced at batch 2, seq 64, and its
	// embed.weight is [1000, 64], so 2·64·64·4 bytes.
	const hidden = 2 * 64 * 64 * 4
	for st, want := range map[int][2]string{0: {"pp.send_forward", "pp.recv_backward"}, 1: {"pp.recv_forward", "pp.send_backward"}} {
		res, err := PlanWith(Spec{Job: Job{Trace: tr, Accum: m}, Parallel: Parallel{PP: pp}}, Options{Stages: []int{st}})
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range want {
			var most units.Bytes
			for _, op := range res.Program.Ops {
				if op.Name == name && op.Micro == 0 {
					most = max(most, op.Comm.Bytes)
				}
			}
			if most != hidden {
				t.Errorf("stage %d: largest %s of micro-step 0 moves %d bytes, want %d", st, name, most, hidden)
			}
		}
	}
	if inFlight[0] <= inFlight[1] {
		t.Errorf("first stage holds %.3f micro-batches in flight, the last %.3f: want more on the first", inFlight[0], inFlight[1])
	}
	if math.Abs(inFlight[0]-pp)/pp > 0.02 {
		t.Errorf("first stage holds %.3f micro-batches in flight, want %d", inFlight[0], pp)
	}
}

// --pp with --dp and --zero on a v2 trace (gpt2_tiny, whose tied embedding
// has a gradient on each stage, strategy.UntieTraceGrads): each stage
// shards its own model state over the data-parallel ranks, within a fp32
// element of rounding per tensor: ZeRO-1 and up the optimizer state,
// ZeRO-2 and up the gradients at the step; and
// ZeRO-1's peak is not above ZeRO-0's. (ZeRO-2's and ZeRO-3's buckets and
// gathers may outgrow what they shard on a model this small: 0.5 MB a
// stage, 28 KB over ZeRO-1 on the last.)
func TestTracePipelineDataParallel(t *testing.T) {
	tr := loadTrace(t, "gpt2_tiny")
	const pp, dp = 2, 2
	for st := 0; st < pp; st++ {
		var grad1, opt0, peak0 units.Bytes
		for z := 0; z <= 3; z++ {
			s := Spec{Job: Job{Trace: tr, Accum: 2, Count: Counter{Measured: true}}, Parallel: Parallel{PP: pp, Sharding: Sharding{DP: dp, ZeRO: z}}}
			res, err := PlanWith(s, Options{Stages: []int{st}})
			if err != nil {
				t.Fatalf("stage %d zero %d: %v", st, z, err)
			}
			k := firstOptimizerOp(res.Program)
			par, grad, opt := statesAt(res.Program, k)
			t.Logf("stage %d ZeRO-%d: peak %s; at the optimizer step parameters %s gradients %s optimizer state %s", st, z, res.Sim.Peak.Total, par, grad, opt)
			slack := units.Bytes(4 * len(res.Program.Params))
			sharded := func(what string, got, whole units.Bytes) {
				if got < whole/dp || got > whole/dp+slack {
					t.Errorf("stage %d ZeRO-%d: %s %d, want %d/%d", st, z, what, got, whole, dp)
				}
			}
			switch z {
			case 0:
				opt0, peak0 = opt, res.Sim.Peak.Total
			case 1:
				grad1 = grad // ZeRO-0's DDP holds its buckets beside the gradients
				sharded("optimizer state", opt, opt0)
				if res.Sim.Peak.Total > peak0 {
					t.Errorf("stage %d ZeRO-1: peak %d above ZeRO-0's %d", st, res.Sim.Peak.Total, peak0)
				}
			default:
				sharded("optimizer state", opt, opt0)
				sharded("gradients", grad, grad1)
			}
		}
	}
}

func firstOptimizerOp(p *ir.Program) int {
	for i := range p.Ops {
		if p.Ops[i].Phase == ir.Optimizer {
			return i
		}
	}
	return len(p.Ops)
}
