package server_test

import (
	"io"
	"log/slog"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/memplan/memplan/cli"
	"github.com/memplan/memplan/server"
)

// counting is the CLI's backend counting the bodies it parses.
type counting struct {
	cli.APIBackend
	parsed atomic.Int64
}

func (b *counting) Parse(c string, body []byte) (server.Request, error) {
	b.parsed.Add(1)
	return b.APIBackend.Parse(c, body)
}

// A body the server has answered is answered again from the cache without
// parsing it; the same request written another way is parsed once, then
// hits too; a body that does not parse is parsed (and refused) every time;
// a body whose answer was evicted is planned again.
func TestCachedBodiesSkipParsing(t *testing.T) {
	b := &counting{}
	ts := httptest.NewServer(server.New(b, server.Config{CacheEntries: 2, Logger: slog.New(slog.NewJSONHandler(io.Discard, nil))}))
	defer ts.Close()
	url := ts.URL + "/v1/plan"
	a := `{"model": "gpt2", "micro_batch": 2, "no_timeline": true}`
	reordered := `{"no_timeline": true, "micro_batch": 2, "model": "gpt2"}`
	for i, step := range []struct {
		body, cache string
		status      int
		parsed      int64
	}{
		{a, "miss", 200, 1},
		{a, "hit", 200, 1},
		{reordered, "hit", 200, 2},
		{reordered, "hit", 200, 2},
		{`{"model": "gpt2", "micro_batch": -1}`, "", 400, 3},
		{`{"model": "gpt2", "micro_batch": -1}`, "", 400, 4},
		{`{"model": "gpt2", "micro_batch": 3, "no_timeline": true}`, "miss", 200, 5},
		{`{"model": "gpt2", "micro_batch": 4, "no_timeline": true}`, "miss", 200, 6}, // evicts a's answer
		{a, "miss", 200, 7},
	} {
		r := post(t, url, step.body)
		if r.status != step.status || r.header.Get("Memplan-Cache") != step.cache || b.parsed.Load() != step.parsed {
			t.Fatalf("step %d: status %d, cache %q, %d parsed; want %d, %q, %d", i, r.status, r.header.Get("Memplan-Cache"), b.parsed.Load(), step.status, step.cache, step.parsed)
		}
	}
}
