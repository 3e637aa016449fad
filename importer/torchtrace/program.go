package torchtrace

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"

	"github.com/memplan/memplan/ir"
	"github.com/memplan/memplan/lower"
	"github.com/memplan/memplan/units"
)

// Options say how to replay a trace. The zero value replays the recorded
// steady step at the trace's batch and sequence, with the recorded optimizer
// and in-kernel scratch.
type Options struct {
	// Batch is the micro-batch (0: the trace batch); Seq the sequence length
	// (0: the trace's; only traces exported with a seq_dim can change it).
	Batch, Seq int
	// Accum micro-steps per optimizer step (0 means 1): forward and backward
	// are replayed Accum times, the optimizer once.
	Accum int
	// FirstStep replays the first iteration: optimizer state does not exist
	// at the start and the recorded first optimizer phase creates it.
	FirstStep bool
	// Optimizer, when set, replaces the recorded optimizer phase by
	// lower.OptimizerStep for the trace's parameters and gradients (its
	// FirstStep is taken from Options.FirstStep).
	Optimizer *lower.TrainConfig
	// NoScratch leaves out the recorded in-kernel scratch (oneDNN reorders,
	// workspaces), which is otherwise the op's Workspace.
	NoScratch bool
	// MinBytes: storages smaller than this count 0 bytes (an allocator
	// counter with a threshold, such as the CPU tracker's 1024 bytes).
	MinBytes int64
	// Granularity rounds every storage up to a multiple of it (the CUDA
	// caching allocator's 512-byte blocks); 0 or 1 leaves sizes exact.
	Granularity int64
	// FullBatchInputs sizes the recorded inputs (category input) at
	// Batch·Accum: the batch is built whole and split into micro-batch views,
	// as memplan_torch's measurement does.
	FullBatchInputs bool
	// Hold is how long the training loop keeps the model's output
	// (loop.hold-outputs): HoldNone as recorded (memplan_torch drops it once
	// the loss exists), HoldBackward until the micro-step's backward is done,
	// HoldNextForward until the next forward returns and rebinds the
	// variable (the previous step's output is alive as the steady step
	// starts). Other than HoldNone it needs the trace's model_output.
	Hold lower.Hold
}

// ErrOptions wraps invalid options.
var ErrOptions = fmt.Errorf("invalid options")

type builder struct {
	t     *Trace
	o     Options
	b, s  int64
	p     *ir.Program
	err   error
	grads map[int]ir.TensorID // gradient storages of micro-step 0, by trace id

	// The replay so far (build).
	created map[int]bool        // storages the first optimizer step creates
	freed   initialFreeSets     // initial storages the replay frees
	initial map[int]ir.TensorID // initial storages, by trace id
	dying   []ir.TensorID       // initial storages the replayed step frees
	last    map[int]ir.TensorID // storages the last micro-step allocated, by trace id
	held    map[int]bool        // the model output's storages, when the loop holds them (Options.Hold)
	prevOut []ir.TensorID       // the output a variable still holds (HoldNextForward)
}

// Program replays the trace as an ir.Program (see Options).
func (t *Trace) Program(o Options) (*ir.Program, error) {
	if o.Batch < 0 || o.Seq < 0 || o.Accum < 0 || o.MinBytes < 0 || o.Granularity < 0 {
		return nil, fmt.Errorf("%w: negative batch, seq, accum, min bytes or granularity", ErrOptions)
	}
	if o.Accum == 0 {
		o.Accum = 1
	}
	bd := &builder{t: t, o: o, b: t.TraceBatch, s: t.TraceSeq, p: &ir.Program{MicroBatches: o.Accum}, grads: map[int]ir.TensorID{}}
	if o.Batch > 0 {
		bd.b = int64(o.Batch)
	}
	if o.Seq > 0 {
		if !t.ReplaysSeq(int64(o.Seq)) {
			return nil, fmt.Errorf("%w: sequence %d: %s", ErrOptions, o.Seq, t.FixedSeq())
		}
		bd.s = int64(o.Seq)
	}
	if err := bd.checkSizes(); err != nil {
		return nil, err
	}
	if o.Hold != lower.HoldNone {
		if t.ModelOutput == nil {
			return nil, fmt.Errorf("%w: trace %s does not record the model's output (model_output; exported before memplan_torch recorded it), so loop.hold-outputs cannot apply: re-export it, or plan with --set loop.hold-outputs=false (as recorded)", ErrOptions, t.label())
		}
		bd.held = map[int]bool{}
		for _, id := range t.ModelOutput.Storages {
			bd.held[id] = true
		}
	}
	if err := bd.build(); err != nil {
		return nil, err
	}
	return bd.p, nil
}

