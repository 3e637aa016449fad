package cli

import (
	"fmt"
	"strconv"

	"github.com/spf13/pflag"
)

// Every integer flag of the CLI (and so every integer field of the
// service, which sets the same flags) is read here, in decimal: pflag's own
// int flags parse with strconv's base prefixes, so --seq 010 planned 8
// tokens, 0x80 128 and 1_024 1024, while --micro-batch 08 was refused. A
// whole number is decimal digits with an optional sign; leading zeros are
// read as decimal (--seq 010 is 10), as the workload file reads its
// integers; 0x, 0o, 0b and _ are refused.

// decimal is an int or int64 flag read in base 10.
type decimal[T int | int64] struct {
	p    *T
	kind string // pflag's type name, "int" or "int64": valueWant's words and GetInt read it
}

func (d decimal[T]) Set(s string) error {
	v, err := parseDecimal(s, d.kind)
	if err != nil {
		return err
	}
	*d.p = T(v)
	return nil
}

func (d decimal[T]) String() string {
	if d.p == nil {
		return "0"
	}
	return strconv.FormatInt(int64(*d.p), 10)
}

func (d decimal[T]) Type() string { return d.kind }

// parseDecimal reads a whole number in decimal for a flag of kind ("int":
// the platform's int, "int64"); its error is strconv's (ErrSyntax,
// ErrRange), which valueWant words.
func parseDecimal(s, kind string) (int64, error) {
	bits := strconv.IntSize
	if kind == "int64" {
		bits = 64
	}
	return strconv.ParseInt(s, 10, bits)
}

// intVar defines an int flag read in decimal (pflag's IntVar reads base
// prefixes).
func intVar(fl *pflag.FlagSet, p *int, name string, value int, usage string) {
	*p = value
	fl.Var(decimal[int]{p: p, kind: "int"}, name, usage)
}

// int64Var defines an int64 flag read in decimal.
func int64Var(fl *pflag.FlagSet, p *int64, name string, value int64, usage string) {
	*p = value
	fl.Var(decimal[int64]{p: p, kind: "int64"}, name, usage)
}

// givenBelow refuses the first of the int flags names given on fl (on the
// command line, or a request's field) below least: "--seq must be at least
// 1, got 0". Several flags' defaults are an unset 0 (or -1) that the
// command fills in, so without it an explicit --seq 0 or fit --gpus 0 ran
// as if the flag were not given. A flag max is solving for ('?') is not
// a value and passes.
func givenBelow(fl *pflag.FlagSet, least int64, names ...string) error {
	for _, name := range names {
		f := fl.Lookup(name)
		if f == nil || !f.Changed {
			continue
		}
		if a, ok := f.Value.(askable); ok && *a.asked {
			continue
		}
		v, err := strconv.ParseInt(f.Value.String(), 10, 64)
		if err == nil && v < least {
			return fmt.Errorf("--%s must be at least %d, got %d", name, least, v)
		}
	}
	return nil
}
