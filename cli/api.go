package cli

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/memplan/memplan/engine"
	"github.com/memplan/memplan/internal/yamlerr"
	"github.com/memplan/memplan/models"
	"github.com/memplan/memplan/pack"
	"github.com/memplan/memplan/search"
)

// The HTTP service (memplan serve, package server) runs the same commands
// as the CLI: a request body is a JSON object whose keys are the command's
// flags with '_' for '-' ({"model": "llama-3-8b", "micro_batch": 4}), set
// on the command's own flag set and run by its own RunE with --json, so a
// request means what the same flags mean and the response is the document
// --json prints. Flags that name files on the server or write files are not
// fields; explain's snapshot and pack's job file (and arrival trace) come
// in the body instead.

// apiCommand is one command the service exposes.
type apiCommand struct {
	build func(stdout io.Writer) *cobra.Command
	// args are the fields that carry the command's positional file: their
	// key, whether the body gives it as base64 (a binary file) or as text,
	// and the file name it is written to.
	file *apiFile
	// inline are flags whose value is a file's path on the CLI and the
	// file's text in a request.
	inline map[string]string
	// hide reports flags of the command that are no request fields of it
	// (beside apiHidden's); nil hides none.
	hide func(flag string) bool
}

type apiFile struct {
	key, help string
	base64    bool
	name      string
}

var apiCommands = map[string]apiCommand{
	"plan":    {build: newPlanCmd},
	"compare": {build: newCompareCmd},
	"fit":     {build: func(w io.Writer) *cobra.Command { return newFitCmd(w, io.Discard) }},
	"max":     {build: newMaxCmd},
	// explain reads its plan flags only with --against flags, and
	// against is no field (it may name a file on the server): a request
	// could give them only to have them refused.
	"explain": {build: newExplainCmd, file: &apiFile{key: "snapshot", base64: true, name: "snapshot",
		help: "the snapshot pickle or profiler memory timeline (.json, .json.gz), base64-encoded"}, hide: isPlanFlag},
	"pack": {build: newPackCmd, file: &apiFile{key: "jobs", name: "jobs.yaml",
		help: "the job file's text (kind: memplan.jobs/v1, YAML or JSON)"},
		inline: map[string]string{"arrivals": "arrivals.yaml"}},
}

// apiHidden are flags that are not request fields: output switches the
// service sets itself, and paths of files on the server's disk to read or
// write.
var apiHidden = map[string]bool{
	"json": true, "output": true, "svg": true, "png": true, "no-chart": true, "plot-policy": true, "help": true,
	"graph": true, "workload": true, "cluster": true, "emit-out": true, "against": true,
}

