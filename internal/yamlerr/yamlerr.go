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
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
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
// A key may hold any character but a space ("same-node").
var typeErr = regexp.MustCompile(`^cannot unmarshal (\w+)(?: (\S+))? into Go (?:struct field \w*\.(\S+?)|value) of type (.+)$`)

// Message is err's text without the library's steps, on one line, with
// "unknown field" said as "unknown key", a type mismatch in the file's
// words (Mismatch) and encoding/json's syntax errors with their byte.
func Message(err error) string {
	if m, ok := TypeMismatch(err); ok {
		where := m.Field
		if where == "" {
			where = "the document"
		}
		return where + ": want " + m.Want + ", got " + m.Got
	}
	var se *json.SyntaxError
	switch {
	case errors.Is(err, io.ErrUnexpectedEOF), errors.As(err, &se) && se.Error() == "unexpected end of JSON input":
		return "truncated JSON"
	case se != nil:
		return fmt.Sprintf("invalid JSON at byte %d: %s", se.Offset, oneLine(se.Error()))
	}
	msg := strip(err)
	if k, ok := strings.CutPrefix(msg, "unknown field "); ok {
		return "unknown key " + k
	}
	return msg
}

// Mismatch is a decoding error's type mismatch in a file's words: the key
// by its dotted path ("" for the document itself), what the file should
// hold there ("a whole number") and what it holds ("a string", "a number
// (4.5)").
type Mismatch struct{ Field, Want, Got string }

// TypeMismatch is err's type mismatch, if it is one: an
// encoding/json.UnmarshalTypeError, or its text inside sigs.k8s.io/yaml's
// (which keeps only the text). A reader that words the document itself
// its own way ("not a JSON object") uses it; the rest use Message.
func TypeMismatch(err error) (Mismatch, bool) {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) && te.Type != nil {
		value, number, _ := strings.Cut(te.Value, " ")
		return mismatch(te.Field, goType(te.Type), value, number), true
	}
	m := typeErr.FindStringSubmatch(strip(err))
	if m == nil {
		return Mismatch{}, false
	}
	return mismatch(m[3], m[4], m[1], m[2]), true
}

func mismatch(field, goType, value, number string) Mismatch {
	got := article(value)
	if number != "" {
		got += " (" + number + ")"
	}
	return Mismatch{Field: field, Want: kind(goType), Got: got}
}

// goType is t's name as kind reads it: a named type by what it is made of
// (a policy's name is a string, not a mapping), units.Bytes by its name.
func goType(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Slice, reflect.Array:
		return "[]"
	case reflect.Map:
		return "map["
	case reflect.Struct, reflect.Interface:
		return "struct"
	}
	if t.String() == "units.Bytes" {
		return t.String()
	}
	return t.Kind().String()
}

// strip is err's text on one line without the library's steps.
func strip(err error) string {
	msg := oneLine(err.Error())
	for again := true; again; {
		again = false
		for _, p := range steps {
			if rest, ok := strings.CutPrefix(msg, p); ok {
				msg, again = rest, true
			}
		}
	}
	return msg
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

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