// checkSizes refuses sizes that leave 2^62 bytes at the replay's batch and
// sequence, and the inputs' at batch × accum when they are built whole.
func (bd *builder) checkSizes() error {
	if err := bd.t.CheckSizes(bd.b, bd.s); err != nil {
		return fmt.Errorf("%w: %w", ErrOptions, err)
	}
	if !bd.o.FullBatchInputs || bd.o.Accum < 2 {
		return nil
	}
	whole, ok := units.MulChecked(bd.b, int64(bd.o.Accum), math.MaxInt64)
	if !ok {
		return fmt.Errorf("%w: %s: batch %d × accum %d overflows", ErrOptions, bd.t.label(), bd.b, bd.o.Accum)
	}
	err := bd.t.checkSizes(whole, bd.s, func(s *Storage) bool { return s.Category == CatInput })
	if err != nil {
		return fmt.Errorf("%w: %w (the inputs of every micro-step, built whole)", ErrOptions, err)
	}
	return nil
}

func (t *Trace) label() string {
	if t.Name != "" {
		return t.Name
	}
	return t.file
}

// size is the modelled size of s, under the counter's threshold and rounding.
func (bd *builder) size(s *Storage, b int64) units.Bytes {
	n := s.Size(b, bd.s)
	if n < 0 {
		if bd.err == nil {
			bd.err = fmt.Errorf("%s: storage %d (%s%s) has %d bytes at batch %d seq %d: its size model does not extrapolate there",
				bd.t.label(), s.ID, s.DType, where(s.Module), n, b, bd.s)
		}
		return 0
	}
	if n < bd.o.MinBytes {
		return 0
	}
	if g := bd.o.Granularity; g > 1 {
		n = (n + g - 1) / g * g
	}
	return units.Bytes(n)
}

// flops is event i's FLOPs at the builder's batch and sequence (0 when the
// trace counts none for it).
func (bd *builder) flops(i int, e *Event) float64 {
	if e.FLOPs == nil {
		return 0
	}
	f := e.FLOPs.Float(bd.b, bd.s)
	if !(f >= 0) || math.IsInf(f, 0) {
		if bd.err == nil {
			bd.err = fmt.Errorf("%s: events[%d] (%s) has %g FLOPs at batch %d seq %d: its FLOPs model does not extrapolate there",
				bd.t.label(), i, e.Op, f, bd.b, bd.s)
		}
		return 0
	}
	return f
}

func where(m string) string {
	if m == "" {
		return ""
	}
	return " in " + m
}

var catOf = map[string]ir.Category{
	CatParameter:      ir.Parameter,
	CatGradient:       ir.Gradient,
	CatOptimizerState: ir.OptimizerState,
	CatInput:          ir.Other,
	CatActivation:     ir.Activation,
	CatTemporary:      ir.Temporary,
}

func (bd *builder) tensor(s *Storage, name string, b int64) ir.Tensor {
	dt, err := units.ParseDType(s.DType)
	if err != nil {
		dt = units.Invalid
	}
	t := ir.Tensor{Name: name, DType: dt, Bytes: bd.size(s, b), Base: ir.NoTensor, Cat: catOf[s.Category], Batch: s.BatchScaled()}
	if !t.Batch && s.PerSeq == 0 && s.PerSeq2 == 0 {
		t.Shape = append([]int64(nil), s.Shape...) // shapes are at the trace size; keep only fixed ones
	}
	if s.Category == CatParameter && !s.Buffer {
		t.RequiresGrad = true
	}
	return t
}

func (bd *builder) add(t ir.Tensor) ir.TensorID {
	bd.p.Tensors = append(bd.p.Tensors, t)
	return ir.TensorID(len(bd.p.Tensors) - 1)
}

func opShort(op string) string {
	op = strings.TrimPrefix(op, "aten.")
	if i := strings.IndexByte(op, '.'); i > 0 {
		op = op[:i]
	}
	return op
}