// APICommands are the commands the service exposes, sorted.
func APICommands() []string {
	out := make([]string, 0, len(apiCommands))
	for n := range apiCommands {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// APIField is one field of a request.
type APIField struct {
	// Key is the JSON key (the flag with '_' for '-').
	Key string
	// Type is its JSON schema type: integer, number, boolean, string or
	// array (of strings).
	Type string
	// Ask: the field also takes the string "?" (max's dimension to solve).
	Ask           bool
	Help, Default string
	Required      bool
}

// APIFields lists the fields of command name's requests, sorted by key.
func APIFields(name string) []APIField {
	return slices.Clone(apiFields()[name])
}

// apiFields are every command's fields, read once from their flag sets.
var apiFields = sync.OnceValue(func() map[string][]APIField {
	out := map[string][]APIField{}
	for name := range apiCommands {
		out[name] = fieldsOf(name)
	}
	return out
})

func fieldsOf(name string) []APIField {
	ac, ok := apiCommands[name]
	if !ok {
		return nil
	}
	var out []APIField
	if ac.file != nil {
		out = append(out, APIField{Key: ac.file.key, Type: "string", Help: ac.file.help, Required: true})
	}
	ac.build(io.Discard).Flags().VisitAll(func(fl *pflag.Flag) {
		if apiHidden[fl.Name] || ac.hide != nil && ac.hide(fl.Name) {
			return
		}
		f := APIField{Key: apiKey(fl.Name), Type: jsonType(fl.Value.Type()), Help: fl.Usage, Default: fl.DefValue}
		if _, ok := fl.Value.(askable); ok {
			f.Ask = true
		}
		if _, ok := ac.inline[fl.Name]; ok {
			f.Type, f.Help, f.Default = "string", fl.Usage+" (its text)", ""
		}
		out = append(out, f)
	})
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out
}

func apiKey(flag string) string { return strings.ReplaceAll(flag, "-", "_") }

func jsonType(pflagType string) string {
	switch pflagType {
	case "int", "int64", "int32", "uint", "uint64":
		return "integer"
	case "float64", "float32":
		return "number"
	case "bool":
		return "boolean"
	case "stringArray", "stringSlice":
		return "array"
	}
	return "string"
}

// APIError is a request the service refuses or could not answer: Status is
// the HTTP status (400 bad input, 422 nothing fits, 503 past the request's
// time or its client gone), Field the request field it is about, if one.
type APIError struct {
	Status int
	Field  string
	Msg    string
}

func (e *APIError) Error() string { return e.Msg }

// APIResult is what a command answered: the JSON document --json prints
// and the exit status the CLI would have (ExitOK, or ExitDoesNotFit with
// the document saying so).
type APIResult struct {
	Doc  []byte
	Exit int
}

// ParseAPIRequest decodes body as a request for command name: one JSON
// object, each key a field of the command (APIFields) given once, each value
// of the field's type. It returns the fields as flag values, in key order,
// and the canonical request (the same object compacted with sorted keys),
// which keys the service's cache.
func ParseAPIRequest(name string, body []byte) (map[string][]string, []byte, error) {
	if _, ok := apiCommands[name]; !ok {
		return nil, nil, &APIError{Status: 404, Msg: fmt.Sprintf("no command %q", name)}
	}
	fields := apiFieldMaps()[name]
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	bad := func(field, format string, a ...any) error {
		return &APIError{Status: 400, Field: field, Msg: fmt.Sprintf(format, a...)}
	}
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil, nil, bad("", "the request body must be one JSON object%s", syntaxAt(err))
	}
	vals := map[string][]string{}
	raw := map[string]json.RawMessage{}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return nil, nil, bad("", "the request body is not valid JSON%s", syntaxAt(err))
		}
		key := t.(string)
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, nil, bad(key, "the request body is not valid JSON%s", syntaxAt(err))
		}
		f, ok := fields[key]
		if !ok {
			return nil, nil, bad(key, "unknown field %q%s", key, suggest(key, fields))
		}
		if _, dup := raw[key]; dup {
			return nil, nil, bad(key, "field %q is given twice", key)
		}
		s, err := fieldValue(f, v)
		if err != nil {
			return nil, nil, err
		}
		raw[key], vals[key] = v, s
	}
	if _, err := dec.Token(); err != nil {
		return nil, nil, bad("", "the request body is not valid JSON%s", syntaxAt(err))
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, nil, bad("", "the request body has data after its JSON object")
	}
	for k, f := range fields {
		if f.Required && vals[k] == nil {
			return nil, nil, bad(k, "field %q is required: %s", k, f.Help)
		}
	}
	keys := make([]string, 0, len(raw))
	for k := range raw {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var canon bytes.Buffer
	canon.WriteString(name + "{")
	for i, k := range keys {
		if i > 0 {
			canon.WriteByte(',')
		}
		kj, _ := json.Marshal(k)
		canon.Write(kj)
		canon.WriteByte(':')
		_ = json.Compact(&canon, raw[k])
	}
	canon.WriteByte('}')
	return vals, canon.Bytes(), nil
}

// apiFieldMaps are apiFields by key.
var apiFieldMaps = sync.OnceValue(func() map[string]map[string]APIField {
	out := map[string]map[string]APIField{}
	for name, fs := range apiFields() {
		out[name] = map[string]APIField{}
		for _, f := range fs {
			out[name][f.Key] = f
		}
	}
	return out
})

// syntaxAt is where a JSON syntax error is, for a message.
func syntaxAt(err error) string {
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return fmt.Sprintf(" (at byte %d: %s)", se.Offset, se.Error())
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return " (it ends early)"
	}
	return ""
}

func suggest(key string, fields map[string]APIField) string {
	if _, ok := fields[strings.ReplaceAll(key, "-", "_")]; ok {
		return fmt.Sprintf(" (did you mean %q?)", strings.ReplaceAll(key, "-", "_"))
	}
	return ""
}

