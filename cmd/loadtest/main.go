// Command loadtest (make loadtest) drives memplan serve on loopback and reports latency,
// errors and memory: --clients clients (default 200) each POST a plan the
// server has cached, one every --think (jittered), for --duration (default
// 60 s), while a stream of new llama-3-70b plans (a sequence length never
// asked before each time) arrives at --new-rate per second. It stops by
// itself at the end of the duration, prints one JSON summary and, with
// --check, exits 1 when a request failed or a p99 is over its target
// (cached < 20 ms, new 70B < 100 ms).
//
// Without --addr it starts the server in this process on 127.0.0.1:0 (the
// RSS it reports is then the server's and the clients' together, an upper
// bound on the server's).
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/memplan/memplan/cli"
	"github.com/memplan/memplan/server"
)

const (
	cachedBody = `{"model": "llama-3-70b", "gpu": "h100", "tp": 8, "pp": 4, "micro_batch": 1, "seq": 4096, "no_timeline": true}`
	// newBody is a llama-3-70b plan at a sequence length no earlier
	// request asked for (a cache miss every time).
	newBody = `{"model": "llama-3-70b", "gpu": "h100", "tp": 8, "pp": 4, "micro_batch": 1, "seq": %d, "no_timeline": true%s}`
)

type summary struct {
	Clients       int            `json:"clients"`
	Duration      string         `json:"duration"`
	Think         string         `json:"think"`
	NewRate       float64        `json:"new_rate_per_s"`
	Cached        stats          `json:"cached"`
	New           stats          `json:"new_70b"`
	Errors        int64          `json:"errors"`
	ErrorSamples  []string       `json:"error_samples,omitempty"`
	RSSMaxMiB     float64        `json:"rss_max_mib"`
	RSSEndMiB     float64        `json:"rss_end_mib"`
	RSSSamplesMiB []float64      `json:"rss_samples_mib"`
	Statuses      map[string]int `json:"statuses"`
	CPUs          int            `json:"cpus"`
	InProcess     bool           `json:"in_process"`
}

type stats struct {
	N    int     `json:"n"`
	RPS  float64 `json:"rps"`
	P50  float64 `json:"p50_ms"`
	P90  float64 `json:"p90_ms"`
	P99  float64 `json:"p99_ms"`
	Max  float64 `json:"max_ms"`
	Mean float64 `json:"mean_ms"`
}

type recorder struct {
	mu       sync.Mutex
	lat      map[string][]time.Duration
	statuses map[string]int
	errs     atomic.Int64
	samples  []string
}

func (r *recorder) add(kind string, d time.Duration, status int, err error, body []byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.statuses[strconv.Itoa(status)]++
	if err != nil || status != http.StatusOK {
		r.errs.Add(1)
		if len(r.samples) < 5 {
			msg := fmt.Sprintf("%s: %d %s", kind, status, bytes.TrimSpace(body))
			if err != nil {
				msg = fmt.Sprintf("%s: %v", kind, err)
			}
			r.samples = append(r.samples, msg)
		}
		return
	}
	r.lat[kind] = append(r.lat[kind], d)
}

func statsOf(ds []time.Duration, over time.Duration) stats {
	if len(ds) == 0 {
		return stats{}
	}
	slices.Sort(ds)
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	q := func(p float64) float64 { return ms(ds[min(len(ds)-1, int(p*float64(len(ds))))]) }
	var sum time.Duration
	for _, d := range ds {
		sum += d
	}
	return stats{N: len(ds), RPS: float64(len(ds)) / over.Seconds(), P50: q(.5), P90: q(.9), P99: q(.99), Max: ms(ds[len(ds)-1]), Mean: ms(sum / time.Duration(len(ds)))}
}

// rssMiB is this process's resident set (VmRSS) in MiB.
func rssMiB() float64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseFloat(f[1], 64)
			return kb / 1024
		}
	}
	return 0
}

type config struct {
	addr, newExtra     string
	clients            int
	duration, think    time.Duration
	newRate            float64
	check, checkErrors bool
}

func main() {
	var c config
	flag.StringVar(&c.addr, "addr", "", "server to load (default: start one in this process)")
	flag.IntVar(&c.clients, "clients", 200, "concurrent clients asking for the cached plan")
	flag.DurationVar(&c.duration, "duration", 60*time.Second, "how long to run")
	flag.DurationVar(&c.think, "think", 100*time.Millisecond, "each client's pause between requests (jittered ±50%)")
	flag.Float64Var(&c.newRate, "new-rate", 4, "new llama-3-70b plans per second (open loop)")
	flag.StringVar(&c.newExtra, "new-fields", "", `extra fields of the new plans, e.g. ', "no_reserved": true'`)
	flag.BoolVar(&c.check, "check", false, "exit 1 on any error or a p99 over its target")
	flag.BoolVar(&c.checkErrors, "check-errors", false, "exit 1 on any error (not on latency: for a shared CI host)")
	flag.Parse()
	if c.clients < 1 || c.duration <= 0 || c.newRate < 0 || c.think < 0 {
		fmt.Fprintln(os.Stderr, "loadtest: --clients must be at least 1, --duration positive, --think and --new-rate not negative")
		os.Exit(2)
	}
	base := c.addr
	if base == "" {
		var stop func()
		var err error
		if base, stop, err = startServer(); err != nil {
			fmt.Fprintln(os.Stderr, "loadtest:", err)
			os.Exit(1)
		}
		defer stop()
	}
	s := run(c, "http://"+base+"/v1/plan")
	out, _ := json.MarshalIndent(s, "", "  ")
	fmt.Println(string(out))
	if c.check || c.checkErrors {
		fails := s.failures(c)
		if !c.check && s.Errors == 0 {
			fails = nil
		}
		if len(fails) > 0 {
			fmt.Fprintln(os.Stderr, "loadtest: "+strings.Join(fails, "; "))
			os.Exit(1)
		}
	}
}

