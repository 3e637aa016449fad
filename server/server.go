// Package server is memplan's HTTP service (memplan serve): the commands a
// Backend runs (the CLI's plan, compare, fit, max, explain and pack) as a
// versioned JSON API, POST /v1/COMMAND with a JSON object of the command's
// fields, answered with the document the command's --json prints. Around
// each request: a body size limit, a time limit (the request's context,
// cancelled too when the client goes away: the request is answered when it
// ends, and the command, which looks at it between its phases, stops soon
// after), bounded concurrency (a semaphore with a short queue; 429 or 503
// with Retry-After past it), an LRU cache of answers keyed by the canonical
// request, one structured log line (log/slog) and Prometheus metrics.
//
// Statuses follow the CLI's exit status for the same flags, one mapping for
// every command (exitHTTP), carried too in the Memplan-Exit-Status header:
// 0 (fits) and 3 (does not fit: the document says so) are 200 with the
// document; 4 (nothing fits) is 422, with the document where the command
// prints one (compare: no strategy fits; max: no value fits; each names the
// largest lever) and {"error": ..., "field": ...} where it prints none (fit
// finds no plan); 1 (bad input) is 400 with the error naming the request
// field. Outside the CLI's statuses: 413 past the size limit; 415 for a
// body not sent as application/json (what keeps other sites' pages from
// posting to a local server without a CORS preflight); 429 and 503
// when busy; 503 past the time limit. A 500 is a bug (a recovered panic),
// never input.
package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"path"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/memplan/memplan/internal/jsonbody"
)

// Field is one field of a command's request body.
type Field struct {
	Key      string // JSON key
	Type     string // JSON schema type: integer, number, boolean, string, array (of strings)
	Ask      bool   // also takes the string "?"
	Help     string
	Default  string
	Required bool
}

// Request is a parsed request: the fields' values and the canonical form
// of the request (the cache's key).
type Request struct {
	Values    map[string][]string
	Canonical []byte
}

// Answer is a command's JSON document and the CLI's exit status for it: 0,
// 3 when the job does not fit, 4 when nothing fits (compare's strategies,
// max's values).
type Answer struct {
	Doc  []byte
	Exit int
}

// Backend runs commands.
type Backend interface {
	Commands() []string
	Fields(command string) []Field
	Parse(command string, body []byte) (Request, error)
	Run(ctx context.Context, command string, r Request) (Answer, error)
}

// StatusError is a Backend error with its HTTP status and the request
// field it is about ("" when none).
type StatusError interface {
	error
	HTTPStatus() int
	FieldKey() string
}

// Config of a Server. Zero values take the defaults documented per field.
type Config struct {
	// MaxBody is the largest request body for plan, compare, fit and max
	// (default 64 KiB); MaxFileBody for explain and pack, whose bodies carry
	// a file (default 64 MiB).
	MaxBody, MaxFileBody int64
	// Timeout is each request's time limit (default 60 s): the request is
	// answered 503 then, and its command stopped through its context.
	Timeout time.Duration
	// MaxInFlight requests compute at once (default GOMAXPROCS); MaxQueue
	// more wait (default 8 × MaxInFlight), each at most QueueWait (default
	// 5 s). A request past the queue gets 429, one that waited too long 503.
	MaxInFlight, MaxQueue int
	QueueWait             time.Duration
	// CacheEntries and CacheBytes bound the answer cache (default 4096
	// entries, 256 MiB); CacheEntries < 0 turns it off.
	CacheEntries int
	CacheBytes   int64
	// Logger gets one line per request (default: JSON on stderr).
	Logger *slog.Logger
}

