package allocator

import (
	"strings"
	"testing"
)

func TestParseConf(t *testing.T) {
	all := func(n int64) (d [16]int64) {
		for i := range d {
			d[i] = n
		}
		return d
	}
	for _, c := range []struct {
		in   string
		want Config
	}{
		{"", Config{}},
		{"expandable_segments:True", Config{Expandable: true}},
		{"max_split_size_mb:128, garbage_collection_threshold:0.6", Config{MaxSplitSize: 128 << 20, GCThreshold: 0.6}},
		{"roundup_power2_divisions:4", Config{RoundupPower2Divisions: all(4)}},
		// CUDAAllocatorConfig's example: [256:1,512:2,1024:4,>:8].
		{"roundup_power2_divisions:[256:1,512:2,1024:4,>:8]", Config{RoundupPower2Divisions: [16]int64{1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 4, 8, 8, 8, 8, 8}}},
		{"expandable_segments:False,pinned_num_register_threads:8,backend:native", Config{}},
	} {
		got, err := ParseConf(c.in)
		if err != nil || got != c.want {
			t.Errorf("ParseConf(%q) = %+v, %v; want %+v", c.in, got, err, c.want)
		}
	}
}

func TestParseConfBadInput(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"max_split_size_mb:20", "above 20"},
		{"max_split_size_mb:x", "whole number"},
		{"garbage_collection_threshold:1", "between 0 and 1"},
		{"expandable_segments:yes", "True or False"},
		{"roundup_power2_divisions:3", "power of two"},
		{"roundup_power2_divisions:[3:1]", "power-of-two number of MiB"},
		{"roundup_power2_divisions:[256:1", "closing bracket"},
		{"backend:cudaMallocAsync", "only the native"},
		{"max_non_split_rounding_mb:40", "not modelled"},
		{"max_split_mb:128", `unknown option "max_split_mb"`},
		{"expandable_segments", "want key:value"},
	} {
		_, err := ParseConf(c.in)
		if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("ParseConf(%q): %v, want one line with %q", c.in, err, c.want)
		}
	}
}

func FuzzParseConf(f *testing.F) {
	for _, s := range []string{"expandable_segments:True", "roundup_power2_divisions:[256:1,>:4]", "max_split_size_mb:64,garbage_collection_threshold:0.5", "[", ":,]",
		// Extreme values (issue 15): sizes past int64 and at 2^62 MiB, NaN.
		"max_split_size_mb:9223372036854775808", "max_split_size_mb:4611686018427387904", "garbage_collection_threshold:NaN",
		"roundup_power2_divisions:[9223372036854775807:4611686018427387904,>:2147483648]"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		c, err := ParseConf(s)
		if err != nil {
			return
		}
		for _, d := range c.RoundupPower2Divisions {
			if d < 0 || d&(d-1) != 0 {
				t.Fatalf("%q: divisions %d", s, d)
			}
		}
		c.RoundSize(12345678)
	})
}
