// Package yamlerr is where outside YAML is read. ToJSON and UnmarshalStrict
// are sigs.k8s.io/yaml's conversions behind two checks the library lacks:
// aliases measured before they are written out (a reader's limit, refused
// in one line) and mapping keys that must be strings (said with their
// line, not in Go's formatting). Message words the errors of
// sigs.k8s.io/yaml's strict decoding in a file's terms, on one line: its
// messages stack the library's steps ("error unmarshaling JSON: while
// decoding JSON: json: unknown field "jobs"") and Go's types ("into Go
// struct field raw.gpus_per_node of type int") where a reader of the file
// wants `unknown key "jobs"` and "gpus_per_node: want a whole number, got a
// string".
package yamlerr

import (
	"regexp"
	"strings"
)

// steps are the prefixes sigs.k8s.io/yaml (yaml.go's Unmarshal and
// YAMLToJSON) and encoding/json put before what went wrong.
var steps = []string{"error converting YAML to JSON: ", "error unmarshaling JSON: ", "while decoding JSON: ", "yaml: ", "unmarshal errors: ", "json: "}

// typeErr is encoding/json's UnmarshalTypeError text.
// The value follows a number's kind ("number 4.5"); a reader that decodes
// into an anonymous struct has an empty struct name (".gpus_per_node") and
// a type with spaces ("struct { GPUsPerNode *int ... }").
var typeErr = regexp.MustCompile(`^cannot unmarshal (\w+)(?: (\S+))? into Go (?:struct field \w*\.([\w.\[\]]+)|value) of type (.+)$`)

// Message is err's text without the library's steps, on one line, with
// "unknown field" said as "unknown key" and a type mismatch in the file's
// words.
func Message(err error) string {
	msg := strings.Join(strings.Fields(err.Error()), " ")
	for again := true; again; {
		again = false
		for _, p := range steps {
			if rest, ok := strings.CutPrefix(msg, p); ok {
				msg, again = rest, true
			}
		}
	}
	if k, ok := strings.CutPrefix(msg, "unknown field "); ok {
		return "unknown key " + k
	}
	if m := typeErr.FindStringSubmatch(msg); m != nil {
		where := m[3]
		if where == "" {
			where = "the document"
		}
		got := article(m[1])
		if m[2] != "" {
			got += " (" + m[2] + ")"
		}
		return where + ": want " + kind(m[4]) + ", got " + got
	}
	return msg
}

// kind is a Go type in a file's words.
func kind(t string) string {
	t = strings.TrimLeft(t, "*")
	switch {
	case t == "units.Bytes": // an int64 of bytes, not a mapping
		return "a whole number of bytes"
	case strings.HasPrefix(t, "[]"):
		return "a list"
	case strings.HasPrefix(t, "map["), strings.Contains(t, "."), strings.HasPrefix(t, "struct"):
		return "a mapping"
	case strings.HasPrefix(t, "int"), strings.HasPrefix(t, "uint"):
		return "a whole number"
	case strings.HasPrefix(t, "float"):
		return "a number"
	case t == "bool":
		return "true or false"
	}
	return "a " + t
}

// article puts "a" or "an" before encoding/json's name of a JSON value.
func article(v string) string {
	switch v {
	case "object":
		return "a mapping"
	case "array":
		return "a list"
	case "number", "string", "bool":
		return "a " + v
	}
	return v
}
