package torchtrace

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/memplan/memplan/internal/boundedio"
	"github.com/memplan/memplan/units"
)

// Trace versions this package reads. v2 adds param_grads (each
// parameter's gradient storage), which data parallelism and ZeRO need.
const (
	SchemaV1 = "memplan.trace/v1"
	SchemaV2 = "memplan.trace/v2"
	// Schema is the newest version, the one memplan_torch writes.
	Schema = SchemaV2
)

const schemaPrefix = "memplan.trace/v"

// Categories a storage may carry (docs/trace-format.md).
const (
	CatParameter      = "parameter"
	CatGradient       = "gradient"
	CatOptimizerState = "optimizer_state"
	CatInput          = "input"
	CatActivation     = "activation"
	CatTemporary      = "temporary"
)

// Phases of an event.
const (
	PhaseForward   = "forward"
	PhaseBackward  = "backward"
	PhaseOptimizer = "optimizer"
)

// Poly is the exporter's exact model of a quantity in the batch b and the
// sequence length s (docs/trace-format.md): Const + PerBatch·b (+ PerSeq·s
// + PerSeq2·s² + PerBatchSeq·b·s + PerBatchSeq2·b·s² for a trace with a
// sequence size model). A storage's bytes and an event's FLOPs follow it.
type Poly struct {
	Const, PerBatch                            int64
	PerSeq, PerSeq2, PerBatchSeq, PerBatchSeq2 int64
}

// Storage is one StorageImpl: its size model and what it holds.
type Storage struct {
	ID       int
	Bytes    int64 // at the trace batch / sequence
	Poly           // its size model
	DType    string
	Shape    []int64
	Category string
	Saved    bool
	Buffer   bool
	Module   string
}

// BatchScaled reports whether the size depends on the batch.
func (s *Storage) BatchScaled() bool {
	return s.PerBatch != 0 || s.PerBatchSeq != 0 || s.PerBatchSeq2 != 0
}

// Size is the storage's bytes at batch b and sequence length seq.
func (s *Storage) Size(b, seq int64) int64 { return s.Poly.At(b, seq) }

// SizeChecked is Size with every product and sum checked (Poly.Checked).
func (s *Storage) SizeChecked(b, seq int64) (int64, bool) { return s.Poly.Checked(b, seq) }

// At is the polynomial at batch b and sequence length seq, in int64
// (Checked where it may wrap).
func (s *Poly) At(b, seq int64) int64 {
	return s.Const + s.PerBatch*b + s.PerSeq*seq + s.PerSeq2*seq*seq + s.PerBatchSeq*b*seq + s.PerBatchSeq2*b*seq*seq
}

// Float is the polynomial at batch b and sequence length seq in floating
// point, which does not wrap: FLOPs grow past int64 where bytes would be
// refused long before (an attention's b·s² at the limits).
func (s *Poly) Float(b, seq int64) float64 {
	fb, fs := float64(b), float64(seq)
	return float64(s.Const) + float64(s.PerBatch)*fb + float64(s.PerSeq)*fs + float64(s.PerSeq2)*fs*fs +
		float64(s.PerBatchSeq)*fb*fs + float64(s.PerBatchSeq2)*fb*fs*fs
}

// Checked is At with every product and sum checked against
// units.MaxBytes (2^62 bytes; any sum of two sizes under it stays inside
// int64): false when a term or a partial sum leaves ±MaxBytes.
func (s *Poly) Checked(b, seq int64) (int64, bool) {
	terms := [...]struct{ c, x, y, z int64 }{
		{s.Const, 1, 1, 1}, {s.PerBatch, b, 1, 1}, {s.PerSeq, seq, 1, 1}, {s.PerSeq2, seq, seq, 1},
		{s.PerBatchSeq, b, seq, 1}, {s.PerBatchSeq2, b, seq, seq},
	}
	const lim = int64(units.MaxBytes)
	var sum int64
	for _, t := range terms {
		c, neg := t.c, t.c < 0
		if neg {
			if c = -c; c < 0 {
				return 0, false
			}
		}
		v, ok := units.MulChecked(c, t.x, lim)
		if ok {
			v, ok = units.MulChecked(v, t.y, lim)
		}
		if ok {
			v, ok = units.MulChecked(v, t.z, lim)
		}
		if !ok {
			return 0, false
		}
		if neg {
			v = -v
		}
		if v > 0 && sum > lim-v || v < 0 && sum < -lim-v {
			return 0, false
		}
		sum += v
	}
	return sum, true
}

// CheckSizes refuses a storage whose size model leaves 2^62 bytes (4 EiB,
// units.MaxBytes) at batch b and sequence seq, naming where the trace
// declares it: the initial storage, or the event index and op that
// allocates it.
func (t *Trace) CheckSizes(b, seq int64) error {
	return t.checkSizes(b, seq, func(*Storage) bool { return true })
}

