// Package snapshot reads the memory snapshots PyTorch writes
// (torch.cuda.memory._dump_snapshot pickles, torch.cuda.memory_snapshot()
// lists, torch.profiler's export_memory_timeline JSON) into plain Go values,
// without ever executing a pickle.
//
// The pickle reader is an interpreter of the pickle opcodes (protocols 0–5,
// CPython's Lib/pickletools.py lists them) that only builds plain values:
// None, booleans, integers, floats, strings, bytes, lists, tuples, dicts and
// sets. Every opcode that would look up or call Python code (GLOBAL,
// STACK_GLOBAL, REDUCE, BUILD, INST, OBJ, NEWOBJ, NEWOBJ_EX, EXT1/2/4,
// PERSID, BINPERSID, NEXT_BUFFER, READONLY_BUFFER) is refused, except a
// GLOBAL of a name on a short whitelist whose only effect is to build one of
// those plain values (collections.OrderedDict → dict).
package snapshot

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/big"
	"strconv"
	"strings"
	"unicode/utf8"
)

// List is a Python list (a pointer, so a list memoized and referenced twice
// is one value, as in Python).
type List struct{ Items []any }

// Tuple is a Python tuple.
type Tuple []any

// Dict is a Python dict in insertion order. Keys are strings, integers,
// floats, booleans, None, bytes or tuples of those.
type Dict struct {
	Keys, Vals []any
	index      map[string]int // hashed key → position
}

// Set is a Python set or frozenset.
type Set struct{ Items []any }

// Get returns the value of a string key.
func (d *Dict) Get(key string) (any, bool) {
	i, ok := d.index[hashKey(key)]
	if !ok {
		return nil, false
	}
	return d.Vals[i], true
}

// Len is the number of keys.
func (d *Dict) Len() int { return len(d.Keys) }

func newDict() *Dict { return &Dict{index: map[string]int{}} }

func (d *Dict) set(k, v any) error {
	h, err := keyHash(k)
	if err != nil {
		return err
	}
	if i, ok := d.index[h]; ok {
		d.Vals[i] = v
		return nil
	}
	d.index[h] = len(d.Keys)
	d.Keys = append(d.Keys, k)
	d.Vals = append(d.Vals, v)
	return nil
}

// hashKey is the index key of a string key: the string itself (no
// allocation on lookup), unless it starts with NUL, the prefix of the other
// key types' hashes.
func hashKey(s string) string {
	if len(s) > 0 && s[0] == 0 {
		return "\x00s" + s
	}
	return s
}

// keyHash is a string equal for keys Python considers equal (within the
// types a snapshot uses: 1 == 1.0 == True is honoured for integers and
// booleans; floats hash by value).
func keyHash(k any) (string, error) {
	switch v := k.(type) {
	case string:
		return hashKey(v), nil
	case int64:
		return "\x00i" + strconv.FormatInt(v, 10), nil
	case *big.Int:
		return "\x00i" + v.String(), nil
	case bool:
		if v {
			return "\x00i1", nil
		}
		return "\x00i0", nil
	case float64:
		if v == math.Trunc(v) && math.Abs(v) < 1<<62 {
			return "\x00i" + strconv.FormatInt(int64(v), 10), nil
		}
		return "\x00f" + strconv.FormatFloat(v, 'g', -1, 64), nil
	case nil:
		return "\x00n", nil
	case []byte:
		return "\x00b" + string(v), nil
	case Tuple:
		var b strings.Builder
		b.WriteString("\x00t(")
		for _, e := range v {
			h, err := keyHash(e)
			if err != nil {
				return "", err
			}
			b.WriteString(strconv.Itoa(len(h)))
			b.WriteByte(':')
			b.WriteString(h)
		}
		b.WriteByte(')')
		return b.String(), nil
	}
	return "", fmt.Errorf("unhashable dict key (%s)", TypeName(k))
}

// TypeName is the Python name of a decoded value's type.
func TypeName(v any) string {
	switch v.(type) {
	case nil:
		return "None"
	case bool:
		return "bool"
	case int64, *big.Int:
		return "int"
	case float64:
		return "float"
	case string:
		return "str"
	case []byte:
		return "bytes"
	case *List:
		return "list"
	case Tuple:
		return "tuple"
	case *Dict:
		return "dict"
	case *Set:
		return "set"
	case global:
		return "class"
	}
	return fmt.Sprintf("%T", v)
}

