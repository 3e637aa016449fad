package snapshot

import (
	"encoding/hex"
	"errors"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Pickles written by CPython 3.11's pickle.dumps (protocols 0, 2, 4 and 5)
// of a small snapshot-shaped dict and of plain values.
var pickles = map[string]string{
	"proto0":      "286470300a567365676d656e74730a70310a286c70320a286470330a566465766963650a70340a49300a7356616464726573730a70350a4c313039393531313632373737364c0a7356746f74616c5f73697a650a70360a49323039373135320a735673747265616d0a70370a49300a73567365676d656e745f747970650a70380a56736d616c6c0a70390a735669735f657870616e6461626c650a7031300a4930300a7356626c6f636b730a7031310a286c7031320a28647031330a67350a4c313039393531313632373737364c0a735673697a650a7031340a49313032340a73567265717565737465645f73697a650a7031350a49313030300a735673746174650a7031360a566163746976655f616c6c6f63617465640a7031370a73566672616d65730a7031380a286c7031390a28647032300a566e616d650a7032310a56660a7032320a735666696c656e616d650a7032330a56612e70790a7032340a73566c696e650a7032350a49330a7361736128647032360a67350a4c313039393531313632383830304c0a736731340a49323039363132380a736731350a49300a736731360a56696e6163746976650a7032370a736731380a286c7032380a7361736173566465766963655f7472616365730a7032390a286c7033300a286c7033310a28647033320a56616374696f6e0a7033330a56616c6c6f630a7033340a7356616464720a7033350a4c313039393531313632373737364c0a736731340a49313030300a7367370a49300a735674696d655f75730a7033360a4931320a736731380a286c7033370a28647033380a6732310a6732320a736732330a6732340a736732350a49330a73617361617356616c6c6f6361746f725f73657474696e67730a7033390a28647034300a566d61785f73706c69745f73697a650a7034310a492d310a7356657870616e6461626c655f7365676d656e74730a7034320a4930300a7356676172626167655f636f6c6c656374696f6e5f7468726573686f6c640a7034330a46302e300a7356726f756e6475705f706f776572325f6469766973696f6e730a7034340a28647034350a56310a7034360a49300a7356320a7034370a49340a7373732e",
	"proto2":      "80027d71002858080000007365676d656e747371015d71027d710328580600000064657669636571044b0058070000006164647265737371058a06000000000001580a000000746f74616c5f73697a6571064a00002000580600000073747265616d71074b00580c0000007365676d656e745f7479706571085805000000736d616c6c7109580d00000069735f657870616e6461626c65710a895806000000626c6f636b73710b5d710c287d710d2868058a06000000000001580400000073697a65710e4d0004580e0000007265717565737465645f73697a65710f4de80358050000007374617465711058100000006163746976655f616c6c6f6361746564711158060000006672616d657371125d71137d71142858040000006e616d6571155801000000667116580800000066696c656e616d6571175804000000612e7079711858040000006c696e6571194b037561757d711a2868058a06000400000001680e4a00fc1f00680f4b0068105808000000696e616374697665711b68125d711c75657561580d0000006465766963655f747261636573711d5d711e5d711f7d7120285806000000616374696f6e71215805000000616c6c6f63712258040000006164647271238a06000000000001680e4de80368074b00580700000074696d655f757371244b0c68125d71257d712628681568166817681868194b0375617561615812000000616c6c6f6361746f725f73657474696e677371277d712828580e0000006d61785f73706c69745f73697a6571294affffffff5813000000657870616e6461626c655f7365676d656e7473712a89581c000000676172626167655f636f6c6c656374696f6e5f7468726573686f6c64712b4700000000000000005818000000726f756e6475705f706f776572325f6469766973696f6e73712c7d712d28580100000031712e4b00580100000032712f4b047575752e",
	"proto4":      "8004952a020000000000007d94288c087365676d656e7473945d947d94288c06646576696365944b008c0761646472657373948a060000000000018c0a746f74616c5f73697a65944a000020008c0673747265616d944b008c0c7365676d656e745f74797065948c05736d616c6c948c0d69735f657870616e6461626c6594898c06626c6f636b73945d94287d942868058a060000000000018c0473697a65944d00048c0e7265717565737465645f73697a65944de8038c057374617465948c106163746976655f616c6c6f6361746564948c066672616d6573945d947d94288c046e616d65948c0166948c0866696c656e616d65948c04612e7079948c046c696e65944b037561757d942868058a06000400000001680e4a00fc1f00680f4b0068108c08696e6163746976659468125d94756575618c0d6465766963655f747261636573945d945d947d94288c06616374696f6e948c05616c6c6f63948c0461646472948a06000000000001680e4de80368074b008c0774696d655f7573944b0c68125d947d9428681568166817681868194b0375617561618c12616c6c6f6361746f725f73657474696e6773947d94288c0e6d61785f73706c69745f73697a65944affffffff8c13657870616e6461626c655f7365676d656e747394898c1c676172626167655f636f6c6c656374696f6e5f7468726573686f6c64944700000000000000008c18726f756e6475705f706f776572325f6469766973696f6e73947d94288c0131944b008c0132944b047575752e",
	"proto5":      "8005952a020000000000007d94288c087365676d656e7473945d947d94288c06646576696365944b008c0761646472657373948a060000000000018c0a746f74616c5f73697a65944a000020008c0673747265616d944b008c0c7365676d656e745f74797065948c05736d616c6c948c0d69735f657870616e6461626c6594898c06626c6f636b73945d94287d942868058a060000000000018c0473697a65944d00048c0e7265717565737465645f73697a65944de8038c057374617465948c106163746976655f616c6c6f6361746564948c066672616d6573945d947d94288c046e616d65948c0166948c0866696c656e616d65948c04612e7079948c046c696e65944b037561757d942868058a06000400000001680e4a00fc1f00680f4b0068108c08696e6163746976659468125d94756575618c0d6465766963655f747261636573945d945d947d94288c06616374696f6e948c05616c6c6f63948c0461646472948a06000000000001680e4de80368074b008c0774696d655f7573944b0c68125d947d9428681568166817681868194b0375617561618c12616c6c6f6361746f725f73657474696e6773947d94288c0e6d61785f73706c69745f73697a65944affffffff8c13657870616e6461626c655f7365676d656e747394898c1c676172626167655f636f6c6c656374696f6e5f7468726573686f6c64944700000000000000008c18726f756e6475705f706f776572325f6469766973696f6e73947d94288c0131944b008c0132944b047575752e",
	"orderedDict": "800263636f6c6c656374696f6e730a4f726465726564446963740a71002952710158080000007365676d656e747371025d7103732e",
	"values4":     "8004953d000000000000005d94288a090000000000000000404afdffffff473ff800000000000043027879944b014b0286948f94284b014b0290284b0391944e888c02c3a994652e",
	"values0":     "286c70300a4c313138303539313632303731373431313330333432344c0a61492d330a6146312e350a61635f636f646563730a656e636f64650a70310a285678790a70320a566c6174696e310a70330a7470340a5270350a612849310a49320a7470360a614e614930310a6156e90a70370a612e",
}

func mustHex(t testing.TB, name string) []byte {
	t.Helper()
	b, err := hex.DecodeString(pickles[name])
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestParseEveryProtocol(t *testing.T) {
	for _, name := range []string{"proto0", "proto2", "proto4", "proto5"} {
		s, err := Parse(mustHex(t, name))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if len(s.Segments) != 1 || len(s.Segments[0].Blocks) != 2 || s.Segments[0].Large || s.Segments[0].Address != 1<<40 {
			t.Fatalf("%s: segments %+v", name, s.Segments)
		}
		b := s.Segments[0].Blocks[0]
		if b.Size != 1024 || b.Requested != 1000 || !b.Allocated() || len(b.Frames) != 1 || b.Frames[0] != (Frame{"f", "a.py", 3}) {
			t.Errorf("%s: block %+v", name, b)
		}
		if len(s.Traces) != 1 || len(s.Traces[0]) != 1 || s.Traces[0][0].Action != Alloc || s.Traces[0][0].Size != 1000 || s.Traces[0][0].TimeUS != 12 || !s.HasTime {
			t.Errorf("%s: trace %+v", name, s.Traces)
		}
		if !s.Settings.Recorded || s.Settings.RoundupPower2Divisions[1] != 4 || s.Settings.MaxSplitSize != DefaultSettings().MaxSplitSize {
			t.Errorf("%s: settings %+v", name, s.Settings)
		}
	}
}

func TestUnpicklePlainValues(t *testing.T) {
	v, err := Unpickle(mustHex(t, "values4"))
	if err != nil {
		t.Fatal(err)
	}
	l := v.(*List).Items
	want, _ := new(big.Int).SetString("1180591620717411303424", 10)
	if b, ok := l[0].(*big.Int); !ok || b.Cmp(want) != 0 {
		t.Errorf("2**70 decoded as %v", l[0])
	}
	if l[1] != int64(-3) || l[2] != 1.5 || string(l[3].([]byte)) != "xy" || l[7] != nil || l[8] != true || l[9] != "é" {
		t.Errorf("values %v", l)
	}
	if tu := l[4].(Tuple); len(tu) != 2 || tu[1] != int64(2) {
		t.Errorf("tuple %v", l[4])
	}
	if len(l[5].(*Set).Items) != 2 || len(l[6].(*Set).Items) != 1 {
		t.Errorf("sets %v %v", l[5], l[6])
	}
	v, err = Unpickle(mustHex(t, "orderedDict"))
	if err != nil {
		t.Fatalf("collections.OrderedDict is whitelisted: %v", err)
	}
	if d, ok := v.(*Dict); !ok || d.Len() != 1 {
		t.Errorf("OrderedDict decoded as %v", v)
	}
}

// Bad input: one line naming the problem, never a panic, nothing executed.
func TestBadInput(t *testing.T) {
	magma, err := os.ReadFile("../testdata/snapshots/MAGMA27__assignment2-systems__15883f2b__memory_snapshot.pickle")
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		data []byte
		want string
	}{
		{"empty", nil, "empty file"},
		{"truncated snapshot", magma[:len(magma)/2], "truncated"},
		{"no STOP", []byte("\x80\x02K\x01"), "truncated"},
		{"os.system via GLOBAL", []byte("cos\nsystem\n(S'echo hi'\ntR."), "global os.system"},
		{"builtins.eval via STACK_GLOBAL", []byte("\x80\x04\x8c\x08builtins\x8c\x04eval\x93\x8c\x011\x85R."), "global builtins.eval"},
		{"torch tensor rebuild", []byte("\x80\x02ctorch._utils\n_rebuild_tensor_v2\nq\x00."), "global torch._utils._rebuild_tensor_v2"},
		{"protocol-0 bytes need _codecs.encode", mustHex(t, "values0"), "global _codecs.encode"},
		{"REDUCE without a global", []byte("\x80\x02K\x01)R."), "refusing to call"},
		{"BUILD", []byte("\x80\x02}}b."), "BUILD would run Python code"},
		{"NEWOBJ", []byte("\x80\x02K\x01)\x81."), "NEWOBJ would run Python code"},
		{"PERSID", []byte("P1\n."), "PERSID would run Python code"},
		{"unknown opcode", []byte("\x80\x02\xff."), "unknown opcode 0xff"},
		{"protocol 6", []byte("\x80\x06N."), "unsupported pickle protocol 6"},
		{"stack underflow", []byte("\x80\x02a."), "stack underflow"},
		{"unhashable key", []byte("\x80\x02}]K\x01s."), "unhashable dict key (list)"},
		{"huge length", []byte("\x80\x04\x8d\xff\xff\xff\xff\xff\xff\xff\x7f."), "truncated"},
		{"memo miss", []byte("\x80\x02h\x05."), "memo index 5 was never stored"},
		{"an integer", []byte("\x80\x02K\x01."), "not a CUDA memory snapshot: the pickle holds a int"},
		{"a dict without segments", []byte("\x80\x02}X\x01\x00\x00\x00aK\x01s."), "a dict without \"segments\" (keys: a)"},
		{"JSON", []byte("{\"segments\": []}"), "this is JSON, not a snapshot pickle"},
		{"a gzipped profiler timeline", []byte{0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3}, "this is gzip or HTML, not a snapshot pickle"},
		{"an HTML profiler timeline", []byte("<html><body></body></html>"), "this is gzip or HTML, not a snapshot pickle"},
		{"unknown action", []byte("\x80\x02}(X\x08\x00\x00\x00segments]X\x0d\x00\x00\x00device_traces]]}(X\x06\x00\x00\x00actionX\x04\x00\x00\x00zoomX\x04\x00\x00\x00addrK\x00X\x04\x00\x00\x00sizeK\x00uaau."), "unknown action \"zoom\""},
		{"segment without blocks", []byte("\x80\x02]}(X\x07\x00\x00\x00addressK\x00X\x0a\x00\x00\x00total_sizeK\x01ua."), "has no \"blocks\""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse(c.data)
			if err == nil {
				t.Fatalf("accepted")
			}
			if !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") {
				t.Errorf("error %q, want one line containing %q", err, c.want)
			}
		})
	}
	var ge *GlobalError
	if _, err := Parse(cases[3].data); !errors.As(err, &ge) || ge.Module != "os" || ge.Name != "system" {
		t.Errorf("GLOBAL os.system gave %v", err)
	}
}

