"""Workload files (memplan.workload/v1), YAML or JSON; see docs/measure-format.md.

The same file is read by `memplan plan --workload`. Unknown fields and wrong types are refused with the
field named.
"""

import json
import math
import os
import re
import stat

def _table_path():
    """fields.json: beside this module when installed with it, else the repository's workload/fields.json."""
    here = os.path.dirname(os.path.abspath(__file__))
    for p in (os.path.join(here, "fields.json"), os.path.join(here, "..", "..", "workload", "fields.json")):
        if os.path.exists(p):
            return p
    raise ImportError("memplan_torch.workload: workload/fields.json (the field table) not found beside %s" % here)


# The field table memplan's Go reader embeds (workload/fields.json): one table, so the readers cannot drift apart.
with open(_table_path()) as _f:
    TABLE = json.load(_f)
SCHEMA = TABLE["schema"]
_TYPES = {"integer": int, "string": str, "mapping": dict, "boolean": bool}
# field -> (types, default), in the table's order
_TOP = {f["name"]: ((_TYPES[f["type"]],), f.get("default")) for f in TABLE["top"]}
_STRATEGY = {f["name"]: ((_TYPES[f["type"]],), f.get("default")) for f in TABLE["strategy"]}
_SPECS = {"": {f["name"]: f for f in TABLE["top"]}, "strategy.": {f["name"]: f for f in TABLE["strategy"]}}
_REQUIRED = tuple(f["name"] for f in TABLE["top"] if f.get("required"))
DEVICES = tuple(_SPECS[""]["device"]["choices"])
DTYPES = tuple(_SPECS[""]["dtype"]["choices"])
CHECKPOINTS = tuple(_SPECS["strategy."]["checkpoint"]["choices"])
OFFLOADS = tuple(_SPECS["strategy."]["offload"]["choices"])
# how long the loop keeps the model's output in a variable (memplan's loop.hold-outputs): dropped once the loss
# exists; until backward is done; until the next forward returns and rebinds it (through the optimizer step)
HOLDS = tuple(_SPECS[""]["hold_outputs"]["choices"])
OPTIMIZERS = tuple(_SPECS[""]["optimizer"]["choices"])
_SCALARS = {k: re.compile(v) for k, v in TABLE["scalars"].items()}
_LIMITS = TABLE["limits"]
_TEXT = {k: re.compile(v) for k, v in TABLE["text"].items()}
_INT64 = (-(1 << 63), (1 << 63) - 1)
# A \u or \U escape that names no character: the Go reader's go-yaml refuses it, PyYAML made a lone surrogate of
# it (or crashed past U+10FFFF); workload/yaml.go's badEscape is the same words.
BAD_ESCAPE = ("invalid YAML: a \\u or \\U escape names no character (a UTF-16 surrogate, U+D800 to U+DFFF, or past "
              "U+10FFFF); write the character itself or one \\U escape (\\U0001F600, not \\uD83D\\uDE00)")
_SURROGATE = re.compile("[\ud800-\udfff]")


class _BigInt(str):
    """An integer outside int64, as written (decimal, normalised), as the Go reader's bigInt: a field's range check
    names it (int() of it would hit Python's limit of 4,300 digits)."""

    @classmethod
    def of(cls, s):
        """The integer of decimal text s: an int inside int64, else a _BigInt."""
        digits = s.lstrip("+-").lstrip("0") or "0"
        neg = s.startswith("-") and digits != "0"
        if len(digits) <= 19:
            v = -int(digits) if neg else int(digits)
            if _INT64[0] <= v <= _INT64[1]:
                return v
        return cls(("-" if neg else "") + digits)

    def short(self):
        """self for a message: past 40 digits, its first 20 characters and its length (bigInt.short)."""
        digits = len(self.lstrip("-"))
        return str(self) if digits <= 40 else "%s... (%d digits)" % (self[:20], digits)


