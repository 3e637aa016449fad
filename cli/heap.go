package cli

import (
	"os"
	"runtime/debug"
	"time"

	"github.com/memplan/memplan/internal/heapwatch"
	"github.com/memplan/memplan/search"
	"github.com/spf13/cobra"
)

// heapLimit is the soft limit on the Go heap (runtime/debug.SetMemoryLimit)
// a command of the CLI runs under unless GOMEMLIMIT sets one: 1.5× the
// search's default memory budget, the limit fit holds a default search
// under (searchGC), or 1.25× the live heap when that is larger
// (heapGrowth). Planning the largest jobs makes programs by the hundred
// megabytes that are garbage once the next transform has copied them, and
// at Go's default 100% growth the heap grew to twice what was live before
// the collector ran: compare deepseek-v3 on h100 kept 1.08 GB live and
// reached 1.78-1.86 GiB of RSS; under the limit, 1.51-1.53 GiB in the same
// time. Every job of the catalog except the largest mixtures of experts
// keeps a few hundred megabytes live and never reaches it.
const heapLimit = int64(search.DefaultMemoryBudget) / 2 * 3

// heapGrowth is how far past the live heap the limit stays: a fixed limit
// under a live heap near it made the collector run back to back (compare
// deepseek-v2 --accum 8, about 2 GB live: 13.2 s → 23.5 s at 1.5 GiB), so
// the limit follows the live heap at 1.25× (GOGC=25's growth), and a job
// past heapLimit is collected more often than at Go's default, not
// continuously. 1.25, not round 15's 1.5: with the cores shared (the
// probes beside other packages' tests) the collector fell behind and
// deepseek-v3's plan --accum 8, 1.5 GB live, reached 2,074 MiB of RSS;
// with two other large plans beside it, 1.71-1.76 GiB at 1.5 and 1.60 GiB
// at 1.25 (8.8 → 9.2-9.7 s). The price is paid by the jobs past heapLimit
// alone: compare deepseek-v2 --accum 8, 18.3-19.9 s and 2.22 GiB → 23.2 s
// and 1.78-1.91 GiB.
const heapGrowth = 1.25

// heapGC is the collector's growth (GOGC) a command runs at under the
// limit unless GOGC sets one: past the limit's share the limit collects
// anyway, so a larger growth saves only the collections before it, and
// with them the pages the scavenger returned between collections and the
// next one faulted back (the kernel's time: 3-7 s of system CPU in
// deepseek-v3's plans on round 24's host). Interleaved runs on that host,
// 100% against 200%: deepseek-v3 plan --accum 8 --json 10.3 and 7.7 s
// against 6.7 and 6.6 s (1.65-1.72 against 1.65-1.66 GB of RSS), compare
// deepseek-v3 10.7 and 10.1 s against 7.3 and 7.7 s (1.54-1.56 GB both),
// plan --pp 4 --accum 8 8.8 and 9.4 s against 8.3 and 10.6 s (1.58 GB
// both), compare deepseek-v2 5.3 and 5.8 s against 4.1 and 4.4 s (1.15-1.24
// against 1.50-1.51 GB). 400% was slower again: the heap stayed at the
// limit and the scavenger returned pages continuously.
const heapGC = 200

// heapPoll is how often the limit follows the live heap.
const heapPoll = 50 * time.Millisecond

// limitsHeap says whether command c runs under heapLimit: every command
// but fit, which holds its search under 1.5× --search-memory (searchGC),
// and no request served through the API (the process's limit is set once,
// by serve). serve runs under it for its life: its requests run side by
// side, and the limit follows their live heaps together. With none, two
// deepseek-v3 plan --accum 8 requests at once reached 4.0-4.4 GB of RSS;
// under it, 3.1-3.5 GB (and twelve 60 MB pack bodies 0.92-1.0 GB against
// 0.97 without it; on a shared 2-core host, the bodies read once each holds a
// place: server.Server.command). GOMEMLIMIT (and GOGC) still set the
// deployment's own.
func limitsHeap(c *cobra.Command) bool {
	return c.Name() != "fit" && !isAPI(c)
}

// gcFor is the collector's growth command c runs at under the limit
// (unless GOGC sets one): heapGC for the CLI's commands, which run one
// job and exit; Go's default 100% for serve, which runs for days, where
// 200% let the heap grow toward the limit between requests (twelve 60 MB
// pack bodies: 1.33 GB of RSS at 200%, 0.92-1.0 GB at 100%; two deepseek-v3
// plans 3.4-3.5 GB against 3.1-3.5 GB).
func gcFor(c *cobra.Command) int {
	if c.Name() == "serve" {
		return 100
	}
	return heapGC
}

// limitHeap sets the heap limit unless GOMEMLIMIT is set (and the
// collector's growth to gc unless GOGC is), follows the live heap until
// the returned function stops it and restores both as they were (the CLI
// runs in-process in tests and in the service).
func limitHeap(gc int) func() {
	if os.Getenv("GOMEMLIMIT") != "" {
		return func() {}
	}
	oldGC := -2 // GOGC given: kept
	if os.Getenv("GOGC") == "" {
		oldGC = debug.SetGCPercent(gc)
	}
	old := debug.SetMemoryLimit(heapLimit)
	stop := heapwatch.Every(heapPoll, func(live uint64) { debug.SetMemoryLimit(limitFor(live)) })
	return func() {
		stop()
		debug.SetMemoryLimit(old)
		if oldGC != -2 {
			debug.SetGCPercent(oldGC)
		}
	}
}

// limitFor is the heap limit for a live heap of live bytes.
func limitFor(live uint64) int64 {
	return max(heapLimit, int64(float64(live)*heapGrowth))
}