// scratch is the in-kernel scratch of e at the replay size: piecewise linear
// in the batch through the points recorded at each sequence length (two, or
// three with the point an export at batch 1 adds below its fit), then (for
// traces with a sequence model) through the sequence lengths, never
// negative. memplan_torch.replay.scratch_bytes is the same function.
func (bd *builder) scratch(e *Event) units.Bytes {
	sc := e.Scratch
	if sc == nil || bd.o.NoScratch {
		return 0
	}
	return units.Bytes(ScratchAt(sc, bd.b, bd.s))
}

// ScratchAt evaluates recorded scratch points at batch b and sequence s.
func ScratchAt(sc *Scratch, b, s int64) int64 {
	bySeq := map[int64][]ScratchPoint{}
	var seqs []int64
	for _, p := range sc.Points {
		if _, ok := bySeq[p.Seq]; !ok {
			seqs = append(seqs, p.Seq)
		}
		bySeq[p.Seq] = append(bySeq[p.Seq], p)
	}
	if len(seqs) == 0 {
		return sc.Bytes
	}
	sort.Slice(seqs, func(i, j int) bool { return seqs[i] < seqs[j] })
	atBatch := func(pts []ScratchPoint) float64 {
		pts = append([]ScratchPoint(nil), pts...)
		sort.SliceStable(pts, func(i, j int) bool { return pts[i].Batch < pts[j].Batch })
		if len(pts) < 2 || pts[0].Batch == pts[len(pts)-1].Batch {
			return float64(pts[0].Bytes)
		}
		// piecewise linear through the points, the end segments extended (two points: one line)
		k := 1
		for k < len(pts)-1 && b > pts[k].Batch {
			k++
		}
		p1, p2 := pts[k-1], pts[k]
		return float64(p1.Bytes) + float64(p2.Bytes-p1.Bytes)*float64(b-p1.Batch)/float64(p2.Batch-p1.Batch)
	}
	var y float64
	switch {
	case len(seqs) == 1 || s == 0:
		y = atBatch(bySeq[seqs[len(seqs)-1]])
	default:
		// Lagrange through (up to) the three largest sequence lengths.
		if len(seqs) > 3 {
			seqs = seqs[len(seqs)-3:]
		}
		for i, si := range seqs {
			w := 1.0
			for j, sj := range seqs {
				if i != j {
					w *= float64(s-sj) / float64(si-sj)
				}
			}
			y += w * atBatch(bySeq[si])
		}
	}
	if y < 0 || math.IsNaN(y) {
		return 0
	}
	if y > math.MaxInt64/4 {
		return math.MaxInt64 / 4
	}
	return int64(math.Round(y))
}

// build replays the trace in phases: the initial storages, the forward and backward events once per
// micro-step, then the optimizer step (the recorded one, or Options.Optimizer's in its place).
func (bd *builder) build() error {
	bd.created = bd.t.FirstStepCreated()
	bd.freed = bd.t.initialFrees(bd.o)
	bd.initialStorages()
	if bd.o.Hold == lower.HoldNextForward && !bd.o.FirstStep {
		bd.carriedOutput()
	}
	endLive := map[int]bool{}
	for _, id := range bd.t.EndLive {
		endLive[id] = true
	}
	for m := 0; m < bd.o.Accum; m++ {
		bd.microStep(m, endLive)
	}
	if bd.err != nil {
		return bd.err
	}
	bd.pairGrads()
	if bd.o.Optimizer != nil {
		if err := bd.replaceOptimizer(bd.initial); err != nil {
			return err
		}
	} else {
		bd.optimizerStep()
		if bd.err != nil {
			return bd.err
		}
	}
	if len(bd.prevOut) > 0 {
		// Still bound when the iteration ends.
		bd.p.Ops = append(bd.p.Ops, ir.Op{Name: "outputs still bound", Phase: ir.Optimizer, In: bd.prevOut, Node: -1})
	}
	return bd.bornAtStart(bd.dying)
}

// pairGrads records each gradient's parameter as Program.GradOf, which
// data parallelism and ZeRO shard by (gradParams: as param_grads says, or
// for a v1 trace by dtype and size; nil when a v1 trace's gradients match
// no parameter, so a strategy that needs them says it cannot tell).
func (bd *builder) pairGrads() {
	if g, err := bd.gradParams(bd.initial); err == nil {
		bd.p.GradOf = g
	}
}

