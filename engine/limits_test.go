package engine

import (
	"errors"
	"strings"
	"testing"

	"github.com/memplan/memplan/hw"
	"github.com/memplan/memplan/importer/torchtrace"
	"github.com/memplan/memplan/models/build"
	"github.com/memplan/memplan/strategy"
)

// Every limit is refused in one line naming its field, before anything
// large is built; each case here wrapped an int64 or ran out of memory
// before the limits (issue 15).
func TestLimits(t *testing.T) {
	lm, err := torchtrace.Load("../testdata/torch/lm.trace.json")
	if err != nil {
		t.Fatal(err)
	}
	// A storage of 2^50 bytes per sample (a trace's size model is read from
	// the file) at 2^20 samples.
	wide := *lm
	wide.Events = append([]torchtrace.Event(nil), lm.Events...)
	for i := range wide.Events {
		if len(wide.Events[i].Alloc) > 0 {
			ev := wide.Events[i]
			ev.Alloc = append([]torchtrace.Storage(nil), ev.Alloc...)
			ev.Alloc[0].PerBatch = 1 << 50
			wide.Events[i] = ev
			break
		}
	}
	moe := *lookup(t, "mixtral-8x7b")
	moe.Name, moe.Layers, moe.NumExperts, moe.Hidden = "mixtral-4096", 4096, 4096, 64
	// 4096 × (1 + 7) = 2^15 blocks: within MaxBlocks, but over two
	// micro-steps 2.6 GB (the adversarial sweep's moe7.json).
	moe7 := *lookup(t, "mixtral-8x7b")
	moe7.Name, moe7.Layers, moe7.NumExperts, moe7.Hidden = "moe7", 4096, 7, 64
	kimi := *lookup(t, "deepseek-v3")
	kimi.Name, kimi.NumExperts = "kimi-k2", 384
	for _, c := range []struct {
		name  string
		s     Spec
		field Field
		want  string
	}{
		{"accum", Spec{Job: Job{Model: lookup(t, "gpt2"), Accum: MaxAccum + 1}}, FieldAccum, "over the limit of 1073741824 micro-steps"},
		{"pipeline accum", Spec{Job: Job{Model: lookup(t, "gpt2"), Accum: 5000}, Parallel: Parallel{PP: 2}}, FieldAccum, "limit of 1024 micro-steps for a pipeline"},
		{"tokens", Spec{Job: Job{Model: lookup(t, "llama-3.2-1b"), MicroBatch: 1 << 20, Seq: 1 << 15}}, FieldMicroBatch, "2^34 tokens"},
		{"tokens wrap", Spec{Job: Job{Model: lookup(t, "llama-3.2-1b"), MicroBatch: 1 << 62, Seq: 1 << 10}}, FieldMicroBatch, "2^34 tokens"},
		{"gpus", Spec{Job: Job{Model: lookup(t, "gpt2")}, Parallel: Parallel{TP: 1 << 12, PP: 1 << 12, Sharding: Sharding{DP: 2}}}, FieldDP, "limit of 16777216 GPUs"},
		{"eager scores", Spec{Job: Job{Model: lookup(t, "llama-3-70b"), Seq: 1 << 30, Attention: build.Eager}}, FieldSeq, "2^58 elements"},
		{"eager total", Spec{Job: Job{Model: lookup(t, "llama-3-70b"), Seq: 1 << 25, Attention: build.Eager}}, FieldMicroBatch, "more than 4 EiB"},
		{"experts", Spec{Job: Job{Model: &moe, Seq: 128}}, FieldModel, "4096 layers × 4096 experts"},
		{"blocks × micro-steps", Spec{Job: Job{Model: &moe7, Seq: 128, Accum: 2}}, FieldModel, "32768 blocks, times the 2 micro-steps a plan holds, are over the limit of 49152"},
		{"blocks × three micro-steps", Spec{Job: Job{Model: &kimi, Seq: 128, Accum: 8}}, FieldModel, "23485 blocks, times the 3 micro-steps a plan holds"},
		// Under engine's 2^34 tokens and 2^58 elements, over the graph
		// builder's own bounds (found by TestPropertyTotalsAtTheLimits: the
		// builder's "bad options" line named no flag).
		{"graph tokens", Spec{Job: Job{Model: lookup(t, "gpt2"), MicroBatch: 1 << 22, Seq: 1 << 10}}, FieldMicroBatch, "2^31 tokens per micro-step a model's graph is built for"},
		{"graph eager scores", Spec{Job: Job{Model: lookup(t, "llama-3.2-1b"), MicroBatch: 8, Seq: 1<<24 + 2, Attention: build.Eager}}, FieldSeq, "2^56 eager attention scores"},
		{"trace micro-batch", Spec{Job: Job{Trace: lm, MicroBatch: 1 << 62}}, FieldMicroBatch, "2^34 tokens"},
		{"trace storage", Spec{Job: Job{Trace: &wide, MicroBatch: 1 << 20}}, FieldMicroBatch, "is over 4 EiB (2^62 bytes) at batch 1048576"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := Plan(c.s)
			if err == nil {
				t.Fatal("no error")
			}
			var fe *FieldError
			if !errors.As(err, &fe) || fe.Field != c.field || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") {
				t.Errorf("got %v, want one line on field %v with %q", err, c.field, c.want)
			}
		})
	}
}

