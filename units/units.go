// Package units holds the leaf vocabulary of memplan: byte counts, FLOP
// counts and tensor element types. It imports nothing of ours.
package units

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"strconv"
	"strings"
)

// Bytes is a count of bytes. Sizes of tensors, ledgers and budgets are Bytes.
type Bytes int64

// Binary multiples.
const (
	KiB Bytes = 1 << 10
	MiB Bytes = 1 << 20
	GiB Bytes = 1 << 30
	TiB Bytes = 1 << 40
)

// Decimal multiples (GPU vendors quote memory in these).
const (
	KB Bytes = 1000
	MB Bytes = 1000 * KB
	GB Bytes = 1000 * MB
	TB Bytes = 1000 * GB
)

// String formats b with a binary unit and three significant digits, as
// PyTorch's memory_summary does ("1.50 GiB").
func (b Bytes) String() string {
	neg := b < 0
	v := float64(b)
	if neg {
		v = -v
	}
	var s string
	switch {
	case v >= float64(TiB):
		s = fmt.Sprintf("%.2f TiB", v/float64(TiB))
	case v >= float64(GiB):
		s = fmt.Sprintf("%.2f GiB", v/float64(GiB))
	case v >= float64(MiB):
		s = fmt.Sprintf("%.2f MiB", v/float64(MiB))
	case v >= float64(KiB):
		s = fmt.Sprintf("%.2f KiB", v/float64(KiB))
	default:
		s = fmt.Sprintf("%d B", int64(v))
	}
	if neg {
		return "-" + s
	}
	return s
}

// GiBf returns b in GiB as a float, for charts.
func (b Bytes) GiBf() float64 { return float64(b) / float64(GiB) }

// ErrBadSize is wrapped by ParseBytes failures.
var ErrBadSize = errors.New("bad size")

// ErrTooLarge is what ParseBytes refusing a size past MaxBytes is (and
// ErrBadSize).
var ErrTooLarge = errors.New("size over the limit")

// tooLarge is ParseBytes' refusal of a size past MaxBytes.
type tooLarge string

func (e tooLarge) Error() string        { return string(e) }
func (e tooLarge) Is(target error) bool { return target == ErrBadSize || target == ErrTooLarge }

var suffixes = []struct {
	s string
	m Bytes
}{
	{"tib", TiB}, {"gib", GiB}, {"mib", MiB}, {"kib", KiB},
	{"tb", TB}, {"gb", GB}, {"mb", MB}, {"kb", KB},
	{"t", TiB}, {"g", GiB}, {"m", MiB}, {"k", KiB},
	{"b", 1},
}

// ParseBytes reads sizes such as "24GiB", "80GB", "1.5 TiB", "4096". A bare
// number is bytes. Single letters (K, M, G, T) are binary, as in ulimit.
// The size must be positive: see ParseBytesOrZero where 0 means none.
func ParseBytes(s string) (Bytes, error) { return parseBytes(s, false) }

// ParseBytesOrZero is ParseBytes for a size whose zero means none (a
// margin, a switch turned off): zero in any spelling ParseBytes reads
// ("0", "0B", "0GiB", "0.0 MiB") is 0, so a flag that defaults to "0"
// takes the same value with a unit.
func ParseBytesOrZero(s string) (Bytes, error) { return parseBytes(s, true) }

func parseBytes(s string, zero bool) (Bytes, error) {
	t := strings.ToLower(strings.TrimSpace(s))
	if t == "" {
		return 0, fmt.Errorf("%w: empty", ErrBadSize)
	}
	mult := Bytes(1)
	for _, suf := range suffixes {
		if strings.HasSuffix(t, suf.s) {
			t = strings.TrimSpace(strings.TrimSuffix(t, suf.s))
			mult = suf.m
			break
		}
	}
	v, err := strconv.ParseFloat(t, 64)
	if err != nil || math.IsNaN(v) || math.IsInf(v, 0) || strings.ContainsAny(t, "xX_") {
		return 0, badNumber(s)
	}
	switch {
	case zero && v == 0:
		return 0, nil
	case zero && v < 0:
		return 0, fmt.Errorf("%w: %q must be 0 or positive", ErrBadSize, s)
	case v <= 0:
		return 0, fmt.Errorf("%w: %q must be positive", ErrBadSize, s)
	}
	f := v * float64(mult)
	if f > float64(MaxBytes) {
		return 0, tooLarge(fmt.Sprintf("%v: %q is too large: over the limit of 4 EiB (2^62 bytes)", ErrBadSize, s))
	}
	if math.Round(f) < 1 {
		return 0, fmt.Errorf("%w: %q is less than one byte", ErrBadSize, s)
	}
	return Bytes(math.Round(f)), nil
}