// global is a whitelisted global pushed by GLOBAL/STACK_GLOBAL; only REDUCE
// with it as the callable gives a value.
type global struct{ module, name string }

// allowedGlobals are the globals a pickle of plain values may name, with
// what REDUCE of them builds from its argument tuple.
var allowedGlobals = map[string]func(args Tuple) (any, error){
	// collections.OrderedDict() and OrderedDict([(k, v), ...]): a dict.
	"collections.OrderedDict": func(args Tuple) (any, error) {
		d := newDict()
		if len(args) == 0 {
			return d, nil
		}
		l, ok := args[0].(*List)
		if len(args) != 1 || !ok {
			return nil, errors.New("collections.OrderedDict takes one list of pairs")
		}
		for _, it := range l.Items {
			p, ok := it.(Tuple)
			if !ok || len(p) != 2 {
				return nil, errors.New("collections.OrderedDict takes one list of pairs")
			}
			if err := d.set(p[0], p[1]); err != nil {
				return nil, err
			}
		}
		return d, nil
	},
}

// GlobalError is a pickle that names a global outside the whitelist.
type GlobalError struct{ Module, Name string }

func (e *GlobalError) Error() string {
	return fmt.Sprintf("the pickle references the global %s.%s, which a memory snapshot never holds; refusing to load it (nothing was executed)", e.Module, e.Name)
}

// Unpickle decodes a pickle of plain values. It never executes anything: an
// opcode that would call Python code is an error, a GLOBAL outside the
// whitelist a *GlobalError. Errors name the byte offset of the opcode.
func Unpickle(data []byte) (any, error) {
	u := unpickler{data: data, memo: map[int64]any{}}
	v, err := u.run()
	if err != nil {
		return nil, err
	}
	return v, nil
}

type unpickler struct {
	data  []byte
	pos   int
	stack []any
	marks []int
	memo  map[int64]any
}

type pickleError struct {
	off int
	msg string
}

func (e *pickleError) Error() string {
	return fmt.Sprintf("not a valid pickle at byte %d: %s", e.off, e.msg)
}

var errTruncated = errors.New("truncated")

func (u *unpickler) read(n int) ([]byte, error) {
	if n < 0 || n > len(u.data)-u.pos {
		return nil, errTruncated
	}
	b := u.data[u.pos : u.pos+n]
	u.pos += n
	return b, nil
}

func (u *unpickler) line() ([]byte, error) {
	for i := u.pos; i < len(u.data); i++ {
		if u.data[i] == '\n' {
			b := u.data[u.pos:i]
			u.pos = i + 1
			return b, nil
		}
	}
	return nil, errTruncated
}

func (u *unpickler) uint(n int) (uint64, error) {
	b, err := u.read(n)
	if err != nil {
		return 0, err
	}
	switch n {
	case 1:
		return uint64(b[0]), nil
	case 2:
		return uint64(binary.LittleEndian.Uint16(b)), nil
	case 4:
		return uint64(binary.LittleEndian.Uint32(b)), nil
	}
	return binary.LittleEndian.Uint64(b), nil
}

func (u *unpickler) push(v any) { u.stack = append(u.stack, v) }

func (u *unpickler) pop() (any, error) {
	n := len(u.stack)
	if n == 0 || (len(u.marks) > 0 && u.marks[len(u.marks)-1] >= n) {
		return nil, errors.New("stack underflow")
	}
	v := u.stack[n-1]
	u.stack = u.stack[:n-1]
	return v, nil
}

func (u *unpickler) top() (any, error) {
	n := len(u.stack)
	if n == 0 || (len(u.marks) > 0 && u.marks[len(u.marks)-1] >= n) {
		return nil, errors.New("stack underflow")
	}
	return u.stack[n-1], nil
}

// popMark pops the items above the topmost mark.
func (u *unpickler) popMark() ([]any, error) {
	if len(u.marks) == 0 {
		return nil, errors.New("no MARK on the stack")
	}
	m := u.marks[len(u.marks)-1]
	u.marks = u.marks[:len(u.marks)-1]
	items := append([]any(nil), u.stack[m:]...)
	u.stack = u.stack[:m]
	return items, nil
}

