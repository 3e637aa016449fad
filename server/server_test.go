package server_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/memplan/memplan/cli"
	"github.com/memplan/memplan/engine"
	"github.com/memplan/memplan/internal/msgcheck"
	"github.com/memplan/memplan/server"
)

func newServer(t testing.TB, cfg server.Config) *httptest.Server {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewJSONHandler(io.Discard, nil))
	}
	ts := httptest.NewServer(server.New(cli.APIBackend{}, cfg))
	t.Cleanup(ts.Close)
	return ts
}

type reply struct {
	status int
	header http.Header
	body   []byte
}

func post(t testing.TB, url, body string) reply {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return reply{resp.StatusCode, resp.Header, b}
}

// errorOf decodes an error body: one JSON object with "error" (one line)
// and maybe "field".
func errorOf(t *testing.T, r reply) (msg, field string) {
	t.Helper()
	var e struct {
		Error string `json:"error"`
		Field string `json:"field"`
	}
	dec := json.NewDecoder(bytes.NewReader(r.body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&e); err != nil || e.Error == "" {
		t.Fatalf("status %d: not a JSON error body: %s", r.status, r.body)
	}
	if strings.Contains(e.Error, "\n") {
		t.Errorf("error is more than one line: %q", e.Error)
	}
	if strings.Contains(e.Error, "--") {
		t.Errorf("error names a flag, not a request field: %q", e.Error)
	}
	if p := msgcheck.Problems(e.Error); len(p) > 0 {
		t.Errorf("error %q: %v", e.Error, p)
	}
	return e.Error, e.Field
}

// Every route's bad input: a 4xx with a one-line JSON error naming the
// request field, never a 500.
func TestBadInput(t *testing.T) {
	ts := newServer(t, server.Config{MaxBody: 1 << 10, MaxFileBody: 4 << 10})
	huge := `{"model": "` + strings.Repeat("x", 2<<10) + `"}`
	hugeFile := `{"snapshot": "` + strings.Repeat("A", 8<<10) + `"}`
	type row struct {
		route, body string
		status      int
		field, want string
	}
	var rows []row
	for _, c := range []string{"plan", "compare", "fit", "max"} {
		ask := ""
		if c == "max" {
			ask = `, "micro_batch": "?"`
		}
		rows = append(rows,
			row{c, `{"model": `, 400, "", "not valid JSON (it ends early)"},
			row{c, `{"model": "gpt2",}`, 400, "", "not valid JSON"},
			row{c, `[1, 2]`, 400, "", "must be one JSON object"},
			row{c, ``, 400, "", "must be one JSON object"},
			row{c, `{"model": "gpt2"} {}`, 400, "", "data after its JSON object"},
			row{c, `{"modle": "gpt2"}`, 400, "modle", `unknown field "modle"`},
			row{c, `{"micro-batch": 2}`, 400, "micro-batch", `did you mean "micro_batch"`},
			row{c, `{"svg": "/tmp/x.svg"}`, 400, "svg", `unknown field "svg"`},
			row{c, `{"graph": "/etc/passwd"}`, 400, "graph", `unknown field "graph"`},
			row{c, `{"micro_batch": "4"}`, 400, "micro_batch", "must be an integer"},
			row{c, `{"micro_batch": 1.5}`, 400, "micro_batch", "must be a whole number"},
			row{c, `{"micro_batch": 99999999999999999999}`, 400, "micro_batch", "want a whole number (this one is out of range)"},
			row{c, `{"model": 7}`, 400, "model", `field "model" must be a string, not a number`},
			row{c, `{"sp": "yes"}`, 400, "sp", "must be true or false"},
			row{c, `{"set": "a=b"}`, 400, "set", "must be an array of strings"},
			row{c, `{"set": [1]}`, 400, "set", "must be an array of strings"},
			row{c, `{"model": "gpt2", "model": "gpt2"}`, 400, "model", "given twice"},
			row{c, `{"model": null}`, 400, "model", "not null"},
			row{c, huge, 413, "", "over the limit of 1024 bytes"},
			row{c, `{"model": "nope", "gpu": "h100"` + ask + `}`, 400, "", `model "nope": not a catalog model`},
			row{c, `{"model": "./config.json"}`, 400, "model", "catalog models"},
			row{c, `{"recipe": "/etc/recipe.yaml"}`, 400, "recipe", "recipe names"},
			row{c, `{"model": "gpt2", "gpu": "h100", "seq": -1` + ask + `}`, 400, "seq", "seq"},
		)
	}
	rows = append(rows,
		row{"plan", `{"model": "gpt2", "gpu": "h100", "micro_batch": -4}`, 400, "micro_batch", "micro_batch must be at least 1"},
		row{"plan", `{"model": "gpt2", "gpu": "h100", "micro_batch": "?"}`, 400, "micro_batch", "must be an integer"},
		row{"plan", `{"model": "gpt2", "mode": "serve", "gpu": "h100", "gpu_memory_utilization": 1e999}`, 400, "gpu_memory_utilization",
			`field "gpu_memory_utilization" 1e999: want a number (this one is out of range)`},
		row{"max", `{"model": "gpt2", "gpu": "h100"}`, 400, "", `'?'`},
		row{"fit", `{"model": "llama-3-70b", "gpu": "rtx-4090", "global_batch": 8}`, 422, "", "no plan fits"},
		row{"fit", `{"model": "gpt2", "gpu": "h100", "headroom": -1e999}`, 400, "headroom", `field "headroom" -1e999: want a number (this one is out of range)`},
		row{"explain", `{}`, 400, "snapshot", `field "snapshot" is required`},
		row{"explain", `{"snapshot": "not base64!"}`, 400, "snapshot", "not base64"},
		row{"explain", `{"snapshot": "` + base64.StdEncoding.EncodeToString([]byte("garbage")) + `"}`, 400, "", `field "snapshot": not a valid pickle`},
		row{"explain", `{"snapshot": 5}`, 400, "snapshot", "must be a string"},
		// explain plans only --against flags, which the service does not
		// take: its plan flags are no fields.
		row{"explain", `{"snapshot": "", "model": "gpt2"}`, 400, "model", `unknown field "model"`},
		row{"explain", hugeFile, 413, "", "over the limit of 4096 bytes"},
		row{"pack", `{"gpus": "8xh100"}`, 400, "jobs", `field "jobs" is required`},
		row{"pack", `{"jobs": "kind: [", "gpus": "8xh100"}`, 400, "", ""},
		row{"pack", `{"jobs": "kind: memplan.jobs/v1\njobs: []\n"}`, 400, "gpus", "gpus"},
		row{"pack", `{"jobs": "kind: memplan.jobs/v1\njobs:\n  - name: a\n    plan: /etc/passwd\n", "gpus": "8xh100"}`, 400, "jobs", "jobs.0.plan names a file"},
		row{"pack", `{"jobs": "kind: memplan.jobs/v1\njobs:\n  - name: a\n    snapshot: ../../../etc/hostname\n", "gpus": "8xh100"}`, 400, "jobs", "jobs.0.snapshot names a file"},
		row{"pack", `{"jobs": "kind: memplan.jobs/v1\njobs:\n  - name: a\n    train: {model: ../../x/config.json}\n", "gpus": "8xh100"}`, 400, "jobs", "jobs.0.train.model is a path"},
	)
	for _, r := range rows {
		t.Run(r.route+" "+r.body[:min(len(r.body), 40)], func(t *testing.T) {
			got := post(t, ts.URL+"/v1/"+r.route, r.body)
			if got.status != r.status {
				t.Fatalf("status %d, want %d: %s", got.status, r.status, got.body)
			}
			msg, field := errorOf(t, got)
			if field != r.field && r.field != "" {
				t.Errorf("field %q, want %q (%s)", field, r.field, msg)
			}
			if !strings.Contains(msg, r.want) {
				t.Errorf("error %q does not say %q", msg, r.want)
			}
		})
	}
	for _, c := range []string{"plan", "explain"} {
		resp, err := http.Get(ts.URL + "/v1/" + c)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 405 || resp.Header.Get("Allow") != "POST" {
			t.Errorf("GET /v1/%s: %d, Allow %q, want 405 POST", c, resp.StatusCode, resp.Header.Get("Allow"))
		}
	}
}

// A plan, compare, max, explain and pack request answers with the document
// the CLI's --json prints for the same flags (byte for byte), a job that
// does not fit included; a repeated request (its keys in another order) is
// a cache hit with the same bytes.
func TestAnswersEqualCLI(t *testing.T) {
	ts := newServer(t, server.Config{})
	snap, err := os.ReadFile("../testdata/snapshots/Muduard__LayoutEditing__413b2eb4__memory_snapshot.pkl")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	jobs := "kind: memplan.jobs/v1\njobs:\n  - name: small\n    train: {model: gpt2, micro-batch: 2, seq: 512}\n    replicas: 3\n"
	if err := os.WriteFile(dir+"/jobs.yaml", []byte(jobs), 0o600); err != nil {
		t.Fatal(err)
	}
	snapPath := dir + "/snapshot"
	if err := os.WriteFile(snapPath, snap, 0o600); err != nil {
		t.Fatal(err)
	}
	jb, _ := json.Marshal(jobs)
	for _, c := range []struct {
		route, body, again string
		args               []string
		exit               string
	}{
		{"plan", `{"model": "gpt2", "gpu": "h100", "micro_batch": 4, "no_timeline": true}`, `{"no_timeline":true,"micro_batch":4,"gpu":"h100","model":"gpt2"}`,
			[]string{"plan", "--model", "gpt2", "--gpu", "h100", "--micro-batch", "4", "--no-timeline", "--json"}, "0"},
		{"plan", `{"model": "llama-3-8b", "gpu": "rtx-4090", "no_timeline": true}`, "",
			[]string{"plan", "--model", "llama-3-8b", "--gpu", "rtx-4090", "--no-timeline", "--json"}, "3"},
		{"compare", `{"model": "gpt2", "gpu": "h100", "micro_batch": 8}`, "",
			[]string{"compare", "--model", "gpt2", "--gpu", "h100", "--micro-batch", "8", "--json"}, "0"},
		{"max", `{"model": "gpt2", "gpu": "h100", "micro_batch": "?", "seq": 1024}`, "",
			[]string{"max", "--model", "gpt2", "--gpu", "h100", "--micro-batch", "?", "--seq", "1024", "--json"}, "0"},
		{"plan", `{"mode": "serve", "model": "llama-3.1-8b", "gpu": "h100", "gpu_memory_utilization": 0.8}`, "",
			[]string{"plan", "--mode", "serve", "--model", "llama-3.1-8b", "--gpu", "h100", "--gpu-memory-utilization", "0.8", "--json"}, ""},
		{"explain", `{"snapshot": "` + base64.StdEncoding.EncodeToString(snap) + `"}`, "",
			[]string{"explain", snapPath, "--json"}, "0"},
		{"pack", `{"jobs": ` + string(jb) + `, "gpus": "2xh100"}`, "",
			[]string{"pack", dir + "/jobs.yaml", "--gpus", "2xh100", "--json"}, "0"},
	} {
		t.Run(c.route+" "+c.body[:min(40, len(c.body))], func(t *testing.T) {
			var out, errb bytes.Buffer
			code := cli.Main(c.args, &out, &errb)
			got := post(t, ts.URL+"/v1/"+c.route, c.body)
			if got.status != 200 {
				t.Fatalf("status %d: %s (CLI exit %d: %s)", got.status, got.body, code, errb.String())
			}
			want := strings.ReplaceAll(out.String(), dir+"/", "")
			if string(got.body) != want {
				t.Errorf("answer differs from the CLI's --json (%d vs %d bytes)", len(got.body), len(want))
			}
			if c.exit != "" && got.header.Get("Memplan-Exit-Status") != c.exit {
				t.Errorf("Memplan-Exit-Status %q, want %q", got.header.Get("Memplan-Exit-Status"), c.exit)
			}
			if c.again != "" {
				again := post(t, ts.URL+"/v1/"+c.route, c.again)
				if again.header.Get("Memplan-Cache") != "hit" || !bytes.Equal(again.body, got.body) {
					t.Errorf("repeated request: cache %q, same bytes %v", again.header.Get("Memplan-Cache"), bytes.Equal(again.body, got.body))
				}
			}
		})
	}
}

// A request past its time limit stops (fit checks its context between
// states) with 503; the long search does not run on.
func TestTimeLimit(t *testing.T) {
	ts := newServer(t, server.Config{Timeout: 50 * time.Millisecond, CacheEntries: -1})
	start := time.Now()
	got := post(t, ts.URL+"/v1/fit", `{"model": "llama-3-8b", "gpu": "h100", "gpus": 8, "global_batch": 64}`)
	if got.status != 503 {
		t.Fatalf("status %d, want 503: %s", got.status, got.body)
	}
	msg, _ := errorOf(t, got)
	if !strings.Contains(msg, "time limit of 50ms") {
		t.Errorf("error %q does not name the time limit", msg)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("a 50ms limit took %s to answer", d)
	}
}

// inFlight is /healthz's count of requests computing.
func inFlight(t *testing.T, url string) int {
	t.Helper()
	var h struct {
		InFlight int `json:"in_flight"`
	}
	if err := json.Unmarshal(get(t, url+"/healthz", nil).body, &h); err != nil {
		t.Fatal(err)
	}
	return h.InFlight
}

// waitIdle waits until no request computes and returns how long that took;
// it fails the test past limit.
func waitIdle(t *testing.T, url string, limit time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	for time.Since(start) < limit {
		if inFlight(t, url) == 0 {
			return time.Since(start)
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("a request still computes %s after its answer", limit)
	return 0
}

// Every route's work stops at the time limit, not only fit's: a 100 ms
// limit on deepseek-v3 jobs that take seconds to plan (plan --accum 8 took
// 5.7 s under a 3 s limit, pack 7.9 s) answers 503 naming the limit, and
// the request's place is free soon after (its plans look at the context
// between phases). Wall times are logged, not asserted beyond bounds
// several times the check's granularity.
func TestEveryRouteStopsAtTheTimeLimit(t *testing.T) {
	ts := newServer(t, server.Config{Timeout: 100 * time.Millisecond, CacheEntries: -1, MaxInFlight: 1})
	jobs, _ := json.Marshal("kind: memplan.jobs/v1\njobs:\n  - name: a\n    train: {model: deepseek-v3, seq: 4096}\n")
	for _, c := range []struct{ route, body string }{
		{"plan", `{"model": "deepseek-v3", "gpu": "h100", "accum": 8}`},
		{"compare", `{"model": "deepseek-v3", "gpu": "h100"}`},
		{"max", `{"model": "deepseek-v3", "gpu": "h100", "seq": "?"}`},
		{"fit", `{"model": "deepseek-v3", "gpu": "h100", "gpus": 64, "global_batch": 64}`},
		{"pack", `{"jobs": ` + string(jobs) + `, "gpus": "8xh100"}`},
	} {
		t.Run(c.route, func(t *testing.T) {
			start := time.Now()
			got := post(t, ts.URL+"/v1/"+c.route, c.body)
			answered := time.Since(start)
			if got.status != 503 {
				t.Fatalf("status %d, want 503: %.300s", got.status, got.body)
			}
			if msg, _ := errorOf(t, got); !strings.Contains(msg, "time limit of 100ms") {
				t.Errorf("error %q does not name the time limit", msg)
			}
			if answered > 2*time.Second {
				t.Errorf("a 100ms limit took %s to answer", answered)
			}
			stopped := waitIdle(t, ts.URL, 5*time.Second)
			t.Logf("answered after %s, stopped %s later", answered, stopped)
		})
	}
}

// stubborn is a backend whose Run ignores its context: it returns when
// released, as a computation between two looks at its context does.
type stubborn struct {
	cli.APIBackend
	started, release chan struct{}
}

func (b *stubborn) Run(ctx context.Context, c string, r server.Request) (server.Answer, error) {
	b.started <- struct{}{}
	<-b.release
	return server.Answer{Doc: []byte("{}\n")}, nil
}

// The answer comes at the time limit, and when the client goes away, even
// while the computation runs on; its place in the semaphore is held until
// it returns, so no more than MaxInFlight requests ever compute.
func TestAnswersAtTheDeadline(t *testing.T) {
	b := &stubborn{started: make(chan struct{}, 1), release: make(chan struct{})}
	srv := httptest.NewServer(server.New(b, server.Config{Timeout: 50 * time.Millisecond, MaxInFlight: 1, CacheEntries: -1,
		Logger: slog.New(slog.NewJSONHandler(io.Discard, nil))}))
	defer srv.Close()
	replied := make(chan reply, 1)
	go func() { replied <- post(t, srv.URL+"/v1/plan", `{"model": "gpt2"}`) }()
	<-b.started
	var got reply
	select {
	case got = <-replied:
	case <-time.After(5 * time.Second):
		close(b.release)
		t.Fatal("no answer 5 s past a 50ms limit: the server waited for the computation")
	}
	if got.status != 503 {
		t.Fatalf("status %d, want 503: %s", got.status, got.body)
	}
	if msg, _ := errorOf(t, got); !strings.Contains(msg, "time limit of 50ms") {
		t.Errorf("error %q does not name the time limit", msg)
	}
	if n := inFlight(t, srv.URL); n != 1 {
		t.Errorf("%d requests computing while the stopped one runs on, want 1", n)
	}
	close(b.release)
	waitIdle(t, srv.URL, 5*time.Second)
}

// panicky is a backend with a bug.
type panicky struct{ cli.APIBackend }

func (panicky) Run(context.Context, string, server.Request) (server.Answer, error) {
	panic("a bug")
}

// A command that panics (it runs beside its handler) is a 500 and a log
// line, not a crash of the server, and its place is given back.
func TestPanicIs500(t *testing.T) {
	var buf bytes.Buffer
	srv := httptest.NewServer(server.New(panicky{}, server.Config{MaxInFlight: 1, CacheEntries: -1, Logger: slog.New(slog.NewJSONHandler(&buf, nil))}))
	defer srv.Close()
	for range 2 {
		got := post(t, srv.URL+"/v1/plan", `{"model": "gpt2"}`)
		if msg, _ := errorOf(t, got); got.status != 500 || !strings.Contains(msg, "a bug in memplan") {
			t.Fatalf("%d %q, want 500", got.status, msg)
		}
	}
	waitIdle(t, srv.URL, 5*time.Second)
	if !strings.Contains(buf.String(), `"panic":"a bug"`) {
		t.Errorf("no log line of the panic: %s", buf.String())
	}
}

// A client that goes away frees its place: the plan it asked for stops at
// its next look at the context, seconds before it would have ended.
func TestClientGoneFreesItsPlace(t *testing.T) {
	ts := newServer(t, server.Config{CacheEntries: -1})
	ctx, cancel := context.WithCancel(context.Background())
	done := postAside(ctx, ts.URL+"/v1/plan", `{"model": "deepseek-v3", "gpu": "h100", "accum": 8}`)
	for deadline := time.Now().Add(5 * time.Second); inFlight(t, ts.URL) == 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the request never started")
		}
	}
	time.Sleep(200 * time.Millisecond)
	cancel()
	<-done
	t.Logf("stopped %s after the client went away", waitIdle(t, ts.URL, 5*time.Second))
}

// postAside posts body to url under ctx on a goroutine of its own; the
// channel is closed once it is answered or ctx ends.
func postAside(ctx context.Context, url, body string) <-chan struct{} {
	req, _ := http.NewRequestWithContext(ctx, "POST", url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	done := make(chan struct{})
	go func() {
		defer close(done)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	return done
}

// blocking is a backend whose Run waits for release or its context.
type blocking struct {
	cli.APIBackend
	started, release chan struct{}
	stopped          chan error
}

func (b *blocking) Run(ctx context.Context, c string, r server.Request) (server.Answer, error) {
	b.started <- struct{}{}
	select {
	case <-b.release:
		return server.Answer{Doc: []byte("{}\n")}, nil
	case <-ctx.Done():
		b.stopped <- ctx.Err()
		return server.Answer{}, ctx.Err()
	}
}

// Bounded concurrency: with one place and one queue slot, a third request
// gets 429 with Retry-After; one that waits past QueueWait 503. A client
// that goes away cancels its computation.
func TestConcurrencyAndCancellation(t *testing.T) {
	b := &blocking{started: make(chan struct{}, 4), release: make(chan struct{}), stopped: make(chan error, 4)}
	srv := httptest.NewServer(server.New(b, server.Config{MaxInFlight: 1, MaxQueue: 1, QueueWait: time.Second, CacheEntries: -1,
		Logger: slog.New(slog.NewJSONHandler(io.Discard, nil))}))
	defer srv.Close()
	first := make(chan reply, 1)
	go func() { first <- post(t, srv.URL+"/v1/plan", `{"model": "gpt2"}`) }()
	<-b.started
	queued := make(chan reply, 1)
	go func() { queued <- post(t, srv.URL+"/v1/plan", `{"model": "gpt2", "seq": 8}`) }()
	waitQueued(t, srv.URL, 1)
	over := post(t, srv.URL+"/v1/plan", `{"model": "gpt2", "seq": 16}`)
	if over.status != 429 || over.header.Get("Retry-After") == "" {
		t.Errorf("request past the queue: %d Retry-After %q, want 429 with Retry-After", over.status, over.header.Get("Retry-After"))
	}
	if q := <-queued; q.status != 503 || q.header.Get("Retry-After") == "" {
		t.Errorf("request that waited past QueueWait: %d, want 503 with Retry-After: %s", q.status, q.body)
	}
	close(b.release)
	if f := <-first; f.status != 200 {
		t.Errorf("first request: %d", f.status)
	}

	// A client that goes away: its request's context ends.
	b.release = make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "POST", srv.URL+"/v1/plan", strings.NewReader(`{"model": "gpt2", "seq": 32}`))
	req.Header.Set("Content-Type", "application/json")
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
	}()
	<-b.started
	cancel()
	select {
	case err := <-b.stopped:
		if err != context.Canceled {
			t.Errorf("computation stopped with %v, want context.Canceled", err)
		}
	case <-time.After(5 * time.Second):
		t.Error("the computation of a request whose client went away was not cancelled")
	}
}

// waitQueued waits until /healthz says n requests wait.
func waitQueued(t *testing.T, url string, n int) {
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		resp, err := http.Get(url + "/healthz")
		if err != nil {
			t.Fatal(err)
		}
		var h struct{ Queued int }
		_ = json.NewDecoder(resp.Body).Decode(&h)
		resp.Body.Close()
		if h.Queued == n {
			return
		}
	}
	t.Fatalf("%d requests never queued", n)
}

