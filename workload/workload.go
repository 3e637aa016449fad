// Package workload reads memplan.workload/v1 files (docs/measure-format.md):
// the pinned training job — model builder, dtype, batch, sequence, optimizer,
// strategy — that python/memplan_torch measures and memplan predicts. It is
// the Go twin of memplan_torch/workload.py: both read their fields, types,
// defaults, ranges and choices, and how a plain YAML scalar reads, from one
// table (fields.json), and both run the odd-YAML corpus of
// testdata/workload/odd against the same expectations, so prediction and
// measurement cannot drift apart.
package workload

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/memplan/memplan/internal/boundedio"
)

// Schema is the version this package reads.
const Schema = "memplan.workload/v1"

// Workload is one validated workload with defaults filled.
type Workload struct {
	Schema    string         `json:"schema"`
	Name      string         `json:"name"`
	Model     string         `json:"model"` // MODULE:FUNCTION
	ModelArgs map[string]any `json:"model_args"`
	DType     string         `json:"dtype"`
	Batch     int            `json:"batch"` // samples per optimizer step
	SeqLen    *int           `json:"seq_len"`
	BatchDim  int            `json:"batch_dim"`
	Device    Device         `json:"device"`
	Warmup    int            `json:"warmup"`
	Iters     int            `json:"iters"`
	Seed      int            `json:"seed"`
	Optimizer string         `json:"optimizer"`
	Foreach   *bool          `json:"foreach"`
	// HoldOutputs is how long the loop keeps the model's output: none,
	// backward or next-forward (memplan's loop.hold-outputs).
	HoldOutputs string   `json:"hold_outputs"`
	Strategy    Strategy `json:"strategy"`
}

// Device is a workload's device field: where memplan_torch runs and
// measures it.
type Device string

const (
	DeviceAuto Device = "auto" // cuda when present, else cpu (memplan_torch measure.resolve_device)
	DeviceCPU  Device = "cpu"
	DeviceCUDA Device = "cuda"
)

// CheckpointMode is a workload's strategy.checkpoint field.
type CheckpointMode string

const (
	CheckpointNone   CheckpointMode = "none"
	CheckpointBlocks CheckpointMode = "blocks" // every block of the module list (checkpoint_blocks)
)

// OffloadMode is a workload's strategy.offload field.
type OffloadMode string

const (
	OffloadNone        OffloadMode = "none"
	OffloadActivations OffloadMode = "activations" // saved activations go to host memory
)

// Strategy is the workload's memory-saving recipe.
type Strategy struct {
	Accumulation     int            `json:"accumulation"`
	Checkpoint       CheckpointMode `json:"checkpoint"`        // none | blocks
	CheckpointBlocks *string        `json:"checkpoint_blocks"` // module path of the block list
	Offload          OffloadMode    `json:"offload"`           // none | activations
}

// MicroBatch is Batch / Accumulation.
func (w *Workload) MicroBatch() int { return w.Batch / w.Strategy.Accumulation }

// Checkpointed reports whether the workload checkpoints its blocks.
func (w *Workload) Checkpointed() bool { return w.Strategy.Checkpoint == CheckpointBlocks }

// Accepted values (fields.json's choices; memplan_torch: DEVICES,
// CHECKPOINTS, OFFLOADS, HOLDS, harness.OPTIMIZERS). Devices, Checkpoints
// and Offloads spell the Device, CheckpointMode and OffloadMode constants;
// the reader converts a field only after checking it is one of them.
var (
	Devices     = choices("device")
	Checkpoints = choices("strategy.checkpoint")
	Offloads    = choices("strategy.offload")
	Holds       = choices("hold_outputs")
	Optimizers  = choices("optimizer")
)

// FieldNames lists the top-level and strategy field names (for tests and
// documentation).
func FieldNames() (top, strategy []string) {
	for _, f := range table.Top {
		top = append(top, f.Name)
	}
	for _, f := range table.Strategy {
		strategy = append(strategy, f.Name)
	}
	return top, strategy
}

// ErrWorkload wraps every invalid-workload error.
var ErrWorkload = errors.New("invalid workload")

type werr struct{ msg string }

func (e *werr) Error() string { return e.msg }
func (e *werr) Unwrap() error { return ErrWorkload }

func bad(where, format string, a ...any) error {
	// A tag or key quoted from the file may hold a line break (the fuzzer's
	// "!0%0A" tag): the message stays one line.
	msg := strings.NewReplacer("\n", `\n`, "\r", `\r`).Replace(fmt.Sprintf(format, a...))
	return &werr{"" + where + ": " + msg}
}

