package cli

import (
	"errors"
	"strings"
	"testing"
)

// FuzzParseAPIRequest: the service's request decoder never panics; it
// accepts a body or refuses it with a 400 APIError of one line, and what it
// accepts has a canonical form that parses to the same values.
func FuzzParseAPIRequest(f *testing.F) {
	for _, s := range []string{
		`{"model": "llama-3-8b", "gpu": "h100", "micro_batch": 4}`,
		`{"micro_batch": "?", "seq": 4096}`,
		`{"set": ["cuda.overhead=1GiB", "loop.hold-outputs=none"], "sp": true, "headroom": 0.1}`,
		`{"snapshot": "gASVAQA=", "device": 0}`,
		`{"jobs": "kind: memplan.jobs/v1", "gpus": "8xh100"}`,
		`{"model": "gpt2", "model": "gpt2"}`, `[1]`, `{`, `{"a":1}{}`, `{"micro_batch": 1e400}`, `"\u0000"`, ``,
		// Extreme values (issue 15): sizes at 2^31-1, 2^62, 2^63-1 and
		// past int64, negative and fractional counts, a NaN headroom.
		`{"model": "gpt2", "micro_batch": 9223372036854775807, "seq": 2147483647, "accum": 4611686018427387904}`,
		`{"model": "gpt2", "micro_batch": 9223372036854775808, "gen_tokens": -1, "tp": 1.5}`,
		`{"model": "gpt2", "gpu": "h100", "headroom": "NaN", "global_batch": 1099511627776, "gpus": -9223372036854775808}`,
		`{"jobs": "kind: memplan.jobs/v1", "gpus": "9223372036854775808xh100", "margin": "16EiB"}`,
	} {
		for _, c := range []string{"plan", "max", "fit", "explain", "pack"} {
			f.Add(c, []byte(s))
		}
	}
	f.Fuzz(func(t *testing.T, command string, body []byte) {
		vals, canon, err := ParseAPIRequest(command, body)
		if err != nil {
			var ae *APIError
			if !errors.As(err, &ae) || (ae.Status != 400 && ae.Status != 404) {
				t.Fatalf("error %v is not a 400/404 APIError", err)
			}
			if strings.Contains(ae.Msg, "\n") || ae.Msg == "" {
				t.Fatalf("error %q is not one line", ae.Msg)
			}
			return
		}
		again, canon2, err := ParseAPIRequest(command, canon[len(command):])
		if err != nil {
			t.Fatalf("canonical form %s does not parse: %v", canon, err)
		}
		if string(canon2) != string(canon) || len(again) != len(vals) {
			t.Fatalf("canonical form is not stable: %s vs %s", canon, canon2)
		}
		for k, v := range vals {
			if strings.Join(again[k], "\x00") != strings.Join(v, "\x00") {
				t.Fatalf("field %s: %q then %q", k, v, again[k])
			}
		}
	})
}
