package validate

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/memplan/memplan/engine"
	"github.com/memplan/memplan/internal/boundedio"
	"github.com/memplan/memplan/internal/yamlerr"
	"github.com/memplan/memplan/units"
	"github.com/memplan/memplan/workload"
)

// MeasuredSchema is the measurement format this package reads.
const MeasuredSchema = "memplan.measured/v1"

// Phases is bytes per phase (forward, backward, optimizer).
type Phases struct {
	Forward   int64 `json:"forward"`
	Backward  int64 `json:"backward"`
	Optimizer int64 `json:"optimizer"`
}

// PhaseNames are the phases in execution order.
var PhaseNames = []string{"forward", "backward", "optimizer"}

// Get returns the bytes of a phase by name.
func (p Phases) Get(name string) int64 {
	switch name {
	case "forward":
		return p.Forward
	case "backward":
		return p.Backward
	}
	return p.Optimizer
}

// Peak is the largest phase and its bytes (the first phase wins a tie).
func (p Phases) Peak() (string, int64) {
	best, n := "forward", p.Forward
	for _, ph := range PhaseNames[1:] {
		if v := p.Get(ph); v > n {
			best, n = ph, v
		}
	}
	return best, n
}

// MemoryKind is the counter named by a case's memory.kind
// (python/memplan_torch/measure.py writes one of the constants).
type MemoryKind string

const (
	MemTrack             MemoryKind = "memtrack"               // the CPU LD_PRELOAD tracker (csrc/memtrack.c)
	CUDACachingAllocator MemoryKind = "cuda_caching_allocator" // torch.cuda's allocator statistics
)

// Memory is the counter a case was measured with (its "memory" object).
type Memory struct {
	Kind      MemoryKind `json:"kind"`
	Threshold int64      `json:"threshold_bytes"`
	Overflow  int64      `json:"overflow"`
}

// rawMemory is a case's "memory" object as read: kind stays a plain string
// so a wrong JSON type is reported as before ("must be string").
type rawMemory struct {
	Kind      string `json:"kind"` // memtrack | cuda_caching_allocator
	Threshold int64  `json:"threshold_bytes"`
	Overflow  int64  `json:"overflow"`
}

// memory converts the memory object read; any kind is kept, as before.
func (r rawMemory) memory() Memory {
	return Memory{Kind: MemoryKind(r.Kind), Threshold: r.Threshold, Overflow: r.Overflow}
}

// Case is one measured workload.
type Case struct {
	Name       string
	Workload   *workload.Workload
	Device     string
	MicroBatch int
	SeqLen     int
	Phases     Phases
	First      Phases
	Memory     Memory
	Trace      string // trace file name, relative to the traces directory
	TraceBatch int
}

// Measured is a memplan.measured/v1 document.
type Measured struct {
	Torch string
	Cases []Case
	file  string
}

type rawCase struct {
	Name       *string         `json:"name"`
	Workload   json.RawMessage `json:"workload"`
	Device     string          `json:"device"`
	MicroBatch *int            `json:"micro_batch"`
	SeqLen     *int            `json:"seq_len"`
	Phases     *rawPhases      `json:"phases"`
	FirstStep  *struct {
		Phases    *rawPhases      `json:"phases"`
		PeakBytes json.RawMessage `json:"peak_bytes"`
	} `json:"first_step"`
	Memory     rawMemory `json:"memory"`
	Trace      string    `json:"trace"`
	TraceBatch int       `json:"trace_batch"`
	// Read only to be checked: the run's peak and its accumulation, which
	// memplan_torch writes beside the phases and the workload.
	PeakBytes json.RawMessage `json:"peak_bytes"`
	Strategy  *struct {
		Accumulation json.RawMessage `json:"accumulation"`
	} `json:"strategy"`
}

// The largest micro-batch and sequence a case may describe: the workload
// file's own limits on batch and seq_len (workload/fields.json).
const (
	maxCaseBatch = 1 << 24
	maxCaseSeq   = engine.MaxTokens
)