// fieldValue checks v's JSON type against f's and returns the flag values.
func fieldValue(f APIField, v json.RawMessage) ([]string, error) {
	var x any
	dec := json.NewDecoder(bytes.NewReader(v))
	dec.UseNumber()
	_ = dec.Decode(&x)
	wrong := &APIError{Status: 400, Field: f.Key, Msg: fmt.Sprintf("field %q must be %s, not %s", f.Key, article(f), jsonKind(x))}
	switch f.Type {
	case "integer":
		if s, ok := x.(string); ok && f.Ask && s == "?" {
			return []string{s}, nil
		}
		n, ok := x.(json.Number)
		if !ok {
			return nil, wrong
		}
		if _, err := strconv.ParseInt(n.String(), 10, 64); errors.Is(err, strconv.ErrRange) {
			return nil, &APIError{Status: 400, Field: f.Key, Msg: fmt.Sprintf("field %q %s: want a whole number (this one is out of range)", f.Key, cutNumber(n.String()))}
		} else if err != nil {
			return nil, &APIError{Status: 400, Field: f.Key, Msg: fmt.Sprintf("field %q must be a whole number, not %s", f.Key, cutNumber(n.String()))}
		}
		return []string{n.String()}, nil
	case "number":
		n, ok := x.(json.Number)
		if !ok {
			return nil, wrong
		}
		return []string{n.String()}, nil
	case "boolean":
		b, ok := x.(bool)
		if !ok {
			return nil, wrong
		}
		return []string{strconv.FormatBool(b)}, nil
	case "array":
		a, ok := x.([]any)
		if !ok {
			return nil, wrong
		}
		out := make([]string, 0, len(a))
		for _, e := range a {
			s, ok := e.(string)
			if !ok {
				return nil, &APIError{Status: 400, Field: f.Key, Msg: fmt.Sprintf("field %q must be an array of strings", f.Key)}
			}
			out = append(out, s)
		}
		return out, nil
	}
	s, ok := x.(string)
	if !ok {
		return nil, wrong
	}
	return []string{s}, nil
}

func article(f APIField) string {
	switch f.Type {
	case "integer":
		if f.Ask {
			return `an integer or "?"`
		}
		return "an integer"
	case "array":
		return "an array of strings"
	case "boolean":
		return "true or false"
	}
	return "a " + f.Type
}

func jsonKind(x any) string {
	switch x.(type) {
	case nil:
		return "null"
	case bool:
		return "a boolean"
	case json.Number:
		return "a number"
	case string:
		return "a string"
	case []any:
		return "an array"
	}
	return "an object"
}

// RunAPI runs command name on a request's fields (ParseAPIRequest's) with
// --json, cancelled by ctx (fit and max check it between plans). A job that
// does not fit is an answer (APIResult.Exit = ExitDoesNotFit); errors are
// *APIError, their messages naming request fields, not flags.
func RunAPI(ctx context.Context, name string, vals map[string][]string) (res *APIResult, err error) {
	ac, ok := apiCommands[name]
	if !ok {
		return nil, &APIError{Status: 404, Msg: fmt.Sprintf("no command %q", name)}
	}
	if err := namesOnly(vals); err != nil {
		return nil, err
	}
	if err := selfContained(ac, vals); err != nil {
		return nil, err
	}
	var out bytes.Buffer
	c := ac.build(&out)
	c.SetOut(io.Discard)
	c.SetErr(io.Discard)
	c.SetContext(ctx)
	if c.Annotations == nil {
		c.Annotations = map[string]string{}
	}
	c.Annotations[apiAnnotation] = "1"
	fl := c.Flags()
	var args []string
	dir := ""
	defer func() {
		if dir != "" {
			_ = os.RemoveAll(dir)
		}
	}()
	temp := func(name string, data []byte) (string, error) {
		if dir == "" {
			d, err := os.MkdirTemp("", "memplan-api-")
			if err != nil {
				return "", err
			}
			dir = d
		}
		p := filepath.Join(dir, name)
		return p, os.WriteFile(p, data, 0o600)
	}
	keys := make([]string, 0, len(vals))
	for k := range vals {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		v := vals[k]
		if ac.file != nil && k == ac.file.key {
			data := []byte(v[0])
			if ac.file.base64 {
				if data, err = base64.StdEncoding.DecodeString(v[0]); err != nil {
					return nil, &APIError{Status: 400, Field: k, Msg: fmt.Sprintf("field %q is not base64: %v", k, err)}
				}
			}
			p, err := temp(ac.file.name, data)
			if err != nil {
				return nil, err
			}
			args = append(args, p)
			continue
		}
		flag := strings.ReplaceAll(k, "_", "-")
		if fname, ok := ac.inline[flag]; ok {
			p, err := temp(fname, []byte(v[0]))
			if err != nil {
				return nil, err
			}
			v = []string{p}
		}
		for _, s := range v {
			if err := fl.Set(flag, s); err != nil {
				return nil, &APIError{Status: 400, Field: k, Msg: apiMessage(apiValueError(name, k, s, err), fl, dir)}
			}
		}
	}
	if err := fl.Set("json", "true"); err != nil {
		return nil, err
	}
	if c.Args != nil {
		if err := c.Args(c, args); err != nil {
			return nil, &APIError{Status: 400, Msg: apiMessage(err, fl, dir)}
		}
	}
	err = c.RunE(c, args)
	doc := out.Bytes()
	if dir != "" {
		// The document names the files it read by their path: the
		// request's files are called by their names, not the temporary
		// directory's.
		doc = bytes.ReplaceAll(doc, []byte(dir+string(filepath.Separator)), nil)
	}
	var v verdict
	switch {
	case err == nil:
		return &APIResult{Doc: doc}, nil
	case errors.As(err, &v):
		return &APIResult{Doc: doc, Exit: int(v)}, nil
	case ctx.Err() != nil:
		return nil, &APIError{Status: 503, Msg: "the request was stopped: " + context.Cause(ctx).Error()}
	}
	ae := &APIError{Status: 400, Msg: apiMessage(err, fl, dir)}
	var fe *engine.FieldError
	if errors.As(err, &fe) && fe.Field != engine.FieldNone {
		ae.Field = apiKey(fe.Field.Key())
	} else if m := flagName.FindStringSubmatch(err.Error()); m != nil && fl.Lookup(m[1]) != nil && !apiHidden[m[1]] {
		ae.Field = apiKey(m[1])
	}
	if errors.Is(err, search.ErrNothingFits) {
		ae.Status = 422
	}
	return nil, ae
}

