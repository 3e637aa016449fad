package models

import (
	"encoding/json"
	"os"
	"strings"
	"testing"
)

// withQuant is the Llama-3-8B catalog config with quantization_config set
// to qc (raw JSON).
func withQuant(t *testing.T, qc string) []byte {
	t.Helper()
	data, err := os.ReadFile("catalog/llama-3-8b.json")
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	m["quantization_config"] = json.RawMessage(qc)
	out, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestQuantizationConfig: each quant_method transformers writes is read
// (with the fields of its transformers config class) or refused by name.
func TestQuantizationConfig(t *testing.T) {
	for _, c := range []struct {
		qc, want string // want: Quantization.String(), or "error: <text>"
	}{
		{`null`, ""},
		{`{"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemm", "zero_point": true}`, "awq 4-bit, group 128"},
		{`{"quant_method": "awq", "w_bit": 4, "q_group_size": 64}`, "awq 4-bit, group 64"},
		{`{"quant_method": "gptq", "bits": 4, "group_size": 32, "desc_act": true}`, "gptq 4-bit, group 32"},
		{`{"quant_method": "gptq", "bits": 4}`, "gptq 4-bit, group 128"},
		{`{"quant_method": "bitsandbytes", "load_in_4bit": true, "bnb_4bit_quant_type": "nf4"}`, "bitsandbytes 4-bit nf4"},
		{`{"quant_method": "bitsandbytes", "load_in_8bit": true}`, "bitsandbytes 8-bit"},
		{`{"quant_method": "fp8", "activation_scheme": "dynamic"}`, "fp8 8-bit"},
		{`{"quant_method": "FP8"}`, "fp8 8-bit"},
		{`{"quant_method": "hqq"}`, `error: quant_method "hqq" is not supported`},
		{`{"quant_method": "compressed-tensors"}`, `error: quant_method "compressed-tensors" is not supported`},
		{`{"quant_method": "mxfp4"}`, `error: quant_method "mxfp4"`},
		{`{"bits": 4}`, `error: missing "quant_method"`},
		{`[1, 2]`, `error: quantization_config: want an object`},
		{`{"quant_method": 4}`, `error: quant_method`},
		{`{"quant_method": "gptq", "bits": 8}`, "error: gptq with 8-bit weights is not supported"},
		{`{"quant_method": "gptq", "bits": 4, "group_size": -1}`, "error: group_size -1"},
		{`{"quant_method": "awq", "bits": "four"}`, "error: bits"},
		{`{"quant_method": "bitsandbytes"}`, "error: neither load_in_4bit nor load_in_8bit"},
		{`{"quant_method": "bitsandbytes", "load_in_4bit": true, "load_in_8bit": true}`, "error: both true"},
		{`{"quant_method": "bitsandbytes", "load_in_4bit": true, "bnb_4bit_use_double_quant": true}`, "error: bnb_4bit_use_double_quant"},
		{`{"quant_method": "bitsandbytes", "load_in_4bit": true, "bnb_4bit_quant_type": "int4"}`, `error: bnb_4bit_quant_type "int4"`},
		{`{"quant_method": "fp8", "weight_block_size": [128, 128]}`, "error: weight_block_size"},
	} {
		a, err := ParseHFConfig(withQuant(t, c.qc), "q/config.json")
		if want, ok := strings.CutPrefix(c.want, "error: "); ok {
			if err == nil || !strings.Contains(err.Error(), want) || !strings.HasPrefix(err.Error(), "q/config.json: quantization_config") || strings.Contains(err.Error(), "\n") {
				t.Errorf("%s: err %v, want one line naming the config and %q", c.qc, err, want)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", c.qc, err)
			continue
		}
		got := ""
		if a.Quant != nil {
			got = a.Quant.String()
		}
		if got != c.want {
			t.Errorf("%s: %q, want %q", c.qc, got, c.want)
		}
	}
}
