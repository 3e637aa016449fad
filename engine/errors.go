package engine

import (
	"fmt"
	"strings"
)

// Field is a part of a job a problem can be about. A library error names
// it in words; package cli, which alone knows flags, names it as its flag
// (FieldError.Render), and a file reader may name it as its key.
type Field uint8

const (
	FieldNone Field = iota
	FieldModel
	FieldTrace
	FieldMode
	FieldMicroBatch
	FieldSeq
	FieldAccum
	FieldGenTokens
	FieldPrecision
	FieldCheckpoint
	FieldTP
	FieldSP
	FieldEP
	FieldDP
	FieldZeRO
	FieldPP
	FieldOffload
	FieldLoRA
	FieldQLoRA
	FieldGPU
	FieldCapacity
	FieldAllow
	FieldGPUs
	FieldGlobalBatch
	FieldHeadroom
	FieldSet
	FieldHostMemory
	FieldGPUsPerNode
	FieldEmit
	FieldAttention
	FieldPPInterleave
)

// fieldNames are each field's key (how a message refers to it: "{key}")
// and the words a library message uses for it.
var fieldNames = [...]struct{ key, words string }{
	FieldNone:         {"", ""},
	FieldModel:        {"model", "model"},
	FieldTrace:        {"graph", "trace"},
	FieldMode:         {"mode", "mode"},
	FieldMicroBatch:   {"micro-batch", "micro-batch"},
	FieldSeq:          {"seq", "sequence length"},
	FieldAccum:        {"accum", "gradient accumulation"},
	FieldGenTokens:    {"gen-tokens", "generated tokens"},
	FieldPrecision:    {"precision", "precision"},
	FieldCheckpoint:   {"checkpoint", "checkpointing"},
	FieldTP:           {"tp", "tensor parallelism"},
	FieldSP:           {"sp", "sequence parallelism"},
	FieldEP:           {"ep", "expert parallelism"},
	FieldDP:           {"dp", "data parallelism"},
	FieldZeRO:         {"zero", "ZeRO stage"},
	FieldPP:           {"pp", "pipeline parallelism"},
	FieldOffload:      {"offload", "offload"},
	FieldLoRA:         {"lora", "LoRA"},
	FieldQLoRA:        {"qlora", "QLoRA"},
	FieldGPU:          {"gpu", "GPU"},
	FieldCapacity:     {"budget", "memory budget"},
	FieldAllow:        {"allow", "allowed change"},
	FieldGPUs:         {"gpus", "GPU count"},
	FieldGlobalBatch:  {"global-batch", "global batch"},
	FieldHeadroom:     {"headroom", "headroom"},
	FieldSet:          {"set", "recipe setting"},
	FieldHostMemory:   {"host-memory", "host memory per node"},
	FieldGPUsPerNode:  {"gpus-per-node", "GPUs per node"},
	FieldEmit:         {"emit", "framework config"},
	FieldAttention:    {"attention", "attention"},
	FieldPPInterleave: {"pp-interleave", "pipeline interleave"},
}

// Key is how messages refer to f ("{micro-batch}").
func (f Field) Key() string { return fieldNames[f].key }

func (f Field) String() string { return fieldNames[f].words }

// Fields lists every field but FieldNone.
func Fields() []Field {
	out := make([]Field, 0, len(fieldNames)-1)
	for f := FieldNone + 1; int(f) < len(fieldNames); f++ {
		out = append(out, f)
	}
	return out
}

// FieldError is a problem with one field of a job. Msg names fields as
// {key} (Field.Key), the one it is about included: Error fills in their
// words, Render whatever its caller calls them.
type FieldError struct {
	Field Field
	Msg   string
}

func (e *FieldError) Error() string { return e.Render(Field.String) }

// Render is the message with every field named by name.
func (e *FieldError) Render(name func(Field) string) string {
	msg := e.Msg
	if !strings.Contains(msg, "{") {
		return msg
	}
	for _, f := range Fields() {
		msg = strings.ReplaceAll(msg, "{"+f.Key()+"}", name(f))
	}
	return msg
}

// fieldErr is a FieldError about f (format names fields as {key}).
func fieldErr(f Field, format string, a ...any) *FieldError {
	return &FieldError{Field: f, Msg: fmt.Sprintf(format, a...)}
}

// invalid is an invalid-spec error about field f.
func invalid(f Field, format string, a ...any) error {
	return fmt.Errorf("%w: %w", ErrSpec, fieldErr(f, format, a...))
}

// FieldErrorf is a FieldError about f for the packages that check a job
// beside engine (search, recipe); format names fields as {key}.
func FieldErrorf(f Field, format string, a ...any) error { return fieldErr(f, format, a...) }
