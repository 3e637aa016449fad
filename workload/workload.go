// Package workload reads memplan.workload/v1 files (docs/measure-format.md):
// the pinned training job — model builder, dtype, batch, sequence, optimizer,
// strategy — that python/memplan_torch measures and memplan predicts. It is
// the Go twin of memplan_torch/workload.py; a test parses every workload of
// the validation suite with both and requires the same result, and compares
// their field tables, so prediction and measurement cannot drift apart.
package workload

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/memplan/memplan/internal/boundedio"
	"sigs.k8s.io/yaml"
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

type kind uint8

const (
	kInt kind = iota
	kStr
	kMap
	kBool
)

func (k kind) String() string {
	return [...]string{"integer", "string", "mapping", "boolean"}[k]
}

type field struct {
	name string
	kind kind
	def  any // nil: none (required or null)
}

// Top and strategy fields, in memplan_torch/workload.py's order (_TOP,
// _STRATEGY); TestFieldsMatchPython holds the two tables equal.
var topFields = []field{
	{"schema", kStr, Schema},
	{"name", kStr, nil},
	{"model", kStr, nil},
	{"model_args", kMap, nil},
	{"dtype", kStr, "float32"},
	{"batch", kInt, nil},
	{"seq_len", kInt, nil},
	{"batch_dim", kInt, int64(0)},
	{"device", kStr, "auto"},
	{"warmup", kInt, int64(1)},
	{"iters", kInt, int64(3)},
	{"seed", kInt, int64(0)},
	{"optimizer", kStr, "adamw"},
	{"foreach", kBool, nil},
	{"hold_outputs", kStr, "none"},
	{"strategy", kMap, nil},
}

var strategyFields = []field{
	{"accumulation", kInt, int64(1)},
	{"checkpoint", kStr, "none"},
	{"checkpoint_blocks", kStr, nil},
	{"offload", kStr, "none"},
}

var required = []string{"model", "batch"}

// Accepted values (memplan_torch: DEVICES, CHECKPOINTS, OFFLOADS,
// harness.OPTIMIZERS, compat.parse_dtype). Devices, Checkpoints and Offloads
// spell the Device, CheckpointMode and OffloadMode constants; the reader
// converts a field only after checking it is one of them.
var (
	Devices     = []string{"auto", "cpu", "cuda"}
	Checkpoints = []string{"none", "blocks"}
	Offloads    = []string{"none", "activations"}
	Holds       = []string{"none", "backward", "next-forward"}
	Optimizers  = []string{"adamw", "sgd", "sgd-momentum"}
	dtypes      = map[string]bool{"float32": true, "float16": true, "bfloat16": true, "float64": true,
		"fp32": true, "float": true, "fp16": true, "half": true, "bf16": true, "fp64": true, "double": true}
)

// FieldNames lists the top-level and strategy field names (for tests and
// documentation).
func FieldNames() (top, strategy []string) {
	for _, f := range topFields {
		top = append(top, f.name)
	}
	for _, f := range strategyFields {
		strategy = append(strategy, f.name)
	}
	return top, strategy
}

// ErrWorkload wraps every invalid-workload error.
var ErrWorkload = errors.New("invalid workload")

type werr struct{ msg string }

func (e *werr) Error() string { return e.msg }
func (e *werr) Unwrap() error { return ErrWorkload }

func bad(where, format string, a ...any) error {
	return &werr{"" + where + ": " + fmt.Sprintf(format, a...)}
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
	js, err := yaml.YAMLToJSON(data)
	if err != nil {
		msg := strings.TrimPrefix(err.Error(), "error converting YAML to JSON: ")
		return nil, bad(where, "invalid YAML: %s", strings.ReplaceAll(msg, "\n", " "))
	}
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.UseNumber()
	var obj any
	if err := dec.Decode(&obj); err != nil {
		return nil, bad(where, "invalid document: %v", err)
	}
	return Validate(where, obj)
}