// carriedOutput adds the previous iteration's output, which a variable holds
// into the steady step until the model returns (HoldNextForward): live from
// the start, freed when the first micro-step rebinds the variable.
func (bd *builder) carriedOutput() {
	var b units.Bytes
	for i := range bd.t.Events {
		for j := range bd.t.Events[i].Alloc {
			if a := &bd.t.Events[i].Alloc[j]; bd.held[a.ID] {
				b += bd.size(a, bd.b)
			}
		}
	}
	id := bd.add(ir.Tensor{Name: "previous outputs", Shape: []int64{int64(b)}, DType: units.U8, Bytes: b, Base: ir.NoTensor, Cat: ir.Temporary, Carried: true})
	bd.dying = append(bd.dying, id)
	bd.prevOut = []ir.TensorID{id}
}

// rebind frees the output a variable held once the model of micro-step m
// has returned.
func (bd *builder) rebind(m int) {
	if len(bd.prevOut) > 0 {
		bd.p.Ops = append(bd.p.Ops, ir.Op{Name: "outputs = model(...) (rebinds)", Phase: ir.Forward, Micro: m, In: bd.prevOut, Node: -1})
		bd.prevOut = nil
	}
}

// holdOutputs ends micro-step m's hold of the model's output (allocated as
// local): after its backward (HoldBackward), or at the next rebind.
func (bd *builder) holdOutputs(m int, local map[int]ir.TensorID) {
	var outs []ir.TensorID
	for _, id := range bd.t.ModelOutput.Storages {
		if tid, ok := local[id]; ok {
			outs = append(outs, tid)
		}
	}
	switch bd.o.Hold {
	case lower.HoldBackward:
		if len(outs) > 0 {
			bd.p.Ops = append(bd.p.Ops, ir.Op{Name: "del outputs", Phase: ir.Backward, Micro: m, In: outs, Node: -1})
		}
	case lower.HoldNextForward:
		bd.prevOut = outs
	}
}

// stateOf reports whether s is an initial storage the recorded optimizer owns (its state), whatever the
// exporter categorised it as: created by the first optimizer step or freed by the steady one (a
// state-replacing optimizer).
func (bd *builder) stateOf(s *Storage) bool {
	switch s.Category {
	case CatOptimizerState:
		return true
	case CatParameter, CatGradient, CatInput:
		return false
	}
	return bd.created[s.ID] || bd.freed.opt[s.ID]
}

// initialStorages adds the storages live before the step, except those the (first or replaced) optimizer step
// creates. A storage the step frees (the old state of an optimizer that replaces it) is not resident: it is
// written by the first op, as if live from the start, and freed after the op the trace frees it at (its last
// read).
func (bd *builder) initialStorages() {
	t, o, p := bd.t, bd.o, bd.p
	bd.initial = map[int]ir.TensorID{}
	for i := range t.Initial {
		s := &t.Initial[i]
		if (o.Optimizer != nil && bd.stateOf(s)) || (o.FirstStep && bd.created[s.ID]) {
			continue
		}
		b := bd.b
		if s.Category == CatInput && o.FullBatchInputs {
			b *= int64(o.Accum)
		}
		tt := bd.tensor(s, fmt.Sprintf("%s#%d", s.Category, s.ID), b)
		if bd.stateOf(s) {
			tt.Cat = ir.OptimizerState
		}
		tt.Resident = !bd.freed.replayed[s.ID]
		id := bd.add(tt)
		bd.initial[s.ID] = id
		if !tt.Resident {
			bd.dying = append(bd.dying, id)
		}
		if s.Category == CatParameter && !s.Buffer {
			p.Params = append(p.Params, id)
		}
	}
}