// Load reads a YAML or JSON workload file and validates it; errors name the
// file and the field.
func Load(path string) (*Workload, error) {
	data, err := boundedio.ReadFile(path, boundedio.SmallFile)
	if err != nil {
		var pe *os.PathError
		if errors.As(err, &pe) {
			return nil, fmt.Errorf("%s: %v", path, pe.Err)
		}
		return nil, fmt.Errorf("%w", err)
	}
	return Parse(filepath.Base(path), data)
}

// Parse validates a workload document (YAML, of which JSON is a subset);
// where names it in errors.
func Parse(where string, data []byte) (*Workload, error) {
	obj, err := decodeYAML(where, data)
	if err != nil {
		return nil, err
	}
	return Validate(where, obj)
}

// Validate checks a decoded document (numbers as json.Number, int64,
// bigInt, float64 or int) against the field table (fields.json) and returns
// the workload with defaults filled, as memplan_torch.workload.validate
// does.
func Validate(where string, obj any) (*Workload, error) {
	top, err := check(where, obj, table.Top, "")
	if err != nil {
		return nil, err
	}
	var sobj any = map[string]any{}
	if v := top["strategy"]; v != nil {
		sobj = v
	}
	s, err := check(where+": strategy", sobj, table.Strategy, "strategy.")
	if err != nil {
		return nil, err
	}
	w := fill(top, s)
	if err := w.validate(where); err != nil {
		return nil, err
	}
	return w, nil
}

// fill is the workload of the checked top-level and strategy fields.
func fill(top, s map[string]any) *Workload {
	w := &Workload{
		Schema: top["schema"].(string), Model: top["model"].(string), DType: top["dtype"].(string),
		Batch: toInt(top["batch"]), BatchDim: toInt(top["batch_dim"]), Device: Device(top["device"].(string)),
		Warmup: toInt(top["warmup"]), Iters: toInt(top["iters"]), Seed: toInt(top["seed"]),
		Optimizer: top["optimizer"].(string), ModelArgs: map[string]any{}, HoldOutputs: top["hold_outputs"].(string),
	}
	if v := top["name"]; v != nil {
		w.Name = v.(string)
	} else {
		w.Name = w.Model[strings.LastIndexByte(w.Model, ':')+1:]
	}
	if v := top["seq_len"]; v != nil {
		n := toInt(v)
		w.SeqLen = &n
	}
	if v := top["foreach"]; v != nil {
		b := v.(bool)
		w.Foreach = &b
	}
	if v := top["model_args"]; v != nil {
		w.ModelArgs = v.(map[string]any)
	}
	w.Strategy = Strategy{Accumulation: toInt(s["accumulation"]), Checkpoint: CheckpointMode(s["checkpoint"].(string)), Offload: OffloadMode(s["offload"].(string))}
	if v := s["checkpoint_blocks"]; v != nil {
		b := v.(string)
		w.Strategy.CheckpointBlocks = &b
	}
	return w
}

// validate checks what the table's types, ranges and choices do not.
func (w *Workload) validate(where string) error {
	if w.Schema != Schema {
		return bad(where, "field 'schema' must be %s, got %s", quote(Schema), quote(w.Schema))
	}
	if !strings.Contains(w.Model, ":") {
		return bad(where, "field 'model' must be MODULE:FUNCTION, got %s", quote(w.Model))
	}
	if w.Batch%w.Strategy.Accumulation != 0 {
		return bad(where, "field 'batch' (%d) must be divisible by 'strategy.accumulation' (%d)", w.Batch, w.Strategy.Accumulation)
	}
	return nil
}

func toInt(v any) int {
	switch x := v.(type) {
	case int64:
		return int(x)
	case int:
		return x
	}
	return 0
}

// check refuses unknown fields, wrong types, values out of range or not
// among the choices, and missing required fields, and fills defaults;
// integers come back as int64. prefix names the fields in messages
// ("strategy.").
func check(where string, obj any, spec []fieldSpec, prefix string) (map[string]any, error) {
	m, ok := obj.(map[string]any)
	if !ok {
		return nil, bad(where, "must be a mapping, got %s", describe(obj))
	}
	known := map[string]*fieldSpec{}
	var names []string
	for i := range spec {
		known[spec[i].Name] = &spec[i]
		names = append(names, spec[i].Name)
	}
	sort.Strings(names)
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := map[string]any{}
	for _, k := range keys {
		f, ok := known[k]
		if !ok {
			return nil, bad(where, "unknown field '%s' (known fields: %s)", k, strings.Join(names, ", "))
		}
		if m[k] == nil {
			continue
		}
		v, at, err := f.value(m[k])
		if err != "" {
			return nil, bad(strings.TrimSuffix(where, ": strategy"), "field '%s%s%s' %s", prefix, k, at, err)
		}
		out[k] = v
	}
	for _, f := range spec {
		if out[f.Name] == nil && f.Default != nil {
			out[f.Name] = f.Default
		}
		if out[f.Name] == nil && f.Required {
			return nil, bad(where, "missing required field '%s%s'", prefix, f.Name)
		}
	}
	return out, nil
}

