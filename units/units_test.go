package units

import (
	"errors"
	"math"
	"strings"
	"testing"
)

func TestParseBytes(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Bytes
	}{
		{"24GiB", 24 * GiB}, {"80GB", 80 * GB}, {"1.5 TiB", TiB + TiB/2}, {"4096", 4096}, {"512MiB", 512 * MiB},
		{"16g", 16 * GiB}, {"  2kb ", 2000}, {"7b", 7},
	} {
		got, err := ParseBytes(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("ParseBytes(%q) = %d, %v; want %d", tc.in, got, err, tc.want)
		}
	}
	for _, bad := range []string{"", "GiB", "-4GiB", "0", "lots", "NaN", "Inf GiB", "1e30TiB", "12 parsecs"} {
		if _, err := ParseBytes(bad); !errors.Is(err, ErrBadSize) {
			t.Errorf("ParseBytes(%q): err %v, want ErrBadSize", bad, err)
		}
	}
}

// A size whose zero means none (a margin, a switch set off) takes zero in
// any spelling a positive size may have; negatives and non-numbers stay
// refused.
func TestParseBytesOrZero(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Bytes
	}{
		{"0", 0}, {"0B", 0}, {"0GiB", 0}, {"00", 0}, {"0.0GiB", 0}, {" 0 MiB ", 0}, {"0e3", 0},
		{"2GiB", 2 * GiB}, {"4096", 4096},
	} {
		got, err := ParseBytesOrZero(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("ParseBytesOrZero(%q) = %d, %v; want %d", tc.in, got, err, tc.want)
		}
	}
	for _, bad := range []string{"", "GiB", "-4GiB", "-1", "lots", "NaN", "0.0000001b", "1e30TiB"} {
		if _, err := ParseBytesOrZero(bad); !errors.Is(err, ErrBadSize) {
			t.Errorf("ParseBytesOrZero(%q): err %v, want ErrBadSize", bad, err)
		}
	}
}

func TestBytesString(t *testing.T) {
	for _, tc := range []struct {
		b    Bytes
		want string
	}{{0, "0 B"}, {1023, "1023 B"}, {1536, "1.50 KiB"}, {80 * GiB, "80.00 GiB"}, {-2 * MiB, "-2.00 MiB"}, {3 * TiB, "3.00 TiB"}} {
		if got := tc.b.String(); got != tc.want {
			t.Errorf("%d.String() = %q, want %q", int64(tc.b), got, tc.want)
		}
	}
}

func TestDTypes(t *testing.T) {
	if F32.Size(10) != 40 || BF16.Size(3) != 6 || NF4.Size(3) != 2 || Bool.Size(5) != 5 {
		t.Error("dtype sizes")
	}
	for _, s := range []string{"float32", "torch.bfloat16", "fp16", "int64", "nf4"} {
		if _, err := ParseDType(s); err != nil {
			t.Errorf("ParseDType(%q): %v", s, err)
		}
	}
	if _, err := ParseDType("complex128"); err == nil {
		t.Error("ParseDType accepted complex128")
	}
}

// FuzzParseBytes: any string is refused with ErrBadSize or parsed to a
// positive size; never a panic.
func FuzzParseBytes(f *testing.F) {
	for _, s := range []string{"24GiB", "80GB", "-1", "1e400", "0.0000001b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		b, err := ParseBytes(s)
		if err == nil && b < 0 {
			t.Fatalf("ParseBytes(%q) = %d", s, b)
		}
		if err != nil && !errors.Is(err, ErrBadSize) {
			t.Fatalf("ParseBytes(%q): unwrapped error %v", s, err)
		}
	})
}

