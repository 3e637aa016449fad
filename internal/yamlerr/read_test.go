package yamlerr_test

import (
	"errors"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/memplan/memplan/internal/msgcheck"
	"github.com/memplan/memplan/internal/yamlerr"
)

// bomb is a document of n aliases of an anchored string of size bytes:
// size·n bytes once its aliases are written out.
func bomb(size, n int) string {
	return "big: &a \"" + strings.Repeat("x", size) + "\"\nrefs: [" + strings.TrimSuffix(strings.Repeat("*a,", n), ",") + "]\n"
}

// laughs is the billion laughs: levels of lists of nine aliases of the
// level below, 9^levels strings written out.
func laughs(levels int) string {
	var b strings.Builder
	b.WriteString("l0: &l0 [lol]\n")
	for i := 1; i <= levels; i++ {
		prev := "*l" + string(rune('0'+i-1))
		b.WriteString("l" + string(rune('0'+i)) + ": &l" + string(rune('0'+i)) + " [" + strings.TrimSuffix(strings.Repeat(prev+",", 9), ",") + "]\n")
	}
	return b.String()
}

// Aliases are measured on the parsed node tree, before anything expands
// them: a document whose aliases would write it out past the limit is
// refused in one line, one within it converts as sigs.k8s.io/yaml
// converts it.
func TestToJSONAliases(t *testing.T) {
	for _, c := range []struct {
		name, in string
		limit    int
		want     string // "": converts
	}{
		{"small alias", "a: &x [1, 2]\nb: *x\n", 1 << 20, ""},
		{"merge key", "base: &b {x: 1}\njob: {<<: *b, y: 2}\n", 1 << 20, ""},
		{"a string past the limit", bomb(64<<10, 300), 16 << 20, "YAML aliases expand to more than 16 MiB"},
		{"the probe's bomb", bomb(1<<20, 500), 16 << 20, "YAML aliases expand to more than 16 MiB"},
		{"an annotation's bomb", bomb(40, 5000), 128 << 10, "YAML aliases expand to more than 128 KiB"},
		{"billion laughs", laughs(9), 16 << 20, "YAML aliases expand to more than 16 MiB"},
		{"laughs within the limit", laughs(2), 1 << 20, ""},
		// The measure: a scalar is its bytes and one, a list or mapping
		// two and its entries, an alias what it names.
		{"at the limit", "a: &x xxxx\nb: *x\n", 2 + 2 + 5 + 2 + 5, ""},
		{"one past the limit", "a: &x xxxx\nb: *x\n", 2 + 2 + 5 + 2 + 5 - 1, "YAML aliases expand to more than 15 bytes"},
		{"no alias, past the limit", strings.Repeat("x: 1\n", 1) + "y: [" + strings.Repeat("1,", 100) + "1]\n", 50, ""},
		{"a star in a string", "a: 'x*y'\nb: \"*\"\n", 10, ""},
		{"an alias inside itself", "a: &a [1, *a]\n", 1 << 20, "a YAML alias names a node that holds it (line 1)"},
		{"a mapping inside itself", "a: &a {b: *a}\n", 1 << 20, "a YAML alias names a node that holds it (line 1)"},
		{"an unknown anchor", "a: *nope\n", 1 << 20, "unknown anchor 'nope' referenced"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := yamlerr.ToJSON([]byte(c.in), c.limit, true)
			if c.want == "" {
				want, werr := yaml.YAMLToJSONStrict([]byte(c.in))
				if err != nil || werr != nil || string(got) != string(want) {
					t.Fatalf("%s, %v; want %s, %v", got, err, want, werr)
				}
				return
			}
			checkRefused(t, err, c.want)
		})
	}
}