// microStep replays the forward and backward events as micro-step m. After the first, a gradient the
// backward allocates is AccumulateGrad's temporary (grad += new), dropped right after its op.
func (bd *builder) microStep(m int, endLive map[int]bool) {
	t := bd.t
	local := map[int]ir.TensorID{}
	maps := []map[int]ir.TensorID{local, bd.initial}
	if m > 0 {
		maps = []map[int]ir.TensorID{local, bd.grads, bd.initial}
	}
	if bd.held != nil && t.ModelOutput.ReturnedAt < 0 {
		bd.rebind(m)
	}
	for i := range t.Events {
		e := &t.Events[i]
		if e.Phase == PhaseOptimizer {
			break
		}
		if bd.held != nil {
			e = bd.unheld(e)
		}
		op := ir.Op{Name: e.Op, Module: e.Module, Phase: phaseOf(e.Phase), Micro: m, Node: -1, Workspace: bd.scratch(e), FLOPs: bd.flops(i, e)}
		for j := range e.Alloc {
			a := &e.Alloc[j]
			name := fmt.Sprintf("%s#%d", opShort(e.Op), a.ID)
			if m > 0 {
				name += fmt.Sprintf("@%d", m)
			}
			if a.Category == CatGradient && m > 0 {
				bd.accumulateGrad(&op, a)
				continue
			}
			tt := bd.tensor(a, name, bd.b)
			if endLive[a.ID] {
				tt.Keep = true
			}
			id := bd.add(tt)
			local[a.ID] = id
			if a.Category == CatGradient {
				bd.grads[a.ID] = id
			}
			op.Out = append(op.Out, id)
		}
		readsOf(&op, e, maps)
		bd.p.Ops = append(bd.p.Ops, op)
		if bd.held != nil && i == t.ModelOutput.ReturnedAt {
			bd.rebind(m)
		}
	}
	if bd.held != nil {
		bd.holdOutputs(m, local)
	}
	bd.last = local
}

// accumulateGrad is AccumulateGrad after the first micro-step: the op's new
// gradient a is added into the existing .grad in place (grad += new), so it
// is held only while the op runs — the op's workspace, as lowering models
// accumulation — and the op reads the gradient it adds into (the strategies
// find each micro-step's gradient work by that read: DDP's all-reduce after
// the last micro-step, ZeRO's reduce-scatter of each).
func (bd *builder) accumulateGrad(op *ir.Op, a *Storage) {
	op.Workspace += bd.size(a, bd.b)
	if g, ok := bd.grads[a.ID]; ok {
		op.In = addIn(*op, g)
	}
}

// unheld is e without the frees of the output storages the loop holds.
func (bd *builder) unheld(e *Event) *Event {
	if !slices.ContainsFunc(e.Free, func(id int) bool { return bd.held[id] }) {
		return e
	}
	c := *e
	c.Free = slices.DeleteFunc(slices.Clone(e.Free), func(id int) bool { return bd.held[id] })
	return &c
}

// optimizerStep replays the recorded optimizer step (the first step's with Options.FirstStep): state it
// allocates and never frees outlives the step, and what the first step creates is optimizer state.
func (bd *builder) optimizerStep() {
	t, o := bd.t, bd.o
	events := t.Events
	if o.FirstStep {
		events = t.First.OptimizerEvents
	}
	freedBy := map[int]bool{}
	for i := range events {
		for _, f := range events[i].Free {
			freedBy[f] = true
		}
	}
	local := map[int]ir.TensorID{}
	maps := []map[int]ir.TensorID{local, bd.grads, bd.initial, bd.last}
	for i := range events {
		e := &events[i]
		if e.Phase != PhaseOptimizer {
			continue
		}
		op := ir.Op{Name: e.Op, Module: e.Module, Phase: ir.Optimizer, Node: -1, Workspace: bd.scratch(e)}
		for j := range e.Alloc {
			a := &e.Alloc[j]
			tt := bd.tensor(a, fmt.Sprintf("%s#%d", opShort(e.Op), a.ID), bd.b)
			if !freedBy[a.ID] {
				tt.Keep = true // lazily created state outlives the step
			}
			if bd.created[a.ID] && a.Category != CatParameter && a.Category != CatInput {
				tt.Cat = ir.OptimizerState // the first step creates an initial (state) storage
			}
			id := bd.add(tt)
			local[a.ID] = id
			op.Out = append(op.Out, id)
		}
		readsOf(&op, e, maps)
		bd.p.Ops = append(bd.p.Ops, op)
	}
}

// initialFreeSets are the initial storages a replay frees: replayed, those
// the replayed events free; opt, those the recorded steady optimizer phase
// frees (the state a replacing optimizer drops).
type initialFreeSets struct{ replayed, opt map[int]bool }