// /metrics counts requests by route and status, cache hits and in-flight
// requests; /healthz answers; / points at the API.
func TestMetricsHealthAndRoot(t *testing.T) {
	ts := newServer(t, server.Config{})
	body := `{"model": "gpt2", "gpu": "h100", "no_timeline": true}`
	post(t, ts.URL+"/v1/plan", body)
	post(t, ts.URL+"/v1/plan", body)
	post(t, ts.URL+"/v1/plan", `{"bad": 1}`)
	m := metricsText(t, ts.URL)
	for _, want := range []string{
		`memplan_http_requests_total{route="/v1/plan",status="200"} 2`,
		`memplan_http_requests_total{route="/v1/plan",status="400"} 1`,
		`memplan_cache_hits_total{route="plan"} 1`,
		`memplan_cache_misses_total{route="plan"} 1`,
		`memplan_http_request_duration_seconds_bucket{route="/v1/plan",status="200",le="+Inf"} 2`,
		`memplan_http_in_flight 0`,
		`process_resident_memory_bytes`,
	} {
		if !strings.Contains(m, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	for path, want := range map[string]int{"/healthz": 200, "/nope": 404} {
		resp, err := http.Get(ts.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want || !json.Valid(b) {
			t.Errorf("GET %s: %d %s, want %d with JSON", path, resp.StatusCode, b, want)
		}
	}
}

// One JSON log line per request, with route, status, duration and cache.
func TestLogLines(t *testing.T) {
	var buf bytes.Buffer
	ts := newServer(t, server.Config{Logger: slog.New(slog.NewJSONHandler(&buf, nil))})
	post(t, ts.URL+"/v1/plan", `{"model": "gpt2", "gpu": "h100", "no_timeline": true}`)
	post(t, ts.URL+"/v1/plan", `{"modle": 1}`)
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("%d log lines, want 2: %s", len(lines), buf.String())
	}
	var l struct {
		Msg, Route, Cache, Error string
		Status                   int
		MS                       *float64 `json:"ms"`
	}
	if err := json.Unmarshal([]byte(lines[0]), &l); err != nil || l.Route != "/v1/plan" || l.Status != 200 || l.Cache != "miss" || l.MS == nil {
		t.Errorf("log line %s (%v)", lines[0], err)
	}
	if err := json.Unmarshal([]byte(lines[1]), &l); err != nil || l.Status != 400 || !strings.Contains(l.Error, "modle") {
		t.Errorf("log line %s (%v)", lines[1], err)
	}
}

// Every route answers the CLI's exit status for the same flags with one
// mapping, the one /openapi.json documents: 0 and 3 are 200 with the
// document, 4 (nothing fits) is 422 with compare's and max's document or
// fit's error, 1 is 400; the Memplan-Exit-Status header says which, a
// cached answer too.
func TestExitStatusHTTP(t *testing.T) {
	ts := newServer(t, server.Config{})
	resp, err := http.Get(ts.URL + "/openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Paths map[string]struct {
			Post struct {
				Responses map[string]struct {
					Headers map[string]struct {
						Description string `json:"description"`
					} `json:"headers"`
				} `json:"responses"`
			} `json:"post"`
		} `json:"paths"`
	}
	err = json.NewDecoder(resp.Body).Decode(&doc)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	snap, err := os.ReadFile("../testdata/snapshots/Muduard__LayoutEditing__413b2eb4__memory_snapshot.pkl")
	if err != nil {
		t.Fatal(err)
	}
	jobs, _ := json.Marshal("kind: memplan.jobs/v1\njobs:\n  - name: a\n    train: {model: gpt2}\n")
	for _, c := range []struct {
		route, body string
		status      int
		exit        string
		schema      string // the document's; "" an error body
	}{
		{"plan", `{"model": "gpt2", "gpu": "h100", "no_timeline": true}`, 200, "0", "memplan.plan/v1"},
		{"plan", `{"model": "llama-3-8b", "gpu": "rtx-4090", "no_timeline": true}`, 200, "3", "memplan.plan/v1"},
		{"plan", `{"model": "gpt2", "micro_batch": 0}`, 400, "1", ""},
		{"compare", `{"model": "gpt2", "gpu": "h100"}`, 200, "0", "memplan.compare/v1"},
		{"compare", `{"model": "llama-3-70b", "gpu": "rtx-4090"}`, 422, "4", "memplan.compare/v1"},
		{"max", `{"model": "gpt2", "gpu": "h100", "micro_batch": "?", "seq": 1024}`, 200, "0", "memplan.max/v1"},
		{"max", `{"model": "llama-3-70b", "gpu": "rtx-4090", "micro_batch": "?"}`, 422, "4", "memplan.max/v1"},
		{"max", `{"model": "gpt2", "mode": "serve", "gpu": "rtx-4090", "context": "?", "requests": 100000000}`, 422, "4", "memplan.max/v1"},
		{"fit", `{"model": "llama-3-70b", "gpu": "rtx-4090", "global_batch": 8}`, 422, "4", ""},
		{"explain", `{"snapshot": "` + base64.StdEncoding.EncodeToString(snap) + `"}`, 200, "0", "memplan.explain/v1"},
		{"pack", `{"jobs": ` + string(jobs) + `, "gpus": "1xh100"}`, 200, "0", "memplan.pack/v1"},
	} {
		t.Run(c.route+" "+c.exit+" "+c.body[:min(40, len(c.body))], func(t *testing.T) {
			for _, try := range []string{"computed", "cached"} {
				got := post(t, ts.URL+"/v1/"+c.route, c.body)
				if got.status != c.status || got.header.Get("Memplan-Exit-Status") != c.exit {
					t.Fatalf("%s: status %d, Memplan-Exit-Status %q, want %d and %s: %.300s", try, got.status, got.header.Get("Memplan-Exit-Status"), c.status, c.exit, got.body)
				}
				if c.schema == "" {
					errorOf(t, got)
				} else {
					var d struct {
						Schema string `json:"schema"`
					}
					if err := json.Unmarshal(got.body, &d); err != nil || d.Schema != c.schema {
						t.Errorf("%s: body schema %q (%v), want %s", try, d.Schema, err, c.schema)
					}
				}
			}
			r, ok := doc.Paths["/v1/"+c.route].Post.Responses[fmt.Sprint(c.status)]
			if !ok || !strings.Contains(r.Headers["Memplan-Exit-Status"].Description, c.exit) {
				t.Errorf("/openapi.json: /v1/%s's %d does not document exit status %s (%+v)", c.route, c.status, c.exit, r)
			}
		})
	}
}

// Every GET route refuses another method with 405 and Allow, /metrics too.
func TestGetRoutesRefuseOtherMethods(t *testing.T) {
	ts := newServer(t, server.Config{})
	for _, path := range []string{"/metrics", "/healthz", "/openapi.json", "/v1/catalog", "/"} {
		for _, method := range []string{http.MethodPost, http.MethodPut, http.MethodDelete} {
			req, _ := http.NewRequest(method, ts.URL+path, strings.NewReader("{}"))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 405 || !strings.Contains(resp.Header.Get("Allow"), "GET") {
				t.Errorf("%s %s: %d, Allow %q, want 405 GET: %.100s", method, path, resp.StatusCode, resp.Header.Get("Allow"), b)
			}
		}
	}
}

// A POST to /v1/COMMAND must say its body is JSON (Content-Type
// application/json, with at most a UTF-8 charset): a page on another
// origin can send text/plain, a form or multipart without asking first (a
// CORS "simple request"), and so make a local server plan for it, but not
// application/json without a preflight, which the server does not grant.
// Every other type is a 415 with a JSON error, before the body is read or
// parsed.
func TestPostNeedsJSONContentType(t *testing.T) {
	b := &counting{}
	ts := httptest.NewServer(server.New(b, server.Config{Logger: slog.New(slog.NewJSONHandler(io.Discard, nil))}))
	defer ts.Close()
	send := func(method, path, ctype string, header map[string]string) reply {
		req, err := http.NewRequest(method, ts.URL+path, strings.NewReader(`{"model": "gpt2", "no_timeline": true}`))
		if err != nil {
			t.Fatal(err)
		}
		if ctype != "-" {
			req.Header.Set("Content-Type", ctype)
		}
		return do(t, req, header)
	}
	evil := map[string]string{"Origin": "http://evil.example"}
	for _, c := range b.Commands() {
		for _, ctype := range []string{"text/plain", "text/plain;charset=UTF-8", "application/x-www-form-urlencoded",
			"multipart/form-data; boundary=x", "-", "", "application/jsonx", "application/json-seq", "text/json",
			"application/json; charset=latin1", "application/json; foo=bar", "application/json, text/plain"} {
			r := send("POST", "/v1/"+c, ctype, evil)
			if r.status != 415 || r.header.Get("Content-Type") != "application/json" {
				t.Errorf("POST /v1/%s as %q from another origin: %d %q %s, want 415 with a JSON error", c, ctype, r.status, r.header.Get("Content-Type"), r.body)
				continue
			}
			if msg, _ := errorOf(t, r); !strings.Contains(msg, "application/json") {
				t.Errorf("POST /v1/%s as %q: 415 %q does not say what to send", c, ctype, msg)
			}
			if r.header.Get("Access-Control-Allow-Origin") != "" {
				t.Errorf("POST /v1/%s: Access-Control-Allow-Origin %q", c, r.header.Get("Access-Control-Allow-Origin"))
			}
		}
	}
	if n := b.parsed.Load(); n != 0 {
		t.Errorf("%d bodies parsed under a type that is not JSON, want none", n)
	}
	// No preflight is granted: a cross-origin page cannot send JSON.
	pre := send("OPTIONS", "/v1/plan", "-", map[string]string{"Origin": "http://evil.example",
		"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "content-type"})
	if pre.status < 400 || pre.header.Get("Access-Control-Allow-Origin") != "" || pre.header.Get("Access-Control-Allow-Headers") != "" {
		t.Errorf("preflight OPTIONS /v1/plan: %d %v, want a refusal without CORS headers", pre.status, pre.header)
	}
	for _, ctype := range []string{"application/json", "application/json; charset=utf-8", "Application/JSON; Charset=\"UTF-8\"", "application/json;"} {
		if r := send("POST", "/v1/plan", ctype, nil); r.status != 200 {
			t.Errorf("POST /v1/plan as %q: %d %s, want 200", ctype, r.status, r.body)
		}
	}
}

// heldOnce is a backend that counts its runs and holds each until released.
type heldOnce struct {
	cli.APIBackend
	runs    atomic.Int32
	release chan struct{}
}

func (b *heldOnce) Run(ctx context.Context, c string, r server.Request) (server.Answer, error) {
	b.runs.Add(1)
	<-b.release
	return server.Answer{Doc: []byte("{\"n\": 1}\n")}, nil
}

// Identical requests at once are computed once: the others wait for its
// answer (a cache hit each), even past MaxInFlight, where eight identical
// fits were four computed and four refused as busy, each a cache miss
// (second adversarial sweep).
func TestIdenticalRequestsComputedOnce(t *testing.T) {
	b := &heldOnce{release: make(chan struct{})}
	srv := httptest.NewServer(server.New(b, server.Config{MaxInFlight: 2, Logger: slog.New(slog.NewJSONHandler(io.Discard, nil))}))
	defer srv.Close()
	const n = 8
	replies := make(chan reply, n)
	for range n {
		go func() { replies <- post(t, srv.URL+"/v1/plan", `{"model": "gpt2", "no_timeline": true}`) }()
	}
	deadline := time.Now().Add(5 * time.Second)
	for b.runs.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond) // the others reach the wait
	close(b.release)
	for range n {
		if r := <-replies; r.status != 200 || string(r.body) != "{\"n\": 1}\n" {
			t.Errorf("status %d, body %q", r.status, r.body)
		}
	}
	if got := b.runs.Load(); got != 1 {
		t.Errorf("%d runs for %d identical requests, want 1", got, n)
	}
}

// watched is a request body that records whether the server read it.
type watched struct {
	r    io.Reader
	read *atomic.Bool
}

func (w watched) Read(p []byte) (int, error) {
	w.read.Store(true)
	return w.r.Read(p)
}

// A request whose body carries a file (pack, explain) takes its place
// before its body is read: while one computes, the queued ones hold no
// body (twelve 60 MB pack bodies at once were all read and parsed while
// two computed, 2.5 GB), one past the queue is refused 429 unread, and
// the queued ones are answered once the place frees.
func TestQueuedFileBodiesAreNotRead(t *testing.T) {
	b := &blocking{started: make(chan struct{}, 8), release: make(chan struct{}), stopped: make(chan error, 8)}
	const queue = 3
	h := server.New(b, server.Config{MaxInFlight: 1, MaxQueue: queue, QueueWait: 20 * time.Second, CacheEntries: -1,
		Logger: slog.New(slog.NewJSONHandler(io.Discard, nil))})
	srv := httptest.NewServer(h)
	defer srv.Close()
	body := func(i int) string {
		return fmt.Sprintf(`{"jobs": "kind: memplan.jobs/v1\njobs: [{name: a%d, train: {model: gpt2}}]\n%s", "gpus": "8xh100"}`, i, strings.Repeat("#", 1<<20))
	}
	first := make(chan reply, 1)
	go func() { first <- post(t, srv.URL+"/v1/pack", body(0)) }()
	<-b.started
	send := func(i int, read *atomic.Bool) int {
		req := httptest.NewRequest("POST", "/v1/pack", watched{strings.NewReader(body(i)), read})
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec.Code
	}
	var reads [queue + 1]atomic.Bool
	codes := make(chan int, queue)
	for i := range queue {
		go func() { codes <- send(i+1, &reads[i]) }()
	}
	waitQueued(t, srv.URL, queue)
	if code := send(queue+1, &reads[queue]); code != 429 || reads[queue].Load() {
		t.Errorf("a pack request past the queue: %d, its body read %t; want 429 unread", code, reads[queue].Load())
	}
	for i := range queue {
		if reads[i].Load() {
			t.Errorf("queued pack request %d: its body was read while it waited for a place", i)
		}
	}
	close(b.release)
	if f := <-first; f.status != 200 {
		t.Errorf("first request: %d %s", f.status, f.body)
	}
	for range queue {
		if code := <-codes; code != 200 {
			t.Errorf("a queued request: %d, want 200 once the place freed", code)
		}
	}
}

// A heavy request that finds the process's heavy turn taken waits for it
// with its place given back (server.WhileWaiting): on a server of one
// place, a gpt2 plan posted behind a deepseek-v3 plan that waits for the
// turn is answered at once, and the deepseek-v3 plan stops when its client
// goes away, its place not given back twice.
func TestHeavyRequestWaitsAside(t *testing.T) {
	done, err := engine.HeavyTurn(context.Background()) // another heavy computation
	if err != nil {
		t.Fatal(err)
	}
	defer done()
	ts := newServer(t, server.Config{CacheEntries: -1, MaxInFlight: 1, QueueWait: 2 * time.Second})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	heavy := postAside(ctx, ts.URL+"/v1/plan", `{"model": "deepseek-v3", "gpu": "h100"}`)
	for deadline := time.Now().Add(10 * time.Second); engine.HeavyWaiting() == 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the deepseek-v3 plan never waited for the heavy turn")
		}
	}
	if n := inFlight(t, ts.URL); n != 0 {
		t.Fatalf("%d requests hold a place while the heavy one waits for its turn", n)
	}
	var h struct {
		Aside int `json:"waiting_aside"`
	}
	if err := json.Unmarshal(get(t, ts.URL+"/healthz", nil).body, &h); err != nil || h.Aside != 1 {
		t.Fatalf("/healthz: %d waiting aside (%v) while the heavy plan waits, want 1", h.Aside, err)
	}
	start := time.Now()
	if r := post(t, ts.URL+"/v1/plan", `{"model": "gpt2", "gpu": "h100", "seq": 64, "no_timeline": true}`); r.status != http.StatusOK {
		t.Fatalf("the gpt2 plan behind it: %d %s", r.status, r.body)
	}
	t.Logf("gpt2 answered in %s beside a deepseek-v3 plan waiting for the heavy turn", time.Since(start).Round(time.Millisecond))
	if !strings.Contains(metricsText(t, ts.URL), "memplan_http_waiting_aside 1") {
		t.Error("memplan_http_waiting_aside is not 1 while the heavy plan waits")
	}
	cancel()
	<-heavy
	waitIdle(t, ts.URL, 5*time.Second)
	for deadline := time.Now().Add(5 * time.Second); engine.HeavyWaiting() != 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the deepseek-v3 plan still waits for the turn after its client went away")
		}
	}
	// The place is free once, not twice: a request still takes it.
	if r := post(t, ts.URL+"/v1/plan", `{"model": "gpt2", "gpu": "h100", "seq": 32, "no_timeline": true}`); r.status != http.StatusOK {
		t.Fatalf("a plan after: %d %s", r.status, r.body)
	}
}