class WorkloadError(ValueError):
    """A refusal of a workload file, on one line whatever the file holds: a tag or key quoted from it may hold a
    line break (workload.FuzzParse's tag "!0%0A" is "!0" and a newline), written as \\n and \\r, as the Go
    reader's bad() writes it (workload/workload.go)."""

    def __init__(self, msg):
        super().__init__(str(msg).replace("\n", "\\n").replace("\r", "\\r"))


def _describe(v):
    """v's kind, as the Go reader's describe names it."""
    if v is None:
        return "null"
    if isinstance(v, _BigInt):
        return "an integer"
    for t, name in ((bool, "a boolean"), (int, "an integer"), (float, "a float"), (str, "a string"),
                    (list, "a list"), (dict, "a mapping")):
        if isinstance(v, t):
            return name
    return "a " + type(v).__name__


def _quote(s):
    """s as a JSON string (one line whatever it holds), as the Go reader's quote writes it."""
    # Go's encoder escapes U+2028 and U+2029 whatever it is told
    return json.dumps(s, ensure_ascii=False).replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


def _article(t):
    return "an integer" if t == "integer" else "a " + t


def _field_error(f, v):
    """Why v is not a value of field f: (where inside v, "must be ..."), where "" is v itself and ".n" model_args'
    n; or None."""
    t = _TYPES[f["type"]]
    if isinstance(v, _BigInt) and t is int:
        return "", _bounds(f, v)
    if not isinstance(v, t) or isinstance(v, _BigInt) or (isinstance(v, bool) and t is not bool):
        return "", "must be %s, got %s" % (_article(f["type"]), _describe(v))
    if t is int and _bounds(f, v):
        return "", _bounds(f, v)
    if t is str and f.get("choices") is not None and v not in f["choices"] and v not in f.get("aliases", {}):
        return "", "must be one of %s, got %s" % (_choice_list(f), _quote(v))
    if t is dict and ("min" in f or "max" in f):
        return _inside(f, v, "")
    return None


def _bounds(f, v):
    """Why integer v (an int or a _BigInt) is outside f's min and max, or None."""
    if isinstance(v, _BigInt):
        op, bound = (">=", f["min"]) if v.startswith("-") else ("<=", f["max"])
        return "must be %s %d, got %s" % (op, bound, v.short())
    if "min" in f and v < f["min"]:
        return "must be >= %d, got %d" % (f["min"], v)
    if "max" in f and v > f["max"]:
        return "must be <= %d, got %d" % (f["max"], v)
    return None


def _inside(f, v, at):
    """The integers inside a mapping's value v (at: its path below the field) against f's bounds, keys in sorted
    order: (path, why) of the first outside them, or None (the Go reader's inside)."""
    if isinstance(v, dict):
        return next((r for r in (_inside(f, v[k], at + "." + k) for k in sorted(v)) if r), None)
    if isinstance(v, list):
        return next((r for r in (_inside(f, e, at) for e in v) if r), None)
    if isinstance(v, int) and not isinstance(v, bool) or isinstance(v, _BigInt):
        why = _bounds(f, v)
        return (at, why) if why else None
    return None


def _choice_list(f):
    """f's choices for a message, then its aliases in sorted order: "float32, float16 (or fp16, fp32)"."""
    s = ", ".join(f["choices"])
    return s + " (or %s)" % ", ".join(sorted(f["aliases"])) if f.get("aliases") else s


def canonical(field, v):
    """The choice that value v of a top-level string field spells (an alias's choice, or v)."""
    return _SPECS[""][field].get("aliases", {}).get(v, v)


