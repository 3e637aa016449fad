package published

import (
	"regexp"
	"strconv"
	"strings"

	"github.com/memplan/memplan/units"
)

// Era is the software a row ran under, as far as the row tells it: the
// PyTorch release (from libraries.torch, else the release current at the
// row's date) and the CUDA version (from the torch build's +cuXYZ tag or
// libraries.cuda, else "CUDA X.Y" in the notes). The zero value is unknown.
type Era struct {
	Torch      [2]int // major, minor; {0, 0}: unknown
	TorchFrom  string // how it was found: "libraries.torch", or the date read
	CUDA       [2]int // major, minor; {0, 0}: unknown
	CUDAFrom   string
	LazyLoaded bool // CUDA modules load lazily (see lazyLoading)
}

// Known reports whether the PyTorch release is known.
func (e Era) Known() bool { return e.Torch != [2]int{} }

// Before reports whether the PyTorch release is known and older than
// major.minor.
func (e Era) Before(major, minor int) bool {
	return e.Known() && versionBefore(e.Torch, major, minor)
}

// versionBefore reports whether release v (major, minor) is older than
// major.minor.
func versionBefore(v [2]int, major, minor int) bool {
	return v[0] < major || v[0] == major && v[1] < minor
}

// torchReleases are PyTorch's release dates (pytorch/pytorch GitHub
// releases, v1.4.0 … v2.7.0): a row dated after one and before the next ran
// that release or a nightly towards the next; the row gets the older one.
var torchReleases = []struct {
	date         string // YYYY-MM-DD
	major, minor int
}{
	{"2020-01-15", 1, 4}, {"2020-04-21", 1, 5}, {"2020-07-28", 1, 6}, {"2020-10-27", 1, 7},
	{"2021-03-04", 1, 8}, {"2021-06-15", 1, 9}, {"2021-10-21", 1, 10}, {"2022-03-10", 1, 11},
	{"2022-06-28", 1, 12}, {"2022-10-28", 1, 13}, {"2023-03-15", 2, 0}, {"2023-10-04", 2, 1},
	{"2024-01-30", 2, 2}, {"2024-04-24", 2, 3}, {"2024-07-24", 2, 4}, {"2024-10-17", 2, 5},
	{"2025-01-29", 2, 6}, {"2025-04-23", 2, 7},
}

var (
	versionRE  = regexp.MustCompile(`^v?(\d{1,2})\.(\d{1,3})`)
	cuTagRE    = regexp.MustCompile(`\+cu(\d{2,3})\b`)
	cudaNoteRE = regexp.MustCompile(`\bCUDA[ -]?(?:version[ :]*)?(\d{1,2})\.(\d{1,2})\b`)
	isoDateRE  = regexp.MustCompile(`\b(20[12]\d)-(0[1-9]|1[0-2])(?:-([0-3]\d))?\b`)
	monthRE    = regexp.MustCompile(`\b(January|February|March|April|May|June|July|August|September|October|November|December)\s+(20[12]\d)\b`)
)

var months = map[string]string{"January": "01", "February": "02", "March": "03", "April": "04", "May": "05", "June": "06",
	"July": "07", "August": "08", "September": "09", "October": "10", "November": "11", "December": "12"}

// EraOf reads a row's era. A date is looked for in libraries.torch (a git
// build's date), framework_version, then source.
func EraOf(r *Row) Era {
	var e Era
	torch := ""
	for lib, v := range r.Libraries {
		switch strings.ToLower(lib) {
		case "torch", "pytorch":
			torch = v
		case "cuda":
			if m := versionRE.FindStringSubmatch(strings.TrimSpace(v)); m != nil {
				e.CUDA, e.CUDAFrom = atoi2(m[1], m[2]), "libraries.cuda"
			}
		}
	}
	if m := versionRE.FindStringSubmatch(strings.TrimSpace(torch)); m != nil {
		e.Torch, e.TorchFrom = atoi2(m[1], m[2]), "libraries.torch"
	} else {
		for _, s := range []string{torch, r.FrameworkVersion, r.Source} {
			if d := dateIn(s); d != "" {
				e.Torch, e.TorchFrom = torchAt(d), "PyTorch release current at "+d
				break
			}
		}
	}
	if e.CUDA == [2]int{} {
		if m := cuTagRE.FindStringSubmatch(torch); m != nil {
			e.CUDA, e.CUDAFrom = atoi2(m[1][:len(m[1])-1], m[1][len(m[1])-1:]), "libraries.torch"
		} else if m := cudaNoteRE.FindStringSubmatch(r.Notes); m != nil {
			e.CUDA, e.CUDAFrom = atoi2(m[1], m[2]), "notes"
		}
	}
	e.LazyLoaded = lazyLoading(e)
	return e
}

