package cli

import (
	"io"
	"os"
	"time"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"
)

// progress is a progress bar on stderr for work of max steps (-1: not yet
// known), when stderr is a terminal; nil otherwise (a pipe, a file, the
// service's buffers), and every caller checks. It counts the steps done
// after desc and is cleared when finished, so nothing of it stays in the
// output.
func progress(stderr io.Writer, max int, desc string) *progressbar.ProgressBar {
	f, ok := stderr.(*os.File)
	if !ok || !term.IsTerminal(int(f.Fd())) {
		return nil
	}
	return newBar(stderr, max, desc)
}

// newBar is progress's bar, drawn on w.
func newBar(w io.Writer, max int, desc string) *progressbar.ProgressBar {
	return progressbar.NewOptions(max, progressbar.OptionSetWriter(w), progressbar.OptionSetDescription(desc),
		progressbar.OptionShowCount(), progressbar.OptionClearOnFinish(), progressbar.OptionThrottle(100*time.Millisecond))
}