// Server is the HTTP handler.
type Server struct {
	cfg     Config
	backend Backend
	mux     *http.ServeMux
	unclean http.Handler // answers a path that is not clean
	sem     chan struct{}
	waiting atomic.Int64
	// aside counts the commands waiting with their place given back
	// (WhileWaiting), at most MaxQueue.
	aside atomic.Int64
	cache *lru
	// bodies maps a request body the server has answered (the command and
	// its bytes) to its canonical request, so a repeated body finds its
	// answer without parsing it again (parsing was half of a cached
	// answer's CPU: server.BenchmarkCachedPlan's profile).
	bodies *lru
	// flights are the cacheable requests being computed, by canonical
	// request: an identical one waits for its answer (await).
	fmu     sync.Mutex
	flights map[string]*flight
	log     *slog.Logger
	reg     *prometheus.Registry
	m       metrics
	openapi []byte
}

type metrics struct {
	requests  *prometheus.CounterVec
	latency   *prometheus.HistogramVec
	inFlight  prometheus.Gauge
	queued    prometheus.Gauge
	aside     prometheus.Gauge
	cacheHits *prometheus.CounterVec
	cacheMiss *prometheus.CounterVec
	rejected  *prometheus.CounterVec
	cacheSize prometheus.GaugeFunc
}

// New builds a server over b.
func New(b Backend, cfg Config) *Server {
	if cfg.MaxBody <= 0 {
		cfg.MaxBody = 64 << 10
	}
	if cfg.MaxFileBody <= 0 {
		cfg.MaxFileBody = 64 << 20
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 60 * time.Second
	}
	if cfg.MaxInFlight <= 0 {
		cfg.MaxInFlight = runtime.GOMAXPROCS(0)
	}
	if cfg.MaxQueue <= 0 {
		cfg.MaxQueue = 8 * cfg.MaxInFlight
	}
	if cfg.QueueWait <= 0 {
		cfg.QueueWait = 5 * time.Second
	}
	if cfg.CacheEntries == 0 {
		cfg.CacheEntries = 4096
	}
	if cfg.CacheBytes <= 0 {
		cfg.CacheBytes = 256 << 20
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	s := &Server{cfg: cfg, backend: b, mux: http.NewServeMux(), sem: make(chan struct{}, cfg.MaxInFlight), log: cfg.Logger}
	if cfg.CacheEntries > 0 {
		s.cache = newLRU(cfg.CacheEntries, cfg.CacheBytes)
		s.bodies = newLRU(cfg.CacheEntries, cfg.CacheBytes/4)
	}
	s.initMetrics()
	doc, err := json.MarshalIndent(OpenAPI(b), "", "  ")
	if err != nil {
		panic(err) // a document of maps and strings always marshals
	}
	s.openapi = doc
	for _, c := range b.Commands() {
		s.mux.Handle("/v1/"+c, s.route("/v1/"+c, s.command(c)))
	}
	s.mux.Handle("/openapi.json", s.route("/openapi.json", s.get(func(w http.ResponseWriter, r *http.Request) int {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(s.openapi)
		return http.StatusOK
	})))
	s.mux.Handle("/healthz", s.route("/healthz", s.get(func(w http.ResponseWriter, r *http.Request) int {
		// waiting_aside: computations that gave their place back to wait
		// for the heavy turn (WhileWaiting): neither in flight nor queued.
		return writeJSON(w, http.StatusOK, map[string]any{"status": "ok", "in_flight": len(s.sem), "queued": s.waiting.Load(), "waiting_aside": s.aside.Load()})
	})))
	prom := promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{})
	s.mux.Handle("/metrics", s.route("/metrics", s.get(func(w http.ResponseWriter, r *http.Request) int {
		prom.ServeHTTP(w, r)
		return http.StatusOK
	})))
	if c, ok := b.(Cataloger); ok {
		s.mux.Handle("/v1/catalog", s.route("/v1/catalog", s.catalog(c)))
	}
	assets := pageAssets()
	s.mux.Handle("/static/", s.route("/static/", s.page(assets)))
	// "/static" itself is a 404 like any other path that is not a file,
	// not the mux's redirect to "/static/".
	s.mux.Handle("/static", s.route("other", s.page(assets)))
	s.mux.Handle("/{$}", s.route("/", s.page(assets)))
	s.mux.Handle("/", s.route("other", s.page(assets)))
	s.unclean = s.route("other", func(w http.ResponseWriter, r *http.Request) int {
		return writeError(w, http.StatusNotFound, "", "no route "+r.URL.Path+": a path with a . or .. segment or a doubled slash is not cleaned (the API is described at /openapi.json)")
	})
	return s
}

