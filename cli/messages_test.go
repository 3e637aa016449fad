package cli

import (
	"fmt"
	"os"
	"sync"
	"testing"

	"github.com/memplan/memplan/internal/msgcheck"
)

// seen are the error messages the tests' runs printed (run, runValidate).
var (
	seenMu sync.Mutex
	seen   []string
)

func record(msg string) {
	seenMu.Lock()
	defer seenMu.Unlock()
	seen = append(seen, msg)
}

// TestMain runs the tests, then checks every error message they produced:
// none may name a Go package, identifier or the code's name of a job
// field (msgcheck); users read flags and words.
func TestMain(m *testing.M) {
	code := m.Run()
	bad := 0
	for _, msg := range seen {
		if p := msgcheck.Problems(msg); p != nil {
			fmt.Fprintf(os.Stderr, "FAIL: error message %q: %v\n", msg, p)
			bad++
		}
	}
	if bad > 0 {
		fmt.Fprintf(os.Stderr, "FAIL: %d of %d error messages of the CLI tests name Go identifiers\n", bad, len(seen))
		code = 1
	}
	os.Exit(code)
}
