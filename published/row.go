// Package published reads published GPU-memory measurements described in
// the training frameworks' own terms (memplan.published/v1, JSON Lines: see
// shared/published/FORMAT.md), maps each row to a recipe and a job, and
// compares memplan's prediction with the measured number. A row it cannot
// express is reported with the capability it lacks, never predicted as a
// near neighbour.
package published

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"

	"github.com/memplan/memplan/internal/boundedio"
	"github.com/memplan/memplan/internal/yamlerr"
	"github.com/memplan/memplan/units"
)

// Schema is the schema string every row carries.
const Schema = "memplan.published/v1"

// Row is one published measurement.
type Row struct {
	Schema           string            `json:"schema"`
	ID               string            `json:"id"`
	Source           string            `json:"source"`
	Framework        string            `json:"framework"`
	FrameworkVersion string            `json:"framework_version"`
	Libraries        map[string]string `json:"libraries"`
	Model            Model             `json:"model"`
	GPU              *string           `json:"gpu"`
	GPUs             int               `json:"gpus"`
	Parallel         Parallel          `json:"parallel"`
	Mode             string            `json:"mode"`
	MicroBatch       int               `json:"micro_batch"`
	Seq              int               `json:"seq"`
	Accum            *int              `json:"accum"`
	Precision        string            `json:"precision"`
	Optimizer        *string           `json:"optimizer"`
	Checkpointing    string            `json:"activation_checkpointing"`
	PEFT             *PEFT             `json:"peft"`
	Quantization     *string           `json:"quantization"`
	Loss             *string           `json:"loss"`
	Metric           string            `json:"metric"`
	Measured         *float64          `json:"measured"`
	Unit             string            `json:"unit"`
	Outcome          string            `json:"outcome"`
	Confidence       string            `json:"confidence"`
	Notes            string            `json:"notes"`
}

// Model names the architecture: a catalog name, or a config.json relative
// to the published file.
type Model struct {
	Name   *string `json:"name"`
	HFID   string  `json:"hf_id"`
	Config *string `json:"config"`
}

// Parallel is the parallel layout in the framework's terms.
type Parallel struct {
	Strategy string `json:"strategy"`
	Degree   int    `json:"degree"`
	Details  string `json:"details"`
}

// PEFT is a parameter-efficient fine-tuning method.
type PEFT struct {
	Method  string   `json:"method"`
	R       int      `json:"r"`
	Alpha   float64  `json:"alpha"`
	Dropout float64  `json:"dropout"`
	Targets []string `json:"targets"`
	Details string   `json:"details"`
}

// Metric kinds, as FORMAT.md names them.
const (
	MaxAllocated   = "max_memory_allocated"
	ActivePeak     = "active_bytes_peak"
	MaxReserved    = "max_memory_reserved"
	ReservedP99    = "memory_reserved_p99"
	NvidiaSMI      = "nvidia-smi"
	UnknownMetric  = "unknown"
	OutcomeOK      = "ok"
	OutcomeOOM     = "oom"
	maxRows        = 100000
	maxLineBytes   = 1 << 20
	maxTotalBytes  = 64 << 20
	maxMeasuredGiB = 1 << 20
)

// Allocated reports whether the metric counts allocated (not reserved)
// bytes.
func (r *Row) Allocated() bool { return r.Metric == MaxAllocated || r.Metric == ActivePeak }

// MeasuredBytes is the measured number in bytes.
func (r *Row) MeasuredBytes() units.Bytes {
	if r.Measured == nil {
		return 0
	}
	return units.Bytes(math.Round(*r.Measured * unitBytes[r.Unit]))
}

var unitBytes = map[string]float64{"GB": 1e9, "GiB": 1 << 30, "MiB": 1 << 20, "MB": 1e6, "bytes": 1}

var metrics = map[string]bool{MaxAllocated: true, ActivePeak: true, MaxReserved: true, ReservedP99: true, NvidiaSMI: true, UnknownMetric: true}

// ErrFile wraps every error reading a published file.
var ErrFile = errors.New("published measurements")

// Read parses a JSON Lines file of rows; name is used in errors
// ("published.jsonl:12: ...").
func Read(r io.Reader, name string) ([]Row, error) {
	br := bufio.NewReader(io.LimitReader(r, maxTotalBytes+1))
	var rows []Row
	ids := map[string]int{}
	total := 0
	for line := 1; ; line++ {
		raw, err := br.ReadBytes('\n')
		total += len(raw)
		if total > maxTotalBytes {
			return nil, fmt.Errorf("%w: %s is larger than %d bytes", ErrFile, name, maxTotalBytes)
		}
		if len(raw) > maxLineBytes {
			return nil, fmt.Errorf("%w: %s:%d: line longer than %d bytes", ErrFile, name, line, maxLineBytes)
		}
		if line == 1 {
			raw = boundedio.TrimBOM(raw) // as an editor may save it
		}
		if t := bytes.TrimSpace(raw); len(t) > 0 {
			row, perr := parseRow(t)
			if perr != nil {
				return nil, fmt.Errorf("%w: %s:%d: %v", ErrFile, name, line, perr)
			}
			if prev, dup := ids[row.ID]; dup {
				return nil, fmt.Errorf("%w: %s:%d: id %q already used on line %d", ErrFile, name, line, row.ID, prev)
			}
			ids[row.ID] = line
			rows = append(rows, row)
			if len(rows) > maxRows {
				return nil, fmt.Errorf("%w: %s has more than %d rows", ErrFile, name, maxRows)
			}
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("%w: %s: %v", ErrFile, name, err)
		}
	}
	if len(rows) == 0 {
		return nil, fmt.Errorf("%w: %s has no rows", ErrFile, name)
	}
	return rows, nil
}