func (s *Server) initMetrics() {
	s.reg = prometheus.NewRegistry()
	s.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	s.m = metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "memplan_http_requests_total",
			Help: "HTTP requests answered, by route and status."}, []string{"route", "status"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "memplan_http_request_duration_seconds",
			Help:    "Time to answer an HTTP request, by route and status.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .02, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}}, []string{"route", "status"}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{Name: "memplan_http_in_flight",
			Help: "Requests computing now (holding the semaphore)."}),
		queued: prometheus.NewGauge(prometheus.GaugeOpts{Name: "memplan_http_queued",
			Help: "Requests waiting for the semaphore."}),
		aside: prometheus.NewGauge(prometheus.GaugeOpts{Name: "memplan_http_waiting_aside",
			Help: "Requests whose command waits, its place given back, for the process's one heavy turn (WhileWaiting)."}),
		cacheHits: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "memplan_cache_hits_total",
			Help: "Answers served from the cache, by route."}, []string{"route"}),
		cacheMiss: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "memplan_cache_misses_total",
			Help: "Answers computed (not in the cache), by route."}, []string{"route"}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "memplan_http_rejected_total",
			Help: "Requests refused for load: queue_full (429) or queue_timeout (503)."}, []string{"reason"}),
	}
	s.m.cacheSize = prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "memplan_cache_bytes",
		Help: "Bytes of answers in the cache."}, func() float64 {
		if s.cache == nil {
			return 0
		}
		return float64(s.cache.size())
	})
	s.reg.MustRegister(s.m.requests, s.m.latency, s.m.inFlight, s.m.queued, s.m.aside, s.m.cacheHits, s.m.cacheMiss, s.m.rejected, s.m.cacheSize)
}

// ServeHTTP serves the API. A path that is not clean (a . or .. segment,
// a doubled slash, no leading slash) is a JSON 404 like any other path
// that is not a route: http.ServeMux would answer it with an HTML redirect
// to the path cleaned, which the API never promised and the page never
// needs.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !isClean(r.URL.EscapedPath()) {
		s.unclean.ServeHTTP(w, r)
		return
	}
	s.mux.ServeHTTP(w, r)
}

// isClean reports whether p is a path http.ServeMux leaves as it is: it
// starts with a slash and path.Clean changes nothing but a trailing slash.
func isClean(p string) bool {
	if p == "" || p[0] != '/' {
		return false
	}
	c := path.Clean(p)
	if c != "/" && strings.HasSuffix(p, "/") {
		c += "/"
	}
	return c == p
}

// handler answers a request and returns the status it wrote.
type handler func(w http.ResponseWriter, r *http.Request) int

// route wraps h with recovery, metrics and the request's log line.
func (s *Server) route(name string, h handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		rec := &recorder{ResponseWriter: w}
		status := func() (status int) {
			defer func() {
				if p := recover(); p != nil {
					s.log.Error("panic", "route", name, "panic", fmt.Sprint(p))
					status = writeError(rec, http.StatusInternalServerError, "", errPanic.Error())
				}
			}()
			return h(rec, r)
		}()
		d := time.Since(start)
		code := strconv.Itoa(status)
		s.m.requests.WithLabelValues(name, code).Inc()
		s.m.latency.WithLabelValues(name, code).Observe(d.Seconds())
		lvl := slog.LevelInfo
		if status >= 500 {
			lvl = slog.LevelError
		}
		attrs := []slog.Attr{slog.String("method", r.Method), slog.String("route", name), slog.Int("status", status),
			slog.Float64("ms", float64(d.Microseconds())/1000), slog.Int("bytes", rec.n), slog.String("remote", r.RemoteAddr)}
		if rec.cache != "" {
			attrs = append(attrs, slog.String("cache", rec.cache))
		}
		if rec.errMsg != "" {
			attrs = append(attrs, slog.String("error", rec.errMsg))
		}
		s.log.LogAttrs(r.Context(), lvl, "request", attrs...)
	})
}

