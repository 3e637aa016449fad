package snapshot

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// pickleWriter writes protocol-2 opcodes, for pickles no PyTorch writes.
type pickleWriter struct {
	b    []byte
	memo int
}

func newPickle() *pickleWriter { return &pickleWriter{b: []byte{0x80, 2}} }

func (w *pickleWriter) op(ops ...byte) *pickleWriter { w.b = append(w.b, ops...); return w }

func (w *pickleWriter) str(s string) *pickleWriter {
	w.b = append(w.b, 'X')
	w.b = binary.LittleEndian.AppendUint32(w.b, uint32(len(s)))
	w.b = append(w.b, s...)
	return w
}

func (w *pickleWriter) int(v int32) *pickleWriter {
	w.b = append(w.b, 'J')
	w.b = binary.LittleEndian.AppendUint32(w.b, uint32(v))
	return w
}

// put memoizes the top of the stack and returns its index.
func (w *pickleWriter) put() int {
	w.b = append(w.b, 'r')
	w.b = binary.LittleEndian.AppendUint32(w.b, uint32(w.memo))
	w.memo++
	return w.memo - 1
}

// gets pushes memo entry i n times.
func (w *pickleWriter) gets(i, n int) *pickleWriter {
	for range n {
		w.b = append(w.b, 'j')
		w.b = binary.LittleEndian.AppendUint32(w.b, uint32(i))
	}
	return w
}

// list writes a list of n references to the value item writes.
func (w *pickleWriter) list(n int, item func()) *pickleWriter {
	w.op(']', '(')
	item()
	i := w.put()
	return w.gets(i, n-1).op('e')
}

// sharedBlocks is a snapshot of segs references to one segment holding
// blocks references to one 512-byte block (/tmp/probeA/pk3.pickle was
// 4000 × 4000 in 16 KB).
func sharedBlocks(segs, blocks int) []byte {
	w := newPickle()
	w.op('}', '(').str("segments")
	w.list(segs, func() {
		w.op('}', '(').str("device").int(0).str("address").int(0).str("total_size").int(int32(512 * blocks)).
			str("segment_type").str("large").str("blocks")
		w.list(blocks, func() { w.op('}', '(').str("size").int(512).str("state").str("active_allocated").op('u') })
		w.op('u')
	})
	return w.op('u', '.').b
}

// sharedEvents is a snapshot with no segments and devices references to
// one trace of events references to one alloc event.
func sharedEvents(devices, events int) []byte {
	w := newPickle()
	w.op('}', '(').str("segments").op(']').str("device_traces")
	w.list(devices, func() {
		w.list(events, func() {
			w.op('}', '(').str("action").str("alloc").str("addr").int(0).str("size").int(512).op('u')
		})
	})
	return w.op('u', '.').b
}

// sharedFrames is a trace of events alloc events that share one list of
// frames references to one frame.
func sharedFrames(events, frames int) []byte {
	w := newPickle()
	w.op('}', '(').str("segments").op(']').str("device_traces").op(']', '(').op(']', '(')
	var fl int
	for i := range events {
		w.op('}', '(').str("action").str("alloc").str("addr").int(int32(512 * i)).str("size").int(512).str("frames")
		if i == 0 {
			w.list(frames, func() { w.op('}', '(').str("name").str("f").str("filename").str("a.py").op('u') })
			fl = w.put()
		} else {
			w.gets(fl, 1)
		}
		w.op('u')
	}
	return w.op('e', 'e', 'u', '.').b
}

// A pickle whose memo references expand past what a snapshot of its size
// holds is refused before it is built, in one line: each segment, block
// and event of a real snapshot is a dict of its own.
func TestParseRefusesSharedExpansion(t *testing.T) {
	cases := []struct {
		name string
		data []byte
		want string // "" accepted
	}{
		{"blocks of a shared segment", sharedBlocks(600, 600), "segments, blocks and trace events"},
		{"events of a shared trace", sharedEvents(600, 600), "segments, blocks and trace events"},
		{"frames of shared lists", sharedFrames(2000, 2000), "stack frames of blocks and trace events"},
		// Sharing within the limits is how PyTorch writes frames.
		{"a few shared blocks", sharedBlocks(8, 8), ""},
		{"a few shared frames", sharedFrames(100, 100), ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			s, err := Parse(c.data)
			runtime.ReadMemStats(&after)
			if c.want == "" {
				if err != nil {
					t.Fatalf("%d bytes: %v", len(c.data), err)
				}
				if len(s.Segments)+len(s.Traces) == 0 {
					t.Fatalf("nothing decoded")
				}
				return
			}
			size := fmt.Sprintf("a snapshot of %d bytes", len(c.data))
			if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), size) || strings.Contains(err.Error(), "\n") {
				t.Fatalf("%d bytes: error %v, want one line containing %q", len(c.data), err, c.want)
			}
			// Built in full, 360,000 blocks or events are 23 MB of
			// structs alone; refused, under 16 MB is allocated.
			if got := after.TotalAlloc - before.TotalAlloc; got > 16<<20 {
				t.Errorf("%d bytes allocated before the refusal", got)
			}
		})
	}
}

// The file the tester found: 16 KB that expanded to 16 million blocks.
func TestReadFileRefusesProbeExpansion(t *testing.T) {
	p := filepath.Join(t.TempDir(), "pk3.pickle")
	if err := os.WriteFile(p, sharedBlocks(4000, 4000), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := ReadFile(p)
	if err == nil || !strings.HasPrefix(err.Error(), p+": its shared references expand to more than") || strings.Contains(err.Error(), "\n") {
		t.Fatalf("error %v, want one line naming %s", err, p)
	}
}
