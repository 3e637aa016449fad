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
	if got := yamlerr.Message(errors.New("error converting YAML to JSON: yaml: a\nb")); got != "a b" {
		t.Errorf("two lines: got %q", got)
	}
}