// counts refuses a case's descriptive sizes outside what a run can have: a
// micro-batch outside 1 to 2^24, a sequence, trace batch, counter
// threshold or overflow count below 0 or past the workload's and engine's
// limits (the plan reads the workload; these describe the run, and the
// threshold picks the counter the peaks are compared as); and the run's
// peaks and accumulation, when given, as the phases and the engine bound
// them (a peak of -1, 0 or 1e300 and an accumulation of 10^9 passed).
func (rc *rawCase) counts(named string, w *workload.Workload) error {
	for _, f := range []struct {
		field     string
		v, lo, hi int64
	}{
		{"micro_batch", int64(*rc.MicroBatch), 1, maxCaseBatch},
		{"seq_len", int64(derefOr(rc.SeqLen, 0)), 0, maxCaseSeq},
		{"trace_batch", int64(rc.TraceBatch), 0, maxCaseBatch},
		{"memory.threshold_bytes", rc.Memory.Threshold, 0, int64(units.MaxBytes)},
		{"memory.overflow", rc.Memory.Overflow, 0, math.MaxInt64},
	} {
		if f.v < f.lo {
			return fmt.Errorf("%s: %s is %d: want at least %d", named, f.field, f.v, f.lo)
		}
		if f.v > f.hi {
			return fmt.Errorf("%s: %s is %d: want at most %d (the workload file's and the engine's limit)", named, f.field, f.v, f.hi)
		}
	}
	const peak = "from 1 to 2^62 (a measured peak's bytes)"
	if _, err := wholeIn(rc.PeakBytes, named, "peak_bytes", 1, int64(units.MaxBytes), peak); err != nil {
		return err
	}
	if _, err := wholeIn(rc.FirstStep.PeakBytes, named, "first_step.peak_bytes", 1, int64(units.MaxBytes), peak); err != nil {
		return err
	}
	if rc.Strategy == nil {
		return nil
	}
	a, err := wholeIn(rc.Strategy.Accumulation, named, "strategy.accumulation", 1, engine.MaxAccum, "from 1 to 2^30 (the engine's limit on micro-steps)")
	if err == nil && a != 0 && a != int64(w.Strategy.Accumulation) {
		err = fmt.Errorf("%s: strategy.accumulation is %d, its workload's strategy.accumulation %d (the case describes the run of its workload)", named, a, w.Strategy.Accumulation)
	}
	return err
}