// startServer serves the API in this process on a loopback port.
func startServer() (string, func(), error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	srv := &http.Server{Handler: server.New(cli.APIBackend{}, server.Config{Logger: slog.New(slog.NewJSONHandler(io.Discard, nil))}),
		ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	return ln.Addr().String(), func() { _ = srv.Close() }, nil
}

// loader is one run: its client, its recorder and its end.
type loader struct {
	c   config
	url string
	hc  *http.Client
	rec *recorder
}

// do posts body and records its latency under kind (a request cut by the
// run's end is not counted).
func (l *loader) do(ctx context.Context, kind, body string) {
	req, _ := http.NewRequestWithContext(ctx, "POST", l.url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	start := time.Now()
	resp, err := l.hc.Do(req)
	if err != nil {
		if ctx.Err() == nil {
			l.rec.add(kind, 0, 0, err, nil)
		}
		return
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	d := time.Since(start)
	if ctx.Err() != nil && resp.StatusCode != http.StatusOK {
		return
	}
	l.rec.add(kind, d, resp.StatusCode, nil, b)
}

// client asks for the cached plan, one request every think time (jittered),
// until ctx ends.
func (l *loader) client(ctx context.Context) {
	t := time.NewTimer(time.Duration(rand.Int64N(int64(l.c.think) + 1)))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		l.do(ctx, "cached", cachedBody)
		t.Reset(time.Duration(float64(l.c.think) * (0.5 + rand.Float64())))
	}
}

// newPlans sends a new llama-3-70b plan at newRate per second, each at a
// sequence no earlier one asked for, until ctx ends.
func (l *loader) newPlans(ctx context.Context) {
	tick := time.NewTicker(time.Duration(float64(time.Second) / l.c.newRate))
	defer tick.Stop()
	var inner sync.WaitGroup
	defer inner.Wait()
	for seq := 1024; ; seq += 8 {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		inner.Add(1)
		go func() { defer inner.Done(); l.do(ctx, "new", fmt.Sprintf(newBody, seq, l.c.newExtra)) }()
	}
}

// sampleRSS records the resident set every second until ctx ends.
func (l *loader) sampleRSS(ctx context.Context, out *[]float64) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			r := rssMiB()
			l.rec.mu.Lock()
			*out = append(*out, r)
			l.rec.mu.Unlock()
		}
	}
}

// run warms the cache, runs the clients, the new plans and the sampler for
// the duration and summarises.
func run(c config, url string) summary {
	tr := &http.Transport{MaxIdleConns: c.clients + 64, MaxIdleConnsPerHost: c.clients + 64, IdleConnTimeout: time.Minute}
	l := &loader{c: c, url: url, hc: &http.Client{Transport: tr, Timeout: 30 * time.Second},
		rec: &recorder{lat: map[string][]time.Duration{}, statuses: map[string]int{}}}
	l.do(context.Background(), "warm", cachedBody)
	l.rec.lat, l.rec.statuses = map[string][]time.Duration{}, map[string]int{}
	ctx, cancel := context.WithTimeout(context.Background(), c.duration)
	defer cancel()
	var wg sync.WaitGroup
	for i := 0; i < c.clients; i++ {
		wg.Go(func() { l.client(ctx) })
	}
	if c.newRate > 0 {
		wg.Go(func() { l.newPlans(ctx) })
	}
	var rss []float64
	wg.Go(func() { l.sampleRSS(ctx, &rss) })
	wg.Wait()
	rec := l.rec
	s := summary{Clients: c.clients, Duration: c.duration.String(), Think: c.think.String(), NewRate: c.newRate,
		Cached: statsOf(rec.lat["cached"], c.duration), New: statsOf(rec.lat["new"], c.duration),
		Errors: rec.errs.Load(), ErrorSamples: rec.samples, RSSEndMiB: rssMiB(), Statuses: rec.statuses,
		CPUs: runtime.NumCPU(), InProcess: c.addr == ""}
	for i, r := range rss {
		s.RSSMaxMiB = max(s.RSSMaxMiB, r)
		if i%10 == 0 { // every 10th sample, to keep the summary short
			s.RSSSamplesMiB = append(s.RSSSamplesMiB, r)
		}
	}
	return s
}

// failures are the targets s misses.
func (s summary) failures(c config) []string {
	var fails []string
	if s.Errors > 0 {
		fails = append(fails, fmt.Sprintf("%d errors", s.Errors))
	}
	if s.Cached.P99 >= 20 {
		fails = append(fails, fmt.Sprintf("cached p99 %.1f ms ≥ 20 ms", s.Cached.P99))
	}
	if c.newRate > 0 && s.New.P99 >= 100 {
		fails = append(fails, fmt.Sprintf("new 70B p99 %.1f ms ≥ 100 ms", s.New.P99))
	}
	return fails
}