// apiValueError is a field's value the command's flag refused, worded as
// the CLI words a flag's (flagError): `field "gpu_memory_utilization"
// 1e999: want a number (this one is out of range)`, the value as the
// request wrote it (a JSON number bare, a string quoted), never pflag's
// or strconv's text.
func apiValueError(command, key, value string, err error) error {
	var iv *pflag.InvalidValueError
	if !errors.As(err, &iv) {
		return fmt.Errorf("field %q: %w", key, err)
	}
	shown := quoteCut(value)
	switch apiFieldMaps()[command][key].Type {
	case "integer", "number", "boolean":
		shown = cutNumber(value)
	}
	return fmt.Errorf("field %q %s: %s", key, shown, valueWant(iv))
}

// cutNumber is a JSON number as a message repeats it: bare, cut to
// maxQuoted bytes with "…" when longer (a number is ASCII).
func cutNumber(n string) string {
	if len(n) > maxQuoted {
		return n[:maxQuoted] + "…"
	}
	return n
}

// fileKeys are the keys of a job file (pack) that name other files.
var fileKeys = map[string]bool{"plan": true, "snapshot": true, "published": true}

// namesOnly refuses a model or recipe the service would have to read from
// its disk: a path, or a model name outside the catalog (the CLI looks for
// a file of that name in the working directory first).
func namesOnly(vals map[string][]string) error {
	if m := vals["model"]; len(m) == 1 && looksLikePath(m[0]) {
		return &APIError{Status: 400, Field: "model", Msg: fmt.Sprintf("field \"model\": the service plans catalog models (memplan models lists them), not config.json files: %q", m[0])}
	} else if len(m) == 1 && !models.InCatalog(m[0]) {
		// Refused here, by name: the CLI would look for a file of that
		// name in the service's working directory first.
		return &APIError{Status: 400, Field: "model", Msg: fmt.Sprintf("field \"model\": model %q: not a catalog model (memplan models lists them); did you mean %s?", m[0], strings.Join(models.Suggest(m[0], 3), ", "))}
	}
	if r := vals["recipe"]; len(r) == 1 && looksLikePath(r[0]) {
		return &APIError{Status: 400, Field: "recipe", Msg: fmt.Sprintf("field \"recipe\": the service takes recipe names, not recipe files: %q", r[0])}
	}
	return nil
}