// get allows GET (and HEAD) only.
func (s *Server) get(h handler) handler {
	return func(w http.ResponseWriter, r *http.Request) int {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			return writeError(w, http.StatusMethodNotAllowed, "", r.Method+" is not allowed here: use GET")
		}
		return h(w, r)
	}
}

// command answers POST /v1/COMMAND: read the body under its limit, parse
// it, answer from the cache or compute under the semaphore and the time
// limit.
//
// A command whose body carries a file (explain, pack: up to MaxFileBody)
// takes its place in the semaphore before its body is read, and keeps it
// to compute: a request waiting for a place holds no body. Read first,
// twelve 60 MB pack bodies at once were all held (and parsed) while two
// computed, 2.5 GB. The other commands' bodies (up to MaxBody, 64 KiB) are
// read first, so a cached answer, or an identical request in flight, is
// served without waiting for a place.
func (s *Server) command(name string) handler {
	limit := s.cfg.MaxBody
	for _, f := range s.backend.Fields(name) {
		if f.Required { // a command whose body carries a file
			limit = s.cfg.MaxFileBody
		}
	}
	placeFirst := limit > s.cfg.MaxBody
	return func(w http.ResponseWriter, r *http.Request) int {
		if r.Method != http.MethodPost {
			w.Header().Set("Allow", "POST")
			return writeError(w, http.StatusMethodNotAllowed, "", r.Method+" is not allowed here: POST a JSON object of the command's fields (see /openapi.json)")
		}
		if err := jsonbody.Check(r.Header); err != nil {
			return writeError(w, http.StatusUnsupportedMediaType, "", err.Error())
		}
		held := false // a place in the semaphore, given back on return unless run takes it
		if placeFirst {
			if status, ok := s.acquire(r.Context(), w); !ok {
				return status
			}
			held = true
			defer func() {
				if held {
					s.release()
				}
			}()
		}
		body, status := readBody(w, r, limit)
		if body == nil {
			return status
		}
		if a, ok := s.cachedBody(name, body); ok {
			return s.hit(w, name, a)
		}
		req, err := s.backend.Parse(name, body)
		if err != nil {
			return writeBackendError(w, err)
		}
		key := string(req.Canonical)
		ctx, cancel := context.WithTimeoutCause(r.Context(), s.cfg.Timeout, fmt.Errorf("the request ran past its time limit of %s", s.cfg.Timeout))
		defer cancel()
		var shared Answer // the answer identical requests waiting on this one get
		if s.cache != nil {
			a, ok, land := s.await(ctx, key)
			if !ok {
				a, ok = s.cache.get(key) // answered while this one waited
			}
			if ok {
				if land != nil {
					land(Answer{}, false)
				}
				s.bodies.put(bodyKey(name, body), Answer{Doc: req.Canonical})
				return s.hit(w, name, a)
			}
			if land == nil {
				return writeError(w, http.StatusServiceUnavailable, "", "the request was stopped: "+stopReason(ctx, r))
			}
			defer func() { land(shared, shared.Doc != nil) }()
			s.m.cacheMiss.WithLabelValues(name).Inc()
			w.(*recorder).cache = "miss"
		}
		if !held {
			if status, ok := s.acquire(ctx, w); !ok {
				return status
			}
		}
		held = false // run gives it back
		a, err := s.run(ctx, name, req)
		if err != nil {
			if ctx.Err() != nil {
				return writeError(w, http.StatusServiceUnavailable, "", "the request was stopped: "+stopReason(ctx, r))
			}
			if errors.Is(err, errPanic) {
				return writeError(w, http.StatusInternalServerError, "", err.Error())
			}
			return writeBackendError(w, err)
		}
		if s.cache != nil {
			s.cache.put(key, a)
			s.bodies.put(bodyKey(name, body), Answer{Doc: req.Canonical})
			shared = a
		}
		return writeAnswer(w, a, "miss")
	}
}