def _check(where, obj, spec, prefix):
    if not isinstance(obj, dict):
        raise WorkloadError("%s: must be a mapping, got %s" % (where, _describe(obj)))
    fields = _SPECS[prefix]
    out = {}
    for k in sorted(obj):
        v = obj[k]
        if k not in fields:
            raise WorkloadError("%s: unknown field '%s' (known fields: %s)" % (where, k, ", ".join(sorted(fields))))
        if v is None:
            continue
        why = _field_error(fields[k], v)
        if why:
            top = where[:-len(": strategy")] if where.endswith(": strategy") else where
            raise WorkloadError("%s: field '%s%s%s' %s" % (top, prefix, k, why[0], why[1]))
        out[k] = v
    for k, f in fields.items():
        if out.get(k) is None:
            out[k] = f.get("default")
        if out[k] is None and f.get("required"):
            raise WorkloadError("%s: missing required field '%s%s'" % (where, prefix, k))
    return out


def validate(obj, where="workload"):
    """Validates a workload mapping against the field table and returns it normalised with defaults filled."""
    w = _check(where, obj, _TOP, "")
    s = _check(where + ": strategy", w["strategy"] or {}, _STRATEGY, "strategy.")
    if w["schema"] != SCHEMA:
        raise WorkloadError("%s: field 'schema' must be %s, got %s" % (where, _quote(SCHEMA), _quote(w["schema"])))
    if ":" not in w["model"]:
        raise WorkloadError("%s: field 'model' must be MODULE:FUNCTION, got %s" % (where, _quote(w["model"])))
    if w["batch"] % s["accumulation"]:
        raise WorkloadError("%s: field 'batch' (%d) must be divisible by 'strategy.accumulation' (%d)"
                            % (where, w["batch"], s["accumulation"]))
    if w["model_args"] is None:
        w["model_args"] = {}
    w["strategy"] = s
    if w["name"] is None:
        w["name"] = w["model"].split(":")[-1]
    return w


def _yaml_loader():
    """A PyYAML loader that only composes nodes, tagging every implicit node with its kind (_decode resolves plain
    scalars with the table's patterns, as the Go reader does), or None without PyYAML."""
    try:
        import yaml
    except ImportError:
        return None

    class Loader(yaml.SafeLoader):
        yaml_implicit_resolvers = {}

        def resolve(self, kind, value, implicit):
            if kind is yaml.ScalarNode:
                return "memplan:plain" if implicit[0] else "memplan:quoted"
            return "memplan:map" if kind is yaml.MappingNode else "memplan:seq"

        def compose_node(self, parent, index):
            # An anchor given again names the later node from there on (YAML 1.2 3.2.2.2), as go-yaml reads it;
            # PyYAML refused it.
            event = self.peek_event()
            if not isinstance(event, yaml.AliasEvent) and event.anchor is not None:
                self.anchors.pop(event.anchor, None)
            return super().compose_node(parent, index)

    return Loader


class _Decoder:
    """Turns composed YAML nodes into values as workload/yaml.go's converter does: plain scalars by the table's
    patterns (null, booleans, decimal integers, floats; anything else a string), quoted ones as strings, aliases
    expanded (counted), and explicit tags, merge keys, duplicate keys and keys that are not strings refused."""

    def __init__(self, where):
        self.where, self.count = where, 0

    def fail(self, msg):
        raise WorkloadError("%s: %s" % (self.where, msg))

    def value(self, n, path, depth):
        import yaml
        self.count += 1
        if self.count > _LIMITS["values"]:
            self.fail("the document expands to over %d values (aliases included)" % _LIMITS["values"])
        if depth > _LIMITS["depth"]:
            self.fail("%s nests deeper than %d levels" % (_field_name(path), _LIMITS["depth"]))
        if not n.tag.startswith("memplan:"):
            self.fail("%s has an explicit YAML tag (%s); write the value plainly"
                      % (_field_name(path), n.tag.replace("tag:yaml.org,2002:", "!!")))
        if isinstance(n, yaml.MappingNode):
            return self.mapping(n, path, depth)
        if isinstance(n, yaml.SequenceNode):
            return [self.value(e, path, depth + 1) for e in n.value]
        return self.scalar(n, path)

    def mapping(self, n, path, depth):
        out = {}
        for kn, vn in n.value:
            if kn.tag == "memplan:plain" and kn.value == "<<":
                self.fail("merge keys ('<<') are not supported; write the fields out")
            k = self.value(kn, path, depth + 1)
            if not isinstance(k, str) or isinstance(k, _BigInt):
                self.fail("a mapping key must be a string, got %s" % _describe(k))
            name = path + "." + k if path else k
            if k in out:
                self.fail("field '%s' is given twice" % name)
            out[k] = self.value(vn, name, depth + 1)
        return out

    def scalar(self, n, path):
        s = n.value
        if _SURROGATE.search(s):
            self.fail(BAD_ESCAPE)
        if n.tag != "memplan:plain":
            return s
        if _SCALARS["null"].match(s):
            return None
        if _SCALARS["bool"].match(s):
            return s.lower() == "true"
        if _SCALARS["int"].match(s):
            return _BigInt.of(s)
        if _SCALARS["float"].match(s):
            t = s.lower().lstrip("+-")
            f = float("nan") if t == ".nan" else float("inf") if t == ".inf" else float(s)
            if math.isinf(f) or math.isnan(f):
                self.fail("%s must be a finite number, got %s (JSON has no infinities or NaN)" % (_field_name(path), s))
            return f
        return s


