package cli

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/memplan/memplan/engine"
	"github.com/memplan/memplan/internal/msgcheck"
)

// The service reads no file of its disk for a caller, however a job file
// spells its keys: a key in another case than the documented one (Model:,
// PLAN:, ſnapshot: with a long s, which Unicode folds to s) is an unknown
// key, never the file key it folds to.
func TestAPIPackKeysInAnotherCase(t *testing.T) {
	cfg, err := filepath.Abs("../testdata/torch/gpt2_tiny.config.json")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, job, want string }{
		{"serve Model", "serve: {Model: CFG, concurrency: 1, context: 64}", `unknown key "Model"`},
		{"train Model", "train: {Model: CFG, seq: 64}", `unknown key "Model"`},
		{"train MODEL", "train: {MODEL: /etc/passwd}", `unknown key "MODEL"`},
		{"train Recipe", "train: {model: gpt2, Recipe: /etc/memplan/recipe.yaml}", `unknown key "Recipe"`},
		{"serve Recipe", "serve: {model: gpt2, concurrency: 1, context: 64, server: hf, rEcipe: /etc/r.yaml}", `unknown key "rEcipe"`},
		{"Train", "Train: {model: gpt2}", `unknown key "Train"`},
		{"Plan", "Plan: /etc/memplan/plan.json", `unknown key "Plan"`},
		{"SNAPSHOT", "SNAPSHOT: /etc/passwd", `unknown key "SNAPSHOT"`},
		{"long s", "ſnapshot: /etc/passwd", `unknown key "ſnapshot"`},
		{"Published", "Published: /etc/rows.jsonl#A", `unknown key "Published"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			jobs := "kind: memplan.jobs/v1\njobs:\n- name: a\n  " + strings.ReplaceAll(tc.job, "CFG", cfg) + "\n"
			body, _ := json.Marshal(map[string]string{"gpus": "2xh100", "jobs": jobs})
			vals, _, err := ParseAPIRequest("pack", body)
			if err != nil {
				t.Fatal(err)
			}
			res, err := RunAPI(context.Background(), "pack", vals)
			var ae *APIError
			if !errors.As(err, &ae) {
				t.Fatalf("answered %v (%s), want a 400", err, res.Doc[:min(len(res.Doc), 80)])
			}
			if ae.Status != 400 || !strings.Contains(ae.Msg, tc.want) {
				t.Errorf("%d %q, want 400 saying %q", ae.Status, ae.Msg, tc.want)
			}
		})
	}
}

// A job file or arrival trace in a request is read as pack reads a file:
// aliases bounded before they are written out (a 1 MiB body of aliases
// was 2 GB in the service), keys that are not strings said in the file's
// words (not "%!s(<nil>)"), each a 400 in one line.
func TestAPIPackYAMLRefusals(t *testing.T) {
	// 300 aliases of a 64 KiB string: 19 MiB written out.
	bomb := func(kind, key string) string {
		return "kind: " + kind + "\nbig: &a \"" + strings.Repeat("x", 64<<10) + "\"\n" + key + ": [" + strings.Repeat("*a,", 300) + "*a]\n"
	}
	jobs := "kind: memplan.jobs/v1\njobs:\n- name: a\n  train: {model: gpt2}\n"
	for _, tc := range []struct{ name, jobs, arrivals, want string }{
		{"aliases", bomb("memplan.jobs/v1", "jobs"), "", `field "jobs": YAML aliases expand to more than 16 MiB`},
		{"null key", "?", "", `field "jobs": a mapping key must be a string (line 1)`},
		{"list key", "? [a]\n: 1\n", "", `field "jobs": a mapping key must be a string (line 1)`},
		{"key in a job", jobs + "  ? {x: 1}\n", "", `field "jobs": a mapping key must be a string (line 5)`},
		{"arrivals null key", jobs, "?", `field "arrivals": a mapping key must be a string (line 1)`},
		{"arrivals list key", jobs, "kind: memplan.arrivals/v1\narrivals:\n- {at: 0s, [d]: 1h, job: a}\n", `field "arrivals": a mapping key must be a string (line 3)`},
		{"arrivals aliases", jobs, bomb("memplan.arrivals/v1", "arrivals"), `field "arrivals": YAML aliases expand to more than 16 MiB`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := map[string]string{"gpus": "1xh100", "jobs": tc.jobs}
			if tc.arrivals != "" {
				req["arrivals"] = tc.arrivals
			}
			body, _ := json.Marshal(req)
			vals, _, err := ParseAPIRequest("pack", body)
			if err != nil {
				t.Fatal(err)
			}
			_, err = RunAPI(context.Background(), "pack", vals)
			var ae *APIError
			if !errors.As(err, &ae) || ae.Status != 400 || !strings.Contains(ae.Msg, tc.want) || strings.Contains(ae.Msg, "\n") {
				t.Fatalf("%v, want a 400 saying %q", err, tc.want)
			}
		})
	}
}

// A value a field's flag refuses is worded as the CLI words a flag's
// (flagError), the field in place of the flag: never pflag's "invalid
// argument ... flag" or strconv's "parsing ...: value out of range".
func TestAPIValueRefusals(t *testing.T) {
	for _, c := range []struct {
		command, body, field, want string
	}{
		{"plan", `{"model": "gpt2", "mode": "serve", "gpu": "h100", "gpu_memory_utilization": 1e999}`, "gpu_memory_utilization",
			`field "gpu_memory_utilization" 1e999: want a number (this one is out of range)`},
		{"fit", `{"model": "gpt2", "gpu": "h100", "headroom": -1e999}`, "headroom",
			`field "headroom" -1e999: want a number (this one is out of range)`},
		{"plan", `{"model": "gpt2", "micro_batch": 99999999999999999999}`, "micro_batch",
			`field "micro_batch" 99999999999999999999: want a whole number (this one is out of range)`},
		{"plan", `{"model": "gpt2", "micro_batch": 1.5}`, "micro_batch", `field "micro_batch" must be a whole number, not 1.5`},
	} {
		t.Run(c.command+" "+c.field, func(t *testing.T) {
			vals, _, err := ParseAPIRequest(c.command, []byte(c.body))
			if err == nil {
				_, err = RunAPI(context.Background(), c.command, vals)
			}
			var ae *APIError
			if !errors.As(err, &ae) || ae.Status != 400 || ae.Field != c.field {
				t.Fatalf("%v (%#v), want a 400 on %q", err, ae, c.field)
			}
			if ae.Msg != c.want {
				t.Errorf("error %q, want %q", ae.Msg, c.want)
			}
			for _, bad := range []string{"invalid argument", "flag", "strconv", "parsing"} {
				if strings.Contains(ae.Msg, bad) {
					t.Errorf("error %q says %q", ae.Msg, bad)
				}
			}
			if p := msgcheck.Problems(ae.Msg); len(p) > 0 {
				t.Errorf("error %q: %v", ae.Msg, p)
			}
		})
	}
}

// A model the service is given by name never reads its disk: a catalog
// name is the catalog's model even beside a file of that name, and any
// other name is refused by name (the CLI would look for such a file in the
// service's working directory first), top level or in a job file.
func TestAPIModelNamesReadNoDisk(t *testing.T) {
	t.Chdir(t.TempDir())
	for _, f := range []string{"gpt2", "secrets"} {
		if err := os.WriteFile(f, []byte(`{"not": "a config"}`), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct{ command, body, want string }{
		{"plan", `{"model": "secrets"}`, `field "model": model "secrets": not a catalog model`},
		{"pack", `{"gpus": "1xh100", "jobs": "kind: memplan.jobs/v1\njobs:\n- name: a\n  train: {model: secrets}"}`, `"secrets" is not a catalog model`},
	} {
		vals, _, err := ParseAPIRequest(c.command, []byte(c.body))
		if err == nil {
			_, err = RunAPI(context.Background(), c.command, vals)
		}
		var ae *APIError
		if !errors.As(err, &ae) || ae.Status != 400 || !strings.Contains(ae.Msg, c.want) {
			t.Errorf("%s %s: %v, want a 400 saying %q", c.command, c.body, err, c.want)
		}
	}
	vals, _, err := ParseAPIRequest("plan", []byte(`{"model": "gpt2", "seq": 64}`))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := RunAPI(context.Background(), "plan", vals); err != nil {
		t.Errorf("gpt2 beside a file named gpt2: %v, want the catalog's model planned", err)
	}
}

// The API's messages drop the kind of error the CLI's drop ("invalid spec: ",
// "recipe: "), as ARCHITECTURE.md says every message does (sweep F, round 25).
func TestAPIMessagesDropTheErrorKind(t *testing.T) {
	for _, c := range []struct{ body, want string }{
		{`{"model": "gpt2", "zero": 2}`, "ZeRO-2 shards over data-parallel ranks"},
		{`{"model": "gpt2", "set": ["foo=bar"]}`, `set unknown switch "foo"`},
	} {
		vals, _, err := ParseAPIRequest("plan", []byte(c.body))
		if err == nil {
			_, err = RunAPI(context.Background(), "plan", vals)
		}
		var ae *APIError
		if !errors.As(err, &ae) || ae.Status != 400 {
			t.Fatalf("%s: %v, want a 400", c.body, err)
		}
		if !strings.HasPrefix(ae.Msg, c.want) {
			t.Errorf("%s: %q, want it to start %q", c.body, ae.Msg, c.want)
		}
	}
}

// A heavy plan (engine.HeavyWork: every deepseek-v3 job) and every fit wait
// for the process's heavy turn, so memplan serve computes one at a time
// beside light requests: two deepseek-v3 plans posted at once held 2.98 GB
// of RSS, one at a time 1.58 GB. Held here, each heavy request waits for
// it (and stops when its request does), while a light plan is answered.
func TestAPIHeavyRequestsTakeTurns(t *testing.T) {
	done, err := engine.HeavyTurn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer done()
	for _, c := range []struct {
		command, body string
		waits         bool
	}{
		{"plan", `{"model": "deepseek-v3", "gpu": "h100"}`, true},
		{"compare", `{"model": "deepseek-v3", "gpu": "h100"}`, true},
		{"max", `{"model": "deepseek-v3", "gpu": "h100", "micro_batch": "?"}`, true},
		{"fit", `{"model": "gpt2", "gpu": "h100", "seq": 64}`, true},
		{"plan", `{"model": "gpt2", "gpu": "h100", "seq": 64}`, false},
	} {
		vals, _, err := ParseAPIRequest(c.command, []byte(c.body))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		ended := make(chan error, 1)
		go func() {
			_, err := RunAPI(ctx, c.command, vals)
			ended <- err
		}()
		waited := false
		for deadline := time.Now().Add(10 * time.Second); !waited && time.Now().Before(deadline); {
			select {
			case err = <-ended:
				deadline = time.Time{}
			case <-time.After(time.Millisecond):
				waited = engine.HeavyWaiting() == 1
			}
		}
		cancel()
		if waited {
			err = <-ended
		}
		switch {
		case waited != c.waits:
			t.Errorf("%s %s beside a heavy request: waited for its turn %v, want %v (%v)", c.command, c.body, waited, c.waits, err)
		case !waited && err != nil:
			t.Errorf("%s %s: %v", c.command, c.body, err)
		case waited && err == nil:
			t.Errorf("%s %s: answered although stopped while it waited", c.command, c.body)
		}
	}
}
