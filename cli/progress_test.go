package cli

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/memplan/memplan/engine"
	"github.com/memplan/memplan/hw"
	"github.com/memplan/memplan/models"
)

// A progress bar is drawn only on a terminal: a buffer (the service's) and
// a regular file (stderr redirected) get none, so nothing of it lands in a
// log or in captured output.
func TestProgressOnlyOnTerminal(t *testing.T) {
	if progress(&bytes.Buffer{}, 3, "x") != nil {
		t.Error("a bar on a buffer")
	}
	f, err := os.Create(filepath.Join(t.TempDir(), "stderr"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if progress(f, 3, "x") != nil {
		t.Error("a bar on a regular file")
	}
}

// The bar counts steps after its description, and compare's counts one
// step per row it will hand: the validated job's strategies.
func TestProgressCountsCompareRows(t *testing.T) {
	var b bytes.Buffer
	bar := newBar(&b, 7, "comparing strategies")
	if err := bar.Add(1); err != nil {
		t.Fatal(err)
	}
	if out := b.String(); !strings.Contains(out, "comparing strategies") || !strings.Contains(out, "1/7") {
		t.Errorf("bar drew %q", out)
	}
	m, err := models.Lookup("gpt2")
	if err != nil {
		t.Fatal(err)
	}
	g, err := hw.Lookup("t4")
	if err != nil {
		t.Fatal(err)
	}
	s := engine.Spec{Job: engine.Job{Model: m, Seq: 128}, Target: engine.Target{GPU: g}}
	rows := 0
	if err := engine.CompareEach(s, engine.Allow{}, func(engine.Row) error { rows++; return nil }); err != nil {
		t.Fatal(err)
	}
	if got := compareRows(s, engine.Allow{}); got != rows {
		t.Errorf("compareRows %d, CompareEach handed %d", got, rows)
	}
	if got := compareRows(engine.Spec{}, engine.Allow{}); got != -1 {
		t.Errorf("compareRows of an invalid job %d, want -1", got)
	}
}
