package yamlerr_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/memplan/memplan/internal/msgcheck"
	"github.com/memplan/memplan/internal/yamlerr"
)

func TestMessage(t *testing.T) {
	type inner struct {
		Gbps float64 `json:"gbps"`
	}
	type doc struct {
		Name  string   `json:"name"`
		Count int      `json:"count"`
		Tags  []string `json:"tags"`
		Link  inner    `json:"link"`
	}
	for _, c := range []struct{ in, want string }{
		{"name: a\njobs: 1\n", `unknown key "jobs"`},
		{"name: [1,\n", "line 1: did not find expected node content"},
		{"count: x\n", "count: want a whole number, got a string"},
		{"tags: 3\n", "tags: want a list, got a number"},
		{"link: {gbps: fast}\n", "link.gbps: want a number, got a string"},
		{"link: 3\n", "link: want a mapping, got a number"},
		{"[1, 2]\n", "the document: want a mapping, got a list"},
		{"{\"name\": \"a\x00\"}", "control characters are not allowed"},
	} {
		var d doc
		err := yaml.UnmarshalStrict([]byte(c.in), &d)
		if err == nil {
			t.Fatalf("%q: no error", c.in)
		}
		got := yamlerr.Message(err)
		if got != c.want {
			t.Errorf("%q: got %q, want %q (from %q)", c.in, got, c.want, err)
		}
		if p := msgcheck.Problems(got); p != nil {
			t.Errorf("%q: %q: %v", c.in, got, p)
		}
	}
	// A reader decoding into an anonymous struct (hw's cluster file): the
	// struct's name is empty and its type has spaces; a number's value is
	// kept.
	var anon struct {
		Count *int `json:"count"`
		Link  *struct {
			Gbps *float64 `json:"gbps"`
		} `json:"link"`
	}
	for _, c := range []struct{ in, want string }{
		{"count: 4.5\n", "count: want a whole number, got a number (4.5)"},
		{"link: 5\n", "link: want a mapping, got a number"},
		{"42\n", "the document: want a mapping, got a number"},
		{"[1]\n", "the document: want a mapping, got a list"},
	} {
		err := yaml.UnmarshalStrict([]byte(c.in), &anon)
		if got := yamlerr.Message(err); got != c.want {
			t.Errorf("%q: got %q, want %q (from %q)", c.in, got, c.want, err)
		}
	}
	if got := yamlerr.Message(errors.New("error converting YAML to JSON: yaml: a\nb")); got != "a b" {
		t.Errorf("two lines: got %q", got)
	}
}

// encoding/json's own errors, read directly (a JSON file, a request body):
// a key with a hyphen, a named string type (a string, not a mapping), a
// file cut short and one with a syntax error.
func TestMessageJSON(t *testing.T) {
	type policy string
	type doc struct {
		SameNode bool   `json:"same-node"`
		Policy   policy `json:"policy"`
		Jobs     []struct {
			Replicas int `json:"replicas"`
		} `json:"jobs"`
	}
	for _, c := range []struct{ in, want string }{
		{`{"same-node": "yes"}`, "same-node: want true or false, got a string"},
		{`{"policy": 3}`, "policy: want a string, got a number"},
		{`{"jobs": [{"replicas": "two"}]}`, "jobs.replicas: want a whole number, got a string"},
		{`[1]`, "the document: want a mapping, got a list"},
		{`{"jobs": [`, "truncated JSON"},
		{`{"jobs" 1}`, "invalid JSON at byte 9: invalid character '1' after object key"},
	} {
		var d doc
		err := json.Unmarshal([]byte(c.in), &d)
		if got := yamlerr.Message(err); got != c.want {
			t.Errorf("%s: got %q, want %q (from %q)", c.in, got, c.want, err)
		}
		if p := msgcheck.Problems(yamlerr.Message(err)); p != nil {
			t.Errorf("%s: %v", c.in, p)
		}
	}
	var d doc
	if got := yamlerr.Message(json.NewDecoder(strings.NewReader(`{"jobs": [`)).Decode(&d)); got != "truncated JSON" {
		t.Errorf("a decoder's truncated document: got %q", got)
	}
}
