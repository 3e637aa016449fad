package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"runtime/debug"
	"strings"

	"github.com/memplan/memplan/engine"
	"github.com/memplan/memplan/search"
)

// Exit statuses: what a script can branch on without reading the report.
const (
	// ExitOK: the job fits (or no GPU or budget was given to fit).
	ExitOK = 0
	// ExitBadInput: a flag, file or model could not be used; one line on
	// stderr says which, nothing on stdout.
	ExitBadInput = 1
	// ExitDoesNotFit: plan, compare or diagnose planned the job as given and
	// it does not fit the GPU or budget; the report is printed.
	ExitDoesNotFit = 3
	// ExitNothingFits: fit found no plan, max no value, compare no
	// strategy that fits.
	ExitNothingFits = 4
)

// exitHelp documents the exit statuses (root --help and README).
const exitHelp = `Exit status: 0 the job fits (or no --gpu, --budget or --host-memory was given); 3 it does not fit (plan, compare,
diagnose: the report is printed); 4 nothing fits (fit found no plan, max no value, compare no
strategy); 1 bad input (one line on stderr, nothing on stdout).`

// verdict is a command's outcome after it printed its report: an exit
// status, with nothing more to say on stderr.
type verdict int

func (v verdict) Error() string { return fmt.Sprintf("exit status %d", int(v)) }

// fitsVerdict is the status of a job that fits or not (ok when no capacity
// was given).
func fitsVerdict(capacity bool, fits bool) error {
	if capacity && !fits {
		return verdict(ExitDoesNotFit)
	}
	return nil
}

// planVerdict is the status of a job planned as given (plan, diagnose): 3
// when it is over --host-memory, or a GPU or budget was given and it does
// not fit it (engine.Result.Fits holds both). --host-memory is a limit of
// its own: over it, the job does not fit with no GPU given too.
func planVerdict(res *engine.Result) error {
	if res.HostShortfall > 0 {
		return verdict(ExitDoesNotFit)
	}
	return fitsVerdict(res.Capacity > 0, res.Fits)
}

// exitCode prints err (unless it is a verdict) and returns its status.
func exitCode(err error, stderr io.Writer) int {
	if err == nil {
		return ExitOK
	}
	var v verdict
	if errors.As(err, &v) {
		return int(v)
	}
	msg := strings.TrimSpace(strings.ReplaceAll(message(err), "\n", "; "))
	fmt.Fprintln(stderr, "memplan: "+msg)
	if errors.Is(err, search.ErrNothingFits) {
		return ExitNothingFits
	}
	return ExitBadInput
}

// warn prints warnings on stderr, one line each.
func warn(stderr io.Writer, ws []string) {
	for _, w := range ws {
		fmt.Fprintln(stderr, "memplan: warning: "+w)
	}
}

// Version is memplan's version; a release build sets it
// (-ldflags "-X github.com/memplan/memplan/cli.Version=v1.2.3"), otherwise
// it is the module version and the commit the binary was built from.
var Version = ""

func version() string {
	if Version != "" {
		return Version
	}
	v := "(devel)"
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return v
	}
	if bi.Main.Version != "" {
		v = bi.Main.Version
	}
	var rev, dirty string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				dirty = ", modified"
			}
		}
	}
	if rev != "" {
		v += fmt.Sprintf(" (commit %.12s%s)", rev, dirty)
	}
	return v
}

// writeJSON writes v as indented JSON, as report's writers do.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