func TestMulChecked(t *testing.T) {
	for _, c := range []struct {
		a, b, limit int64
		want        int64
		ok          bool
	}{
		{3, 4, 100, 12, true},
		{0, 1 << 62, 1, 0, true},
		{1 << 31, 1 << 31, 1 << 62, 1 << 62, true},
		{1 << 31, 1<<31 + 1, 1 << 62, 0, false},
		{1 << 62, 4, math.MaxInt64, 0, false}, // wraps to 0 unchecked
		{math.MaxInt64, math.MaxInt64, math.MaxInt64, 0, false},
		{-1, 5, 100, 0, false},
		{10, 11, 100, 0, false},
	} {
		got, ok := MulChecked(c.a, c.b, c.limit)
		if got != c.want || ok != c.ok {
			t.Errorf("MulChecked(%d, %d, %d) = %d, %v; want %d, %v", c.a, c.b, c.limit, got, ok, c.want, c.ok)
		}
	}
	if _, ok := MulBytes(GiB, 1<<32); !ok {
		t.Error("4 EiB refused")
	}
	if _, ok := MulBytes(GiB, 1<<32+1); ok {
		t.Error("past 4 EiB accepted")
	}
}

// Size never forms n·bits: 2^58 fp32 elements (engine.MaxElements) are
// 1 EiB, not a wrapped negative size; below that it is (n·bits + 7)/8.
func TestSizeDoesNotWrap(t *testing.T) {
	for _, d := range []DType{F64, F32, BF16, FP8, NF4, Bool} {
		for n := int64(0); n < 100; n++ {
			if got, want := d.Size(n), Bytes((n*int64(d.Bits())+7)/8); got != want {
				t.Errorf("%s.Size(%d) = %d, want %d", d, n, got, want)
			}
		}
	}
	if got := F32.Size(1 << 58); got != 1<<60 {
		t.Errorf("F32.Size(2^58) = %d, want 2^60", got)
	}
	if got := F64.Size(1<<58 + 3); got != 1<<61+24 {
		t.Errorf("F64.Size(2^58+3) = %d, want 2^61+24", got)
	}
	if got := NF4.Size(1<<62 + 1); got != 1<<61+1 {
		t.Errorf("NF4.Size(2^62+1) = %d, want 2^61+1", got)
	}
}

// A refused size says what is wrong: a unit past TiB is named as one not
// taken (1PiB said "not a number with a unit"), a size past 4 EiB is over
// the limit (ErrTooLarge), and base prefixes and _ are not decimal.
func TestParseBytesRefusals(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"1PiB", `"1PiB": the unit "PiB" is not one memplan takes`},
		{"4EiB", `the unit "EiB" is not one memplan takes`},
		{"1e3 PB", `the unit "PB" is not one memplan takes`},
		{"9223372036854775807", `"9223372036854775807" is too large: over the limit of 4 EiB (2^62 bytes)`},
		{"4194305TiB", "over the limit of 4 EiB"},
		{"0x10GiB", "is not a number with a unit"},
		{"0x1p4", "is not a number with a unit"},
		{"1_024MiB", "is not a number with a unit"},
		{"banana", "is not a number with a unit"},
	} {
		_, err := ParseBytes(c.in)
		if !errors.Is(err, ErrBadSize) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("ParseBytes(%q): %v, want %q", c.in, err, c.want)
		}
		if tooLarge := strings.Contains(c.want, "over the limit"); errors.Is(err, ErrTooLarge) != tooLarge {
			t.Errorf("ParseBytes(%q): ErrTooLarge %v, want %v", c.in, !tooLarge, tooLarge)
		}
	}
	if b, err := ParseBytes("4194304TiB"); err != nil || b != MaxBytes {
		t.Errorf("ParseBytes(4194304TiB) = %d, %v; want MaxBytes", b, err)
	}
}

// AddBytes sums sizes in [0, MaxBytes] and refuses past it.
func TestAddBytes(t *testing.T) {
	for _, c := range []struct {
		a, b Bytes
		want Bytes
		ok   bool
	}{
		{1, 2, 3, true}, {MaxBytes - 1, 1, MaxBytes, true}, {MaxBytes, 1, 0, false},
		{MaxBytes + 1, 0, 0, false}, {-1, 5, 0, false}, {1 << 62, 1 << 62, 0, false},
	} {
		if got, ok := AddBytes(c.a, c.b); got != c.want || ok != c.ok {
			t.Errorf("AddBytes(%d, %d) = %d, %v; want %d, %v", c.a, c.b, got, ok, c.want, c.ok)
		}
	}
}
