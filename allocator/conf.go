package allocator

import (
	"fmt"
	"math/bits"
	"strconv"
	"strings"
)

// ParseConf reads PYTORCH_CUDA_ALLOC_CONF's vocabulary as
// c10/cuda/CUDAAllocatorConfig.cpp (parseArgs, 2.x) does: comma-separated
// key:value options
//
//	max_split_size_mb:N            (N > 20, as the C++ checks)
//	roundup_power2_divisions:N     (0 or a power of two, every interval)
//	roundup_power2_divisions:[256:1,512:2,>:4]
//	                               (per interval starting at a power-of-two
//	                               number of MiB; ">" fills the intervals
//	                               after the last one named; the first one
//	                               named also fills the intervals before it)
//	garbage_collection_threshold:F (0 < F < 1)
//	expandable_segments:True|False
//
// The host allocator's options (pinned_use_cuda_host_register,
// pinned_num_register_threads) and release_lock_on_cudamalloc do not change
// what the device reserves and are accepted; backend:cudaMallocAsync and
// max_non_split_rounding_mb are refused: the model does not follow them.
func ParseConf(s string) (Config, error) {
	var c Config
	s = strings.ReplaceAll(s, " ", "")
	if s == "" {
		return c, nil
	}
	for _, opt := range splitTop(s) {
		key, val, ok := strings.Cut(opt, ":")
		if !ok || val == "" {
			return c, fmt.Errorf("option %q: want key:value", opt)
		}
		switch key {
		case "max_split_size_mb":
			n, err := strconv.ParseInt(val, 10, 64)
			if err != nil || n <= LargeBuffer>>20 || n > 1<<40 {
				return c, fmt.Errorf("max_split_size_mb:%s: want a whole number of MiB above %d", val, LargeBuffer>>20)
			}
			c.MaxSplitSize = n << 20
		case "garbage_collection_threshold":
			f, err := strconv.ParseFloat(val, 64)
			if err != nil || !(f > 0 && f < 1) {
				return c, fmt.Errorf("garbage_collection_threshold:%s: want a number between 0 and 1", val)
			}
			c.GCThreshold = f
		case "expandable_segments":
			switch val {
			case "True", "true", "1":
				c.Expandable = true
			case "False", "false", "0":
				c.Expandable = false
			default:
				return c, fmt.Errorf("expandable_segments:%s: want True or False", val)
			}
		case "roundup_power2_divisions":
			d, err := parseDivisions(val)
			if err != nil {
				return c, fmt.Errorf("roundup_power2_divisions:%s: %v", val, err)
			}
			c.RoundupPower2Divisions = d
		case "pinned_use_cuda_host_register", "pinned_num_register_threads", "release_lock_on_cudamalloc", "pinned_use_background_threads":
		case "backend":
			if val != "native" {
				return c, fmt.Errorf("backend:%s: only the native caching allocator is modelled", val)
			}
		case "max_non_split_rounding_mb":
			return c, fmt.Errorf("max_non_split_rounding_mb is not modelled")
		default:
			return c, fmt.Errorf("unknown option %q (want max_split_size_mb, roundup_power2_divisions, garbage_collection_threshold or expandable_segments)", key)
		}
	}
	return c, nil
}

// splitTop splits s at the commas outside brackets.
func splitTop(s string) []string {
	var out []string
	depth, from := 0, 0
	for i, r := range s {
		switch r {
		case '[':
			depth++
		case ']':
			depth--
		case ',':
			if depth == 0 {
				out = append(out, s[from:i])
				from = i + 1
			}
		}
	}
	return append(out, s[from:])
}

func division(v string) (int64, error) {
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 || n > 1<<20 || n&(n-1) != 0 {
		return 0, fmt.Errorf("divisions %q: want 0 or a power of two", v)
	}
	return n, nil
}

// parseDivisions is parseRoundUpPower2Divisions.
func parseDivisions(v string) ([16]int64, error) {
	var d [16]int64
	if !strings.HasPrefix(v, "[") {
		n, err := division(v)
		if err != nil {
			return d, err
		}
		for i := range d {
			d[i] = n
		}
		return d, nil
	}
	if !strings.HasSuffix(v, "]") || len(v) < 3 {
		return d, fmt.Errorf("want [MiB:divisions,...] with a closing bracket")
	}
	first, last := true, 0
	for _, e := range strings.Split(v[1:len(v)-1], ",") {
		k, val, ok := strings.Cut(e, ":")
		if !ok {
			return d, fmt.Errorf("entry %q: want MiB:divisions", e)
		}
		n, err := division(val)
		if err != nil {
			return d, err
		}
		if k == ">" {
			for i := last + 1; i < len(d); i++ {
				d[i] = n
			}
			continue
		}
		mib, err := strconv.ParseInt(k, 10, 64)
		if err != nil || mib <= 0 || mib&(mib-1) != 0 {
			return d, fmt.Errorf("interval %q: want a power-of-two number of MiB", k)
		}
		idx := min(bits.Len64(uint64(mib))-1, len(d)-1)
		if first {
			for i := 0; i < idx; i++ {
				d[i] = n
			}
			first = false
		}
		d[idx], last = n, idx
	}
	return d, nil
}
