package cli

import (
	"os"
	"runtime/debug"

	"github.com/memplan/memplan/search"
	"github.com/spf13/cobra"
)

// heapLimit is the soft limit on the Go heap (runtime/debug.SetMemoryLimit)
// a command of the CLI runs under unless GOMEMLIMIT sets one: 1.5× the
// search's default memory budget, the limit fit holds a default search
// under (searchGC). Planning the largest jobs makes programs by the hundred
// megabytes that are garbage once the next transform has copied them, and
// at Go's default 100% growth the heap grew to twice what was live before
// the collector ran: compare deepseek-v3 on h100 kept 1.08 GB live and
// reached 1.9 GB of RSS, plan deepseek-v3 --pp 4 --accum 8 1.34 GB and
// 2.46 GB. Under the limit the collector runs as the heap nears it: 1.53 GB
// and 1.58 GB, for no and 1.3 s more (8.2 s). A job whose live heap is
// over the limit runs slower, never fails: the runtime caps the
// collector's share of the CPU. Every job of the catalog except the
// largest mixtures of experts keeps a few hundred megabytes live and
// never reaches it.
const heapLimit = int64(search.DefaultMemoryBudget) / 2 * 3

// limitsHeap says whether command c runs under heapLimit: every command
// but serve, whose requests run side by side (its process is the
// deployment's to tune, GOMEMLIMIT), and no request served through the API.
func limitsHeap(c *cobra.Command) bool {
	return c.Name() != "serve" && !isAPI(c)
}

// limitHeap sets heapLimit unless GOMEMLIMIT is set, and returns the
// function that restores the limit before it (the CLI runs in-process in
// tests and in the service).
func limitHeap() func() {
	if os.Getenv("GOMEMLIMIT") != "" {
		return func() {}
	}
	old := debug.SetMemoryLimit(heapLimit)
	return func() { debug.SetMemoryLimit(old) }
}
