package server_test

import (
	"encoding/json"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/memplan/memplan/cli"
	"github.com/memplan/memplan/hw"
	"github.com/memplan/memplan/models"
	"github.com/memplan/memplan/recipe"
	"github.com/memplan/memplan/server"
)

func get(t *testing.T, url string, header map[string]string) reply {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	return do(t, req, header)
}

// do sends req with header set and reads the whole answer.
func do(t *testing.T, req *http.Request, header map[string]string) reply {
	t.Helper()
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return reply{resp.StatusCode, resp.Header, b}
}

// The page and every asset index.html names are served byte for byte as
// the files in web/, with their content type, an ETag that answers 304,
// and caching by kind: the page's own files revalidated on each load, the
// versioned vendor files immutable.
func TestPageServesEmbeddedFiles(t *testing.T) {
	ts := newServer(t, server.Config{})
	index, err := os.ReadFile("web/index.html")
	if err != nil {
		t.Fatal(err)
	}
	refs := regexp.MustCompile(`(?:src|href)="(/static/[^"]+)"`).FindAllStringSubmatch(string(index), -1)
	if len(refs) != 4 {
		t.Fatalf("index.html names %d assets, want 4 (app.js, app.css, uPlot's js and css): %v", len(refs), refs)
	}
	type want struct{ path, file, ctype, cache string }
	cases := []want{{"/", "web/index.html", "text/html; charset=utf-8", "no-cache"}}
	for _, r := range refs {
		c := want{path: r[1], file: "web/" + strings.TrimPrefix(r[1], "/static/"), cache: "no-cache"}
		c.ctype = map[string]string{".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8"}[r[1][strings.LastIndex(r[1], "."):]]
		if strings.HasPrefix(r[1], "/static/vendor/") {
			c.cache = "public, max-age=31536000, immutable"
		}
		cases = append(cases, c)
	}
	for _, c := range cases {
		body, err := os.ReadFile(c.file)
		if err != nil {
			t.Fatal(err)
		}
		r := get(t, ts.URL+c.path, nil)
		if r.status != 200 || string(r.body) != string(body) {
			t.Errorf("GET %s: %d, %d bytes; want 200 with %s's %d bytes", c.path, r.status, len(r.body), c.file, len(body))
		}
		if got := r.header.Get("Content-Type"); got != c.ctype {
			t.Errorf("GET %s: Content-Type %q, want %q", c.path, got, c.ctype)
		}
		if got := r.header.Get("Cache-Control"); got != c.cache {
			t.Errorf("GET %s: Cache-Control %q, want %q", c.path, got, c.cache)
		}
		if r.header.Get("X-Content-Type-Options") != "nosniff" {
			t.Errorf("GET %s: no X-Content-Type-Options: nosniff", c.path)
		}
		etag := r.header.Get("ETag")
		if again := get(t, ts.URL+c.path, map[string]string{"If-None-Match": etag}); etag == "" || again.status != 304 || len(again.body) != 0 {
			t.Errorf("GET %s with If-None-Match %s: %d with %d bytes, want 304 and none", c.path, etag, again.status, len(again.body))
		}
		if other := get(t, ts.URL+c.path, map[string]string{"If-None-Match": `"0"`}); other.status != 200 {
			t.Errorf("GET %s with a stale ETag: %d, want 200", c.path, other.status)
		}
	}
	csp := get(t, ts.URL+"/", nil).header.Get("Content-Security-Policy")
	if !strings.Contains(csp, "default-src 'self'") || !strings.Contains(csp, "script-src 'self'") {
		t.Errorf("the page's Content-Security-Policy %q does not keep it to its own origin", csp)
	}
}