def _field_name(path):
    return "field '%s'" % path if path else "the document"


def decode_yaml(text, where):
    """The one YAML document of text as plain values (see _Decoder); several documents are refused."""
    import yaml
    # Explicit tags are refused before they construct anything; the node's own tag says which.
    try:
        docs = list(yaml.compose_all(text, Loader=_yaml_loader()))
    except yaml.YAMLError as e:
        raise WorkloadError("%s: invalid YAML: %s" % (where, " ".join(str(e).split())))
    except ValueError as e:  # PyYAML's chr() of a \U escape past U+10FFFF
        if "chr()" not in str(e):
            raise
        raise WorkloadError("%s: %s" % (where, BAD_ESCAPE))
    except RecursionError:
        # PyYAML composes recursively: 1,000 nested [ overflow the stack before _Decoder counts levels
        raise WorkloadError("%s: the document nests deeper than %d levels" % (where, _LIMITS["depth"]))
    if not docs:
        return None
    if len(docs) > 1:
        raise WorkloadError("%s: holds %d YAML documents; a workload is one" % (where, len(docs)))
    return _Decoder(where).value(docs[0], "", 0)


def _json_pairs(where):
    def hook(pairs):
        out = {}
        for k, v in pairs:
            if k in out:
                raise WorkloadError("%s: field '%s' is given twice" % (where, k))
            out[k] = v
        return out
    return hook


# what a path that is not a regular file is, in the Go reader's words (internal/boundedio kind)
_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a named pipe"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a device"), (stat.S_ISBLK, "a device"))


