package cli

import (
	"errors"
	"fmt"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// Every command that prints JSON takes it spelled both ways: --json, and
// kubectl's -o/--output json|text (models and gpus took only -o json, the
// others only --json). The two set one choice; given both, they must agree.

// outputValue is -o/--output: text or json.
type outputValue struct {
	json   *bool
	format string
}

func (o *outputValue) Set(s string) error {
	if s != "text" && s != "json" {
		return errors.New("want text or json")
	}
	o.format = s
	return nil
}

func (o *outputValue) String() string { return o.format }

// Type is what the help shows after -o: its values.
func (o *outputValue) Type() string { return "text|json" }

// outputFlags defines --json (usage says what it prints) and -o/--output
// on fl, both setting *jsonOut.
func outputFlags(fl *pflag.FlagSet, jsonOut *bool, usage string) {
	fl.BoolVar(jsonOut, "json", false, usage+" (the same as -o json)")
	fl.VarP(&outputValue{json: jsonOut, format: "text"}, "output", "o", "output format: text or json (-o json is --json)")
}

// resolveOutput applies a command's -o to its --json once the flags are
// parsed, and refuses the two disagreeing (--json -o text).
func resolveOutput(c *cobra.Command) error {
	f := c.Flags().Lookup("output")
	if f == nil || !f.Changed {
		return nil
	}
	o, ok := f.Value.(*outputValue)
	if !ok {
		return nil
	}
	want := o.format == "json"
	if c.Flags().Changed("json") && *o.json != want {
		return fmt.Errorf("--json=%t and -o %s disagree: give one of them", *o.json, o.format)
	}
	*o.json = want
	return nil
}
