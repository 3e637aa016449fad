package boundedio

import (
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"
)

// pending are the temporary files being written, removed on a signal.
var pending = struct {
	sync.Mutex
	files map[string]bool
	sig   chan os.Signal
}{files: map[string]bool{}}

// WriteFile writes path whole: write fills a temporary file in the target's
// directory, which is renamed over the target when write and the close
// succeed and removed otherwise (on SIGINT or SIGTERM too: track). A
// symlink is written through: its final target is replaced, the link stays. A target that exists and is not a regular file
// (a directory, a named pipe, a device) is refused. The file gets mode perm.
func WriteFile(path string, perm os.FileMode, write func(io.Writer) error) (err error) {
	target := path
	if fi, lerr := os.Lstat(path); lerr == nil && fi.Mode()&os.ModeSymlink != 0 {
		if target, err = filepath.EvalSymlinks(path); err != nil {
			// A dangling link names the file to create.
			if target, err = os.Readlink(path); err != nil {
				return fmt.Errorf("cannot write %s: %w", path, unwrap(err))
			}
			if !filepath.IsAbs(target) {
				target = filepath.Join(filepath.Dir(path), target)
			}
			// A link to itself (or to another dangling link) would be
			// replaced by the file (probe: plan --svg LOOP exited 0).
			if fi, lerr := os.Lstat(target); lerr == nil && fi.Mode()&os.ModeSymlink != 0 {
				return fmt.Errorf("cannot write %s: its symbolic links lead nowhere (a loop, or a link to a dangling link)", path)
			}
		}
	}
	if fi, serr := os.Stat(target); serr == nil && !fi.Mode().IsRegular() {
		return fmt.Errorf("cannot write %s: %w (%s)", path, ErrNotRegular, kind(fi.Mode()))
	}
	f, err := os.CreateTemp(filepath.Dir(target), "."+filepath.Base(target)+".*.tmp")
	if err != nil {
		return fmt.Errorf("cannot write %s: %w", path, unwrap(err))
	}
	tmp := f.Name()
	track(tmp, true)
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("cannot write %s: %v", path, p)
		}
		if err != nil {
			f.Close()
			os.Remove(tmp)
		}
		track(tmp, false)
	}()
	if err = write(f); err != nil {
		return err
	}
	if err = f.Chmod(perm); err != nil {
		return fmt.Errorf("cannot write %s: %w", path, unwrap(err))
	}
	if err = f.Close(); err != nil {
		return fmt.Errorf("cannot write %s: %w", path, unwrap(err))
	}
	if err = os.Rename(tmp, target); err != nil {
		return fmt.Errorf("cannot write %s: %w", path, unwrap(err))
	}
	return nil
}

// track adds or removes a temporary file; while any is open, SIGINT and
// SIGTERM remove them all and exit with 128 + the signal's number, as a
// shell reports it (and the default handling resumes when none is).
func track(name string, add bool) {
	pending.Lock()
	defer pending.Unlock()
	if add {
		pending.files[name] = true
		if len(pending.files) == 1 {
			pending.sig = make(chan os.Signal, 1)
			signal.Notify(pending.sig, os.Interrupt, syscall.SIGTERM)
			go onSignal(pending.sig)
		}
		return
	}
	delete(pending.files, name)
	if len(pending.files) == 0 && pending.sig != nil {
		signal.Stop(pending.sig)
		close(pending.sig)
		pending.sig = nil
	}
}

func onSignal(c chan os.Signal) {
	s, ok := <-c
	if !ok {
		return
	}
	pending.Lock()
	for name := range pending.files {
		os.Remove(name)
	}
	os.Exit(128 + int(s.(syscall.Signal)))
}