// Pickle opcodes (CPython Lib/pickle.py).
const (
	opMark           = '('
	opStop           = '.'
	opPop            = '0'
	opPopMark        = '1'
	opDup            = '2'
	opFloat          = 'F'
	opInt            = 'I'
	opBinInt         = 'J'
	opBinInt1        = 'K'
	opLong           = 'L'
	opBinInt2        = 'M'
	opNone           = 'N'
	opPersID         = 'P'
	opBinPersID      = 'Q'
	opReduce         = 'R'
	opString         = 'S'
	opBinString      = 'T'
	opShortBinString = 'U'
	opUnicode        = 'V'
	opBinUnicode     = 'X'
	opAppend         = 'a'
	opBuild          = 'b'
	opGlobal         = 'c'
	opDict           = 'd'
	opEmptyDict      = '}'
	opAppends        = 'e'
	opGet            = 'g'
	opBinGet         = 'h'
	opInst           = 'i'
	opLongBinGet     = 'j'
	opList           = 'l'
	opEmptyList      = ']'
	opObj            = 'o'
	opPut            = 'p'
	opBinPut         = 'q'
	opLongBinPut     = 'r'
	opSetItem        = 's'
	opTuple          = 't'
	opEmptyTuple     = ')'
	opSetItems       = 'u'
	opBinFloat       = 'G'
	opProto          = 0x80
	opNewObj         = 0x81
	opExt1           = 0x82
	opExt2           = 0x83
	opExt4           = 0x84
	opTuple1         = 0x85
	opTuple2         = 0x86
	opTuple3         = 0x87
	opNewTrue        = 0x88
	opNewFalse       = 0x89
	opLong1          = 0x8a
	opLong4          = 0x8b
	opBinBytes       = 'B'
	opShortBinBytes  = 'C'
	opShortBinUni    = 0x8c
	opBinUnicode8    = 0x8d
	opBinBytes8      = 0x8e
	opEmptySet       = 0x8f
	opAddItems       = 0x90
	opFrozenSet      = 0x91
	opNewObjEx       = 0x92
	opStackGlobal    = 0x93
	opMemoize        = 0x94
	opFrame          = 0x95
	opByteArray8     = 0x96
	opNextBuffer     = 0x97
	opReadOnlyBuffer = 0x98
)

// codeOps name the opcodes that would run Python code.
var codeOps = map[byte]string{
	opPersID: "PERSID", opBinPersID: "BINPERSID", opBuild: "BUILD", opInst: "INST", opObj: "OBJ",
	opNewObj: "NEWOBJ", opNewObjEx: "NEWOBJ_EX", opExt1: "EXT1", opExt2: "EXT2", opExt4: "EXT4",
	opNextBuffer: "NEXT_BUFFER", opReadOnlyBuffer: "READONLY_BUFFER",
}

func (u *unpickler) run() (any, error) {
	for {
		off := u.pos
		if u.pos >= len(u.data) {
			if off == 0 {
				return nil, &pickleError{0, "empty file"}
			}
			return nil, &pickleError{off, "truncated (no STOP opcode)"}
		}
		op := u.data[u.pos]
		u.pos++
		done, err := u.step(op)
		if err != nil {
			var ge *GlobalError
			if errors.As(err, &ge) {
				return nil, err
			}
			if errors.Is(err, errTruncated) {
				return nil, &pickleError{off, "truncated"}
			}
			return nil, &pickleError{off, err.Error()}
		}
		if done {
			if len(u.stack) != 1 || len(u.marks) != 0 {
				return nil, &pickleError{off, "STOP with an unbalanced stack"}
			}
			return u.stack[0], nil
		}
	}
}