// ReadFile reads a published file.
func ReadFile(path string) ([]Row, error) {
	// Open refuses a pipe or device without blocking; Read bounds the
	// lines and the total (maxLineBytes, maxTotalBytes).
	f, err := boundedio.Open(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrFile, err)
	}
	defer f.Close()
	return Read(f, path)
}

func parseRow(data []byte) (Row, error) {
	var r Row
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&r); err != nil {
		if m, ok := yamlerr.TypeMismatch(err); ok {
			if m.Field == "" {
				return r, fmt.Errorf("not a JSON object (got %s)", m.Got)
			}
			return r, fmt.Errorf("field %s: want %s, got %s", m.Field, m.Want, m.Got)
		}
		return r, fmt.Errorf("not a JSON object: %s", yamlerr.Message(err))
	}
	if dec.More() {
		return r, fmt.Errorf("more than one JSON value on the line")
	}
	return r, r.check()
}

func (r *Row) check() error {
	switch {
	case r.Schema != Schema:
		return fmt.Errorf("field schema: want %q, got %q", Schema, r.Schema)
	case strings.TrimSpace(r.ID) == "":
		return fmt.Errorf("field id: empty")
	case strings.TrimSpace(r.Framework) == "":
		return fmt.Errorf("row %s: field framework: empty", r.ID)
	case r.MicroBatch <= 0 || r.MicroBatch > 1<<20:
		return fmt.Errorf("row %s: field micro_batch: want a positive integer, got %d", r.ID, r.MicroBatch)
	case r.Seq <= 0 || r.Seq > 1<<24:
		return fmt.Errorf("row %s: field seq: want a positive integer, got %d", r.ID, r.Seq)
	case r.Accum != nil && (*r.Accum <= 0 || *r.Accum > 1<<20):
		return fmt.Errorf("row %s: field accum: want a positive integer or null, got %d", r.ID, *r.Accum)
	case r.GPUs <= 0 || r.GPUs > 1<<20:
		return fmt.Errorf("row %s: field gpus: want a positive integer, got %d", r.ID, r.GPUs)
	case !metrics[r.Metric]:
		return fmt.Errorf("row %s: field metric: unknown %q (want %s)", r.ID, r.Metric, "max_memory_allocated, active_bytes_peak, max_memory_reserved, memory_reserved_p99, nvidia-smi or unknown")
	case r.Outcome != OutcomeOK && r.Outcome != OutcomeOOM:
		return fmt.Errorf("row %s: field outcome: want ok or oom, got %q", r.ID, r.Outcome)
	case r.Outcome == OutcomeOK && r.Measured == nil:
		return fmt.Errorf("row %s: field measured: null for an ok row", r.ID)
	case r.Outcome == OutcomeOOM && r.Measured != nil:
		return fmt.Errorf("row %s: field measured: an oom row has no measurement (want null)", r.ID)
	case r.Measured != nil && (math.IsNaN(*r.Measured) || *r.Measured <= 0):
		return fmt.Errorf("row %s: field measured: want a positive number", r.ID)
	case r.Measured != nil && unitBytes[r.Unit] == 0:
		return fmt.Errorf("row %s: field unit: unknown %q (want GB, GiB, MiB, MB or bytes)", r.ID, r.Unit)
	case r.Measured != nil && *r.Measured*unitBytes[r.Unit] > maxMeasuredGiB*(1<<30):
		return fmt.Errorf("row %s: field measured: %g %s is not a GPU's memory", r.ID, *r.Measured, r.Unit)
	case r.Model.Name == nil && r.Model.Config == nil:
		return fmt.Errorf("row %s: field model: neither name nor config", r.ID)
	case r.Mode != "" && r.Mode != "train" && r.Mode != "generate":
		return fmt.Errorf("row %s: field mode: want train or generate, got %q", r.ID, r.Mode)
	}
	if p := r.PEFT; p != nil && p.Method == "lora" && (p.R <= 0 || p.R > 1<<16 || !(p.Dropout >= 0 && p.Dropout < 1) || len(p.Targets) == 0) {
		return fmt.Errorf("row %s: field peft: want r > 0, dropout in [0, 1) and targets", r.ID)
	}
	return nil
}