// wholeIn is a field's value, 0 when absent or null; a field given that is
// not a whole number from lo to hi is refused in one line naming it and
// what it takes.
func wholeIn(raw json.RawMessage, named, field string, lo, hi int64, want string) (int64, error) {
	s := strings.TrimSpace(string(raw))
	if s == "" || s == "null" {
		return 0, nil
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil || v < lo || v > hi {
		if len(s) > 40 {
			s = s[:40] + "..."
		}
		return 0, fmt.Errorf("%s: %s is %s: want a whole number %s", named, field, s, want)
	}
	return v, nil
}

func derefOr(p *int, or int) int {
	if p == nil {
		return or
	}
	return *p
}

// rawPhases is a phases object as read: a phase left out (or null) is
// told apart from a 0, so that both are refused by name.
type rawPhases struct {
	Forward   *int64 `json:"forward"`
	Backward  *int64 `json:"backward"`
	Optimizer *int64 `json:"optimizer"`
}

// phases checks every phase peak of the object at field (such as
// "first_step.phases") and returns them. Each is refused unless in
// (0, 2^62]: a measured peak divides every relative error, so a 0 made
// them +Inf (which JSON cannot encode) and a negative one made them
// meaningless, and no device holds more than units.MaxBytes.
func (r *rawPhases) phases(where, field string) (Phases, error) {
	vals := [...]*int64{r.Forward, r.Backward, r.Optimizer}
	for i, v := range vals {
		name := field + "." + PhaseNames[i]
		switch {
		case v == nil:
			return Phases{}, fmt.Errorf("%s: missing %q (a measured peak must be positive)", where, name)
		case *v <= 0:
			return Phases{}, fmt.Errorf("%s: %s is %d bytes: a measured peak must be positive", where, name, *v)
		case *v > int64(units.MaxBytes):
			return Phases{}, fmt.Errorf("%s: %s is %d bytes: over 4 EiB (2^62 bytes), more than any device holds", where, name, *v)
		}
	}
	return Phases{Forward: *r.Forward, Backward: *r.Backward, Optimizer: *r.Optimizer}, nil
}

// LoadMeasured reads a memplan.measured/v1 file.
func LoadMeasured(path string) (*Measured, error) {
	data, err := boundedio.ReadFile(path, boundedio.TraceFile)
	if err != nil {
		var pe *os.PathError
		if errors.As(err, &pe) {
			return nil, fmt.Errorf("%s: %v", path, pe.Err)
		}
		return nil, fmt.Errorf("%w", err)
	}
	return ParseMeasured(filepath.Base(path), data)
}

// ParseMeasured parses a measured document; file names it in errors.
func ParseMeasured(file string, data []byte) (*Measured, error) {
	var doc struct {
		Schema   *string `json:"schema"`
		Producer struct {
			Torch string `json:"torch"`
		} `json:"producer"`
		Cases []json.RawMessage `json:"cases"`
	}
	if err := json.Unmarshal(boundedio.TrimBOM(data), &doc); err != nil {
		return nil, fmt.Errorf("%s: %s", file, yamlerr.Message(err))
	}
	if doc.Schema == nil {
		return nil, fmt.Errorf("%s: missing \"schema\" (want %q)", file, MeasuredSchema)
	}
	if *doc.Schema != MeasuredSchema {
		return nil, fmt.Errorf("%s: schema %q, this memplan reads %s", file, *doc.Schema, MeasuredSchema)
	}
	m := &Measured{Torch: doc.Producer.Torch, file: file}
	for i, raw := range doc.Cases {
		where := fmt.Sprintf("%s: cases[%d]", file, i)
		var rc rawCase
		if err := json.Unmarshal(raw, &rc); err != nil {
			return nil, fmt.Errorf("%s: %s", where, yamlerr.Message(err))
		}
		switch {
		case rc.Name == nil:
			return nil, fmt.Errorf("%s: missing \"name\"", where)
		case rc.Workload == nil:
			return nil, fmt.Errorf("%s: missing \"workload\"", where)
		case rc.MicroBatch == nil:
			return nil, fmt.Errorf("%s: missing \"micro_batch\"", where)
		case rc.Phases == nil:
			return nil, fmt.Errorf("%s: missing \"phases\"", where)
		case rc.FirstStep == nil || rc.FirstStep.Phases == nil:
			return nil, fmt.Errorf("%s: missing \"first_step.phases\"", where)
		}
		var wobj any
		dec := json.NewDecoder(bytesReader(rc.Workload))
		dec.UseNumber()
		if err := dec.Decode(&wobj); err != nil {
			return nil, fmt.Errorf("%s.workload: %s", where, yamlerr.Message(err))
		}
		w, err := workload.Validate(where+".workload", wobj)
		if err != nil {
			return nil, fmt.Errorf("%w", err)
		}
		named := fmt.Sprintf("%s %q", where, *rc.Name) // quoted: a name may hold a newline
		steady, err := rc.Phases.phases(named, "phases")
		if err != nil {
			return nil, err
		}
		first, err := rc.FirstStep.Phases.phases(named, "first_step.phases")
		if err != nil {
			return nil, err
		}
		if err := rc.counts(named, w); err != nil {
			return nil, err
		}
		c := Case{Name: *rc.Name, Workload: w, Device: rc.Device, MicroBatch: *rc.MicroBatch, Phases: steady,
			First: first, Memory: rc.Memory.memory(), Trace: rc.Trace, TraceBatch: rc.TraceBatch}
		if rc.SeqLen != nil {
			c.SeqLen = *rc.SeqLen
		}
		m.Cases = append(m.Cases, c)
	}
	if len(m.Cases) == 0 {
		return nil, fmt.Errorf("%s: no cases", file)
	}
	return m, nil
}
