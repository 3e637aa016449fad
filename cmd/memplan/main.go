// Command memplan plans GPU memory for deep-learning jobs. See README.md.
package main

import (
	"os"

	"github.com/memplan/memplan/cli"
)

func main() { os.Exit(cli.Main(os.Args[1:], os.Stdout, os.Stderr)) }
