package cli

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"
)

// Arguments are refused in the command's words, as flags are: cobra says
// "accepts at most 1 arg(s), received 2" without the command or what it
// takes, runs a command group's help for a subcommand it does not have
// (memplan completion nope: exit 0), answers help for an unknown topic
// with the usage (exit 0), and prints the version past any argument.

// checkArgs rewords every command's argument refusals, gives the command
// groups (completion) a refusal of an unknown subcommand, and replaces
// cobra's help command with one that refuses an unknown topic.
func checkArgs(root *cobra.Command) {
	root.InitDefaultCompletionCmd()
	root.SetHelpCommand(newHelpCmd(root))
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		if c.Args != nil {
			c.Args = wordArgs(c.Args)
		}
		if c != root && !c.Runnable() && c.HasSubCommands() {
			c.Args = cobra.ArbitraryArgs
			c.RunE = func(cmd *cobra.Command, args []string) error {
				if len(args) > 0 {
					return unknownSubcommand(cmd, args[0])
				}
				return cmd.Help()
			}
		}
		for _, s := range c.Commands() {
			walk(s)
		}
	}
	walk(root)
}

// wordArgs is check with cobra's count refusals said as the command and
// what it takes: `memplan recipes takes [NAME]: got 2 arguments ("hf", "extra")`.
func wordArgs(check cobra.PositionalArgs) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		err := check(cmd, args)
		if err == nil || !strings.Contains(err.Error(), "arg(s)") {
			return err
		}
		return fmt.Errorf("%s takes %s: got %d arguments (%s)", strings.TrimPrefix(cmd.CommandPath(), "memplan "), takes(cmd), len(args), quoteArgs(args))
	}
}

// takes is what a command's Use says it takes ("[NAME]"), "no arguments"
// when it says nothing.
func takes(cmd *cobra.Command) string {
	if f := strings.Fields(cmd.Use); len(f) > 1 {
		return strings.Join(f[1:], " ")
	}
	return "no arguments"
}

// quoteArgs lists arguments quoted and cut, at most four of them.
func quoteArgs(args []string) string {
	var q []string
	for i, a := range args {
		if i == 4 {
			q = append(q, fmt.Sprintf("and %d more", len(args)-i))
			break
		}
		q = append(q, quoteCut(a))
	}
	return strings.Join(q, ", ")
}

// unknownSubcommand refuses name under the command group cmd.
func unknownSubcommand(cmd *cobra.Command, name string) error {
	var names []string
	for _, s := range cmd.Commands() {
		if s.IsAvailableCommand() {
			names = append(names, s.Name())
		}
	}
	return fmt.Errorf("unknown command %s for %q: want %s", quoteCut(name), cmd.CommandPath(), oneOf(names))
}

// newHelpCmd is help [command]: an unknown topic is refused (exit 1), not
// answered with the usage.
func newHelpCmd(root *cobra.Command) *cobra.Command {
	return &cobra.Command{
		Use:   "help [command]",
		Short: "Help about any command",
		Args:  cobra.ArbitraryArgs,
		RunE: func(_ *cobra.Command, args []string) error {
			c, rest, err := root.Find(args)
			if err != nil || len(rest) > 0 {
				return fmt.Errorf("help: no command %s (memplan help lists them)", quoteCut(strings.Join(args, " ")))
			}
			c.InitDefaultHelpFlag()
			return c.Help()
		},
	}
}

// versionAlone refuses --version (-v) given with anything else: cobra
// prints the version and ignores the rest (memplan -v plan, memplan
// --version extra exited 0), so a command line meant to run did nothing.
func versionAlone(args []string) error {
	if len(args) < 2 {
		return nil
	}
	for _, a := range args {
		if a == "--" {
			return nil
		}
		if a == "-v" || a == "--version" || strings.HasPrefix(a, "--version=") {
			return fmt.Errorf("--version prints memplan's version and takes nothing else: got %s", quoteArgs(args))
		}
	}
	return nil
}
