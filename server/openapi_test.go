package server_test

import (
	"context"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"

	"github.com/memplan/memplan/cli"
	"github.com/memplan/memplan/server"
)

// /openapi.json is a valid OpenAPI 3 document (parsed and validated by
// kin-openapi) that lists every route the server answers, each command's
// request schema with every field the command takes and closed to others.
func TestOpenAPI(t *testing.T) {
	ts := newServer(t, server.Config{})
	resp, err := http.Get(ts.URL + "/openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	data, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	doc, err := openapi3.NewLoader().LoadFromData(data)
	if err != nil {
		t.Fatalf("parsing /openapi.json: %v", err)
	}
	if err := doc.Validate(context.Background()); err != nil {
		t.Fatalf("validating /openapi.json: %v", err)
	}
	want := []string{"/", "/healthz", "/metrics", "/openapi.json", "/static/{file}", "/v1/catalog"}
	for _, c := range cli.APICommands() {
		want = append(want, "/v1/"+c)
	}
	var got []string
	for p := range doc.Paths.Map() {
		got = append(got, p)
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("paths %v, want %v", got, want)
	}
	for _, p := range want {
		p = strings.ReplaceAll(p, "{file}", "app.js")
		resp, err := http.Get(ts.URL + p)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode == 404 {
			t.Errorf("%s is documented but not served", p)
		}
	}
	for _, c := range cli.APICommands() {
		op := doc.Paths.Find("/v1/" + c).Post
		s := op.RequestBody.Value.Content.Get("application/json").Schema.Value
		if s.AdditionalProperties.Has == nil || *s.AdditionalProperties.Has {
			t.Errorf("%s: the request schema is not closed to unknown fields", c)
		}
		for _, f := range cli.APIFields(c) {
			if s.Properties[f.Key] == nil {
				t.Errorf("%s: field %s is not in the schema", c, f.Key)
			}
		}
		for _, code := range []int{200, 400, 413, 415, 422, 429, 503} {
			if op.Responses.Status(code) == nil {
				t.Errorf("%s: no %d response", c, code)
			}
		}
		if c == "plan" {
			if err := s.VisitJSON(map[string]any{"model": "gpt2", "micro_batch": 2.0}); err != nil {
				t.Errorf("plan schema refuses a plan request: %v", err)
			}
			if err := s.VisitJSON(map[string]any{"modle": "gpt2"}); err == nil {
				t.Error("plan schema accepts an unknown field")
			}
		}
	}
}