// Validate checks a decoded document (numbers as json.Number, float64 or
// int) and returns the workload with defaults filled, as
// memplan_torch.workload.validate does.
func Validate(where string, obj any) (*Workload, error) {
	top, err := check(where, obj, topFields)
	if err != nil {
		return nil, err
	}
	for _, k := range required {
		if top[k] == nil {
			return nil, bad(where, "missing required field '%s'", k)
		}
	}
	w := &Workload{
		Schema: top["schema"].(string), Model: top["model"].(string), DType: top["dtype"].(string),
		Batch: toInt(top["batch"]), BatchDim: toInt(top["batch_dim"]), Device: Device(top["device"].(string)),
		Warmup: toInt(top["warmup"]), Iters: toInt(top["iters"]), Seed: toInt(top["seed"]),
		Optimizer: top["optimizer"].(string), ModelArgs: map[string]any{}, HoldOutputs: top["hold_outputs"].(string),
	}
	if v := top["name"]; v != nil {
		w.Name = v.(string)
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
	if w.Schema != Schema {
		return nil, bad(where, "field 'schema' must be '%s', got '%s'", Schema, w.Schema)
	}
	if !strings.Contains(w.Model, ":") {
		return nil, bad(where, "field 'model' must be MODULE:FUNCTION, got '%s'", w.Model)
	}
	if w.Batch < 1 {
		return nil, bad(where, "field 'batch' must be >= 1, got %d", w.Batch)
	}
	if w.SeqLen != nil && *w.SeqLen < 1 {
		return nil, bad(where, "field 'seq_len' must be >= 1, got %d", *w.SeqLen)
	}
	for _, f := range []struct {
		name string
		v    int
	}{{"warmup", w.Warmup}, {"seed", w.Seed}, {"batch_dim", w.BatchDim}} {
		if f.v < 0 {
			return nil, bad(where, "field '%s' must be >= 0, got %d", f.name, f.v)
		}
	}
	if w.Iters < 1 {
		return nil, bad(where, "field 'iters' must be >= 1, got %d", w.Iters)
	}
	if !dtypes[w.DType] {
		return nil, bad(where, "field 'dtype': dtype '%s' is not a floating-point torch dtype (float32, float16, bfloat16, float64)", w.DType)
	}
	if !contains(Devices, string(w.Device)) {
		return nil, bad(where, "field 'device' must be one of %s, got '%s'", strings.Join(Devices, ", "), w.Device)
	}
	if !contains(Optimizers, w.Optimizer) {
		return nil, bad(where, "field 'optimizer': unknown optimizer '%s' (choose one of: %s)", w.Optimizer, strings.Join(Optimizers, ", "))
	}
	if !contains(Holds, w.HoldOutputs) {
		return nil, bad(where, "field 'hold_outputs' must be one of %s, got '%s'", strings.Join(Holds, ", "), w.HoldOutputs)
	}
	var sobj any = map[string]any{}
	if v := top["strategy"]; v != nil {
		sobj = v
	}
	s, err := check(where+": strategy", sobj, strategyFields)
	if err != nil {
		return nil, err
	}
	w.Strategy = Strategy{Accumulation: toInt(s["accumulation"]), Checkpoint: CheckpointMode(s["checkpoint"].(string)), Offload: OffloadMode(s["offload"].(string))}
	if v := s["checkpoint_blocks"]; v != nil {
		b := v.(string)
		w.Strategy.CheckpointBlocks = &b
	}
	if w.Strategy.Accumulation < 1 {
		return nil, bad(where, "field 'strategy.accumulation' must be >= 1, got %d", w.Strategy.Accumulation)
	}
	if w.Batch%w.Strategy.Accumulation != 0 {
		return nil, bad(where, "field 'batch' (%d) must be divisible by 'strategy.accumulation' (%d)", w.Batch, w.Strategy.Accumulation)
	}
	if !contains(Checkpoints, string(w.Strategy.Checkpoint)) {
		return nil, bad(where, "field 'strategy.checkpoint' must be one of %s, got '%s'", strings.Join(Checkpoints, ", "), w.Strategy.Checkpoint)
	}
	if !contains(Offloads, string(w.Strategy.Offload)) {
		return nil, bad(where, "field 'strategy.offload' must be one of %s, got '%s'", strings.Join(Offloads, ", "), w.Strategy.Offload)
	}
	if w.Name == "" && top["name"] == nil {
		w.Name = w.Model[strings.LastIndexByte(w.Model, ':')+1:]
	}
	return w, nil
}

func contains(xs []string, v string) bool {
	for _, x := range xs {
		if x == v {
			return true
		}
	}
	return false
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

// check refuses unknown fields and wrong types and fills defaults; integers
// come back as int64.
func check(where string, obj any, spec []field) (map[string]any, error) {
	m, ok := obj.(map[string]any)
	if !ok {
		return nil, bad(where, "must be a mapping, got %s", describe(obj))
	}
	known := map[string]field{}
	var names []string
	for _, f := range spec {
		known[f.name] = f
		names = append(names, f.name)
	}
	sort.Strings(names)
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := map[string]any{}
	for _, k := range keys {
		v := m[k]
		f, ok := known[k]
		if !ok {
			return nil, bad(where, "unknown field '%s' (known fields: %s)", k, strings.Join(names, ", "))
		}
		if v == nil {
			continue
		}
		got, ok := typed(v, f.kind)
		if !ok {
			return nil, bad(where, "field '%s' must be a %s, got %s", k, f.kind, describe(v))
		}
		out[k] = got
	}
	for _, f := range spec {
		if out[f.name] == nil && f.def != nil {
			out[f.name] = f.def
		}
	}
	return out, nil
}

func typed(v any, k kind) (any, bool) {
	switch k {
	case kInt:
		switch x := v.(type) {
		case json.Number:
			n, err := strconv.ParseInt(x.String(), 10, 64)
			if err != nil {
				return nil, false
			}
			return n, true
		case int:
			return int64(x), true
		case int64:
			return x, true
		case float64:
			if x == float64(int64(x)) && !strings.ContainsAny(strconv.FormatFloat(x, 'g', -1, 64), ".e") {
				return int64(x), true
			}
		}
		return nil, false
	case kStr:
		s, ok := v.(string)
		return s, ok
	case kMap:
		m, ok := v.(map[string]any)
		return m, ok
	case kBool:
		b, ok := v.(bool)
		return b, ok
	}
	return nil, false
}

func describe(v any) string {
	switch x := v.(type) {
	case nil:
		return "null"
	case string:
		return strconv.Quote(x)
	case bool:
		if x {
			return "true"
		}
		return "false"
	case json.Number:
		return x.String()
	case []any:
		return "a list"
	case map[string]any:
		return "a mapping"
	}
	return fmt.Sprint(v)
}
