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

// long writes v as LONG1 (8 bytes, little-endian two's complement).
func (w *pickleWriter) long(v int64) *pickleWriter {
	w.b = append(w.b, 0x8a, 8)
	w.b = binary.LittleEndian.AppendUint64(w.b, uint64(v))
	return w
}

// sizedSnapshot is one segment of total bytes in one block of block bytes,
// and a trace of alloc events of the given sizes.
func sizedSnapshot(total, block int64, sizes ...int64) []byte {
	w := newPickle()
	w.op('}', '(').str("segments").op(']', '(')
	w.op('}', '(').str("device").int(0).str("address").long(1<<30).str("total_size").long(total).
		str("segment_type").str("large").str("blocks").op(']', '(')
	w.op('}', '(').str("size").long(block).str("state").str("inactive").op('u')
	w.op('e', 'u', 'e').str("device_traces").op(']', '(', ']', '(')
	for i, s := range sizes {
		w.op('}', '(').str("action").str("alloc").str("addr").long(int64(1<<40) + int64(i)<<40).str("size").long(s).op('u')
	}
	return w.op('e', 'e', 'u', '.').b
}

// Every size a snapshot records is one of a device, and their sum cannot
// wrap: a 2^63−1-byte allocation was reported as an 8388608 TiB allocated
// peak beside 4 MiB reserved, and a segment of 2^63−1 bytes as a negative
// reserved one (-9223372036852678657 bytes).
func TestSizesAreADevices(t *testing.T) {
	const tib = int64(1) << 40
	cases := []struct {
		name string
		data []byte
		want string // "" accepted
	}{
		{"an alloc of 2^63-1", sizedSnapshot(2<<20, 2<<20, 1<<62-1+1<<62), "device_traces[0][0] (alloc).size is 9223372036854775807 bytes, past 1 TiB"},
		{"a segment of 2^63-1", sizedSnapshot(1<<62-1+1<<62, 2<<20), "segments[0].total_size is 9223372036854775807 bytes, past 1 TiB"},
		{"a block of 2^63-1", sizedSnapshot(2<<20, 1<<62-1+1<<62), "segments[0].blocks[0].size is 9223372036854775807 bytes, past 1 TiB"},
		{"a block past its segment", sizedSnapshot(2<<20, 4<<20), "blocks up to blocks[0] add up to 4194304 bytes, past its total_size 2097152"},
		{"an alloc of -2", sizedSnapshot(2<<20, 2<<20, -2), "device_traces[0][0] (alloc) has addr 1099511627776, size -2"},
		{"a segment of 1 TiB", sizedSnapshot(tib, tib, tib), ""},
	}
	// 2^22 events of 1 TiB take a pickle of 64 MiB (maxRecords); the sum
	// is checked on the converter.
	c := converter{}
	for i := range 1 << 22 {
		if err := c.sizeOK(tib, "device_traces[0]", fmt.Sprintf("[%d].size", i)); err != nil {
			t.Fatalf("event %d: %v", i, err)
		}
	}
	if err := c.sizeOK(1, "device_traces[0]", "[4194304].size"); err == nil || !strings.Contains(err.Error(), "device_traces[0][4194304].size: the sizes of the segments, blocks and trace events read so far sum past 4 EiB") {
		t.Errorf("past 2^62 in all: %v", err)
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse(c.data)
			if c.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") {
				t.Errorf("error %v, want one line containing %q", err, c.want)
			}
		})
	}
}