// metricsText is the server's /metrics.
func metricsText(t *testing.T, url string) string {
	t.Helper()
	return string(get(t, url+"/metrics", nil).body)
}

// No more than --max-queue requests wait aside for the heavy turn: past
// them a heavy request waits in its place, and lighter ones behind it are
// refused as busy, as a flood of any other requests is.
func TestWaitingAsideIsBounded(t *testing.T) {
	done, err := engine.HeavyTurn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer done()
	ts := newServer(t, server.Config{CacheEntries: -1, MaxInFlight: 1, MaxQueue: 1, QueueWait: 200 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	var posted []<-chan struct{}
	defer func() {
		cancel()
		for _, c := range posted {
			<-c
		}
	}()
	for i, accum := range []int{1, 2} {
		posted = append(posted, postAside(ctx, ts.URL+"/v1/plan", fmt.Sprintf(`{"model": "deepseek-v3", "gpu": "h100", "accum": %d}`, accum)))
		for deadline := time.Now().Add(10 * time.Second); engine.HeavyWaiting() != int64(i+1); time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("heavy request %d never waited for the turn", i+1)
			}
		}
	}
	if n := inFlight(t, ts.URL); n != 1 {
		t.Fatalf("%d requests hold a place, want the second heavy one waiting in its place", n)
	}
	if r := post(t, ts.URL+"/v1/plan", `{"model": "gpt2", "gpu": "h100", "seq": 64, "no_timeline": true}`); r.status != http.StatusServiceUnavailable {
		t.Fatalf("a gpt2 plan behind a heavy request waiting in its place: %d, want 503 after --queue-wait", r.status)
	}
}