// opHandlers is the interpreter's dispatch table: one handler per opcode that builds a plain value or moves the
// stack, memo or marks. STOP is handled by step; an opcode without a handler is refused there (codeOps names the
// ones that would run Python code). Each handler gets its opcode, so one handler serves an opcode family whose
// members differ only in an argument's width.
var opHandlers = [256]func(u *unpickler, op byte) error{
	opProto: (*unpickler).proto, opFrame: (*unpickler).frame,
	opMark: (*unpickler).mark, opPop: (*unpickler).popOne, opPopMark: (*unpickler).popToMark, opDup: (*unpickler).dup,

	opNone: (*unpickler).constant, opNewTrue: (*unpickler).constant, opNewFalse: (*unpickler).constant,
	opEmptyList: (*unpickler).constant, opEmptyTuple: (*unpickler).constant,
	opEmptyDict: (*unpickler).constant, opEmptySet: (*unpickler).constant,

	opBinInt: (*unpickler).binInt, opBinInt1: (*unpickler).binInt, opBinInt2: (*unpickler).binInt,
	opInt: (*unpickler).textInt, opLong: (*unpickler).textLong,
	opLong1: (*unpickler).binLong, opLong4: (*unpickler).binLong,
	opFloat: (*unpickler).textFloat, opBinFloat: (*unpickler).binFloat,

	opShortBinUni: (*unpickler).binUnicode, opBinUnicode: (*unpickler).binUnicode, opBinUnicode8: (*unpickler).binUnicode,
	opShortBinBytes: (*unpickler).binBytes, opBinBytes: (*unpickler).binBytes, opBinBytes8: (*unpickler).binBytes,
	opByteArray8: (*unpickler).binBytes, opShortBinString: (*unpickler).binBytes, opBinString: (*unpickler).binBytes,
	opString: (*unpickler).textString, opUnicode: (*unpickler).textUnicode,

	opList: (*unpickler).list, opTuple: (*unpickler).tuple,
	opTuple1: (*unpickler).tupleN, opTuple2: (*unpickler).tupleN, opTuple3: (*unpickler).tupleN,
	opFrozenSet: (*unpickler).frozenSet, opDict: (*unpickler).dict,
	opAppend: (*unpickler).append, opAppends: (*unpickler).appends, opAddItems: (*unpickler).addItems,
	opSetItem: (*unpickler).setItem, opSetItems: (*unpickler).setItems,

	opPut: (*unpickler).textPut, opBinPut: (*unpickler).binPut, opLongBinPut: (*unpickler).binPut,
	opMemoize: (*unpickler).memoize,
	opGet:     (*unpickler).textGet, opBinGet: (*unpickler).binGet, opLongBinGet: (*unpickler).binGet,

	opGlobal: (*unpickler).textGlobal, opStackGlobal: (*unpickler).stackGlobal, opReduce: (*unpickler).reduce,
}

// step runs one opcode; it reports true at STOP.
func (u *unpickler) step(op byte) (bool, error) {
	if op == opStop {
		return true, nil
	}
	if h := opHandlers[op]; h != nil {
		return false, h(u, op)
	}
	if name, ok := codeOps[op]; ok {
		return false, fmt.Errorf("opcode %s would run Python code; refusing it", name)
	}
	return false, fmt.Errorf("unknown opcode 0x%02x", op)
}

// width is the byte width of the length or index argument of a sized opcode.
func width(op byte) int {
	switch op {
	case opBinInt, opLong4, opBinUnicode, opBinBytes, opBinString, opLongBinPut, opLongBinGet:
		return 4
	case opBinUnicode8, opBinBytes8, opByteArray8:
		return 8
	case opBinInt2:
		return 2
	}
	return 1
}

// sized reads a length of width(op) bytes and then that many bytes.
func (u *unpickler) sized(op byte) ([]byte, error) {
	n, err := u.uint(width(op))
	if err != nil {
		return nil, err
	}
	if op == opBinString && int32(uint32(n)) < 0 {
		return nil, errors.New("negative BINSTRING length")
	}
	if n > uint64(len(u.data)) {
		return nil, errTruncated
	}
	return u.read(int(n))
}

// --- framing and the stack ---

func (u *unpickler) proto(byte) error {
	p, err := u.uint(1)
	if err != nil {
		return err
	}
	if p > 5 {
		return fmt.Errorf("unsupported pickle protocol %d", p)
	}
	return nil
}

func (u *unpickler) frame(byte) error {
	_, err := u.uint(8)
	return err
}

func (u *unpickler) mark(byte) error {
	u.marks = append(u.marks, len(u.stack))
	return nil
}

// popOne is POP: it discards the top item, or a mark with nothing above it.
func (u *unpickler) popOne(byte) error {
	if len(u.marks) > 0 && u.marks[len(u.marks)-1] == len(u.stack) {
		u.marks = u.marks[:len(u.marks)-1]
		return nil
	}
	_, err := u.pop()
	return err
}

func (u *unpickler) popToMark(byte) error {
	_, err := u.popMark()
	return err
}

func (u *unpickler) dup(byte) error {
	v, err := u.top()
	if err != nil {
		return err
	}
	u.push(v)
	return nil
}

// --- scalars ---