func (t *Trace) checkSizes(b, seq int64, which func(*Storage) bool) error {
	bad := func(s *Storage, at string) error {
		if _, ok := s.SizeChecked(b, seq); ok || !which(s) {
			return nil
		}
		atSeq := ""
		if t.HasSeq() {
			atSeq = fmt.Sprintf(", sequence %d", seq)
		}
		return fmt.Errorf("%s: %s: storage %d (%s%s) is over 4 EiB (2^62 bytes) at batch %d%s by its size model: no GPU holds it",
			t.label(), at, s.ID, s.DType, where(s.Module), b, atSeq)
	}
	for i := range t.Initial {
		if err := bad(&t.Initial[i], fmt.Sprintf("initial_storages[%d]", i)); err != nil {
			return err
		}
	}
	for k, evs := range [][]Event{t.Events, t.First.OptimizerEvents} {
		path := []string{"events", "first_step.optimizer_events"}[k]
		for i := range evs {
			for j := range evs[i].Alloc {
				if err := bad(&evs[i].Alloc[j], fmt.Sprintf("%s[%d].alloc[%d] (%s)", path, i, j, evs[i].Op)); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// Output is one tensor an event returned.
type Output struct {
	Storage int
	DType   string
	Shape   []int64
	Alias   bool // the storage existed before the op (view or in-place)
	Inplace bool // the output is one of the op's inputs
}

// ScratchPoint is the in-kernel scratch an op took at one fit point.
type ScratchPoint struct {
	Batch, Seq int64 // Seq is 0 for traces without a sequence size model
	Bytes      int64
}

// Scratch is the recorded in-kernel scratch of an event (CPU traces).
type Scratch struct {
	Bytes  int64 // at the trace batch / sequence
	Points []ScratchPoint
}

// Event is one aten op.
type Event struct {
	Index   int
	Op      string
	Phase   string
	Module  string
	Alloc   []Storage
	Free    []int
	Saved   []int
	Outputs []Output
	// Inputs are the storages the op read (optional; exporters from
	// memplan_torch 0.2 on).
	Inputs  []int
	Scratch *Scratch
	// FLOPs are the op's floating-point operations as PyTorch counts them
	// (torch.utils.flop_counter: matrix products, convolutions, fused
	// attention; nil for an op it counts none for, and in a trace whose
	// exporter counted none, Trace.FLOPsSource), and FLOPsAt their number
	// at the trace batch and sequence.
	FLOPs   *Poly
	FLOPsAt int64
}

// FirstStep is the first iteration's optimizer phase, which creates the
// optimizer state.
type FirstStep struct {
	Exact           bool
	OptimizerState  []int
	OptimizerEvents []Event
}

// PhaseRange is the inclusive event range of a phase.
type PhaseRange struct{ First, Last int }

// Device is a trace's trace_device, the device memplan_torch ran the step on
// (python/memplan_torch/export.py). The reader keeps any spelling; the
// constants are the ones memplan acts on.
type Device string

const (
	DeviceCPU  Device = "cpu"
	DeviceCUDA Device = "cuda"
)

// ScratchKind is a trace's scratch field: whether the exporter measured
// in-kernel scratch (python/memplan_torch/export.py writes "measured" or
// "not measured"; older traces leave it out).
type ScratchKind string

const (
	ScratchMeasured    ScratchKind = "measured"
	ScratchNotMeasured ScratchKind = "not measured"
)

// ParamGrad pairs a parameter's storage with its gradient's: the storage
// AccumulateGrad bound to the parameter's .grad in the steady step.
type ParamGrad struct{ Param, Grad int }

// Trace is a parsed memplan.trace/v1 or v2 document.
type Trace struct {
	Schema      string // SchemaV1 or SchemaV2
	Name        string
	Source      string
	Torch       string // producer.torch
	TraceDevice Device // trace_device: where the step was traced
	Notes       []string
	Optimizer   string
	Foreach     *bool
	BatchDim    *int // nil: not recorded
	SeqDim      *int // nil: no sequence size model
	TraceBatch  int64
	// TraceSeq is the sequence length of the trace: its sizes are modelled
	// in it with SeqDim; without, it is the length the builder ran at when
	// the trace records one (0 when not).
	TraceSeq int64

	ScratchKind ScratchKind // scratch: whether in-kernel scratch was measured
	// FLOPsSource is the document's flops field: where its events' FLOPs
	// come from ("torch.utils.flop_counter"), "not recorded" (an exporter on
	// PyTorch 1.13), or empty (exporters before FLOPs were recorded).
	FLOPsSource string
	NParams     int64
	ParamBytes  int64
	Phases      map[string]PhaseRange
	Initial     []Storage
	Events      []Event
	EndLive     []int
	First       FirstStep
	// ModelOutput is what the model returned in the steady step (nil in
	// traces exported before memplan_torch recorded it).
	ModelOutput *ModelOutput
	// ParamGrads are the parameters' gradient storages (v2; nil in v1).
	ParamGrads []ParamGrad

	file  string
	dtype units.DType // ComputeDType, found by parse
}

// ModelOutput is the model's output in the steady step: the storages its
// tensors are in (allocated by the step) and the index of the event after
// which the model returned (-1: before the first event). A loop that keeps
// the output in a variable keeps these storages past the loss.
type ModelOutput struct {
	Storages   []int
	ReturnedAt int
	// Hold is the habit of the loop the exporter modelled, when it says
	// ("none", "backward", "next-forward"; export-hf: "none", the Trainer's).
	Hold string
}

// Holds are the values of model_output.hold, in lower.Hold's order.
var Holds = []string{"none", "backward", "next-forward"}

// HasSeq reports whether sizes are modelled in the sequence length too.
func (t *Trace) HasSeq() bool { return t.SeqDim != nil }

// ReplaysSeq reports whether the trace replays at sequence length seq: any
// length with a sequence dimension, else only the length it recorded.
func (t *Trace) ReplaysSeq(seq int64) bool { return t.HasSeq() || seq == t.TraceSeq }

// FixedSeq says why a trace without a sequence dimension replays no other
// length than its own, and how to export one that does: memplan_torch
// export fits the sequence with --seq-dim; export-hf unless --no-seq-fit
// (or a --seq under 3), never for an image model.
func (t *Trace) FixedSeq() string {
	at := " and does not record its length, so it replays none given"
	if t.TraceSeq > 0 {
		at = fmt.Sprintf(" at sequence %d, so it replays only that length", t.TraceSeq)
	}
	how := "memplan_torch export --seq-len N --seq-dim D"
	switch {
	case strings.HasPrefix(t.Source, "transformers ") && strings.Contains(t.Source, "ImageClassification"):
		how = "memplan_torch export-hf traces an image model without one"
	case strings.HasPrefix(t.Source, "transformers "):
		how = "memplan_torch export-hf --seq N without --no-seq-fit"
	}
	return fmt.Sprintf("trace %s was exported without a sequence dimension%s (re-export it with %s)", t.label(), at, how)
}

// FirstStepCreated returns the ids of the initial storages that do not exist
// before the first step because its optimizer phase creates them:
// first_step.optimizer_state and every initial storage that
// first_step.optimizer_events allocates. An optimizer that replaces its state
// each step (m = β·m + g stored back, rather than updated in place) creates
// its state under ids that are initial in the steady step, which exporters
// before issue 10 did not categorise as optimizer state (they looked only at
// the state after the steady step: that step's new tensors).
func (t *Trace) FirstStepCreated() map[int]bool {
	out := map[int]bool{}
	for _, id := range t.First.OptimizerState {
		out[id] = true
	}
	init := map[int]bool{}
	for i := range t.Initial {
		init[t.Initial[i].ID] = true
	}
	for i := range t.First.OptimizerEvents {
		for _, a := range t.First.OptimizerEvents[i].Alloc {
			if init[a.ID] {
				out[a.ID] = true
			}
		}
	}
	return out
}

// ErrSchema is wrapped by errors about the document's schema version.
var ErrSchema = errors.New("unsupported schema")

// Load reads and parses a trace file; errors name the file.
func Load(path string) (*Trace, error) {
	data, err := boundedio.ReadFile(path, boundedio.TraceFile)
	if err != nil {
		var pe *os.PathError
		if errors.As(err, &pe) {
			return nil, fmt.Errorf("%s: %v", path, pe.Err)
		}
		return nil, fmt.Errorf("%w", err)
	}
	return parse(filepath.Base(path), data)
}

// Parse parses a trace document (named "trace" in errors).
func Parse(data []byte) (*Trace, error) { return parse("trace", data) }

// ParseNamed parses a trace document, naming it file in errors.
func ParseNamed(file string, data []byte) (*Trace, error) { return parse(file, data) }

type perr struct{ msg string }

func (e *perr) Error() string { return e.msg }

type parser struct {
	file string
}

func (p *parser) fail(path, format string, a ...any) {
	msg := fmt.Sprintf(format, a...)
	if path != "" {
		msg = path + ": " + msg
	}
	panic(&perr{fmt.Sprintf("%s: %s", p.file, msg)})
}

func parse(file string, data []byte) (t *Trace, err error) {
	p := &parser{file: file}
	defer func() {
		if r := recover(); r != nil {
			pe, ok := r.(*perr)
			if !ok {
				panic(r)
			}
			t, err = nil, pe
		}
	}()
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var root any
	if e := dec.Decode(&root); e != nil {
		p.fail("", "%s", jsonError(data, e))
	}
	if dec.More() {
		p.fail("", "invalid JSON: extra data after the document")
	}
	if _, e := dec.Token(); e == nil {
		p.fail("", "invalid JSON: extra data after the document")
	}
	m, ok := root.(map[string]any)
	if !ok {
		p.fail("", "not a JSON object (a memplan trace is one object with \"schema\": %q)", Schema)
	}
	schema, ok := m["schema"].(string)
	if !ok {
		if _, has := m["schema"]; has {
			p.fail("", "field \"schema\" must be a string")
		}
		p.fail("", "missing \"schema\": not a memplan trace (want %q)", Schema)
	}
	if schema != SchemaV1 && schema != SchemaV2 {
		if v, ok := strings.CutPrefix(schema, schemaPrefix); ok {
			if n, e := strconv.Atoi(v); e == nil && n > 2 {
				panic(&perr{fmt.Sprintf("%s is schema %s; this memplan reads v1 and v2 — upgrade memplan", file, schema)})
			}
		}
		panic(&perr{fmt.Sprintf("%s: schema %q is not a memplan trace (want %q)", file, schema, Schema)})
	}
	t = p.trace(m)
	t.Schema = schema
	if schema == SchemaV2 {
		t.ParamGrads = p.paramGrads(p.get(m, "", "param_grads"))
	}
	t.file = file
	p.check(t)
	t.dtype = t.scanDType()
	return t, nil
}

// jsonError turns a decoder error into one line with the line number.
func jsonError(data []byte, err error) string {
	if errors.Is(err, io.EOF) {
		return "empty document"
	}
	if errors.Is(err, io.ErrUnexpectedEOF) {
		return "truncated JSON (the file ends inside the document)"
	}
	var se *json.SyntaxError
	if errors.As(err, &se) {
		off := min(int(se.Offset), len(data))
		line := 1 + bytes.Count(data[:off], []byte("\n"))
		return fmt.Sprintf("invalid JSON at line %d (byte %d): %v", line, se.Offset, se)
	}
	return "invalid JSON: " + err.Error()
}

// ---- typed access with paths ----

func (p *parser) get(m map[string]any, path, key string) any {
	v, ok := m[key]
	if !ok {
		p.fail(path, "missing %q", key)
	}
	return v
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

func (p *parser) obj(v any, path string) map[string]any {
	m, ok := v.(map[string]any)
	if !ok {
		p.fail(path, "must be an object, got %s", kind(v))
	}
	return m
}

func (p *parser) list(v any, path string) []any {
	l, ok := v.([]any)
	if !ok {
		p.fail(path, "must be a list, got %s", kind(v))
	}
	return l
}

func kind(v any) string {
	switch x := v.(type) {
	case nil:
		return "null"
	case bool:
		return "a boolean"
	case json.Number:
		return "the number " + x.String()
	case string:
		return "a string"
	case []any:
		return "a list"
	case map[string]any:
		return "an object"
	}
	return fmt.Sprintf("%T", v)
}

func (p *parser) intv(v any, path string) int64 {
	n, ok := v.(json.Number)
	if !ok {
		p.fail(path, "must be an integer, got %s", kind(v))
	}
	i, err := strconv.ParseInt(n.String(), 10, 64)
	if err != nil {
		if f, e := strconv.ParseFloat(n.String(), 64); e == nil && f == math.Trunc(f) && math.Abs(f) < 1<<62 {
			return int64(f)
		}
		p.fail(path, "must be an integer, got %s", n)
	}
	return i
}

func (p *parser) strv(v any, path string) string {
	s, ok := v.(string)
	if !ok {
		p.fail(path, "must be a string, got %s", kind(v))
	}
	return s
}

func (p *parser) boolv(v any, path string) bool {
	b, ok := v.(bool)
	if !ok {
		p.fail(path, "must be a boolean, got %s", kind(v))
	}
	return b
}

func (p *parser) reqInt(m map[string]any, path, key string) int64 {
	return p.intv(p.get(m, path, key), join(path, key))
}

func (p *parser) reqStr(m map[string]any, path, key string) string {
	return p.strv(p.get(m, path, key), join(path, key))
}

func (p *parser) reqBool(m map[string]any, path, key string) bool {
	return p.boolv(p.get(m, path, key), join(path, key))
}

func (p *parser) optStr(m map[string]any, path, key string) string {
	v, ok := m[key]
	if !ok || v == nil {
		return ""
	}
	return p.strv(v, join(path, key))
}

func (p *parser) optInt(m map[string]any, path, key string) (int64, bool) {
	v, ok := m[key]
	if !ok || v == nil {
		return 0, false
	}
	return p.intv(v, join(path, key)), true
}

func (p *parser) ints(v any, path string) []int {
	l := p.list(v, path)
	out := make([]int, len(l))
	for i, x := range l {
		out[i] = p.storageID(x, fmt.Sprintf("%s[%d]", path, i))
	}
	return out
}

// storageID reads a storage id at path: an integer in [0, 2^31).
func (p *parser) storageID(v any, path string) int {
	n := p.intv(v, path)
	if n < 0 || n > math.MaxInt32 {
		p.fail(path, "storage id %d out of range", n)
	}
	return int(n)
}

func (p *parser) shape(v any, path string) []int64 {
	l := p.list(v, path)
	out := make([]int64, len(l))
	for i, x := range l {
		out[i] = p.intv(x, fmt.Sprintf("%s[%d]", path, i))
		if out[i] < 0 {
			p.fail(fmt.Sprintf("%s[%d]", path, i), "negative dimension %d", out[i])
		}
	}
	return out
}

// ---- document ----

func (p *parser) paramGrads(v any) []ParamGrad {
	l := p.list(v, "param_grads")
	out := make([]ParamGrad, len(l))
	for i, x := range l {
		path := fmt.Sprintf("param_grads[%d]", i)
		pm := p.obj(x, path)
		out[i] = ParamGrad{p.storageID(p.get(pm, path, "param"), join(path, "param")), p.storageID(p.get(pm, path, "grad"), join(path, "grad"))}
	}
	return out
}

func (p *parser) trace(m map[string]any) *Trace {
	t := &Trace{Schema: Schema, Phases: map[string]PhaseRange{}}
	t.Name = p.optStr(m, "", "name")
	t.Source = p.optStr(m, "", "source")
	if v, ok := m["producer"]; ok && v != nil {
		pm := p.obj(v, "producer")
		t.Torch = p.optStr(pm, "producer", "torch")
	}
	t.TraceDevice = Device(p.reqStr(m, "", "trace_device"))
	if v, ok := m["notes"]; ok && v != nil {
		for i, x := range p.list(v, "notes") {
			t.Notes = append(t.Notes, p.strv(x, fmt.Sprintf("notes[%d]", i)))
		}
	}
	t.Optimizer = p.optStr(m, "", "optimizer")
	if v, ok := m["foreach"]; ok && v != nil {
		b := p.boolv(v, "foreach")
		t.Foreach = &b
	}
	if bd, ok := p.optInt(m, "", "batch_dim"); ok {
		d := int(bd)
		t.BatchDim = &d
	}
	if sd, ok := p.optInt(m, "", "seq_dim"); ok {
		d := int(sd)
		t.SeqDim = &d
	}
	t.TraceBatch = p.reqInt(m, "", "trace_batch")
	if t.TraceBatch < 1 {
		p.fail("trace_batch", "must be at least 1, got %d", t.TraceBatch)
	}
	if t.SeqDim != nil {
		t.TraceSeq = p.intv(p.get(m, "", "trace_seq"), "trace_seq")
		if t.TraceSeq < 1 {
			p.fail("trace_seq", "must be at least 1 when seq_dim is set, got %d", t.TraceSeq)
		}
	} else if v, ok := m["trace_seq"]; ok && v != nil {
		// the length the builder ran at, with no size model in it
		if t.TraceSeq = p.intv(v, "trace_seq"); t.TraceSeq < 1 {
			p.fail("trace_seq", "must be at least 1 or null, got %d", t.TraceSeq)
		}
	}
	t.ScratchKind = ScratchKind(p.optStr(m, "", "scratch"))
	t.FLOPsSource = p.optStr(m, "", "flops")
	if n, ok := p.optInt(m, "", "n_params"); ok {
		t.NParams = n
	}
	if n, ok := p.optInt(m, "", "param_bytes"); ok {
		t.ParamBytes = n
	}
	if v, ok := m["phases"]; ok && v != nil {
		for k, x := range p.obj(v, "phases") {
			pr := p.obj(x, "phases."+k)
			t.Phases[k] = PhaseRange{int(p.reqInt(pr, "phases."+k, "first_event")), int(p.reqInt(pr, "phases."+k, "last_event"))}
		}
	}
	for i, x := range p.list(p.get(m, "", "initial_storages"), "initial_storages") {
		t.Initial = append(t.Initial, p.storage(x, fmt.Sprintf("initial_storages[%d]", i), t))
	}
	t.Events = p.events(p.get(m, "", "events"), "events", t)
	t.EndLive = p.ints(p.get(m, "", "end_live"), "end_live")
	fs := p.obj(p.get(m, "", "first_step"), "first_step")
	t.First.Exact = p.reqBool(fs, "first_step", "exact")
	t.First.OptimizerState = p.ints(p.get(fs, "first_step", "optimizer_state"), "first_step.optimizer_state")
	t.First.OptimizerEvents = p.events(p.get(fs, "first_step", "optimizer_events"), "first_step.optimizer_events", t)
	if v, ok := m["model_output"]; ok && v != nil {
		mo := p.obj(v, "model_output")
		t.ModelOutput = &ModelOutput{Storages: p.ints(p.get(mo, "model_output", "storages"), "model_output.storages"),
			ReturnedAt: int(p.reqInt(mo, "model_output", "returned_at")), Hold: p.optStr(mo, "model_output", "hold")}
		if h := t.ModelOutput.Hold; h != "" && !slices.Contains(Holds, h) {
			p.fail("model_output.hold", "unknown hold %q (want none, backward or next-forward)", h)
		}
	}
	return t
}

// poly reads the model of quantity ("bytes" or "flops") in m: its
// quantity_const and quantity_per_batch terms, and with a sequence size
// model its four sequence terms.
func (p *parser) poly(m map[string]any, path, quantity string, t *Trace) Poly {
	var s Poly
	terms := []*int64{&s.Const, &s.PerBatch}
	keys := []string{"_const", "_per_batch"}
	if t.HasSeq() {
		terms = append(terms, &s.PerSeq, &s.PerSeq2, &s.PerBatchSeq, &s.PerBatchSeq2)
		keys = append(keys, "_per_seq", "_per_seq2", "_per_batch_seq", "_per_batch_seq2")
	}
	for i, k := range keys {
		*terms[i] = p.reqInt(m, path, quantity+k)
	}
	return s
}

func (p *parser) storage(v any, path string, t *Trace) Storage {
	m := p.obj(v, path)
	s := Storage{}
	s.ID = p.storageID(p.get(m, path, "id"), join(path, "id"))
	s.Bytes = p.reqInt(m, path, "bytes")
	s.Poly = p.poly(m, path, "bytes", t)
	s.DType = p.reqStr(m, path, "dtype")
	s.Shape = p.shape(p.get(m, path, "shape"), join(path, "shape"))
	s.Category = p.reqStr(m, path, "category")
	switch s.Category {
	case CatParameter, CatGradient, CatOptimizerState, CatInput, CatActivation, CatTemporary:
	default:
		p.fail(join(path, "category"), "unknown category %q (want parameter, gradient, optimizer_state, input, activation or temporary)", s.Category)
	}
	s.Saved = p.reqBool(m, path, "saved")
	if v, ok := m["buffer"]; ok && v != nil {
		s.Buffer = p.boolv(v, join(path, "buffer"))
	}
	s.Module = p.optStr(m, path, "module")
	if s.Bytes < 0 {
		p.fail(join(path, "bytes"), "negative size %d", s.Bytes)
	}
	// A storage does not shrink as the batch grows: max bisects the
	// micro-batch on a peak that never falls (a bytes_per_batch of -16
	// made max say nothing fits where plan at a larger batch fitted).
	for i, v := range []int64{s.PerBatch, s.PerBatchSeq, s.PerBatchSeq2} {
		if v < 0 {
			k := []string{"bytes_per_batch", "bytes_per_batch_seq", "bytes_per_batch_seq2"}[i]
			p.fail(join(path, k), "%d: a storage cannot shrink as the batch grows", v)
		}
	}
	if got := s.Size(t.TraceBatch, t.TraceSeq); got != s.Bytes {
		p.fail(path, "the size model gives %d bytes at the trace batch, but \"bytes\" is %d", got, s.Bytes)
	}
	return s
}

func (p *parser) events(v any, path string, t *Trace) []Event {
	l := p.list(v, path)
	out := make([]Event, len(l))
	for i, x := range l {
		out[i] = p.event(x, fmt.Sprintf("%s[%d]", path, i), i, t)
	}
	return out
}

func (p *parser) event(v any, path string, i int, t *Trace) Event {
	m := p.obj(v, path)
	e := Event{}
	e.Index = int(p.reqInt(m, path, "index"))
	if e.Index != i {
		p.fail(join(path, "index"), "is %d, want %d (its position)", e.Index, i)
	}
	e.Op = p.reqStr(m, path, "op")
	e.Phase = p.reqStr(m, path, "phase")
	switch e.Phase {
	case PhaseForward, PhaseBackward, PhaseOptimizer:
	default:
		p.fail(join(path, "phase"), "unknown phase %q (want forward, backward or optimizer)", e.Phase)
	}
	e.Module = p.reqStr(m, path, "module")
	for j, x := range p.list(p.get(m, path, "alloc"), join(path, "alloc")) {
		e.Alloc = append(e.Alloc, p.storage(x, fmt.Sprintf("%s.alloc[%d]", path, j), t))
	}
	e.Free = p.ints(p.get(m, path, "free"), join(path, "free"))
	e.Saved = p.ints(p.get(m, path, "saved"), join(path, "saved"))
	for j, x := range p.list(p.get(m, path, "outputs"), join(path, "outputs")) {
		op := fmt.Sprintf("%s.outputs[%d]", path, j)
		om := p.obj(x, op)
		o := Output{}
		o.Storage = p.storageID(p.get(om, op, "storage"), join(op, "storage"))
		o.DType = p.optStr(om, op, "dtype")
		if sv, ok := om["shape"]; ok && sv != nil {
			o.Shape = p.shape(sv, join(op, "shape"))
		}
		if av, ok := om["alias"]; ok && av != nil {
			o.Alias = p.boolv(av, join(op, "alias"))
		}
		if iv, ok := om["inplace"]; ok && iv != nil {
			o.Inplace = p.boolv(iv, join(op, "inplace"))
		}
		e.Outputs = append(e.Outputs, o)
	}
	if iv, ok := m["inputs"]; ok && iv != nil {
		e.Inputs = p.ints(iv, join(path, "inputs"))
	}
	if sv, ok := m["scratch"]; ok && sv != nil {
		sp := join(path, "scratch")
		sm := p.obj(sv, sp)
		sc := &Scratch{Bytes: p.reqInt(sm, sp, "bytes")}
		if sc.Bytes < 0 {
			p.fail(join(sp, "bytes"), "negative scratch %d", sc.Bytes)
		}
		for k, x := range p.list(p.get(sm, sp, "points"), join(sp, "points")) {
			pp := fmt.Sprintf("%s.points[%d]", sp, k)
			pl := p.list(x, pp)
			if len(pl) != 3 {
				p.fail(pp, "must be [batch, seq, bytes], got %d numbers", len(pl))
			}
			pt := ScratchPoint{Batch: p.intv(pl[0], pp+"[0]"), Bytes: p.intv(pl[2], pp+"[2]")}
			if pl[1] != nil {
				pt.Seq = p.intv(pl[1], pp+"[1]")
			}
			if pt.Batch < 1 || pt.Bytes < 0 || pt.Seq < 0 {
				p.fail(pp, "bad point [%d, %d, %d]", pt.Batch, pt.Seq, pt.Bytes)
			}
			sc.Points = append(sc.Points, pt)
		}
		e.Scratch = sc
	}
	if fv, ok := m["flops"]; ok && fv != nil {
		e.FLOPsAt = p.intv(fv, join(path, "flops"))
		if e.FLOPsAt < 0 {
			p.fail(join(path, "flops"), "negative FLOPs %d", e.FLOPsAt)
		}
		f := p.poly(m, path, "flops", t)
		if got, ok := f.Checked(t.TraceBatch, t.TraceSeq); !ok || got != e.FLOPsAt {
			p.fail(path, "the FLOPs model gives %.0f at the trace batch, but \"flops\" is %d", f.Float(t.TraceBatch, t.TraceSeq), e.FLOPsAt)
		}
		e.FLOPs = &f
	}
	return e
}

// check verifies the document's invariants: ids unique, every storage an
// event reads, saves, views or frees live there, phases in order, v2's
// param_grads. Each error names the event index and its op.
func (p *parser) check(t *Trace) {
	// A training step's trace starts with its model's forward: without one
	// the steady step has no op for its peak (a plan of no events, or of an
	// optimizer step alone, had none to report and panicked on it).
	if !slices.ContainsFunc(t.Events, func(e Event) bool { return e.Phase == PhaseForward }) {
		what := "no events"
		if len(t.Events) > 0 {
			what = fmt.Sprintf("no forward event among its %d", len(t.Events))
		}
		p.fail("events", "%s: a trace records a training step, whose model's forward comes first", what)
	}
	w := &walker{p: p, known: map[int]bool{}, decl: declared(t)}
	live := map[int]bool{}
	for i, s := range t.Initial {
		if w.known[s.ID] {
			p.fail(fmt.Sprintf("initial_storages[%d]", i), "storage id %d listed twice", s.ID)
		}
		w.known[s.ID] = true
		live[s.ID] = true
	}
	steady := maps.Clone(live)
	w.walk(t.Events, "events", steady, false)
	for i, id := range t.EndLive {
		if !steady[id] {
			p.fail(fmt.Sprintf("end_live[%d]", i), "storage %d is not live after the last event", id)
		}
	}
	for i, id := range t.First.OptimizerState {
		if !live[id] {
			p.fail(fmt.Sprintf("first_step.optimizer_state[%d]", i), "storage %d is not an initial storage", id)
		}
	}
	// The first step: initial storages minus those its optimizer creates,
	// the steady forward and backward, then the recorded first optimizer
	// phase.
	created := t.FirstStepCreated()
	first := map[int]bool{}
	for k := range live {
		if !created[k] {
			first[k] = true
		}
	}
	fb := make([]Event, 0, len(t.Events))
	for _, e := range t.Events {
		if e.Phase != PhaseOptimizer {
			fb = append(fb, e)
		}
	}
	w.walk(fb, "events", first, true)
	for i := range t.First.OptimizerEvents {
		e := &t.First.OptimizerEvents[i]
		if e.Phase != PhaseOptimizer {
			p.fail(fmt.Sprintf("first_step.optimizer_events[%d].phase", i), "is %q, want optimizer", e.Phase)
		}
	}
	w.walk(t.First.OptimizerEvents, "first_step.optimizer_events", first, true)
	if mo := t.ModelOutput; mo != nil {
		p.checkModelOutput(t, mo)
	}
	if t.Schema != SchemaV1 {
		p.checkParamGrads(t)
	}
}

// declared is every storage id the document declares: initial storages and
// every event's alloc.
func declared(t *Trace) map[int]bool {
	d := map[int]bool{}
	for i := range t.Initial {
		d[t.Initial[i].ID] = true
	}
	for _, evs := range [][]Event{t.Events, t.First.OptimizerEvents} {
		for i := range evs {
			for j := range evs[i].Alloc {
				d[evs[i].Alloc[j].ID] = true
			}
		}
	}
	return d
}

// walker replays events over a live set, refusing any use of a storage that
// is not live there: read (inputs), saved, viewed (an alias output), freed.
type walker struct {
	p       *parser
	known   map[int]bool   // ids allocated so far (the steady walk)
	decl    map[int]bool   // ids the document declares
	freedAt map[int]string // the event that freed each storage, in this walk
}

var phaseOrder = map[string]int{PhaseForward: 0, PhaseBackward: 1, PhaseOptimizer: 2}

func (w *walker) walk(events []Event, path string, live map[int]bool, firstStep bool) {
	p := w.p
	w.freedAt = map[int]string{}
	last := 0
	for i := range events {
		e := &events[i]
		ep := fmt.Sprintf("%s[%d]", path, i)
		at := func(field string, j int) string { return fmt.Sprintf("%s.%s[%d] (%s)", ep, field, j, e.Op) }
		if phaseOrder[e.Phase] < last {
			p.fail(join(ep, "phase"), "%s after %s", e.Phase, []string{"forward", "backward", "optimizer"}[last])
		}
		last = phaseOrder[e.Phase]
		for j, a := range e.Alloc {
			if live[a.ID] {
				p.fail(at("alloc", j), "allocates storage %d, which is live", a.ID)
			}
			if w.known[a.ID] && !firstStep {
				p.fail(at("alloc", j), "storage id %d is allocated twice", a.ID)
			}
			w.known[a.ID] = true
			live[a.ID] = true
			delete(w.freedAt, a.ID)
		}
		// after the allocs: a tensor made outside the dispatcher (torch.tensor)
		// is first seen, and allocated, as an input of the op that reads it
		for j, id := range e.Inputs {
			w.use(live, id, at("inputs", j), "reads")
		}
		for j, o := range e.Outputs {
			verb := "outputs"
			if o.Alias {
				verb = "returns a view of"
			}
			w.use(live, o.Storage, at("outputs", j)+".storage", verb)
		}
		for j, id := range e.Saved {
			w.use(live, id, at("saved", j), "saves")
		}
		for j, id := range e.Free {
			if _, twice := w.freedAt[id]; twice {
				p.fail(at("free", j), "frees storage %d twice (it was freed after %s)", id, w.freedAt[id])
			}
			w.use(live, id, at("free", j), "frees")
			delete(live, id)
			w.freedAt[id] = ep
		}
	}
}

// use refuses verb on storage id at path unless it is live.
func (w *walker) use(live map[int]bool, id int, path, verb string) {
	switch {
	case live[id]:
	case w.freedAt[id] != "":
		w.p.fail(path, "%s storage %d, which was freed after %s", verb, id, w.freedAt[id])
	case !w.decl[id]:
		w.p.fail(path, "%s storage %d, which is never allocated (no initial storage or alloc has that id)", verb, id)
	default:
		w.p.fail(path, "%s storage %d, which is not live", verb, id)
	}
}

// checkParamGrads: each pair is an initial parameter (not a buffer), listed
// once, and a gradient storage of the step.
func (p *parser) checkParamGrads(t *Trace) {
	param, grad := map[int]bool{}, map[int]bool{}
	for i := range t.Initial {
		s := &t.Initial[i]
		param[s.ID] = s.Category == CatParameter && !s.Buffer
		grad[s.ID] = s.Category == CatGradient
	}
	for i := range t.Events {
		for _, a := range t.Events[i].Alloc {
			grad[a.ID] = a.Category == CatGradient
		}
	}
	seen := map[int]bool{}
	for i, pg := range t.ParamGrads {
		path := fmt.Sprintf("param_grads[%d]", i)
		if !param[pg.Param] {
			p.fail(join(path, "param"), "storage %d is not a parameter (an initial storage of category parameter, not a buffer)", pg.Param)
		}
		if seen[pg.Param] {
			p.fail(join(path, "param"), "parameter %d is listed twice", pg.Param)
		}
		seen[pg.Param] = true
		if !grad[pg.Grad] {
			p.fail(join(path, "grad"), "storage %d is not a gradient (a storage of category gradient)", pg.Grad)
		}
	}
}

// checkModelOutput: the output's storages are allocated by the steady step's
// forward events up to the one the model returned at.
func (p *parser) checkModelOutput(t *Trace, mo *ModelOutput) {
	if mo.ReturnedAt < -1 || mo.ReturnedAt >= len(t.Events) || (mo.ReturnedAt >= 0 && t.Events[mo.ReturnedAt].Phase != PhaseForward) {
		p.fail("model_output.returned_at", "%d is not the index of a forward event", mo.ReturnedAt)
	}
	made := map[int]bool{}
	for i := 0; i <= mo.ReturnedAt; i++ {
		for _, a := range t.Events[i].Alloc {
			made[a.ID] = true
		}
	}
	for i, id := range mo.Storages {
		if !made[id] {
			p.fail(fmt.Sprintf("model_output.storages[%d]", i), "storage %d is not allocated by the forward before event %d", id, mo.ReturnedAt)
		}
	}
}
