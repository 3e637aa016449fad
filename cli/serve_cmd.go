package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/memplan/memplan/engine"
	"github.com/memplan/memplan/server"
)

// APIBackend runs the CLI's commands for the HTTP service (package server).
type APIBackend struct{}

// Commands are the commands the service exposes.
func (APIBackend) Commands() []string { return APICommands() }

// Fields are command's request fields.
func (APIBackend) Fields(command string) []server.Field {
	var out []server.Field
	for _, f := range APIFields(command) {
		out = append(out, server.Field{Key: f.Key, Type: f.Type, Ask: f.Ask, Help: f.Help, Default: f.Default, Required: f.Required})
	}
	return out
}

// Parse decodes a request body (ParseAPIRequest).
func (APIBackend) Parse(command string, body []byte) (server.Request, error) {
	vals, canon, err := ParseAPIRequest(command, body)
	return server.Request{Values: vals, Canonical: canon}, err
}

// Run runs the command (RunAPI).
func (APIBackend) Run(ctx context.Context, command string, r server.Request) (server.Answer, error) {
	res, err := RunAPI(ctx, command, r.Values)
	if err != nil {
		return server.Answer{}, err
	}
	return server.Answer{Doc: res.Doc, Exit: res.Exit}, nil
}

func newServeCmd(stderr io.Writer) *cobra.Command {
	var addr string
	var cfg server.Config
	c := &cobra.Command{
		Use:   "serve",
		Short: "Serve plan, compare, fit, max, explain and pack as a JSON HTTP API (POST /v1/COMMAND, /openapi.json, /metrics)",
		Long: "serve answers POST /v1/plan, /v1/compare, /v1/fit, /v1/max, /v1/explain and /v1/pack: a JSON object of the\n" +
			"command's flags ('-' written '_', e.g. {\"model\": \"llama-3-8b\", \"gpu\": \"h100\", \"micro_batch\": 4}) answered with\n" +
			"the document its --json prints, with the CLI's exit status in Memplan-Exit-Status: 200 for 0 and 3 (a job that\n" +
			"does not fit: the document says so), 422 for 4 (nothing fits: compare's and max's document, fit's error),\n" +
			"400 for 1 (bad input). explain takes the snapshot base64-encoded in \"snapshot\", pack the job file's text in\n" +
			"\"jobs\". Errors are {\"error\", \"field\"}: 400 bad input, 413 too large, 415 a body not sent as\n" +
			"Content-Type: application/json (so that no page of another site can make the server compute), 422 fit found\n" +
			"no plan, 429/503 busy (Retry-After), 503 past --timeout. It caches answers, logs one JSON line per request on\n" +
			"stderr and exposes Prometheus metrics at /metrics. explain and pack wait for their place before their body is\n" +
			"read; fits, and plans, compares and maxes of jobs of deepseek-v3's size, compute one at a time beside lighter\n" +
			"requests; the process keeps its heap under a soft limit of 1.5 GiB, or 1.25× what is live (GOMEMLIMIT overrides).\n" +
			"(plan --mode serve is a different thing: vLLM serving a model.)",
		Example: `  memplan serve --addr 127.0.0.1:8080
  curl -s localhost:8080/v1/plan -H 'Content-Type: application/json' -d '{"model":"llama-3-8b","gpu":"h100","micro_batch":4,"no_timeline":true}'`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkServeFlags(cmd.Flags(), &cfg); err != nil {
				return err
			}
			log := slog.New(slog.NewJSONHandler(stderr, nil))
			cfg.Logger = log
			ln, err := listen(addr)
			if err != nil {
				return err
			}
			hs := &http.Server{Handler: server.New(APIBackend{}, cfg), ReadHeaderTimeout: 10 * time.Second,
				ReadTimeout: time.Minute, IdleTimeout: 2 * time.Minute, MaxHeaderBytes: 64 << 10}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			done := make(chan error, 1)
			go func() { done <- hs.Serve(ln) }()
			log.Info("serving", "addr", ln.Addr().String())
			select {
			case err := <-done:
				return err
			case <-ctx.Done():
			}
			log.Info("shutting down")
			sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := hs.Shutdown(sctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
				return err
			}
			return nil
		},
	}
	fl := c.Flags()
	fl.StringVar(&addr, "addr", "127.0.0.1:8080", "HOST:PORT to listen on")
	fl.DurationVar(&cfg.Timeout, "timeout", 60*time.Second, "each request's time limit: it is answered 503 then, and its command stops (explain's replay too, between events)")
	intVar(fl, &cfg.MaxInFlight, "max-in-flight", 0, "requests computing at once (default: the CPUs)")
	intVar(fl, &cfg.MaxQueue, "max-queue", 0, "requests waiting for a place beyond those (default 8 × --max-in-flight); past it, 429")
	fl.DurationVar(&cfg.QueueWait, "queue-wait", 5*time.Second, "how long a request waits for a place; past it, 503")
	int64Var(fl, &cfg.MaxBody, "max-body", 64<<10, "largest request body in bytes for plan, compare, fit and max")
	int64Var(fl, &cfg.MaxFileBody, "max-file-body", 64<<20, "largest request body in bytes for explain and pack (they carry a file)")
	intVar(fl, &cfg.CacheEntries, "cache-entries", 4096, "answers kept in the cache (-1: no cache)")
	int64Var(fl, &cfg.CacheBytes, "cache-bytes", 256<<20, "bytes of answers kept in the cache")
	return c
}

// checkServeFlags refuses limits server.New would quietly replace by its
// defaults: a negative one (probes: serve --timeout -1s, --max-body -1
// served with 60 s and 64 KiB) or a 0 given (--max-queue 0 queued 8 ×
// --max-in-flight, --timeout 0s allowed 60 s). --cache-entries -1 turns
// the cache off.
func checkServeFlags(fl *pflag.FlagSet, cfg *server.Config) error {
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"timeout", cfg.Timeout}, {"queue-wait", cfg.QueueWait}} {
		if d.v <= 0 {
			return fmt.Errorf("--%s must be positive, got %s", d.name, d.v)
		}
	}
	if err := givenBelow(fl, 1, "max-in-flight", "max-queue", "max-body", "max-file-body", "cache-bytes"); err != nil {
		return err
	}
	if cfg.CacheEntries < -1 || cfg.CacheEntries == 0 && fl.Changed("cache-entries") {
		return fmt.Errorf("--cache-entries must be -1 (no cache) or at least 1, got %d", cfg.CacheEntries)
	}
	return nil
}

// heavyTurn waits for the process's one heavy turn (engine.HeavyTurn) for
// a fit (s nil) or a plan of s past engine.HeavyWork, and returns what
// gives it back (nothing to give back for a lighter plan). Under memplan
// serve it waits with the request's place given back, when another holds
// the turn (server.WhileWaiting).
func heavyTurn(ctx context.Context, s *engine.Spec) (func(), error) {
	if s != nil && !engine.Heavy(s) {
		return func() {}, nil
	}
	if done, ok := engine.TryHeavyTurn(); ok {
		return done, nil
	}
	var done func()
	err := server.WhileWaiting(ctx, func() error {
		var err error
		done, err = engine.HeavyTurn(ctx)
		return err
	})
	if err != nil {
		if done != nil {
			done()
		}
		return nil, err
	}
	return done, nil
}
