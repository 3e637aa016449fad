package cli

import (
	"strings"
	"testing"
)

// The help of a flag a recipe switch mirrors states no built-in default:
// left out, the flag takes the --recipe's value (issue 15: --optimizer-impl
// showed (default "foreach") while --recipe megatron plans fused).
func TestHelpDefaultsFromRecipe(t *testing.T) {
	for _, cmd := range []string{"plan", "compare", "fit", "max"} {
		code, out, _ := run(cmd, "--help")
		if code != 0 {
			t.Fatalf("%s --help: exit %d", cmd, code)
		}
		for _, want := range []string{
			"(default: the --recipe's; amp-bf16 with --recipe hf)",
			"(default: the --recipe's; foreach with --recipe hf)",
			"(default: the --recipe's; none with --recipe hf)",
		} {
			if !strings.Contains(out, want) {
				t.Errorf("%s --help lacks %q", cmd, want)
			}
		}
		for _, stale := range []string{`(default "amp-bf16")`, `(default "foreach")`, `(default "adamw")`, `(default "sdpa")`} {
			if strings.Contains(out, stale) {
				t.Errorf("%s --help still says %s", cmd, stale)
			}
		}
	}
}
