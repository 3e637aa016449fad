package cli

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	frameworks "github.com/memplan/memplan/emit"
	"github.com/memplan/memplan/engine"
	"github.com/memplan/memplan/internal/boundedio"
	"github.com/memplan/memplan/report"
	"github.com/memplan/memplan/search"
)

// checkEmit refuses, before the search, an --emit the run cannot satisfy:
// an unknown framework, --emit-out without --emit or into a missing
// directory, or a recipe other than the one the framework implies (the
// emitted run has the winner's peak only when the search planned it as the
// framework runs it).
func checkEmit(name, out string, s *engine.Spec) error {
	if name == "" {
		if out != "" {
			return fmt.Errorf("--emit-out needs --emit FRAMEWORK (%s)", strings.Join(frameworks.Names(), ", "))
		}
		return nil
	}
	rs := frameworks.Recipes(name)
	if rs == nil {
		return badChoice("--emit", name, frameworks.Names()...)
	}
	if !slices.Contains(rs, s.Sem.Recipe) {
		return fmt.Errorf("--emit %s plans the run with --recipe %s, not --recipe %s: the emitted config has the winner's peak only when fit searched it that way", name, strings.Join(rs, " or --recipe "), s.Sem.Recipe)
	}
	if out != "" {
		if st, err := os.Stat(filepath.Dir(out)); err != nil || !st.IsDir() {
			return fmt.Errorf("--emit-out %s: its directory does not exist", out)
		}
	}
	return nil
}

// emitWinner writes the winner's framework config to out (through a
// temporary file renamed into place: whole or not at all), or returns it
// for the report; a winner the framework cannot express is one error
// naming the dimension.
func emitWinner(name, out string, win *search.Plan, pinned search.Pins) (*report.EmittedJSON, error) {
	if name == "" || win == nil {
		return nil, nil
	}
	text, err := frameworks.Config(name, &win.Spec)
	var fe *engine.FieldError
	switch {
	case errors.As(err, &fe) && fe.Field == engine.FieldEmit:
		// Not a dimension fit searches (the job's optimizer): no pin helps.
		return nil, fmt.Errorf("the winner (%s): %s", win.Describe(), message(err))
	case fe != nil && slices.Contains(pinned.Names(), fe.Field.Key()):
		// The user gave it: pinning it is what made the winner so.
		return nil, fmt.Errorf("the winner (%s): %s; --%s is given, so every plan fit searched has it: give one %s can run, or leave it out for fit to choose", win.Describe(), message(err), fe.Field.Key(), name)
	case err != nil:
		return nil, fmt.Errorf("the winner (%s): %s; pin or --deny that dimension so fit searches plans %s can run", win.Describe(), message(err), name)
	}
	e := &report.EmittedJSON{Framework: name}
	if out == "" {
		e.Config = text
		return e, nil
	}
	if err := boundedio.WriteFile(out, 0o644, func(w io.Writer) error { _, err := io.WriteString(w, text); return err }); err != nil {
		return nil, fmt.Errorf("--emit-out: %v", err)
	}
	e.File = out
	return e, nil
}