// Paths that are not the page's files are the API's JSON 404 (the vendor
// directory's LICENSE and VERSION are in the repository, not served), and
// the page's paths take GET and HEAD only.
func TestPageRefuses(t *testing.T) {
	ts := newServer(t, server.Config{})
	for _, path := range []string{"/static/nope.js", "/static/", "/static/vendor/uplot-1.6.32/LICENSE",
		"/static/vendor/uplot-1.6.32/VERSION", "/index.html", "/static/index.html", "/static/../server.go", "/nope"} {
		r := get(t, ts.URL+path, nil)
		if r.status != 404 || !json.Valid(r.body) || r.header.Get("Content-Type") != "application/json" {
			t.Errorf("GET %s: %d %q %s, want 404 with a JSON error", path, r.status, r.header.Get("Content-Type"), r.body)
		}
	}
	for _, path := range []string{"/", "/static/app.js"} {
		r := post(t, ts.URL+path, "{}")
		if r.status != 405 || r.header.Get("Allow") != "GET, HEAD" {
			t.Errorf("POST %s: %d Allow %q, want 405 Allow GET, HEAD", path, r.status, r.header.Get("Allow"))
		}
		errorOf(t, r)
		resp, err := http.Head(ts.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || len(b) != 0 || resp.ContentLength <= 0 {
			t.Errorf("HEAD %s: %d, %d bytes, Content-Length %d; want 200, no body, the length", path, resp.StatusCode, len(b), resp.ContentLength)
		}
	}
}

// A path that is not clean (dot segments, doubled slashes, a directory
// without its slash) is the API's JSON 404, as any other path that is not
// the page's: never the mux's HTML redirect to the cleaned path (README:
// "200 only for the page's files, JSON 404/405 otherwise"). The requests
// go out as written and redirects are not followed, as curl --path-as-is.
func TestUncleanPathsAreJSON404(t *testing.T) {
	ts := newServer(t, server.Config{})
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	for _, c := range []struct{ method, path string }{
		{"GET", "/static/../main.go"}, {"GET", "/static/../go.mod"}, {"GET", "/static"}, {"HEAD", "/static"},
		{"GET", "/static/./app.js"}, {"GET", "//static/app.js"}, {"GET", "/static//app.js"}, {"HEAD", "/static//app.js"},
		{"GET", "/static/vendor/../app.js"}, {"GET", "/static/app.js/."}, {"GET", "/./"}, {"GET", "//"}, {"GET", "/.."},
		{"GET", "/static/%2e%2e/main.go"}, {"GET", "/v1/../openapi.json"}, {"GET", "//healthz"}, {"GET", "/metrics/"},
		{"POST", "//v1/plan"}, {"POST", "/v1/./plan"}, {"POST", "/v1//plan"}, {"DELETE", "/static/../app.js"},
	} {
		req, err := http.NewRequest(c.method, ts.URL+c.path, strings.NewReader(`{"model": "gpt2"}`))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 404 || resp.Header.Get("Content-Type") != "application/json" || resp.Header.Get("Location") != "" ||
			(c.method != "HEAD" && !json.Valid(b)) {
			t.Errorf("%s %s: %d %q Location %q %q, want a JSON 404", c.method, c.path, resp.StatusCode,
				resp.Header.Get("Content-Type"), resp.Header.Get("Location"), b)
		} else if c.method != "HEAD" {
			errorOf(t, reply{resp.StatusCode, resp.Header, b})
		}
	}
}

// GET /v1/catalog lists exactly the embedded catalogs' models, GPUs and
// recipes: what the page's pickers offer is what plan accepts.
func TestCatalog(t *testing.T) {
	ts := newServer(t, server.Config{})
	r := get(t, ts.URL+"/v1/catalog", nil)
	if r.status != 200 || r.header.Get("Content-Type") != "application/json" {
		t.Fatalf("GET /v1/catalog: %d %q", r.status, r.header.Get("Content-Type"))
	}
	var doc struct {
		Schema  string
		Models  []struct{ Name string }
		GPUs    []struct{ Name string }
		Recipes []struct{ Name string }
	}
	if err := json.Unmarshal(r.body, &doc); err != nil {
		t.Fatal(err)
	}
	names := func(n int, name func(int) string) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = name(i)
		}
		return out
	}
	var wantModels, wantGPUs, wantRecipes []string
	for _, e := range models.Catalog() {
		wantModels = append(wantModels, e.Name)
	}
	for _, g := range hw.All() {
		wantGPUs = append(wantGPUs, g.Name)
	}
	rs, err := recipe.List()
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range rs {
		wantRecipes = append(wantRecipes, x.Name)
	}
	if doc.Schema != "memplan.catalog/v1" ||
		!slices.Equal(names(len(doc.Models), func(i int) string { return doc.Models[i].Name }), wantModels) ||
		!slices.Equal(names(len(doc.GPUs), func(i int) string { return doc.GPUs[i].Name }), wantGPUs) ||
		!slices.Equal(names(len(doc.Recipes), func(i int) string { return doc.Recipes[i].Name }), wantRecipes) {
		t.Errorf("catalog %s, want models %v, GPUs %v, recipes %v", r.body, wantModels, wantGPUs, wantRecipes)
	}
	// Each recipe's fields are the request fields its switches set (a
	// plan flag's switch), with its values: what the page's controls show
	// when the recipe is chosen. Each is a field plan takes.
	var withFields struct {
		Recipes []struct {
			Name   string
			Fields map[string]string
		}
	}
	if err := json.Unmarshal(r.body, &withFields); err != nil {
		t.Fatal(err)
	}
	planFields := map[string]bool{}
	for _, f := range cli.APIFields("plan") {
		planFields[f.Key] = true
	}
	fields := map[string]map[string]string{}
	for _, x := range withFields.Recipes {
		fields[x.Name] = x.Fields
		for k := range x.Fields {
			if !planFields[k] {
				t.Errorf("recipe %s: field %q is not one plan takes", x.Name, k)
			}
		}
	}
	for name, want := range map[string]map[string]string{ // memplan recipes NAME
		"hf":         {"optimizer": "adamw", "optimizer_impl": "foreach"},
		"hf5":        {"precision": "checkpoint", "optimizer": "adamw", "optimizer_impl": "fused"},
		"litgpt":     {"precision": "pure-bf16", "optimizer": "adamw", "optimizer_impl": "foreach"},
		"torchtune":  {"precision": "pure-bf16", "optimizer": "adamw", "optimizer_impl": "fused"},
		"torchtitan": {"optimizer": "adamw", "optimizer_impl": "foreach", "checkpoint": "selective-op", "alloc_conf": "expandable_segments:True"},
	} {
		if !maps.Equal(fields[name], want) {
			t.Errorf("recipe %s: fields %v, want %v", name, fields[name], want)
		}
	}
	if p := post(t, ts.URL+"/v1/catalog", "{}"); p.status != 405 {
		t.Errorf("POST /v1/catalog: %d, want 405", p.status)
	}
}