// constant pushes the value an argument-less opcode stands for (a fresh one for the containers).
func (u *unpickler) constant(op byte) error {
	switch op {
	case opNone:
		u.push(nil)
	case opNewTrue:
		u.push(true)
	case opNewFalse:
		u.push(false)
	case opEmptyList:
		u.push(&List{})
	case opEmptyTuple:
		u.push(Tuple{})
	case opEmptyDict:
		u.push(newDict())
	case opEmptySet:
		u.push(&Set{})
	}
	return nil
}

// binInt is BININT (signed 4 bytes), BININT1 and BININT2 (unsigned 1 and 2 bytes).
func (u *unpickler) binInt(op byte) error {
	v, err := u.uint(width(op))
	if err != nil {
		return err
	}
	if op == opBinInt {
		u.push(int64(int32(uint32(v))))
	} else {
		u.push(int64(v))
	}
	return nil
}

func (u *unpickler) binLong(op byte) error {
	b, err := u.sized(op)
	if err != nil {
		return err
	}
	u.push(decodeLong(b))
	return nil
}

func (u *unpickler) textFloat(byte) error {
	l, err := u.line()
	if err != nil {
		return err
	}
	f, err := strconv.ParseFloat(strings.TrimSpace(string(l)), 64)
	if err != nil {
		return fmt.Errorf("bad FLOAT %q", truncate(string(l)))
	}
	u.push(f)
	return nil
}

func (u *unpickler) binFloat(byte) error {
	v, err := u.read(8)
	if err != nil {
		return err
	}
	u.push(math.Float64frombits(binary.BigEndian.Uint64(v)))
	return nil
}

// --- strings and bytes ---

func (u *unpickler) binUnicode(op byte) error {
	b, err := u.sized(op)
	if err != nil {
		return err
	}
	if !utf8.Valid(b) {
		return errors.New("a string is not valid UTF-8")
	}
	u.push(string(b))
	return nil
}

// binBytes is the bytes and bytearray opcodes and protocol 2's SHORT_BINSTRING and BINSTRING, whose Python 2 str
// is decoded as text, as pickle's default encoding does.
func (u *unpickler) binBytes(op byte) error {
	b, err := u.sized(op)
	if err != nil {
		return err
	}
	if op == opShortBinString || op == opBinString {
		u.push(string(b))
	} else {
		u.push(append([]byte(nil), b...))
	}
	return nil
}

func (u *unpickler) textString(byte) error {
	l, err := u.line()
	if err != nil {
		return err
	}
	s, err := strconv.Unquote(pyQuoteToGo(string(l)))
	if err != nil {
		return fmt.Errorf("bad STRING %q", truncate(string(l)))
	}
	u.push(s)
	return nil
}

func (u *unpickler) textUnicode(byte) error {
	l, err := u.line()
	if err != nil {
		return err
	}
	s, err := rawUnicodeEscape(l)
	if err != nil {
		return err
	}
	u.push(s)
	return nil
}

// --- containers ---

func (u *unpickler) list(byte) error {
	items, err := u.popMark()
	if err != nil {
		return err
	}
	u.push(&List{Items: items})
	return nil
}

func (u *unpickler) tuple(byte) error {
	items, err := u.popMark()
	if err != nil {
		return err
	}
	u.push(Tuple(items))
	return nil
}

// tupleN is TUPLE1, TUPLE2 and TUPLE3: a tuple of the top one to three items.
func (u *unpickler) tupleN(op byte) error {
	n := int(op-opTuple1) + 1
	t := make(Tuple, n)
	for i := n - 1; i >= 0; i-- {
		v, err := u.pop()
		if err != nil {
			return err
		}
		t[i] = v
	}
	u.push(t)
	return nil
}

// hashable checks that every item may be a set member.
func hashable(items []any) error {
	for _, it := range items {
		if _, err := keyHash(it); err != nil {
			return err
		}
	}
	return nil
}

func (u *unpickler) frozenSet(byte) error {
	items, err := u.popMark()
	if err != nil {
		return err
	}
	if err := hashable(items); err != nil {
		return err
	}
	u.push(&Set{Items: items})
	return nil
}

// setPairs sets alternating keys and values of items in d; name is the opcode, for the error.
func setPairs(d *Dict, items []any, name string) error {
	if len(items)%2 != 0 {
		return fmt.Errorf("%s with an odd number of items", name)
	}
	for i := 0; i < len(items); i += 2 {
		if err := d.set(items[i], items[i+1]); err != nil {
			return err
		}
	}
	return nil
}