// readBody reads r's body, at most limit bytes; nil and the status it
// answered when it could not.
func readBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, int) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if err != nil {
		var mb *http.MaxBytesError
		if errors.As(err, &mb) {
			return nil, writeError(w, http.StatusRequestEntityTooLarge, "", fmt.Sprintf("the request body is over the limit of %d bytes", mb.Limit))
		}
		return nil, writeError(w, http.StatusBadRequest, "", "reading the request body: "+err.Error())
	}
	if body == nil {
		body = []byte{}
	}
	return body, 0
}

// flight is a request being computed; done is closed once a (ok: it was
// answered) is set.
type flight struct {
	done chan struct{}
	a    Answer
	ok   bool
}

// await returns the answer of an identical request (key: the canonical
// request) computed while this one waited (ok), or makes this request the
// one computing key and returns land, which it must call with its answer
// (or false: it failed, and a waiting request computes its own). Both nil
// and false: ctx ended while waiting. Eight identical fits at once were
// four computed and four refused as busy, each counted a cache miss
// (second adversarial sweep); now one computes and the others wait for it.
func (s *Server) await(ctx context.Context, key string) (a Answer, ok bool, land func(Answer, bool)) {
	for {
		s.fmu.Lock()
		f := s.flights[key]
		if f == nil {
			if s.flights == nil {
				s.flights = map[string]*flight{}
			}
			f = &flight{done: make(chan struct{})}
			s.flights[key] = f
			s.fmu.Unlock()
			return Answer{}, false, func(a Answer, ok bool) {
				s.fmu.Lock()
				delete(s.flights, key)
				s.fmu.Unlock()
				f.a, f.ok = a, ok
				close(f.done)
			}
		}
		s.fmu.Unlock()
		select {
		case <-f.done:
			if f.ok {
				return f.a, true, nil
			}
			// It failed or was stopped: compute (or wait for the next).
		case <-ctx.Done():
			return Answer{}, false, nil
		}
	}
}

// errPanic is a command that panicked (a bug), logged where it happened.
var errPanic = errors.New("internal error (a bug in memplan, not your request)")

// run runs a command holding a place in the semaphore (taken by acquire)
// and returns its answer, or ctx's cause as soon as ctx is done: the
// request is answered at its time limit, or when its client goes away,
// even while the command is between two looks at ctx (a plan's phase,
// explain's replay). The place is given back when the command returns,
// which its looks at ctx make soon after, so no more than MaxInFlight
// commands ever compute.
func (s *Server) run(ctx context.Context, name string, req Request) (Answer, error) {
	type result struct {
		a   Answer
		err error
	}
	done := make(chan result, 1)
	pl := &place{s: s, held: true}
	go func() {
		res := func() (res result) {
			defer func() {
				if p := recover(); p != nil {
					s.log.Error("panic", "route", "/v1/"+name, "panic", fmt.Sprint(p))
					res = result{err: errPanic}
				}
			}()
			a, err := s.backend.Run(context.WithValue(ctx, placeKey{}, pl), name, req)
			return result{a, err}
		}()
		// Given back before the answer is handed over: a client that
		// reads its answer finds the place free.
		if pl.held {
			s.release()
		}
		done <- res
	}()
	select {
	case res := <-done:
		return res.a, res.err
	case <-ctx.Done():
		select {
		case res := <-done: // it ended as ctx did: its answer
			return res.a, res.err
		default:
			return Answer{}, context.Cause(ctx)
		}
	}
}