// badNumber refuses s, which is not a decimal number with a unit: a unit
// past TiB (PiB, EB) is named as one memplan does not take, so that 1PiB
// does not read as a typo of the number.
func badNumber(s string) error {
	t := strings.TrimSpace(s)
	num := strings.TrimRightFunc(t, func(r rune) bool { return r >= 'A' && r <= 'Z' || r >= 'a' && r <= 'z' })
	if unit := t[len(num):]; unit != "" && !strings.ContainsAny(num, "xX_") {
		if _, err := strconv.ParseFloat(strings.TrimSpace(num), 64); err == nil {
			return fmt.Errorf("%w: %q: the unit %q is not one memplan takes (B, KiB, MiB, GiB, TiB, KB, MB, GB, TB; K, M, G, T are binary; a size is under 4 EiB)", ErrBadSize, s, unit)
		}
	}
	return fmt.Errorf("%w: %q is not a number with a unit such as 24GiB or 80GB", ErrBadSize, s)
}

// FLOPs counts floating-point operations (a multiply-add is two).
type FLOPs float64

// DType is a tensor element type.
type DType uint8

// Element types. Bits, not bytes, so that 4-bit types are exact.
const (
	Invalid DType = iota
	F32
	F16
	BF16
	F64
	I64
	I32
	I8
	U8
	Bool
	NF4 // 4-bit NormalFloat (QLoRA)
	FP8
)

var dtypeInfo = [...]struct {
	name string
	bits int
}{
	Invalid: {"invalid", 0},
	F32:     {"float32", 32},
	F16:     {"float16", 16},
	BF16:    {"bfloat16", 16},
	F64:     {"float64", 64},
	I64:     {"int64", 64},
	I32:     {"int32", 32},
	I8:      {"int8", 8},
	U8:      {"uint8", 8},
	Bool:    {"bool", 8},
	NF4:     {"nf4", 4},
	FP8:     {"float8_e4m3fn", 8},
}

// String returns PyTorch's name for the type ("bfloat16").
func (d DType) String() string {
	if int(d) < len(dtypeInfo) {
		return dtypeInfo[d].name
	}
	return "dtype(" + strconv.Itoa(int(d)) + ")"
}

// Bits is the width of one element.
func (d DType) Bits() int {
	if int(d) < len(dtypeInfo) {
		return dtypeInfo[d].bits
	}
	return 0
}

// Size is the storage of n elements, rounded up to a whole byte. Whole
// bytes of eight elements are counted apart from the rest, so that n·bits
// is never formed: it wrapped for 2^58 fp32 elements (the limit on one
// activation, engine.MaxElements), while the size, 1 EiB, fits.
func (d DType) Size(n int64) Bytes {
	b := int64(d.Bits())
	if n < 0 {
		return Bytes((n*b + 7) / 8)
	}
	return Bytes(n>>3*b + (n&7*b+7)/8)
}

// ParseDType accepts PyTorch names ("float32", "torch.bfloat16") and short
// forms ("fp32", "bf16").
func ParseDType(s string) (DType, error) {
	t := strings.TrimPrefix(strings.ToLower(strings.TrimSpace(s)), "torch.")
	switch t {
	case "float32", "fp32", "float", "f32":
		return F32, nil
	case "float16", "fp16", "half", "f16":
		return F16, nil
	case "bfloat16", "bf16":
		return BF16, nil
	case "float64", "fp64", "double":
		return F64, nil
	case "int64", "long":
		return I64, nil
	case "int32", "int":
		return I32, nil
	case "int8":
		return I8, nil
	case "uint8":
		return U8, nil
	case "bool":
		return Bool, nil
	case "nf4":
		return NF4, nil
	case "float8_e4m3fn", "fp8":
		return FP8, nil
	}
	return Invalid, fmt.Errorf("unknown dtype %q", s)
}

// MulChecked is a × b for non-negative a and b, and false when either is
// negative or the product exceeds limit (or int64): the overflow-checked
// product every size, FLOP or time total built from user input goes
// through.
func MulChecked(a, b, limit int64) (int64, bool) {
	if a < 0 || b < 0 {
		return 0, false
	}
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	if hi != 0 || lo > uint64(limit) {
		return 0, false
	}
	return int64(lo), true
}

// MulBytes is b × n, false past MaxBytes.
func MulBytes(b Bytes, n int64) (Bytes, bool) {
	v, ok := MulChecked(int64(b), n, int64(MaxBytes))
	return Bytes(v), ok
}

// AddBytes is a + b for sizes in [0, MaxBytes], false when either is
// outside it or the sum exceeds MaxBytes.
func AddBytes(a, b Bytes) (Bytes, bool) {
	if a < 0 || b < 0 || a > MaxBytes || b > MaxBytes-a {
		return 0, false
	}
	return a + b, true
}

// MaxBytes is the largest size a plan holds: 2^62 bytes (4 EiB), so that any
// sum of two sizes stays inside int64.
const MaxBytes = Bytes(1) << 62