// Every real snapshot decodes (../shared/snapshots/raw, as CI has it).
func TestRealSnapshotsDecode(t *testing.T) {
	files, _ := filepath.Glob(filepath.Join("..", "..", "shared", "snapshots", "raw", "*"))
	if len(files) < 8 {
		t.Fatalf("found %d snapshots in ../shared/snapshots/raw; CI has the shared directory next to the clone", len(files))
	}
	for _, f := range files {
		s, err := ReadFile(f)
		if err != nil {
			t.Errorf("%v", err)
			continue
		}
		if len(s.Segments) == 0 {
			t.Errorf("%s: no segments", f)
		}
	}
}

func FuzzParse(f *testing.F) {
	for name := range pickles {
		f.Add(mustHex(f, name))
	}
	// Pickles whose shared references expand past what their size holds
	// (TestParseRefusesSharedExpansion), and ones within it.
	for _, b := range [][]byte{sharedBlocks(300, 300), sharedEvents(300, 300), sharedFrames(600, 600), sharedBlocks(4, 4), sharedFrames(8, 8)} {
		f.Add(b)
	}
	seeds, _ := filepath.Glob("../testdata/snapshots/*")
	shared, _ := filepath.Glob(filepath.Join("..", "..", "shared", "snapshots", "raw", "*"))
	for _, p := range append(seeds, shared...) {
		data, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		// The fuzzer mutates small inputs fast: a real snapshot's head and
		// tail (the opcodes of every kind it uses, truncated).
		f.Add(data[:min(len(data), 4096)])
		f.Add(data[max(0, len(data)-4096):])
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := Parse(data)
		if err != nil {
			if strings.Contains(err.Error(), "\n") {
				t.Fatalf("multi-line error %q", err)
			}
			return
		}
		for _, sg := range s.Segments {
			var sum int64
			for _, b := range sg.Blocks {
				sum += b.Size
			}
			if len(sg.Blocks) > 0 && sum != sg.TotalSize {
				t.Fatalf("segment blocks add up to %d of %d", sum, sg.TotalSize)
			}
		}
	})
}
