package yamlerr

import (
	"bytes"
	"errors"
	"fmt"
	"github.com/memplan/memplan/internal/boundedio"
	"io"
	"regexp"
	"strings"

	"sigs.k8s.io/yaml"
	yaml3 "sigs.k8s.io/yaml/goyaml.v3"
)

// ErrRefused is what ToJSON and UnmarshalStrict refuse themselves, before
// or instead of sigs.k8s.io/yaml's words: aliases that expand a document
// past its reader's limit, a mapping key that is not a string.
var ErrRefused = errors.New("YAML document refused")

type refusal string

func (r refusal) Error() string        { return string(r) }
func (r refusal) Is(target error) bool { return target == ErrRefused }

// ToJSON is sigs.k8s.io/yaml's YAMLToJSON (YAMLToJSONStrict when strict:
// duplicate keys refused) of a document whose aliases, written out, make
// it at most limit bytes (checkAliases) and whose mapping keys are strings
// (keyError). Every reader of outside YAML goes through it or
// UnmarshalStrict: the library writes every alias out, so a few hundred
// aliases of a 1 MiB string made a 1 MiB job file 500 MiB of JSON (2 GB
// of memory), and its key errors were Go's formatting ("%!s(<nil>)").
func ToJSON(data []byte, limit int, strict bool) ([]byte, error) {
	if err := checkTree(data, limit); err != nil {
		return nil, err
	}
	convert := yaml.YAMLToJSON
	if strict {
		convert = yaml.YAMLToJSONStrict
	}
	js, err := convert(data)
	if err != nil {
		return nil, keyError(data, err)
	}
	return js, nil
}

// UnmarshalStrict is sigs.k8s.io/yaml's UnmarshalStrict (the target still
// shapes the conversion: a number given for a string field reads as its
// text) with ToJSON's checks.
func UnmarshalStrict(data []byte, v any, limit int) error {
	if err := checkTree(data, limit); err != nil {
		return err
	}
	if err := yaml.UnmarshalStrict(data, v); err != nil {
		return keyError(data, err)
	}
	return nil
}

// checkTree refuses a file of several documents (OneDocument: the library
// converts the first and drops the rest, so a second job, recipe or cluster
// was ignored without a word) and one that its aliases would write out to
// more than limit bytes, measured on its node tree (go-yaml v3's, which
// keeps an alias as a pointer to what it names). A file without a '*' has
// no alias, and one without "---" or "..." a single document: such a file
// is not parsed here (the tree costs about as much as the library's own
// conversion). The limit is the reader's file limit: aliases let a
// document hold no more than a file without them may. A document this
// parser refuses is refused with its words, not handed to the library
// unmeasured.
func checkTree(data []byte, limit int) error {
	if err := strayBOM(data); err != nil {
		return err
	}
	aliases := bytes.ContainsRune(data, '*')
	numbers := notDecimalHint.Match(data)
	if !aliases && !numbers && !bytes.Contains(data, []byte("---")) && !bytes.Contains(data, []byte("...")) {
		return nil
	}
	doc, err := OneDocument(data, "a file")
	if err != nil || doc == nil {
		return err
	}
	if numbers {
		if err := checkDecimal(doc); err != nil {
			return err
		}
	}
	if !aliases {
		return nil
	}
	m := measure{anchored: map[*yaml3.Node]int64{}}
	size := m.size(doc)
	if m.err != nil {
		return m.err
	}
	if m.aliases && size > int64(limit) {
		return refusal("YAML aliases expand to more than " + sizeName(limit))
	}
	return nil
}

// notDecimalHint finds what may be a whole number sigs.k8s.io/yaml reads
// in another base (YAML 1.1: 010 is octal 8, 0x10 16, 0b11 3, 1_000 1000):
// a file without it is not parsed for checkDecimal.
var notDecimalHint = regexp.MustCompile(`(?:^|[^0-9A-Za-z_.])[-+]?(?:0[0-9_xXoObB]|[0-9]+_)`)

// notDecimal is a plain scalar that sigs.k8s.io/yaml reads as a whole
// number written other than in decimal digits.
var notDecimal = regexp.MustCompile(`^[-+]?(?:0[0-9_]+|0[xX][0-9a-fA-F_]+|0[oO][0-7_]+|0[bB][01_]+|[0-9][0-9_]*_[0-9_]*)$`)

// checkDecimal refuses a plain scalar that the library would read as a
// whole number in a base other than ten, naming its line: memplan reads
// whole numbers in decimal everywhere (its flags, the workload file read
// 010 as ten), and this library would read it as eight, so it is refused
// rather than read either way. A quoted scalar is a string and passes.
func checkDecimal(n *yaml3.Node) error {
	if n.Kind == yaml3.ScalarNode && n.Style == 0 && notDecimal.MatchString(n.Value) {
		return refusal(fmt.Sprintf("line %d: %s: write a whole number in decimal digits without a leading zero", n.Line, n.Value))
	}
	for _, c := range n.Content {
		if err := checkDecimal(c); err != nil {
			return err
		}
	}
	return nil
}