func (u *unpickler) dict(byte) error {
	items, err := u.popMark()
	if err != nil {
		return err
	}
	d := newDict()
	if err := setPairs(d, items, "DICT"); err != nil {
		return err
	}
	u.push(d)
	return nil
}

// topList is the list on top of the stack that the opcode name appends to.
func (u *unpickler) topList(name string) (*List, error) {
	t, err := u.top()
	if err != nil {
		return nil, err
	}
	l, ok := t.(*List)
	if !ok {
		return nil, fmt.Errorf("%s to a %s", name, TypeName(t))
	}
	return l, nil
}

// topDict is the dict on top of the stack that the opcode name sets items on.
func (u *unpickler) topDict(name string) (*Dict, error) {
	t, err := u.top()
	if err != nil {
		return nil, err
	}
	d, ok := t.(*Dict)
	if !ok {
		return nil, fmt.Errorf("%s on a %s", name, TypeName(t))
	}
	return d, nil
}

func (u *unpickler) append(byte) error {
	v, err := u.pop()
	if err != nil {
		return err
	}
	l, err := u.topList("APPEND")
	if err != nil {
		return err
	}
	l.Items = append(l.Items, v)
	return nil
}

func (u *unpickler) appends(byte) error {
	items, err := u.popMark()
	if err != nil {
		return err
	}
	l, err := u.topList("APPENDS")
	if err != nil {
		return err
	}
	l.Items = append(l.Items, items...)
	return nil
}

func (u *unpickler) addItems(byte) error {
	items, err := u.popMark()
	if err != nil {
		return err
	}
	t, err := u.top()
	if err != nil {
		return err
	}
	s, ok := t.(*Set)
	if !ok {
		return fmt.Errorf("ADDITEMS to a %s", TypeName(t))
	}
	if err := hashable(items); err != nil {
		return err
	}
	s.Items = append(s.Items, items...)
	return nil
}

func (u *unpickler) setItem(byte) error {
	v, err := u.pop()
	if err != nil {
		return err
	}
	k, err := u.pop()
	if err != nil {
		return err
	}
	d, err := u.topDict("SETITEM")
	if err != nil {
		return err
	}
	return d.set(k, v)
}

func (u *unpickler) setItems(byte) error {
	items, err := u.popMark()
	if err != nil {
		return err
	}
	if len(items)%2 != 0 {
		return errors.New("SETITEMS with an odd number of items")
	}
	d, err := u.topDict("SETITEMS")
	if err != nil {
		return err
	}
	return setPairs(d, items, "SETITEMS")
}

// --- the memo ---

func (u *unpickler) textPut(byte) error {
	l, err := u.line()
	if err != nil {
		return err
	}
	i, err := strconv.ParseInt(string(l), 10, 64)
	if err != nil || i < 0 {
		return fmt.Errorf("bad PUT index %q", truncate(string(l)))
	}
	return u.put(i)
}

func (u *unpickler) binPut(op byte) error {
	i, err := u.uint(width(op))
	if err != nil {
		return err
	}
	return u.put(int64(i))
}

func (u *unpickler) memoize(byte) error { return u.put(int64(len(u.memo))) }

func (u *unpickler) textGet(byte) error {
	l, err := u.line()
	if err != nil {
		return err
	}
	i, err := strconv.ParseInt(string(l), 10, 64)
	if err != nil {
		return fmt.Errorf("bad GET index %q", truncate(string(l)))
	}
	return u.get(i)
}

func (u *unpickler) binGet(op byte) error {
	i, err := u.uint(width(op))
	if err != nil {
		return err
	}
	return u.get(int64(i))
}

// --- globals ---

func (u *unpickler) textGlobal(byte) error {
	m, err := u.line()
	if err != nil {
		return err
	}
	n, err := u.line()
	if err != nil {
		return err
	}
	return u.global(string(m), string(n))
}

func (u *unpickler) stackGlobal(byte) error {
	n, err := u.pop()
	if err != nil {
		return err
	}
	m, err := u.pop()
	if err != nil {
		return err
	}
	ms, ok1 := m.(string)
	ns, ok2 := n.(string)
	if !ok1 || !ok2 {
		return errors.New("STACK_GLOBAL needs two strings")
	}
	return u.global(ms, ns)
}