func checkRefused(t *testing.T, err error, want string) {
	t.Helper()
	if err == nil {
		t.Fatalf("no error, want %q", want)
	}
	msg := yamlerr.Message(err)
	if !strings.Contains(msg, want) || strings.Contains(msg, "\n") {
		t.Fatalf("%q, want one line containing %q", msg, want)
	}
	for _, p := range msgcheck.Problems(msg) {
		t.Errorf("%q: %s", msg, p)
	}
	if strings.Contains(msg, "%!") || strings.Contains(msg, "interface") || strings.Contains(msg, "<nil>") {
		t.Errorf("%q speaks Go", msg)
	}
}

// A mapping key must be a string (a number or true is read as one, as
// sigs.k8s.io/yaml reads it): a key that is null, a list or a mapping is
// refused naming its line, not in Go's formatting ("%!s(<nil>)",
// "[]interface {}{"a"}").
func TestToJSONKeys(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"?", "a mapping key must be a string (line 1)"},
		{"? [a]\n: 1\n", "a mapping key must be a string (line 1)"},
		{"a: 1\n? {b: 1}\n: 2\n", "a mapping key must be a string (line 2)"},
		{"~: 1\n", "a mapping key must be a string (line 1)"},
		{"a:\n  null: 1\n", "a mapping key must be a string (line 2)"},
		{"[[a]: 1]\n", "a mapping key must be a string (line 1)"},
		{"x: &k [1]\n*k : 2\n", "a mapping key must be a string (line 2)"},
		{"jobs:\n- name: a\n  train: {model: gpt2, ? [x]}\n", "a mapping key must be a string (line 3)"},
		{`{"a": {"b": 1}, "c": {? [1] : 2}}`, "a mapping key must be a string (line 1)"},
		{"1: a\ntrue: b\n2.5: c\n", ""},
		{"&k a: 1\nb: {*k : 2}\n", ""},
	} {
		for _, strict := range []bool{true, false} {
			got, err := yamlerr.ToJSON([]byte(c.in), 1<<20, strict)
			if c.want == "" {
				want, werr := yaml.YAMLToJSON([]byte(c.in))
				if err != nil || werr != nil || string(got) != string(want) {
					t.Errorf("%q: %s, %v; want %s, %v", c.in, got, err, want, werr)
				}
				continue
			}
			checkRefused(t, err, c.want)
			if !errors.Is(err, yamlerr.ErrRefused) {
				t.Errorf("%q: %v is not ErrRefused", c.in, err)
			}
		}
	}
}

// UnmarshalStrict is sigs.k8s.io/yaml's with the same checks first: the
// target still shapes the conversion (a number given for a string field
// reads as its text).
func TestUnmarshalStrict(t *testing.T) {
	type doc struct {
		Version string   `json:"version"`
		Tags    []string `json:"tags"`
	}
	var d doc
	if err := yamlerr.UnmarshalStrict([]byte("version: 3\ntags: &t [a]\n"), &d, 1<<20); err != nil || d.Version != "3" || d.Tags[0] != "a" {
		t.Fatalf("%+v, %v", d, err)
	}
	for _, c := range []struct{ in, want string }{
		{bomb(1<<10, 100), "YAML aliases expand to more than 64 KiB"},
		{"? [a]\n: 1\n", "a mapping key must be a string (line 1)"},
		{"version: 1\ncolour: red\n", `unknown key "colour"`},
		{"?\n", "a mapping key must be a string (line 1)"},
	} {
		err := yamlerr.UnmarshalStrict([]byte(c.in), &d, 64<<10)
		checkRefused(t, err, c.want)
	}
}

