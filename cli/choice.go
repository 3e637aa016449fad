package cli

import (
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/memplan/memplan/hw"
	"github.com/memplan/memplan/models"
	"github.com/memplan/memplan/pack"
	"github.com/memplan/memplan/recipe"
)

// A choice flag's refusal reads `--flag "value": want a, b or c`: the
// flag first, the value as given (quoted, cut when long), what it takes in
// the flag's words. Libraries name the thing ("unknown precision"); the
// flag is named here, where flags are known.

// badChoice refuses value of flag, which takes one of allowed.
func badChoice(flag, value string, allowed ...string) error {
	return fmt.Errorf("%s %s: want %s", flag, quoteCut(value), oneOf(allowed))
}

// oneOf lists allowed values: "a", "a or b", "one of a, b, c".
func oneOf(allowed []string) string {
	switch len(allowed) {
	case 1:
		return allowed[0]
	case 2:
		return allowed[0] + " or " + allowed[1]
	}
	return "one of " + strings.Join(allowed, ", ")
}

// maxQuoted is how much of a refused value a message repeats.
const maxQuoted = 64

// quoteCut quotes s (Go's escapes keep a control character on the line),
// cut to maxQuoted runes with "…" when longer.
func quoteCut(s string) string {
	if utf8.RuneCountInString(s) > maxQuoted {
		s = string([]rune(s)[:maxQuoted])
		return fmt.Sprintf("%q…", s)
	}
	return fmt.Sprintf("%q", s)
}

// lookupGPU reads --gpu: a catalog GPU or its alias.
func lookupGPU(name string) (*hw.GPU, error) {
	g, err := hw.Lookup(name)
	if errors.Is(err, hw.ErrUnknownGPU) {
		return nil, fmt.Errorf("--gpu %s: not a GPU of the catalog (memplan gpus lists them); closest: %s", quoteCut(name), strings.Join(hw.Suggest(name, 3), ", "))
	}
	return g, err
}

// resolveModel reads --model: a catalog name, a config.json or a snapshot
// directory.
func resolveModel(name string) (*models.Arch, error) {
	a, err := models.Resolve(name)
	if errors.Is(err, models.ErrUnknownModel) {
		return nil, fmt.Errorf("--model %s: not a catalog model (memplan models lists them), a config.json or a directory holding one; did you mean %s?",
			quoteCut(name), strings.Join(models.Suggest(name, 3), ", "))
	}
	return a, err
}

// loadRecipe reads --recipe: a recipe's name or a recipe file.
func loadRecipe(name string) (*recipe.Recipe, error) {
	r, err := recipe.Load(name)
	if errors.Is(err, recipe.ErrUnknownRecipe) {
		return nil, badChoice("--recipe", name, append(recipe.Names(), "a recipe file's path")...)
	}
	return r, err
}

// policyNames are pack's policies, in the order reports show them.
func policyNames() []string {
	var out []string
	for _, p := range pack.Policies() {
		out = append(out, p.String())
	}
	return out
}

// flagError words pflag's refusal of a flag's value (`invalid argument
// "NaN" for "--seq" flag: strconv.ParseInt: parsing "NaN": invalid
// syntax`) as the choice flags' are: `--seq "NaN": want a whole number`.
func flagError(c *cobra.Command, err error) error {
	var iv *pflag.InvalidValueError
	if !errors.As(err, &iv) {
		return fmt.Errorf("%s (see '%s --help')", err, c.CommandPath())
	}
	f := iv.GetFlag()
	return fmt.Errorf("--%s %s: %s (see '%s --help')", f.Name, quoteCut(iv.GetValue()), valueWant(iv), c.CommandPath())
}

// valueWant says what a flag whose value pflag refused takes, in words
// (`want a number (this one is out of range)`), for the CLI's refusal and
// the service's (apiValueError).
func valueWant(iv *pflag.InvalidValueError) string {
	f, cause := iv.GetFlag(), iv.Unwrap()
	want := valueWants[f.Value.Type()]
	if _, ok := f.Value.(askable); ok {
		want = "a whole number or '?' (the one max solves for)"
	}
	switch {
	case want == "":
		// A memplan flag type: its own words.
		return goParser.ReplaceAllString(cause.Error(), "")
	case errors.Is(cause, strconv.ErrRange):
		return "want " + want + " (this one is out of range)"
	}
	return "want " + want
}

// valueWants are what pflag's value types take, in words.
var valueWants = map[string]string{
	"int": "a whole number", "int32": "a whole number", "int64": "a whole number", "uint": "a whole number of 0 or more",
	"float64": "a number", "bool": "true or false", "duration": "a duration such as 30s, 5m or 1h30m",
}

// plotFlags pairs --svg and --png with their paths ("" when not given).
func plotFlags(svg, png string) [2]struct{ flag, path string } {
	return [2]struct{ flag, path string }{{"--svg", svg}, {"--png", png}}
}

// checkPlotNames refuses a --svg or --png file not named for the flag's
// format. The writers draw the format a file's extension names, so plan
// --png a.svg wrote an SVG and --svg x.pdf a PDF; each flag writes its own
// format and nothing else, so the name must say it (a file named for one
// format holding another misleads whatever opens it by its name).
func checkPlotNames(svg, png string) error {
	for _, o := range plotFlags(svg, png) {
		if o.path == "" {
			continue
		}
		want := "." + strings.TrimPrefix(o.flag, "--")
		ext := strings.ToLower(filepath.Ext(o.path))
		if ext == want {
			continue
		}
		var other string
		for _, p := range plotFlags("", "") {
			if ext == "."+strings.TrimPrefix(p.flag, "--") {
				other = fmt.Sprintf(" (%s is %s's)", ext, p.flag)
			}
		}
		return fmt.Errorf("%s %s: want a file name ending in %s%s", o.flag, quoteCut(o.path), want, other)
	}
	return nil
}

// onFlag names the output flag a plot's write failed on ("--svg: cannot
// write d.svg: not a regular file (a directory)"); nil stays nil.
func onFlag(flag string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%s: %w", flag, err)
}

// listen opens the TCP listener of --addr: HOST:PORT, the host optional
// (every interface) and port 0 a free one. An empty --addr is refused:
// net.Listen would take it for ":0", a free port on every interface, which
// nobody asking for "" means.
func listen(addr string) (net.Listener, error) {
	const want = "want HOST:PORT such as 127.0.0.1:8080 (:PORT listens on every interface, port 0 on a free port)"
	if addr == "" {
		return nil, fmt.Errorf("--addr \"\": %s", want)
	}
	if _, _, err := net.SplitHostPort(addr); err != nil {
		var ae *net.AddrError
		if errors.As(err, &ae) {
			return nil, fmt.Errorf("--addr %s: %s; %s", quoteCut(addr), ae.Err, want)
		}
		return nil, fmt.Errorf("--addr %s: %s", quoteCut(addr), want)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		var ae *net.AddrError
		var oe *net.OpError
		switch {
		case errors.As(err, &ae):
			return nil, fmt.Errorf("--addr %s: %s %s; %s", quoteCut(addr), ae.Err, ae.Addr, want)
		case errors.As(err, &oe):
			return nil, fmt.Errorf("--addr %s: cannot listen: %v", quoteCut(addr), oe.Err)
		}
		return nil, fmt.Errorf("--addr %s: cannot listen: %v", quoteCut(addr), err)
	}
	return ln, nil
}