// selfContained refuses a request file that names other files: the service
// reads no file of its disk for a caller (a job file's names resolve beside
// it, and ".." would climb out of the request's directory).
func selfContained(ac apiCommand, vals map[string][]string) error {
	if ac.file == nil || ac.file.base64 || vals[ac.file.key] == nil {
		return nil
	}
	key := ac.file.key
	text := []byte(vals[key][0])
	if len(text) > pack.MaxFileBytes {
		return nil // pack refuses it before reading it
	}
	// Read as pack reads it (aliases bounded, keys strings), or a body of
	// aliases would be written out here before pack refused it.
	js, err := yamlerr.ToJSON(text, pack.MaxFileBytes, false)
	var doc any
	if err != nil || json.Unmarshal(js, &doc) != nil {
		return nil // the command says what is wrong with it
	}
	var walk func(v any, at string) error
	walk = func(v any, at string) error {
		switch v := v.(type) {
		case map[string]any:
			for k, e := range v {
				if fileKeys[k] {
					return &APIError{Status: 400, Field: key, Msg: fmt.Sprintf("field %q: %s names a file (%s); the service reads none from its disk: give the job in train or serve terms", key, at+k, k)}
				}
				if err := walk(e, at+k+"."); err != nil {
					return err
				}
			}
		case []any:
			for i, e := range v {
				if err := walk(e, fmt.Sprintf("%s%d.", at, i)); err != nil {
					return err
				}
			}
		case string:
			last := at[strings.LastIndex(strings.TrimSuffix(at, "."), ".")+1:]
			if ((last == "model." || last == "recipe.") && looksLikePath(v)) || strings.Contains(v, "..") {
				return &APIError{Status: 400, Field: key, Msg: fmt.Sprintf("field %q: %s is a path (%q); the service reads no file from its disk: name catalog models and recipes", key, strings.TrimSuffix(at, "."), v)}
			}
			if last == "model." && !models.InCatalog(v) {
				return &APIError{Status: 400, Field: key, Msg: fmt.Sprintf("field %q: %s %q is not a catalog model (memplan models lists them)", key, strings.TrimSuffix(at, "."), v)}
			}
		}
		return nil
	}
	return walk(doc, "")
}

// apiAnnotation marks a command run by RunAPI: process-wide tuning (fit's
// collector setting) is the service's, not one request's.
const apiAnnotation = "memplan-api"

func isAPI(c *cobra.Command) bool { return c.Annotations[apiAnnotation] != "" }

func looksLikePath(s string) bool {
	return strings.ContainsAny(s, `/\`) || strings.HasSuffix(s, ".json") || strings.HasSuffix(s, ".yaml") || strings.HasSuffix(s, ".yml")
}

var flagName = regexp.MustCompile(`--([a-z][a-z0-9-]*)`)

// apiMessage is err's text speaking in request fields: a field error's
// fields as their keys, a flag named in the text as its field, a temporary
// file's path as its field, without the CLI's help pointer.
func apiMessage(err error, fl *pflag.FlagSet, dir string) string {
	msg := err.Error()
	var fe *engine.FieldError
	if errors.As(err, &fe) {
		msg = strings.Replace(msg, fe.Error(), fe.Render(func(f engine.Field) string { return apiKey(f.Key()) }), 1)
	}
	msg = trimKind(err, msg, func(rest string) bool {
		k, _, _ := strings.Cut(rest, " ")
		return fl.Lookup(strings.ReplaceAll(k, "_", "-")) != nil
	})
	msg = flagName.ReplaceAllStringFunc(msg, func(m string) string {
		if fl.Lookup(m[2:]) != nil && !apiHidden[m[2:]] {
			return apiKey(m[2:])
		}
		return m
	})
	if i := strings.Index(msg, " (see 'memplan"); i >= 0 {
		msg = msg[:i]
	}
	if dir != "" {
		for _, ac := range apiCommands {
			if ac.file != nil {
				msg = strings.ReplaceAll(msg, filepath.Join(dir, ac.file.name), fmt.Sprintf("field %q", ac.file.key))
			}
			for flag, name := range ac.inline {
				msg = strings.ReplaceAll(msg, filepath.Join(dir, name), fmt.Sprintf("field %q", apiKey(flag)))
			}
		}
		msg = strings.ReplaceAll(msg, dir+string(filepath.Separator), "")
	}
	msg = strings.TrimPrefix(msg, "memplan: ")
	return strings.TrimSpace(strings.ReplaceAll(msg, "\n", "; "))
}

// HTTPStatus is the status the service answers e with.
func (e *APIError) HTTPStatus() int { return e.Status }

// FieldKey is the request field e is about ("" when none).
func (e *APIError) FieldKey() string { return e.Field }