// place is a running command's place in the semaphore; held is false
// while WhileWaiting has given it back. Only the command's goroutine
// reads or writes it.
type place struct {
	s    *Server
	held bool
}

type placeKey struct{}

// WhileWaiting runs wait, a command's wait for something other than a
// CPU (the process's one turn for heavy work, engine.HeavyTurn), with the
// command's place in the semaphore given back, so a lighter request
// computes meanwhile; it takes a place again before it returns (waiting
// for one as long as ctx lasts, not counted in the queue). At most
// MaxQueue commands wait so; past them a command waits in its place, and
// the queue behind it fills and refuses (429) as before: a flood of heavy
// requests is bounded as one of any other. Outside a command of the
// server it runs wait alone. Only the command's own
// goroutine may call it: a command that computes on several goroutines
// (pack's jobs) waits holding its place. Two deepseek-v3 plans posted at
// once to a server of two places held both, one waiting for the turn,
// and a gpt2 plan behind them was answered 503 after --queue-wait.
func WhileWaiting(ctx context.Context, wait func() error) error {
	pl, _ := ctx.Value(placeKey{}).(*place)
	if pl == nil || !pl.held {
		return wait()
	}
	s := pl.s
	if s.aside.Add(1) > int64(s.cfg.MaxQueue) {
		s.aside.Add(-1)
		return wait()
	}
	defer s.aside.Add(-1)
	s.release()
	pl.held = false
	s.m.aside.Inc()
	err := wait()
	s.m.aside.Dec()
	select {
	case s.sem <- struct{}{}:
		s.m.inFlight.Inc()
		pl.held = true
	case <-ctx.Done():
		if err == nil {
			err = context.Cause(ctx)
		}
	}
	return err
}

// stopReason says why a request's context ended: its time limit, or its
// client going away.
func stopReason(ctx context.Context, r *http.Request) string {
	if r.Context().Err() != nil {
		return "the client closed the connection"
	}
	return context.Cause(ctx).Error()
}

// bodyKey is the key of a request body in s.bodies.
func bodyKey(command string, body []byte) string { return command + "\x00" + string(body) }

// cachedBody is the cached answer to body, when the server has parsed the
// same bytes for the same command before (parsing is a pure function of
// them) and the answer is still cached.
func (s *Server) cachedBody(command string, body []byte) (Answer, bool) {
	if s.cache == nil {
		return Answer{}, false
	}
	canon, ok := s.bodies.get(bodyKey(command, body))
	if !ok {
		return Answer{}, false
	}
	return s.cache.get(string(canon.Doc))
}

// hit answers from the cache.
func (s *Server) hit(w http.ResponseWriter, command string, a Answer) int {
	s.m.cacheHits.WithLabelValues(command).Inc()
	w.(*recorder).cache = "hit"
	return writeAnswer(w, a, "hit")
}

// acquire takes a place in the semaphore: at once when one is free, else
// in the queue when it has room (429 when not) for at most QueueWait (503
// past it, or when ctx ends).
func (s *Server) acquire(ctx context.Context, w http.ResponseWriter) (int, bool) {
	select {
	case s.sem <- struct{}{}:
		s.m.inFlight.Inc()
		return 0, true
	default:
	}
	if s.waiting.Add(1) > int64(s.cfg.MaxQueue) {
		s.waiting.Add(-1)
		s.m.rejected.WithLabelValues("queue_full").Inc()
		w.Header().Set("Retry-After", "1")
		return writeError(w, http.StatusTooManyRequests, "", fmt.Sprintf("busy: %d requests computing and %d waiting; retry later", s.cfg.MaxInFlight, s.cfg.MaxQueue)), false
	}
	s.m.queued.Inc()
	defer func() { s.waiting.Add(-1); s.m.queued.Dec() }()
	t := time.NewTimer(s.cfg.QueueWait)
	defer t.Stop()
	select {
	case s.sem <- struct{}{}:
		s.m.inFlight.Inc()
		return 0, true
	case <-t.C:
		s.m.rejected.WithLabelValues("queue_timeout").Inc()
		w.Header().Set("Retry-After", "1")
		return writeError(w, http.StatusServiceUnavailable, "", fmt.Sprintf("busy: waited %s for one of %d places; retry later", s.cfg.QueueWait, s.cfg.MaxInFlight)), false
	case <-ctx.Done():
		return writeError(w, http.StatusServiceUnavailable, "", "the request was stopped while waiting: "+context.Cause(ctx).Error()), false
	}
}

