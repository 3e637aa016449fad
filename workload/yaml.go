package workload

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"math/big"
	"strconv"
	"strings"
	"unicode/utf8"

	yaml "sigs.k8s.io/yaml/goyaml.v3"

	"github.com/memplan/memplan/internal/yamlerr"
)

// bigInt is an integer outside int64, as written (decimal, normalised); a
// field's range check names it.
type bigInt string

// short is b for a message: past 40 digits, its first 20 characters and
// its length (memplan_torch/workload.py's _BigInt.short).
func (b bigInt) short() string {
	digits := len(strings.TrimPrefix(string(b), "-"))
	if digits <= 40 {
		return string(b)
	}
	return fmt.Sprintf("%s... (%d digits)", b[:20], digits)
}

// badEscape refuses a \u or \U escape that names no character, which
// go-yaml refuses and PyYAML turned into a lone surrogate (or a crash past
// U+10FFFF); memplan_torch/workload.py's BAD_ESCAPE is the same words.
const badEscape = `invalid YAML: a \u or \U escape names no character (a UTF-16 surrogate, U+D800 to U+DFFF, or past U+10FFFF); write the character itself or one \U escape (\U0001F600, not \uD83D\uDE00)`

// decodeYAML reads one YAML document into plain values with the table's
// scalar rules (fields.json "scalars"), as memplan_torch/workload.py's
// _decode does: plain scalars resolve to null, booleans, decimal integers
// (int64, or bigInt outside it) and floats by those patterns, every other
// scalar is a string; aliases expand; explicit tags, merge keys, duplicate
// keys, keys that are not strings and several documents are refused.
func decodeYAML(where string, data []byte) (any, error) {
	data, err := checkText(where, data)
	if err != nil {
		return nil, err
	}
	doc, err := yamlerr.OneDocument(data, "a workload")
	if errors.Is(err, yamlerr.ErrRefused) {
		return nil, bad(where, "%s", err.Error())
	}
	if err != nil && strings.Contains(err.Error(), "invalid Unicode character escape code") {
		return nil, bad(where, "%s", badEscape)
	}
	if err != nil {
		msg := strings.TrimPrefix(err.Error(), "yaml: ")
		return nil, bad(where, "invalid YAML: %s", strings.ReplaceAll(msg, "\n", " "))
	}
	if doc == nil {
		return nil, nil
	}
	c := &converter{where: where}
	return c.value(doc, "", 0)
}

// converter turns nodes into values, counting them (aliases expanded).
type converter struct {
	where string
	count int
}

// An alias is the value it names, at the alias's depth, and neither it nor
// the document node is a value of its own: memplan_torch's _Decoder counts
// the same (sweep G, round 25: Go counted both and a level per alias, and
// refused files at the limits that Python read).
func (c *converter) value(n *yaml.Node, path string, depth int) (any, error) {
	if n.Kind == yaml.AliasNode {
		return c.value(n.Alias, path, depth)
	}
	if n.Kind == yaml.DocumentNode {
		if len(n.Content) == 0 {
			return nil, nil
		}
		return c.value(n.Content[0], path, depth)
	}
	c.count++
	if c.count > table.Limits.Values {
		return nil, bad(c.where, "the document expands to over %d values (aliases included)", table.Limits.Values)
	}
	if depth > table.Limits.Depth {
		return nil, bad(c.where, "%s nests deeper than %d levels", fieldName(path), table.Limits.Depth)
	}
	if n.Style&yaml.TaggedStyle != 0 {
		return nil, bad(c.where, "%s has an explicit YAML tag (%s); write the value plainly", fieldName(path), n.Tag)
	}
	switch n.Kind {
	case yaml.MappingNode:
		return c.mapping(n, path, depth)
	case yaml.SequenceNode:
		out := make([]any, 0, len(n.Content))
		for _, e := range n.Content {
			v, err := c.value(e, path, depth+1)
			if err != nil {
				return nil, err
			}
			out = append(out, v)
		}
		return out, nil
	}
	return c.scalar(n, path)
}

func (c *converter) mapping(n *yaml.Node, path string, depth int) (any, error) {
	out := make(map[string]any, len(n.Content)/2)
	for i := 0; i+1 < len(n.Content); i += 2 {
		kn := n.Content[i]
		for kn.Kind == yaml.AliasNode {
			kn = kn.Alias
		}
		if kn.Kind == yaml.ScalarNode && kn.Style&^yaml.TaggedStyle == 0 && kn.Value == "<<" {
			return nil, bad(c.where, "merge keys ('<<') are not supported; write the fields out")
		}
		k, err := c.value(kn, path, depth+1)
		if err != nil {
			return nil, err
		}
		ks, ok := k.(string)
		if !ok {
			return nil, bad(c.where, "a mapping key must be a string, got %s", describe(k))
		}
		name := ks
		if path != "" {
			name = path + "." + ks
		}
		if _, dup := out[ks]; dup {
			return nil, bad(c.where, "field '%s' is given twice", name)
		}
		v, err := c.value(n.Content[i+1], name, depth+1)
		if err != nil {
			return nil, err
		}
		out[ks] = v
	}
	return out, nil
}