func (t *Trace) initialFrees(o Options) initialFreeSets {
	init := map[int]bool{}
	for i := range t.Initial {
		init[t.Initial[i].ID] = true
	}
	fs := initialFreeSets{replayed: map[int]bool{}, opt: map[int]bool{}}
	add := func(events []Event, opt bool, into map[int]bool) {
		for i := range events {
			if (events[i].Phase == PhaseOptimizer) != opt {
				continue
			}
			for _, f := range events[i].Free {
				if init[f] {
					into[f] = true
				}
			}
		}
	}
	add(t.Events, true, fs.opt)
	add(t.Events, false, fs.replayed)
	switch {
	case o.Optimizer != nil: // the recorded optimizer phase is not replayed
	case o.FirstStep:
		add(t.First.OptimizerEvents, true, fs.replayed)
	default:
		add(t.Events, true, fs.replayed)
	}
	return fs
}

// bornAtStart makes the first op write the initial storages that the step
// frees: live from the start like a resident storage, but freed after their
// last read (the op the trace frees them at).
func (bd *builder) bornAtStart(dying []ir.TensorID) error {
	if len(dying) == 0 {
		return nil
	}
	p := bd.p
	if len(p.Ops) == 0 {
		return fmt.Errorf("%s: frees initial storages but replays no op", bd.t.label())
	}
	op := &p.Ops[0]
	born := map[ir.TensorID]bool{}
	for _, id := range dying {
		born[id] = true
	}
	in := op.In[:0:0]
	for _, id := range op.In {
		if !born[id] {
			in = append(in, id)
		}
	}
	op.In = in
	op.Out = append(append([]ir.TensorID(nil), dying...), op.Out...)
	return nil
}

// addIn adds a read of tid to op unless op writes it (a storage allocated and
// freed by the same op is already last used there).
// readsOf adds to op the storages event e reads and those freed after it:
// the simulator frees a storage after its last use, so a free becomes a
// read by the op it follows.
func readsOf(op *ir.Op, e *Event, maps []map[int]ir.TensorID) {
	for _, ids := range [][]int{e.Inputs, e.Free} {
		for _, id := range ids {
			if tid, ok := lookup(maps, id); ok {
				op.In = addIn(*op, tid)
			}
		}
	}
}

// lookup finds trace storage id in the first of maps that has it.
func lookup(maps []map[int]ir.TensorID, id int) (ir.TensorID, bool) {
	for _, m := range maps {
		if v, ok := m[id]; ok {
			return v, true
		}
	}
	return 0, false
}

func addIn(op ir.Op, tid ir.TensorID) []ir.TensorID {
	for _, o := range op.Out {
		if o == tid {
			return op.In
		}
	}
	for _, i := range op.In {
		if i == tid {
			return op.In
		}
	}
	return append(op.In, tid)
}

func phaseOf(s string) ir.Phase {
	switch s {
	case PhaseBackward:
		return ir.Backward
	case PhaseOptimizer:
		return ir.Optimizer
	}
	return ir.Forward
}

// replaceOptimizer appends lower.OptimizerStep for the trace's parameters.
func (bd *builder) replaceOptimizer(initial map[int]ir.TensorID) error {
	grads, err := bd.gradParams(initial)
	if err != nil {
		return fmt.Errorf("%w; cannot replace the optimizer", err)
	}
	byParam := make(map[ir.TensorID]ir.TensorID, len(grads))
	for g, p := range grads {
		byParam[p] = g
	}
	c := *bd.o.Optimizer
	c.FirstStep = bd.o.FirstStep
	lower.OptimizerStep(bd.p, byParam, c)
	return nil
}

// gradParams pairs the gradients of micro-step 0 with their parameters
// (gradient → parameter): as param_grads records (v2), else by dtype and
// size (v1 does not record which .grad belongs to which parameter, and a
// gradient's storage may have been created with another shape, such as a
// bias gradient summed with keepdim; any matching of equal-size tensors
// gives the same memory).
func (bd *builder) gradParams(initial map[int]ir.TensorID) (map[ir.TensorID]ir.TensorID, error) {
	out := map[ir.TensorID]ir.TensorID{}
	if bd.t.ParamGrads != nil {
		for _, pg := range bd.t.ParamGrads {
			g, gok := bd.grads[pg.Grad]
			p, pok := initial[pg.Param]
			if _, dup := out[g]; gok && pok && !dup {
				out[g] = p
			}
		}
		return out, nil
	}
	return bd.gradsBySize(initial)
}