func (s *Server) release() {
	<-s.sem
	s.m.inFlight.Dec()
}

// recorder remembers what a handler wrote, for the log line.
type recorder struct {
	http.ResponseWriter
	n      int
	cache  string
	errMsg string
}

func (r *recorder) Write(b []byte) (int, error) {
	n, err := r.ResponseWriter.Write(b)
	r.n += n
	return n, err
}

// exitHTTP is the HTTP status of each of the CLI's exit statuses: a job
// that does not fit is an answer (200, the document says so); nothing
// fitting is the request's question left without an answer (422, as fit's
// error has always been); bad input is 400. /openapi.json says the same
// (OpenAPI); TestExitStatusHTTP checks every route.
var exitHTTP = map[int]int{0: http.StatusOK, 1: http.StatusBadRequest, 3: http.StatusOK, 4: http.StatusUnprocessableEntity}

// exitOfHTTP is the exit status of a backend error's HTTP status, for its
// Memplan-Exit-Status header (none for the others: busy, too large, past
// the time limit have no exit status).
var exitOfHTTP = map[int]int{http.StatusBadRequest: 1, http.StatusUnprocessableEntity: 4}

// Header values every answer shares, set without Header.Set's
// canonicalising and allocating a slice each (3 of a cached round trip's
// 103 allocations in BenchmarkCachedPlan); net/http only reads them.
var (
	jsonType  = []string{"application/json"}
	cacheWord = map[string][]string{"hit": {"hit"}, "miss": {"miss"}}
	exitWords = [...][]string{{"0"}, {"1"}, {"2"}, {"3"}, {"4"}}
)

func writeAnswer(w http.ResponseWriter, a Answer, cache string) int {
	h := w.Header()
	h["Content-Type"] = jsonType
	if a.Exit >= 0 && a.Exit < len(exitWords) {
		h["Memplan-Exit-Status"] = exitWords[a.Exit]
	} else {
		h.Set("Memplan-Exit-Status", strconv.Itoa(a.Exit))
	}
	if v, ok := cacheWord[cache]; ok {
		h["Memplan-Cache"] = v
	} else {
		h.Set("Memplan-Cache", cache)
	}
	status, ok := exitHTTP[a.Exit]
	if !ok {
		status = http.StatusOK // a status the CLI does not have: the document answers
	}
	w.WriteHeader(status)
	_, _ = w.Write(a.Doc)
	return status
}

func writeBackendError(w http.ResponseWriter, err error) int {
	status, field, msg := http.StatusBadRequest, "", err.Error()
	var se StatusError
	if errors.As(err, &se) {
		status, field = se.HTTPStatus(), se.FieldKey()
	}
	// A backend error without a status is about the input (the CLI's exit
	// status 1): 400, never a 500.
	if exit, ok := exitOfHTTP[status]; ok {
		w.Header()["Memplan-Exit-Status"] = exitWords[exit]
	}
	return writeError(w, status, field, msg)
}

// errorBody is every error's JSON.
type errorBody struct {
	Error string `json:"error"`
	Field string `json:"field,omitempty"`
}

func writeError(w http.ResponseWriter, status int, field, msg string) int {
	if r, ok := w.(*recorder); ok {
		r.errMsg = msg
	}
	return writeJSON(w, status, errorBody{Error: msg, Field: field})
}

func writeJSON(w http.ResponseWriter, status int, v any) int {
	b, _ := json.Marshal(v)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
	return status
}