def _read(path):
    """The bytes of the regular file at path, at most the table's limit, as Go's boundedio.ReadFile reads them: a
    named pipe is refused without blocking (O_NONBLOCK), a device such as /dev/zero without reading it."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as e:
        raise WorkloadError("%s: %s" % (path, e.strerror or e))
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = next((k for t, k in _KINDS if t(mode)), "mode %o" % mode)
        raise WorkloadError("cannot read %s: not a regular file (%s)" % (path, kind))
    with os.fdopen(fd, "rb") as f:
        try:
            return f.read(_LIMITS["bytes"] + 1)
        except OSError as e:
            raise WorkloadError("%s: %s" % (path, e.strerror or e))


def load(path):
    """Reads a YAML or JSON workload file and validates it. JSON is YAML, so a .json file takes the YAML path too,
    as the Go reader's does (the table's count, depth and scalar rules apply to both); the json module only
    without PyYAML."""
    where = os.path.basename(path)
    data = _read(path)
    if len(data) > _LIMITS["bytes"]:
        raise WorkloadError("%s: is over the limit of %d bytes for a workload file" % (where, _LIMITS["bytes"]))
    text = check_text(data, where)
    if _yaml_loader() is None:
        try:
            obj = json.loads(text, object_pairs_hook=_json_pairs(where), parse_constant=_no_constant(where),
                             parse_int=_BigInt.of)
        except ValueError as e:
            if isinstance(e, WorkloadError):
                raise
            if not path.endswith(".json"):
                raise WorkloadError("%s: PyYAML is not installed (apt-get install python3-yaml); "
                                    "write the workload as JSON instead" % where)
            raise WorkloadError("%s: invalid JSON: %s" % (where, e))
    else:
        obj = decode_yaml(text, where)
    return validate(obj, where)


def check_text(data, where):
    """The text of a workload file's bytes, checked before it is parsed (the table's "text"), as the Go reader's
    checkText does, since the YAML parsers differ there: UTF-16 (go-yaml reads it after a byte order mark, PyYAML
    never), bytes that are not UTF-8, a character YAML does not allow, a tab (go-yaml takes one after "key:",
    PyYAML not), and directives (see _directives)."""
    if data[:2] in (b"\xff\xfe", b"\xfe\xff"):
        raise WorkloadError("%s: is UTF-16 text (it starts with a UTF-16 byte order mark); save it as UTF-8" % where)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise WorkloadError("%s: is not UTF-8 text (byte %d)" % (where, e.start))
    m = _TEXT["unprintable"].search(text)
    if m:
        hint = " (NUL bytes: is it UTF-16? save it as UTF-8)" if m.group() == "\0" else ""
        raise WorkloadError("%s: holds U+%04X at %s, a character YAML does not allow%s"
                            % (where, ord(m.group()), _position(text, m.start()), hint))
    if "\t" in text:
        raise WorkloadError("%s: holds a tab at %s; indent and separate with spaces (a tab inside a string: \\t in "
                            "double quotes)" % (where, _position(text, text.index("\t"))))
    text = _directives(text, where)
    i = text.find("\ufeff", 1 if text.startswith("\ufeff") else 0)
    if i >= 0:  # as the Go reader's internal/yamlerr (strayBOM) refuses it
        raise WorkloadError("%s: holds a byte order mark (U+FEFF) at byte %d; a file may start with one, nowhere else"
                            % (where, len(text[:i].encode("utf-8"))))
    return text


def _position(text, i):
    """ "line L, column C" of character i of text."""
    return "line %d, column %d" % (text.count("\n", 0, i) + 1, i - text.rfind("\n", 0, i))


def _directives(text, where):
    """text with its %YAML 1.1 and 1.2 directive lines made comments (the table's scalar rules apply whatever the
    version; go-yaml refuses 1.2, PyYAML reads it); a second one before the same document and any other directive
    (%TAG, reserved ones) refused. A directive is a line starting with % where only blank lines and comments
    precede it, at the start or after a "..." line (workload/yaml.go's directives)."""
    lines = text.split("\n")
    head, seen = True, False
    for n, line in enumerate(lines):
        l = line.rstrip("\r\n")
        bom = n == 0 and l.startswith("\ufeff")
        l = l[1:] if bom else l
        trimmed = l.lstrip(" ")
        if l == "..." or l.startswith("... "):
            head, seen = True, False
        elif not head or trimmed == "" or trimmed.startswith("#"):
            pass
        elif not l.startswith("%"):
            head = False
        elif not _TEXT["directive"].search(l):
            raise WorkloadError("%s: line %d holds the YAML directive %s; a workload may start with %%YAML 1.1 or "
                                "%%YAML 1.2, no other" % (where, n + 1, _quote(l[:40] + "..." if len(l) > 40 else l)))
        elif seen:
            raise WorkloadError("%s: line %d gives a second %%YAML directive" % (where, n + 1))
        else:
            lines[n], seen = ("\ufeff#" if bom else "#") + line[2 if bom else 1:], True
    return "\n".join(lines)


def _no_constant(where):
    def refuse(name):
        raise WorkloadError("%s: invalid JSON: %s is not a number" % (where, name))
    return refuse
