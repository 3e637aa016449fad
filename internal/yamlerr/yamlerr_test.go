package yamlerr_test

import (
	"errors"
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
