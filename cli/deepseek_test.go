package cli

import (
	"encoding/json"
	"testing"
)

// DeepSeek from the command line: a training plan of DeepSeek-V2-Lite builds
// and counts its 15,706,484,224 parameters; a serving plan sizes vLLM's MLA
// cache, 576 elements per token and layer (16 x 576 x 27 x 2 bytes per
// block of 16 tokens in bfloat16).
func TestDeepSeekPlans(t *testing.T) {
	code, out, errs := run("plan", "--model", "deepseek-v2-lite", "--gpu", "h100", "--micro-batch", "1", "--seq", "256",
		"--precision", "bf16", "--offload", "optimizer", "--json")
	if code != 0 && code != 3 {
		t.Fatalf("train: exit %d: %s", code, errs)
	}
	var tr struct {
		Params int64 `json:"params"`
	}
	if err := json.Unmarshal([]byte(out), &tr); err != nil || tr.Params != 15_706_484_224 {
		t.Errorf("train: params %d (%v)", tr.Params, err)
	}
	code, out, errs = run("plan", "--model", "deepseek-v2-lite", "--gpu", "h100", "--mode", "serve", "--max-model-len", "8192", "--json")
	if code != 0 {
		t.Fatalf("serve: exit %d: %s", code, errs)
	}
	var sv struct {
		BlockBytes int64 `json:"block_bytes"`
		Blocks     int64 `json:"gpu_blocks"`
	}
	if err := json.Unmarshal([]byte(out), &sv); err != nil {
		t.Fatal(err)
	}
	if sv.BlockBytes != 16*576*27*2 || sv.Blocks <= 0 {
		t.Errorf("serve: block %d bytes, %d blocks; want %d-byte blocks", sv.BlockBytes, sv.Blocks, 16*576*27*2)
	}
}