// storageSize never wraps: each product and the sum are checked.
func TestStorageSizeChecked(t *testing.T) {
	for _, c := range []struct {
		st     torchtrace.Storage
		b, seq int64
		want   int64
		ok     bool
	}{
		{torchtrace.Storage{Poly: torchtrace.Poly{Const: 8, PerBatch: 4, PerBatchSeq: 2}}, 3, 5, 8 + 12 + 30, true},
		{torchtrace.Storage{Poly: torchtrace.Poly{PerBatch: 1 << 40}}, 1 << 30, 1, 0, false},
		{torchtrace.Storage{Poly: torchtrace.Poly{PerBatchSeq2: 2}}, 1 << 20, 1 << 20, 1 << 61, true},
		{torchtrace.Storage{Poly: torchtrace.Poly{PerBatchSeq2: 8}}, 1 << 20, 1 << 20, 0, false},
		{torchtrace.Storage{Poly: torchtrace.Poly{PerBatch: 1 << 61, PerSeq: 1 << 61, Const: 1 << 61}}, 1, 1, 0, false},
		{torchtrace.Storage{Poly: torchtrace.Poly{PerBatch: 1 << 61, PerSeq: -(1 << 61)}}, 1, 1, 0, true},
		{torchtrace.Storage{Poly: torchtrace.Poly{PerBatch: -1 << 63}}, 1, 1, 0, false},
	} {
		got, ok := storageSize(&c.st, c.b, c.seq)
		if got != c.want || ok != c.ok {
			t.Errorf("%+v at %d, %d: %d, %v; want %d, %v", c.st, c.b, c.seq, got, ok, c.want, c.ok)
		}
	}
}

// The blocks a plan holds at once: deepseek-v3 over three micro-steps
// (47,031) and a Kimi-K2-sized model over one, or cut by --pp 2 over
// three, are within it; compare's limit is its own (MaxCompareBlocks).
func TestSimulatedBlocksWithin(t *testing.T) {
	kimi := *lookup(t, "deepseek-v3")
	kimi.Name, kimi.NumExperts = "kimi-k2", 384
	for _, s := range []Spec{
		{Job: Job{Model: lookup(t, "deepseek-v3"), Seq: 128, Accum: 8}},
		{Job: Job{Model: lookup(t, "deepseek-v3"), Seq: 128, Accum: 4}},
		{Job: Job{Model: &kimi, Seq: 128, Accum: 1}},
		{Job: Job{Model: &kimi, Seq: 128, Accum: 8}, Parallel: Parallel{PP: 2}},
	} {
		if err := s.Validate(); err != nil {
			t.Errorf("%s accum %d pp %d: %v", s.Model.Name, s.Accum, s.PP, err)
		}
	}
	s := Spec{Job: Job{Model: lookup(t, "deepseek-v3"), Seq: 128, Accum: 8}}
	if err := s.Validate(); err != nil {
		t.Fatal(err)
	}
	err := CompareEachContext(t.Context(), s, Allow{}, func(Row) error { return nil })
	var fe *FieldError
	if !errors.As(err, &fe) || fe.Field != FieldModel || !strings.Contains(err.Error(), "compare holds") {
		t.Errorf("compare deepseek-v3 --accum 8: %v, want compare's limit", err)
	}
}