// lazyLoading: PyTorch turns on CUDA_MODULE_LOADING=LAZY when the user has
// not set it from 1.13 (its release notes: lazy module loading by default
// with CUDA 11.7+), which the driver honours from CUDA 11.7 (CUDA C
// Programming Guide, "Lazy Loading"); before either, every kernel image of
// the process loads with the context. An unknown CUDA version on a PyTorch 2.x era is taken as 11.7+
// (every 2.x wheel is built with CUDA 11.7 or later).
func lazyLoading(e Era) bool {
	if !e.Known() || e.Before(1, 13) {
		return false
	}
	if e.CUDA == [2]int{} {
		return !e.Before(2, 0)
	}
	return e.CUDA[0] > 11 || e.CUDA[0] == 11 && e.CUDA[1] >= 7
}

// dateIn finds the first date in s: YYYY-MM[-DD] or "Month YYYY".
func dateIn(s string) string {
	if m := isoDateRE.FindStringSubmatch(s); m != nil {
		d := m[3]
		if d == "" {
			d = "01"
		}
		return m[1] + "-" + m[2] + "-" + d
	}
	if m := monthRE.FindStringSubmatch(s); m != nil {
		return m[2] + "-" + months[m[1]] + "-01"
	}
	return ""
}

// torchAt is the newest PyTorch release on or before date (YYYY-MM-DD).
func torchAt(date string) [2]int {
	v := [2]int{}
	for _, rel := range torchReleases {
		if rel.date <= date {
			v = [2]int{rel.major, rel.minor}
		}
	}
	return v
}

func atoi2(a, b string) [2]int {
	x, _ := strconv.Atoi(a)
	y, _ := strconv.Atoi(b)
	return [2]int{x, y}
}

// contextRow is one public measurement of the device memory a PyTorch
// process holds outside the caching allocator once CUDA is initialised (the
// context: driver state and loaded kernel images).
type contextRow struct {
	lazy   bool
	cuda   int    // CUDA major version the measurement ran (0: any)
	gpu    string // memplan GPU name ("": any)
	bytes  units.Bytes
	source string
}

// contextTable: with lazy loading the context holds only the kernels used so
// far, so it is nearly the same on every GPU; with eager loading it holds
// every kernel image of the binary for the device's architecture, which
// grows with the CUDA version. More specific rows come first.
var contextTable = []contextRow{
	{lazy: false, cuda: 11, gpu: "v100-16gb", bytes: 1343 << 20,
		source: "huggingface/transformers docs/source/en/perf_train_gpu_one.md (2022-01: nvidia-smi after torch.ones((1, 1)).to(\"cuda\") on a Tesla V100-SXM2 16 GB, CUDA 11.2, driver 460.91.03: 1343 MB, pynvml used // 1024**2); the C rows' own source, which measured it on their machine"},
	{lazy: false, cuda: 11, bytes: 1687 << 20,
		source: "PyTorch issue #55277 (torch 1.8.2+cu111, RTX 3090: 1687 MB; ptrblck in #107667: before CUDA 11.7 every kernel loads with the context, \">1000MB\"); the one eager CUDA 11 measurement in the table besides the C rows' own V100"},
	{lazy: false, cuda: 10, bytes: 721 << 20,
		source: "PyTorch issue #55277 (torch 1.8.2+cu101 on a GTX 1080: 721 MB in nvidia-smi; discuss.pytorch.org #73021, 2020: 723 MiB)"},
	{lazy: true, bytes: 400e6,
		source: "PyTorch issues #107667 and #109888 (ptrblck, NVIDIA): about 300-400 MB with lazy module loading (PyTorch #86509 measured 287,047,680 bytes for a bare context); the upper figure, since a training step loads the kernels it uses"},
}

// contextOf is the CUDA context's device memory for an era on a GPU, with
// its source; ok is false when no row of the table covers the era.
func contextOf(e Era, gpu string) (units.Bytes, string, bool) {
	if !e.Known() {
		return 0, "", false
	}
	for _, c := range contextTable {
		if c.lazy != e.LazyLoaded || c.cuda != 0 && c.cuda != e.CUDA[0] || c.gpu != "" && c.gpu != gpu {
			continue
		}
		return c.bytes, c.source, true
	}
	return 0, "", false
}