// OneDocument parses data's one YAML document (nil when it holds none),
// refusing several in one line: "holds 2 YAML documents; what is one". It
// is the one check of every reader of outside YAML: ToJSON and
// UnmarshalStrict make it, and the workload reader, which walks the
// document itself, calls it. A parse error is go-yaml's, as it is.
//
// A byte order mark (U+FEFF) is taken at the start only: go-yaml reads a
// second one as part of the first line and then drops the first character
// of every later line, so "Xbatch: 16" was read as batch (sweep G, round
// 25), where memplan_torch refuses the file.
func OneDocument(data []byte, what string) (*yaml3.Node, error) {
	if err := strayBOM(data); err != nil {
		return nil, err
	}
	dec := yaml3.NewDecoder(bytes.NewReader(data))
	var docs []*yaml3.Node
	for {
		var n yaml3.Node
		err := dec.Decode(&n)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		docs = append(docs, &n)
	}
	switch len(docs) {
	case 0:
		return nil, nil
	case 1:
		return docs[0], nil
	}
	return nil, refusal(fmt.Sprintf("holds %d YAML documents; %s is one", len(docs), what))
}

// keyError words sigs.k8s.io/yaml's error for a mapping key that is not a
// string ("unsupported map key of type: %!s(<nil>)", "invalid map key:
// []interface {}{"a"}") as the key's line; any other error is returned as
// it is. The document has passed checkAliases, so parsing it again costs
// no more than the library's try did.
func keyError(data []byte, err error) error {
	if !strings.Contains(err.Error(), "map key") {
		return err
	}
	var doc yaml3.Node
	if yaml3.Unmarshal(data, &doc) == nil {
		m := measure{anchored: map[*yaml3.Node]int64{}}
		if m.size(&doc); m.err != nil {
			return m.err
		}
	}
	return refusal("a mapping key must be a string")
}

// measure sizes a node tree as its aliases would write it out: a scalar is
// its bytes and one, a list or mapping two and its entries, an alias what
// it names. An anchored node is measured once (the only node an alias can
// reach twice), so the walk is linear in the nodes however the aliases
// nest. It also notes the first mapping key that is not a string and an
// alias inside the node it names.
type measure struct {
	anchored map[*yaml3.Node]int64 // -1: being measured
	aliases  bool
	err      error
}

// maxSize caps a size: sums of capped sizes stay inside an int64.
const maxSize = 1 << 60

func (m *measure) size(n *yaml3.Node) int64 {
	if m.err != nil {
		return 0
	}
	if n.Kind == yaml3.AliasNode {
		m.aliases = true
		if n.Alias == nil {
			return 0
		}
		if m.anchored[n.Alias] < 0 {
			m.err = refusal(fmt.Sprintf("a YAML alias names a node that holds it (line %d)", n.Line))
			return 0
		}
		return m.size(n.Alias)
	}
	if v, ok := m.anchored[n]; ok {
		return v
	}
	if n.Anchor != "" {
		m.anchored[n] = -1
	}
	total := int64(2)
	switch n.Kind {
	case yaml3.ScalarNode:
		total = int64(len(n.Value)) + 1
	case yaml3.DocumentNode:
		total = 0
	}
	for i, c := range n.Content {
		if n.Kind == yaml3.MappingNode && i%2 == 0 && m.err == nil && !stringKey(c) {
			m.err = refusal(fmt.Sprintf("a mapping key must be a string (line %d)", c.Line))
		}
		total = min(total+m.size(c), maxSize)
	}
	if n.Anchor != "" {
		m.anchored[n] = total
	}
	return total
}

// stringKey reports whether key reads as a string: a scalar that is not
// null (sigs.k8s.io/yaml writes a number or a boolean as its text).
func stringKey(key *yaml3.Node) bool {
	for key.Kind == yaml3.AliasNode && key.Alias != nil {
		key = key.Alias
	}
	return key.Kind == yaml3.ScalarNode && key.ShortTag() != "!!null"
}

// sizeName says a limit in a message: "16 MiB", "256 KiB", "15 bytes".
func sizeName(n int) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d bytes", n)
}

// strayBOM refuses a byte order mark anywhere but at the start (OneDocument).
func strayBOM(data []byte) error {
	rest := boundedio.TrimBOM(data)
	if i := bytes.Index(rest, []byte("\uFEFF")); i >= 0 {
		return refusal(fmt.Sprintf("holds a byte order mark (U+FEFF) at byte %d; a file may start with one, nowhere else", i+len(data)-len(rest)))
	}
	return nil
}
