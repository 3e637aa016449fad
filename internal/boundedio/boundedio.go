// Package boundedio reads the files memplan is given without trusting them:
// a regular file only (a device such as /dev/zero never ends, a named pipe
// blocks until someone writes to it), at most a stated size, and writes
// files whole (a temporary file in the target directory renamed over it on
// success, removed on error or interruption).
package boundedio

import (
	"errors"
	"fmt"
	"io"
	"os"
	"syscall"
)

// Size caps of the files memplan reads, each far above any real file of the
// kind: a config.json is a few kilobytes, a recipe or workload file under
// one, an exported trace of a 400-layer model tens of megabytes.
const (
	SmallFile = 1 << 20   // config.json, workload, recipe, cluster, arrivals, measurement
	TraceFile = 256 << 20 // memplan_torch traces and plan JSON
	LargeFile = 1 << 30   // CUDA memory snapshots
)

// ErrNotRegular is returned for a path that is not a regular file.
var ErrNotRegular = errors.New("not a regular file")

// ErrTooLarge is returned for a file over its cap.
var ErrTooLarge = errors.New("file too large")

// ReadFile reads the regular file at path (symlinks followed), refusing a
// device, pipe, socket or directory without blocking, and a file larger
// than limit bytes. Errors name path and say what is wrong in one line.
func ReadFile(path string, limit int64) ([]byte, error) {
	f, err := Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("cannot read %s: %w", path, unwrap(err))
	}
	if st.Size() > limit {
		return nil, fmt.Errorf("cannot read %s: %w (%d bytes, the limit is %d)", path, ErrTooLarge, st.Size(), limit)
	}
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, fmt.Errorf("cannot read %s: %w", path, unwrap(err))
	}
	if int64(len(data)) > limit { // it grew while read
		return nil, fmt.Errorf("cannot read %s: %w (over %d bytes)", path, ErrTooLarge, limit)
	}
	return data, nil
}

// Open opens the regular file at path for reading (symlinks followed),
// refusing a device, pipe, socket or directory without blocking; the
// caller bounds what it reads.
func Open(path string) (*os.File, error) {
	// O_NONBLOCK: opening a named pipe with no writer returns at once
	// (the mode check below refuses it) instead of waiting for one.
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("cannot read %s: %w", path, unwrap(err))
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("cannot read %s: %w", path, unwrap(err))
	}
	if !st.Mode().IsRegular() {
		f.Close()
		return nil, fmt.Errorf("cannot read %s: %w (%s)", path, ErrNotRegular, kind(st.Mode()))
	}
	return f, nil
}

func kind(m os.FileMode) string {
	switch {
	case m.IsDir():
		return "a directory"
	case m&os.ModeNamedPipe != 0:
		return "a named pipe"
	case m&os.ModeSocket != 0:
		return "a socket"
	case m&os.ModeDevice != 0:
		return "a device"
	}
	return "mode " + m.String()
}

// unwrap drops the operation and path a *PathError repeats.
func unwrap(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// bom is the UTF-8 byte order mark some editors (Notepad, PowerShell's
// Out-File) put before a text file.
var bom = []byte{0xef, 0xbb, 0xbf}

// TrimBOM is data without a leading UTF-8 byte order mark: encoding/json
// refuses one ("invalid character 'ï'"), the YAML readers skip it, so every
// JSON file reader trims it first.
func TrimBOM(data []byte) []byte {
	if len(data) >= 3 && data[0] == bom[0] && data[1] == bom[1] && data[2] == bom[2] {
		return data[3:]
	}
	return data
}