// value is v as field f's type, or why it is not: where inside v the
// refusal is ("" for v itself, ".n" for model_args' n) and "must be ...".
func (f *fieldSpec) value(v any) (any, string, string) {
	got, ok := typed(v, f.Type)
	if !ok {
		return nil, "", fmt.Sprintf("must be %s, got %s", article(f.Type), describe(v))
	}
	switch x := got.(type) {
	case bigInt, int64:
		if why := f.bounds(x); why != "" {
			return nil, "", why
		}
	case string:
		if f.Choices != nil && !contains(f.Choices, x) && f.Aliases[x] == "" {
			return nil, "", fmt.Sprintf("must be one of %s, got %s", f.choiceList(), quote(x))
		}
	case map[string]any:
		if f.Min != nil || f.Max != nil {
			if at, why := f.inside(x, ""); why != "" {
				return nil, at, why
			}
		}
	}
	return got, "", ""
}

// bounds is why integer v (int64 or bigInt) is outside f's min and max, or
// "".
func (f *fieldSpec) bounds(v any) string {
	switch x := v.(type) {
	case bigInt:
		if strings.HasPrefix(string(x), "-") {
			return fmt.Sprintf("must be >= %d, got %s", *f.Min, x.short())
		}
		return fmt.Sprintf("must be <= %d, got %s", *f.Max, x.short())
	case int64:
		if f.Min != nil && x < *f.Min {
			return fmt.Sprintf("must be >= %d, got %d", *f.Min, x)
		}
		if f.Max != nil && x > *f.Max {
			return fmt.Sprintf("must be <= %d, got %d", *f.Max, x)
		}
	}
	return ""
}

// inside checks the integers inside a mapping's value v (at: its path
// below the field) against f's bounds, keys in sorted order: the path of
// the first one outside them and why, or "", "".
func (f *fieldSpec) inside(v any, at string) (string, string) {
	switch x := v.(type) {
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			if p, why := f.inside(x[k], at+"."+k); why != "" {
				return p, why
			}
		}
	case []any:
		for _, e := range x {
			if p, why := f.inside(e, at); why != "" {
				return p, why
			}
		}
	case int64, bigInt:
		return at, f.bounds(x)
	}
	return "", ""
}

// choiceList is f's choices for a message, then its aliases in sorted
// order: "float32, float16 (or fp16, fp32)".
func (f *fieldSpec) choiceList() string {
	s := strings.Join(f.Choices, ", ")
	if len(f.Aliases) == 0 {
		return s
	}
	var as []string
	for a := range f.Aliases {
		as = append(as, a)
	}
	sort.Strings(as)
	return s + " (or " + strings.Join(as, ", ") + ")"
}

func contains(xs []string, v string) bool {
	for _, x := range xs {
		if x == v {
			return true
		}
	}
	return false
}

// typed is v as type t (fields.json), integers as int64 or bigInt.
func typed(v any, t string) (any, bool) {
	switch t {
	case "integer":
		switch x := v.(type) {
		case json.Number:
			if n, err := strconv.ParseInt(x.String(), 10, 64); err == nil {
				return n, true
			}
			if b, ok := new(big.Int).SetString(x.String(), 10); ok {
				return bigInt(b.String()), true
			}
		case int:
			return int64(x), true
		case int64, bigInt:
			return x, true
		}
		return nil, false
	case "string":
		s, ok := v.(string)
		return s, ok
	case "mapping":
		m, ok := v.(map[string]any)
		return m, ok
	case "boolean":
		b, ok := v.(bool)
		return b, ok
	}
	return nil, false
}

// quote is s as a JSON string (one line whatever it holds), as
// memplan_torch/workload.py's _quote writes it.
func quote(s string) string {
	var b strings.Builder
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s)
	return strings.TrimSuffix(b.String(), "\n")
}

// article is "an integer", "a string", ...
func article(t string) string {
	if t == "integer" {
		return "an integer"
	}
	return "a " + t
}

// describe names v's kind as memplan_torch/workload.py's _describe does.
func describe(v any) string {
	switch x := v.(type) {
	case nil:
		return "null"
	case string:
		return "a string"
	case bool:
		return "a boolean"
	case int, int64, bigInt:
		return "an integer"
	case float64:
		return "a float"
	case json.Number:
		if _, ok := new(big.Int).SetString(x.String(), 10); ok {
			return "an integer"
		}
		return "a float"
	case []any:
		return "a list"
	case map[string]any:
		return "a mapping"
	}
	return fmt.Sprintf("a %T", v)
}