// Any path and method: the page's handler answers 200 (or 304) only for
// the page and its assets, with their content type, and a JSON 404 or 405
// otherwise: never a redirect (the mux's cleaning of a path), a text or
// HTML answer, a 500 or a panic.
func FuzzPagePath(f *testing.F) {
	for _, p := range []string{"/", "/static/app.js", "/static/vendor/uplot-1.6.32/uPlot.min.css", "/static/", "/static/../go.mod",
		"/static/vendor/uplot-1.6.32/LICENSE", "//", "/static//app.js", "/%00", "/static/app.js/", "/static", "/static/./app.js",
		"//static/app.js", "/.", "", "static/app.js", "/static/%2e%2e/go.mod"} {
		f.Add(p, "GET")
		f.Add(p, "HEAD")
		f.Add(p, "DELETE")
	}
	f.Add("/static", "CONNECT")
	f.Add("/static/../app.js", "OPTIONS")
	s := server.New(cli.APIBackend{}, server.Config{Logger: slog.New(slog.NewJSONHandler(io.Discard, nil))})
	served := map[string]string{"/": "text/html; charset=utf-8", "/static/app.js": "text/javascript; charset=utf-8",
		"/static/app.css": "text/css; charset=utf-8", "/static/vendor/uplot-1.6.32/uPlot.iife.min.js": "text/javascript; charset=utf-8",
		"/static/vendor/uplot-1.6.32/uPlot.min.css": "text/css; charset=utf-8"}
	f.Fuzz(func(t *testing.T, path, method string) {
		if strings.HasPrefix(path, "/v1/") || path == "/openapi.json" || path == "/healthz" || path == "/metrics" {
			t.Skip() // the API's routes have their own tests
		}
		if !slices.Contains([]string{"GET", "HEAD", "POST", "DELETE", "PUT", "OPTIONS", "CONNECT"}, method) {
			t.Skip()
		}
		req := httptest.NewRequest(method, "/", nil)
		req.URL.Path = path
		w := httptest.NewRecorder()
		s.ServeHTTP(w, req)
		ctype := w.Header().Get("Content-Type")
		switch code := w.Code; {
		case code == 200:
			if served[path] == "" || ctype != served[path] || (method != "GET" && method != "HEAD") {
				t.Errorf("%s %q: %d %q, but it is not one of the page's files", method, path, code, ctype)
			}
		case code == 304:
			t.Errorf("%s %q: 304 to a request without If-None-Match", method, path)
		case code == 404 || code == 405:
			if ctype != "application/json" || !json.Valid(w.Body.Bytes()) {
				t.Errorf("%s %q: %d %q with a body that is not JSON: %q", method, path, code, ctype, w.Body.String())
			}
			if loc := w.Header().Get("Location"); loc != "" {
				t.Errorf("%s %q: %d with Location %q", method, path, code, loc)
			}
		default:
			t.Errorf("%s %q: %d %q %q", method, path, code, ctype, w.Body.String())
		}
	})
}