// gradsBySize matches gradients to parameters of the same dtype and size,
// both in id order.
func (bd *builder) gradsBySize(initial map[int]ir.TensorID) (map[ir.TensorID]ir.TensorID, error) {
	t := bd.t
	type key struct {
		dt    string
		bytes int64
	}
	k := func(s *Storage) key { return key{s.DType, s.Bytes} }
	byID := map[int]*Storage{}
	for i := range t.Events {
		for j := range t.Events[i].Alloc {
			a := &t.Events[i].Alloc[j]
			byID[a.ID] = a
		}
	}
	order := make([]int, 0, len(bd.grads))
	for id := range bd.grads {
		order = append(order, id)
	}
	sort.Ints(order)
	pool := map[key][]ir.TensorID{}
	for _, id := range order {
		s := byID[id]
		pool[k(s)] = append(pool[k(s)], bd.grads[id])
	}
	out := map[ir.TensorID]ir.TensorID{}
	for i := range t.Initial {
		s := &t.Initial[i]
		if s.Category != CatParameter || s.Buffer {
			continue
		}
		q := pool[k(s)]
		if len(q) == 0 {
			continue // frozen or unused parameter
		}
		if p, ok := initial[s.ID]; ok {
			out[q[0]] = p
		}
		pool[k(s)] = q[1:]
	}
	for kk, q := range pool {
		if len(q) > 0 {
			return nil, fmt.Errorf("%s: %d gradient(s) of %d bytes (%s) match no parameter", t.label(), len(q), kk.bytes, kk.dt)
		}
	}
	return out, nil
}

// computeOps are the aten ops whose kernels run on tensor cores: matrix
// products, convolutions and fused attention (short names, opShort).
var computeOps = map[string]bool{
	"mm": true, "addmm": true, "bmm": true, "baddbmm": true, "matmul": true, "linear": true,
	"convolution": true, "convolution_backward": true, "_convolution": true, "mkldnn_convolution": true,
	"cudnn_convolution": true, "_scaled_dot_product_flash_attention": true,
	"_scaled_dot_product_efficient_attention": true, "_scaled_dot_product_cudnn_attention": true,
	"_flash_attention_forward": true, "_efficient_attention_forward": true, "_scaled_mm": true,
}

// ComputeDType is the floating dtype the trace's matrix products and
// convolutions write, weighted by their outputs' bytes at the trace batch
// (a trace records dtypes, not FLOPs); a trace without any is taken at its
// parameters' floating dtype, else float32.
func (t *Trace) ComputeDType() units.DType {
	if t.dtype != units.Invalid {
		return t.dtype // found at parse time
	}
	return t.scanDType()
}

func (t *Trace) scanDType() units.DType {
	by := map[units.DType]int64{}
	add := func(dtype string, b int64) {
		if dt, err := units.ParseDType(dtype); err == nil {
			by[dt] += b + 1 // an empty output still says its dtype; only floating ones are chosen below
		}
	}
	for i := range t.Events {
		e := &t.Events[i]
		if computeOps[opShort(e.Op)] {
			for _, a := range e.Alloc {
				add(a.DType, a.Bytes)
			}
		}
	}
	if best := mostBytes(by); best != units.Invalid {
		return best
	}
	if p := t.ParamDType(); p != units.Invalid {
		return p
	}
	return units.F32
}

// ParamDType is the floating dtype holding most of the trace's parameter
// bytes (buffers left out): the dtype the model was cast to, a workload's
// dtype. Invalid when no parameter is floating-point.
func (t *Trace) ParamDType() units.DType {
	by := map[units.DType]int64{}
	for i := range t.Initial {
		if s := &t.Initial[i]; s.Category == CatParameter && !s.Buffer {
			if dt, err := units.ParseDType(s.DType); err == nil {
				by[dt] += s.Bytes + 1 // an empty parameter still says its dtype
			}
		}
	}
	return mostBytes(by)
}

// mostBytes is the floating dtype with the most bytes in by (float32 first
// on a tie), Invalid when none has any.
func mostBytes(by map[units.DType]int64) units.DType {
	best, most := units.Invalid, int64(0)
	for _, dt := range []units.DType{units.F32, units.BF16, units.F16, units.FP8, units.F64} {
		if by[dt] > most {
			best, most = dt, by[dt]
		}
	}
	return best
}
