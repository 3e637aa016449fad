package boundedio

import (
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestReadFile(t *testing.T) {
	dir := t.TempDir()
	small := filepath.Join(dir, "small.json")
	if err := os.WriteFile(small, []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	big := filepath.Join(dir, "big.json")
	if err := os.WriteFile(big, make([]byte, 101), 0o644); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Skip("no named pipes:", err)
	}
	link := filepath.Join(dir, "link.json")
	if err := os.Symlink(small, link); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		path string
		err  error
		want string
	}{
		{small, nil, ""},
		{link, nil, ""},
		{big, ErrTooLarge, "101 bytes, the limit is 100"},
		{fifo, ErrNotRegular, "a named pipe"},
		{"/dev/zero", ErrNotRegular, "a device"},
		{dir, ErrNotRegular, "a directory"},
		{filepath.Join(dir, "missing"), nil, "no such file"},
	} {
		done := make(chan struct{})
		var data []byte
		var err error
		go func() { data, err = ReadFile(c.path, 100); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: blocked", c.path)
		}
		if c.want == "" {
			if err != nil || string(data) != "{}" {
				t.Errorf("%s: %q, %v", c.path, data, err)
			}
			continue
		}
		if err == nil || c.err != nil && !errors.Is(err, c.err) || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), c.path) {
			t.Errorf("%s: got %v, want %v naming the path and %q", c.path, err, c.err, c.want)
		}
	}
}

func TestWriteFile(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "out.svg")
	write := func(s string) func(io.Writer) error {
		return func(w io.Writer) error { _, err := io.WriteString(w, s); return err }
	}
	if err := WriteFile(out, 0o644, write("a")); err != nil {
		t.Fatal(err)
	}
	// A failed or panicking writer leaves the old file and nothing else.
	if err := WriteFile(out, 0o644, func(w io.Writer) error { io.WriteString(w, "half"); return errors.New("boom") }); err == nil {
		t.Fatal("no error")
	}
	if err := WriteFile(out, 0o644, func(w io.Writer) error { panic("draw") }); err == nil || !strings.Contains(err.Error(), "draw") {
		t.Fatalf("panic: %v", err)
	}
	if b, _ := os.ReadFile(out); string(b) != "a" {
		t.Errorf("after failures: %q", b)
	}
	// A symlink is written through.
	real := filepath.Join(dir, "real.svg")
	link := filepath.Join(dir, "link.svg")
	if err := os.Symlink("real.svg", link); err != nil {
		t.Fatal(err)
	}
	if err := WriteFile(link, 0o644, write("b")); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Lstat(link); err != nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Errorf("link replaced: %v", err)
	}
	if b, _ := os.ReadFile(real); string(b) != "b" {
		t.Errorf("through the link: %q", b)
	}
	// A named pipe is refused (not replaced, not blocked on).
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o644); err == nil {
		if err := WriteFile(fifo, 0o644, write("c")); !errors.Is(err, ErrNotRegular) {
			t.Errorf("pipe: %v", err)
		}
		if fi, _ := os.Lstat(fifo); fi.Mode()&os.ModeNamedPipe == 0 {
			t.Error("pipe replaced")
		}
	}
	if err := WriteFile(filepath.Join(dir, "no", "such", "dir.svg"), 0o644, write("d")); err == nil {
		t.Error("missing directory: no error")
	}
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), ".tmp") {
			t.Errorf("left behind: %s", e.Name())
		}
	}
}

// SIGTERM while a file is written removes its temporary file and exits 143.
func TestSignalRemovesTemporary(t *testing.T) {
	if dir := os.Getenv("BOUNDEDIO_CHILD_DIR"); dir != "" {
		WriteFile(filepath.Join(dir, "out.png"), 0o644, func(w io.Writer) error {
			io.WriteString(w, "partial")
			os.WriteFile(filepath.Join(dir, "started"), nil, 0o644)
			time.Sleep(time.Minute)
			return nil
		})
		os.Exit(0)
	}
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestSignalRemovesTemporary$")
	cmd.Env = append(os.Environ(), "BOUNDEDIO_CHILD_DIR="+dir)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		if _, err := os.Stat(filepath.Join(dir, "started")); err == nil {
			break
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			t.Fatal("child never started writing")
		}
		time.Sleep(10 * time.Millisecond)
	}
	cmd.Process.Signal(syscall.SIGTERM)
	err := cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 143 {
		t.Errorf("exit: %v", err)
	}
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if e.Name() != "started" {
			t.Errorf("left behind: %s", e.Name())
		}
	}
}
