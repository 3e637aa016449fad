package cli

import "testing"

// BenchmarkParseAPIRequest: decoding a plan request, the work a cache hit
// does besides the lookup.
func BenchmarkParseAPIRequest(b *testing.B) {
	body := []byte(`{"model": "llama-3-70b", "gpu": "h100", "tp": 8, "micro_batch": 1, "seq": 4096, "no_timeline": true}`)
	for b.Loop() {
		if _, _, err := ParseAPIRequest("plan", body); err != nil {
			b.Fatal(err)
		}
	}
}