// A pipeline whose stages are each built from the whole model and cut
// (--checkpoint auto, interleaving) holds the whole model's blocks per
// stage: deepseek-v3 --pp 8 --accum 16 under auto (7.2 GB, past two
// minutes, counted as 8 layers a stage) is refused naming the way out,
// and the same pipeline checkpointing every block, whose stages are built
// from their own layers, is not.
func TestWholeModelStagesHoldTheWholeModel(t *testing.T) {
	s := Spec{Job: Job{Model: lookup(t, "deepseek-v3"), Seq: 128, Accum: 16}, Parallel: Parallel{PP: 8}}
	s.Checkpoint = CheckpointPolicy{Kind: CheckpointAuto}
	var fe *FieldError
	if err := s.Validate(); !errors.As(err, &fe) || fe.Field != FieldModel || !strings.Contains(err.Error(), "every pipeline stage is built from all of them") ||
		!strings.Contains(err.Error(), "full or every=K") {
		t.Errorf("deepseek-v3 --pp 8 --accum 16 --checkpoint auto: %v, want the whole model's blocks refused", err)
	}
	s.Checkpoint = CheckpointPolicy{Kind: CheckpointFull}
	if err := s.Validate(); err != nil {
		t.Errorf("deepseek-v3 --pp 8 --accum 16 --checkpoint full: %v", err)
	}
	v2 := Spec{Job: Job{Model: lookup(t, "deepseek-v2-lite"), Seq: 128, Accum: 32}, Parallel: Parallel{PP: 4, PPInterleave: 2}}
	if err := v2.Validate(); !errors.As(err, &fe) || !strings.Contains(err.Error(), "interleave 2, every pipeline stage is built from all of them") {
		t.Errorf("deepseek-v2-lite --pp 4 --pp-interleave 2 --accum 32: %v, want the whole model's blocks refused", err)
	}
}

// A trace's events × the micro-steps a plan holds are bounded as a model's
// blocks are (validateTraceEvents; the limit here lm's events × 2): one and
// two micro-steps pass, three are refused on {trace}, naming {accum} 2 as
// the way out, and under --pp 2 each stage holds half the events.
func TestTraceEventSteps(t *testing.T) {
	lm, err := torchtrace.Load("../testdata/torch/lm.trace.json")
	if err != nil {
		t.Fatal(err)
	}
	limit := int64(2 * len(lm.Events))
	for _, c := range []struct {
		accum, pp int
		ok        bool
	}{{1, 1, true}, {2, 1, true}, {3, 1, false}, {8, 1, false}, {3, 2, true}} {
		s := Spec{Job: Job{Trace: lm, Accum: c.accum}, Parallel: Parallel{PP: c.pp}}
		err := s.validateTraceEvents(limit, "a plan holds")
		var fe *FieldError
		switch {
		case c.ok && err != nil:
			t.Errorf("accum %d pp %d: %v", c.accum, c.pp, err)
		case !c.ok && (!errors.As(err, &fe) || fe.Field != FieldTrace || !strings.Contains(fe.Msg, "{accum} 2 or less")):
			t.Errorf("accum %d pp %d: %v, want a refusal on the trace naming {accum} 2", c.accum, c.pp, err)
		}
	}
}

// A pipeline whose schedule simulates every micro-step (GPipe,
// interleaving) is refused past MaxPipelineWork ops to build, naming {pp},
// {accum} and the schedule, with an {accum} that is within it (a multiple
// of {pp} under interleaving); a 1F1B pipeline of as many micro-steps is
// not bounded by it.
func TestPipelineWorkLimit(t *testing.T) {
	gpu, err := hw.Lookup("h100")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		model string
		par   Parallel
		want  string
	}{
		{"llama-3-8b", Parallel{PP: 8, PPInterleave: 4}, "{pp} 8 over {accum} 1024 micro-steps of llama-3-8b simulates every micro-step ({pp-interleave} 4 builds each stage from the whole model): about 22.0 million ops to build, over the limit of 4 million (about 2 s and 1.5 GB): give {accum} 184 or less, or the 1f1b schedule without {pp-interleave}"},
		{"llama-3-70b", Parallel{PP: 8, PPSchedule: strategy.GPipe}, "{pp} 8 over {accum} 1024 micro-steps of llama-3-70b simulates every micro-step (the gpipe schedule holds every micro-batch): about 6.9 million ops to build, over the limit of 4 million (about 2 s and 1.5 GB): give {accum} 595 or less, or the 1f1b schedule without {pp-interleave}"},
	} {
		s := Spec{Job: Job{Model: lookup(t, tc.model), MicroBatch: 1, Seq: 2048, Accum: 1024}, Parallel: tc.par, Target: Target{GPU: gpu}}
		err := s.Validate()
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Field != FieldAccum || fe.Msg != tc.want {
			t.Errorf("%+v: %v, want %q", tc.par, err, tc.want)
		}
		s.Accum = 184
		if err := s.Validate(); err != nil {
			t.Errorf("%+v at accum 184: %v", tc.par, err)
		}
		if w := PipelineWork(&s); w > MaxPipelineWork {
			t.Errorf("%+v at accum 184: work %d", tc.par, w)
		}
	}
	s := Spec{Job: Job{Model: lookup(t, "llama-3-70b"), MicroBatch: 1, Seq: 2048, Accum: 1024}, Parallel: Parallel{PP: 8}, Target: Target{GPU: gpu}}
	if err := s.Validate(); err != nil {
		t.Errorf("1f1b over 1024 micro-steps: %v", err)
	}
}