// reduce is REDUCE of a whitelisted global: the value allowedGlobals builds from the argument tuple.
func (u *unpickler) reduce(byte) error {
	a, err := u.pop()
	if err != nil {
		return err
	}
	f, err := u.pop()
	if err != nil {
		return err
	}
	g, ok := f.(global)
	args, ok2 := a.(Tuple)
	if !ok || !ok2 {
		return fmt.Errorf("REDUCE of a %s: refusing to call anything", TypeName(f))
	}
	v, err := allowedGlobals[g.module+"."+g.name](args)
	if err != nil {
		return err
	}
	u.push(v)
	return nil
}

func (u *unpickler) put(i int64) error {
	v, err := u.top()
	if err != nil {
		return err
	}
	u.memo[i] = v
	return nil
}

func (u *unpickler) get(i int64) error {
	v, ok := u.memo[i]
	if !ok {
		return fmt.Errorf("memo index %d was never stored", i)
	}
	u.push(v)
	return nil
}

func (u *unpickler) global(module, name string) error {
	module, name = strings.TrimSpace(module), strings.TrimSpace(name)
	if _, ok := allowedGlobals[module+"."+name]; !ok {
		return &GlobalError{Module: truncate(module), Name: truncate(name)}
	}
	u.push(global{module, name})
	return nil
}

func (u *unpickler) textInt(byte) error {
	l, err := u.line()
	if err != nil {
		return err
	}
	s := strings.TrimSpace(string(l))
	switch s {
	case "00":
		u.push(false)
		return nil
	case "01":
		u.push(true)
		return nil
	}
	return u.pushDecimal(s)
}

func (u *unpickler) textLong(byte) error {
	l, err := u.line()
	if err != nil {
		return err
	}
	return u.pushDecimal(strings.TrimSuffix(strings.TrimSpace(string(l)), "L"))
}

func (u *unpickler) pushDecimal(s string) error {
	if v, err := strconv.ParseInt(s, 10, 64); err == nil {
		u.push(v)
		return nil
	}
	b, ok := new(big.Int).SetString(s, 10)
	if !ok || len(s) > 4096 {
		return fmt.Errorf("bad integer %q", truncate(s))
	}
	u.push(b)
	return nil
}

// decodeLong decodes a little-endian two's-complement integer (LONG1/LONG4):
// an int64 when it fits, a *big.Int otherwise.
func decodeLong(b []byte) any {
	if len(b) == 0 {
		return int64(0)
	}
	if len(b) <= 8 {
		var v uint64
		for i := len(b) - 1; i >= 0; i-- {
			v = v<<8 | uint64(b[i])
		}
		shift := uint(64 - 8*len(b))
		return int64(v<<shift) >> shift
	}
	be := make([]byte, len(b))
	for i := range b {
		be[len(b)-1-i] = b[i]
	}
	v := new(big.Int).SetBytes(be)
	if b[len(b)-1]&0x80 != 0 {
		v.Sub(v, new(big.Int).Lsh(big.NewInt(1), uint(8*len(b))))
	}
	if v.IsInt64() {
		return v.Int64()
	}
	return v
}

// pyQuoteToGo turns a protocol-0 STRING argument ('...' or "...") into a Go
// double-quoted literal.
func pyQuoteToGo(s string) string {
	if len(s) >= 2 && s[0] == '\'' && s[len(s)-1] == '\'' {
		inner := s[1 : len(s)-1]
		inner = strings.ReplaceAll(inner, `\'`, `'`)
		inner = strings.ReplaceAll(inner, `"`, `\"`)
		return `"` + inner + `"`
	}
	return s
}

// rawUnicodeEscape decodes Python's raw-unicode-escape (protocol 0 UNICODE).
func rawUnicodeEscape(b []byte) (string, error) {
	var out strings.Builder
	for i := 0; i < len(b); i++ {
		if b[i] == '\\' && i+1 < len(b) && (b[i+1] == 'u' || b[i+1] == 'U') {
			n := 4
			if b[i+1] == 'U' {
				n = 8
			}
			if i+2+n > len(b) {
				return "", errors.New("bad \\u escape in UNICODE")
			}
			r, err := strconv.ParseUint(string(b[i+2:i+2+n]), 16, 32)
			if err != nil || r > utf8.MaxRune {
				return "", errors.New("bad \\u escape in UNICODE")
			}
			out.WriteRune(rune(r))
			i += 1 + n
			continue
		}
		out.WriteRune(rune(b[i])) // latin-1
	}
	return out.String(), nil
}

func truncate(s string) string {
	if len(s) > 80 {
		return s[:80] + "…"
	}
	return strings.ToValidUTF8(s, "?")
}
