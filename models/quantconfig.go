package models

import (
	"encoding/json"
	"fmt"
	"strings"
)

// Quantization is a config.json's quantization_config: how a pre-quantized
// checkpoint stores its linear weights. Every method transformers writes is
// either read into one of these or refused by name; none is ignored.
type Quantization struct {
	// Method is the quant_method: "awq", "gptq", "bitsandbytes" or "fp8".
	Method string
	// Bits is the stored weight width: 4 (awq, gptq, bitsandbytes 4-bit) or
	// 8 (bitsandbytes 8-bit, fp8).
	Bits int
	// GroupSize is the inputs that share a scale and zero (awq, gptq).
	GroupSize int
	// Type is bitsandbytes' bnb_4bit_quant_type ("nf4" or "fp4"; the same
	// storage: 4-bit codes with a float32 absmax per 64).
	Type string
}

// String names the scheme as "awq 4-bit, group 128".
func (q *Quantization) String() string {
	s := fmt.Sprintf("%s %d-bit", q.Method, q.Bits)
	if q.GroupSize > 0 {
		s += fmt.Sprintf(", group %d", q.GroupSize)
	}
	if q.Type != "" {
		s += " " + q.Type
	}
	return s
}

// QuantMethods are the quant_method values memplan reads.
var QuantMethods = []string{"awq", "gptq", "bitsandbytes", "fp8"}

// quantization reads quantization_config (absent or null: none). The
// fields are transformers' own (utils/quantization_config.py: AwqConfig
// bits/w_bit and group_size/q_group_size, GPTQConfig bits and group_size,
// BitsAndBytesConfig load_in_4bit/load_in_8bit, bnb_4bit_quant_type and
// bnb_4bit_use_double_quant, FbgemmFp8Config/FineGrainedFP8Config as
// quant_method fp8), and the storage each implies is what vLLM loads
// (serve.Quant).
func (p *parser) quantization() (*Quantization, error) {
	raw, ok := p.get("quantization_config")
	if !ok || p.isNull("quantization_config") {
		return nil, nil
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, p.errf("quantization_config: want an object, got %s", describeJSON(raw))
	}
	q := &parser{name: p.name + ": quantization_config", m: m}
	method, ok, err := q.str("quant_method")
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, q.errf("missing \"quant_method\" (memplan reads %s)", strings.Join(QuantMethods, ", "))
	}
	method = strings.ToLower(method)
	switch method {
	case "awq", "gptq":
		return q.groupQuant(method)
	case "bitsandbytes":
		return q.bitsandbytes()
	case "fp8":
		if _, has := m["weight_block_size"]; has && !q.isNull("weight_block_size") {
			return nil, q.errf("fp8 with weight_block_size (block-wise scales) is not supported; memplan reads per-tensor fp8")
		}
		return &Quantization{Method: "fp8", Bits: 8}, nil
	}
	return nil, q.errf("quant_method %q is not supported (memplan reads %s)", method, strings.Join(QuantMethods, ", "))
}

// groupQuant reads AWQ's and GPTQ's 4-bit grouped storage.
func (q *parser) groupQuant(method string) (*Quantization, error) {
	bits, err := q.optPos(4, 64, "bits", "w_bit")
	if err != nil {
		return nil, err
	}
	if bits != 4 {
		return nil, q.errf("%s with %d-bit weights is not supported; memplan reads 4-bit %s", method, bits, method)
	}
	group := 128
	if k, raw, ok := q.first([]string{"group_size", "q_group_size"}); ok && string(raw) != "null" {
		g, err := q.intValue(k, raw)
		if err != nil {
			return nil, err
		}
		if g <= 0 || g > 1<<20 {
			return nil, q.errf("%s %d: memplan reads groups of a positive size (per-channel -1 is not supported)", k, g)
		}
		group = g
	}
	return &Quantization{Method: method, Bits: 4, GroupSize: group}, nil
}

// bitsandbytes reads BitsAndBytesConfig: 8-bit (LLM.int8, int8 weights with
// a float32 scale per row) or 4-bit (nf4/fp4 codes, float32 absmax per 64).
func (q *parser) bitsandbytes() (*Quantization, error) {
	four, err := q.boolDef(false, "load_in_4bit")
	if err != nil {
		return nil, err
	}
	eight, err := q.boolDef(false, "load_in_8bit")
	if err != nil {
		return nil, err
	}
	switch {
	case four && eight:
		return nil, q.errf("load_in_4bit and load_in_8bit are both true")
	case eight:
		return &Quantization{Method: "bitsandbytes", Bits: 8}, nil
	case !four:
		return nil, q.errf("bitsandbytes with neither load_in_4bit nor load_in_8bit")
	}
	typ, _, err := q.strDef("fp4", "bnb_4bit_quant_type")
	if err != nil {
		return nil, err
	}
	if typ != "nf4" && typ != "fp4" {
		return nil, q.errf("bnb_4bit_quant_type %q (want nf4 or fp4)", typ)
	}
	dq, err := q.boolDef(false, "bnb_4bit_use_double_quant")
	if err != nil {
		return nil, err
	}
	if dq {
		return nil, q.errf("bnb_4bit_use_double_quant is not supported for a pre-quantized checkpoint; memplan reads float32 absmax per 64 weights")
	}
	return &Quantization{Method: "bitsandbytes", Bits: 4, Type: typ}, nil
}
