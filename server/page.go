package server

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"io/fs"
	"net/http"
	"path"
	"strconv"
	"strings"
)

// The web page: web/index.html at GET /, the rest of web/ (the page's
// script and style, the vendored uPlot) at GET /static/PATH, all embedded
// in the binary so the page works offline. The page speaks to the API
// (POST /v1/COMMAND, GET /v1/catalog) like any other client.

//go:embed web
var webFS embed.FS

// asset is one embedded file as served.
type asset struct {
	body  []byte
	ctype string
	etag  string
	cache string
}

// contentTypes are the types of the files web/ holds; a file of another
// extension is not served (pageAssets refuses to build).
var contentTypes = map[string]string{
	".html": "text/html; charset=utf-8",
	".js":   "text/javascript; charset=utf-8",
	".css":  "text/css; charset=utf-8",
	".png":  "image/png",
	".svg":  "image/svg+xml",
}

// pageAssets reads web/ into assets keyed by the path they are served at.
// Files under web/vendor/NAME-VERSION/ never change at their path (a new
// version is a new directory): cached for a year, immutable. The page's own
// files are revalidated on every load (no-cache with a content ETag, 304
// when unchanged), so a new binary's page is never mixed with an old one's.
// Text files that are not served (a vendor directory's LICENSE, VERSION)
// are skipped.
func pageAssets() map[string]*asset {
	out := map[string]*asset{}
	err := fs.WalkDir(webFS, "web", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		ct, ok := contentTypes[path.Ext(p)]
		if !ok {
			return nil
		}
		body, err := webFS.ReadFile(p)
		if err != nil {
			return err
		}
		sum := sha256.Sum256(body)
		a := &asset{body: body, ctype: ct, etag: `"` + hex.EncodeToString(sum[:8]) + `"`, cache: "no-cache"}
		rel := strings.TrimPrefix(p, "web/")
		if strings.HasPrefix(rel, "vendor/") {
			a.cache = "public, max-age=31536000, immutable"
		}
		if rel == "index.html" {
			out["/"] = a
		} else {
			out["/static/"+rel] = a
		}
		return nil
	})
	if err != nil {
		panic(err) // an embedded file system reads without error
	}
	return out
}

// pageCSP keeps the page to its own origin: no script, style, font or
// image from elsewhere (it works offline because it needs nothing else).
// uPlot sets element styles from script, hence 'unsafe-inline' for styles.
const pageCSP = "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data: blob:; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// page serves GET / and GET /static/PATH from assets; any other path is the
// JSON 404 of the API.
func (s *Server) page(assets map[string]*asset) handler {
	return func(w http.ResponseWriter, r *http.Request) int {
		a, ok := assets[r.URL.Path]
		if !ok {
			return writeError(w, http.StatusNotFound, "", "no route "+r.URL.Path+" (the API is described at /openapi.json)")
		}
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			return writeError(w, http.StatusMethodNotAllowed, "", r.Method+" is not allowed here: use GET")
		}
		h := w.Header()
		h.Set("ETag", a.etag)
		h.Set("Cache-Control", a.cache)
		h.Set("X-Content-Type-Options", "nosniff")
		if r.URL.Path == "/" {
			h.Set("Content-Security-Policy", pageCSP)
			h.Set("Referrer-Policy", "no-referrer")
		}
		if inm := r.Header.Get("If-None-Match"); inm != "" && etagMatch(inm, a.etag) {
			w.WriteHeader(http.StatusNotModified)
			return http.StatusNotModified
		}
		h.Set("Content-Type", a.ctype)
		h.Set("Content-Length", strconv.Itoa(len(a.body)))
		w.WriteHeader(http.StatusOK)
		if r.Method == http.MethodGet {
			_, _ = w.Write(a.body)
		}
		return http.StatusOK
	}
}

// etagMatch reports whether an If-None-Match list names etag (or is *).
func etagMatch(list, etag string) bool {
	for _, e := range strings.Split(list, ",") {
		e = strings.TrimPrefix(strings.TrimSpace(e), "W/")
		if e == etag || e == "*" {
			return true
		}
	}
	return false
}

// Cataloger is a Backend that also lists what requests may name (models,
// GPUs, recipes: the page's pickers), served at GET /v1/catalog.
type Cataloger interface {
	Catalog() ([]byte, error)
}

// catalog answers GET /v1/catalog with c's document.
func (s *Server) catalog(c Cataloger) handler {
	return s.get(func(w http.ResponseWriter, r *http.Request) int {
		doc, err := c.Catalog()
		if err != nil {
			return writeError(w, http.StatusInternalServerError, "", "listing the catalog: "+err.Error())
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-cache")
		_, _ = w.Write(doc)
		return http.StatusOK
	})
}

// pagePaths adds the page and the catalog to the OpenAPI paths.
func pagePaths(paths map[string]any, b Backend) {
	html := func(summary string) map[string]any {
		return map[string]any{"summary": summary, "responses": map[string]any{
			"200": map[string]any{"description": summary, "content": map[string]any{"text/html": map[string]any{"schema": map[string]any{"type": "string"}}}}}}
	}
	paths["/"] = map[string]any{"get": html("the web page (its script, style and uPlot under /static/)")}
	paths["/static/{file}"] = map[string]any{"get": map[string]any{"summary": "the web page's assets: app.js, app.css, vendor/uplot-1.6.32/uPlot.iife.min.js and uPlot.min.css (file may hold '/')",
		"parameters": []any{map[string]any{"name": "file", "in": "path", "required": true, "schema": map[string]any{"type": "string"}}},
		"responses": map[string]any{
			"200": map[string]any{"description": "the file (JavaScript, CSS)"},
			"304": map[string]any{"description": "not modified (If-None-Match)"},
			"404": map[string]any{"description": "no such file", "content": map[string]any{"application/json": map[string]any{
				"schema": map[string]any{"$ref": "#/components/schemas/Error"}}}}}}}
	if _, ok := b.(Cataloger); ok {
		paths["/v1/catalog"] = map[string]any{"get": map[string]any{"summary": "what requests may name: models, GPUs and recipes (memplan.catalog/v1)",
			"responses": map[string]any{"200": map[string]any{"description": "the catalog", "content": map[string]any{"application/json": map[string]any{
				"schema": map[string]any{"type": "object", "properties": map[string]any{
					"schema": map[string]any{"type": "string"},
					"models": map[string]any{"type": "array", "items": map[string]any{"type": "object"}},
					"gpus":   map[string]any{"type": "array", "items": map[string]any{"type": "object"}},
					"recipes": map[string]any{"type": "array", "items": map[string]any{"type": "object", "properties": map[string]any{
						"name":      map[string]any{"type": "string"},
						"framework": map[string]any{"type": "string"},
						"fields": map[string]any{"type": "object", "additionalProperties": map[string]any{"type": "string"},
							"description": "the request fields the recipe's switches set, with its values (a field given in a request wins)"},
					}}},
				}}}}}}}}
	}
}