// A file of several documents is refused by every reader, naming the
// count: sigs.k8s.io/yaml converted the first and dropped the rest, so a
// job file's second document of jobs, or invalid YAML after "...", passed
// unread. One document, with or without its markers, converts.
func TestOneDocument(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"a: 1\n---\nb: 2\n", "holds 2 YAML documents; a file is one"},
		{"---\na: 1\n---\nb: 2\n---\nc: 3\n", "holds 3 YAML documents; a file is one"},
		{"a: 1\n...\n---\nb: 2\n", "holds 2 YAML documents; a file is one"},
		{"a: 1\n...\ngarbage: [\n", "did not find expected"},
		{"a: &x 1\n---\nb: *x\n", "holds 2 YAML documents"},
		{"---\na: 1\n", ""},
		{"a: 1\n...\n", ""},
		{"a: '---'\nb: \"...\"\n", ""},
		// A byte order mark at the start only (sweep G, round 25: two
		// made go-yaml drop the first character of every later line).
		{"\uFEFFa: 1\nb: 2\n", ""},
		{"\uFEFF\uFEFFXa: 1\nXb: 2\n", "holds a byte order mark (U+FEFF) at byte 3; a file may start with one, nowhere else"},
		{"a: 1\nb: \"x\uFEFF\"\n", "holds a byte order mark (U+FEFF) at byte 10"},
	} {
		var v map[string]any
		errs := []error{yamlerr.UnmarshalStrict([]byte(c.in), &v, 1<<20)}
		for _, strict := range []bool{true, false} {
			_, err := yamlerr.ToJSON([]byte(c.in), 1<<20, strict)
			errs = append(errs, err)
		}
		checkEach(t, c.in, c.want, errs)
	}
}

// A whole number is read in decimal by every reader of memplan; the
// library reads YAML 1.1's 010 as eight and 0x10 as sixteen, so such a
// plain scalar is refused naming its line. Quoted, it is a string.
func TestDecimalOnly(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"seq: 010\n", "line 1: 010: write a whole number in decimal digits without a leading zero"},
		{"a: 1\nseq: 0x80\n", "line 2: 0x80: write a whole number"},
		{"seq: 0o17\n", "line 1: 0o17"},
		{"seq: 0b1000\n", "line 1: 0b1000"},
		{"seq: 1_024\n", "line 1: 1_024"},
		{"seq: -007\n", "line 1: -007"},
		{"jobs: [{seq: 08}]\n", "line 1: 08"},
		{"seq: 10\nb: 0\nc: -0\nd: 0.5\ne: 1e3\nf: '010'\ng: x_010\nh: 10.05\n", ""},
	} {
		var v map[string]any
		errs := []error{yamlerr.UnmarshalStrict([]byte(c.in), &v, 1<<20)}
		_, err := yamlerr.ToJSON([]byte(c.in), 1<<20, true)
		errs = append(errs, err)
		checkEach(t, c.in, c.want, errs)
	}
}

// checkEach checks every reader's error on in: none when want is "", else
// a one-line refusal holding want (checkRefused).
func checkEach(t *testing.T, in, want string, errs []error) {
	t.Helper()
	for _, err := range errs {
		if want == "" {
			if err != nil {
				t.Errorf("%q: %v", in, err)
			}
			continue
		}
		checkRefused(t, err, want)
	}
}

// FuzzToJSON: whatever the document, ToJSON never panics, refuses in one
// line, and what it converts is what sigs.k8s.io/yaml converts (called
// only then, so a bomb the fuzzer finds cannot take the test's memory).
func FuzzToJSON(f *testing.F) {
	for _, s := range []string{
		"a: &x [1, 2]\nb: *x\n", bomb(16, 40), laughs(3), "a: &a [*a]", "?", "? [a]\n: 1", "[[a]: 1]",
		"base: &b {x: 1}\njob: {<<: *b, y: 2}\n", "&k a: 1\n*k : 2\n", "{\"a\": 1}", "a: *b\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		js, err := yamlerr.ToJSON(data, 4<<10, true)
		if err != nil {
			if strings.Contains(yamlerr.Message(err), "\n") {
				t.Fatalf("two lines: %q", err)
			}
			return
		}
		want, err := yaml.YAMLToJSONStrict(data)
		if err != nil || string(js) != string(want) {
			t.Fatalf("%s; sigs.k8s.io/yaml: %s, %v", js, want, err)
		}
	})
}