// scalar resolves a scalar: quoted and block scalars are strings, plain
// ones by the table's patterns.
func (c *converter) scalar(n *yaml.Node, path string) (any, error) {
	s := n.Value
	if n.Style != 0 {
		return s, nil
	}
	switch {
	case scalars.null.MatchString(s):
		return nil, nil
	case scalars.bool.MatchString(s):
		return strings.ToLower(s) == "true", nil
	case scalars.int.MatchString(s):
		if v, err := strconv.ParseInt(s, 10, 64); err == nil {
			return v, nil
		}
		b, _ := new(big.Int).SetString(strings.TrimPrefix(s, "+"), 10)
		return bigInt(b.String()), nil
	case scalars.float.MatchString(s):
		if f := parseFloat(s); !math.IsInf(f, 0) && !math.IsNaN(f) {
			return f, nil
		}
		return nil, bad(c.where, "%s must be a finite number, got %s (JSON has no infinities or NaN)", fieldName(path), s)
	}
	return s, nil
}

// parseFloat reads a float the table's pattern matched (.inf and .nan
// included).
func parseFloat(s string) float64 {
	t := strings.ToLower(strings.TrimLeft(s, "+-"))
	switch t {
	case ".inf":
		if strings.HasPrefix(s, "-") {
			return math.Inf(-1)
		}
		return math.Inf(1)
	case ".nan":
		return math.NaN()
	}
	v, _ := strconv.ParseFloat(s, 64) // ±Inf past float64's range, as Python's float()
	return v
}

// fieldName names the field at path for a message ("the document" at the
// top).
func fieldName(path string) string {
	if path == "" {
		return "the document"
	}
	return "field '" + path + "'"
}

// checkText refuses what a workload's text must not hold before it is
// parsed (fields.json "text"), as memplan_torch/workload.py's check_text
// does, since the YAML parsers differ there: UTF-16 (go-yaml reads it after
// a byte order mark, PyYAML never), bytes that are not UTF-8, a character
// YAML does not allow, a tab (go-yaml takes one after "key:", PyYAML not),
// and directives (see directives). It returns the text to parse.
func checkText(where string, data []byte) ([]byte, error) {
	if bytes.HasPrefix(data, []byte{0xff, 0xfe}) || bytes.HasPrefix(data, []byte{0xfe, 0xff}) {
		return nil, bad(where, "is UTF-16 text (it starts with a UTF-16 byte order mark); save it as UTF-8")
	}
	if !utf8.Valid(data) {
		i := 0
		for r, n := utf8.DecodeRune(data); r != utf8.RuneError || n > 1; r, n = utf8.DecodeRune(data[i:]) {
			i += n
		}
		return nil, bad(where, "is not UTF-8 text (byte %d)", i)
	}
	if loc := text.unprintable.FindIndex(data); loc != nil {
		r, _ := utf8.DecodeRune(data[loc[0]:])
		hint := ""
		if r == 0 {
			hint = " (NUL bytes: is it UTF-16? save it as UTF-8)"
		}
		return nil, bad(where, "holds U+%04X at %s, a character YAML does not allow%s", r, position(data, loc[0]), hint)
	}
	if i := bytes.IndexByte(data, '\t'); i >= 0 {
		return nil, bad(where, "holds a tab at %s; indent and separate with spaces (a tab inside a string: \\t in double quotes)", position(data, i))
	}
	return directives(where, data)
}

// position is "line L, column C" of byte i of data (columns in
// characters).
func position(data []byte, i int) string {
	start := bytes.LastIndexByte(data[:i], '\n') + 1
	return fmt.Sprintf("line %d, column %d", bytes.Count(data[:i], []byte("\n"))+1, utf8.RuneCount(data[start:i])+1)
}

// directives reads the directive lines of the file (a line starting with
// % where only blank lines and comments precede it, at the start or after
// a "..." line): %YAML 1.1 and 1.2 become comments (the table's scalar
// rules apply whatever the version; go-yaml refuses 1.2, PyYAML reads it),
// a second one before the same document and any other directive (%TAG,
// reserved ones) are refused. It returns data with those lines commented
// out.
func directives(where string, data []byte) ([]byte, error) {
	out, copied, head, seen, off := data, false, true, false, 0
	for n, line := range bytes.SplitAfter(data, []byte("\n")) {
		start := off
		off += len(line)
		l := strings.TrimRight(string(line), "\r\n")
		if n == 0 && strings.HasPrefix(l, "\uFEFF") {
			l, start = l[len("\uFEFF"):], start+len("\uFEFF")
		}
		trimmed := strings.TrimLeft(l, " ")
		switch {
		case l == "..." || strings.HasPrefix(l, "... "):
			head, seen = true, false
		case !head, trimmed == "" || strings.HasPrefix(trimmed, "#"):
		case !strings.HasPrefix(l, "%"):
			head = false
		case !text.directive.MatchString(l):
			if r := []rune(l); len(r) > 40 { // characters, as Python cuts it
				l = string(r[:40]) + "..."
			}
			return nil, bad(where, "line %d holds the YAML directive %s; a workload may start with %%YAML 1.1 or %%YAML 1.2, no other", n+1, quote(l))
		case seen:
			return nil, bad(where, "line %d gives a second %%YAML directive", n+1)
		default:
			if !copied {
				out, copied = append([]byte(nil), data...), true
			}
			out[start], seen = '#', true
		}
	}
	return out, nil
}
