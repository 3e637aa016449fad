package hw

import (
	"strings"
	"testing"
	"time"
)

func TestParseCluster(t *testing.T) {
	c, err := ParseCluster([]byte("gpus_per_node: 4\ninter_node:\n  gbps: 200\n  latency_us: 2.5\n"))
	if err != nil {
		t.Fatal(err)
	}
	if want := (Cluster{GPUsPerNode: 4, InterNodePerDirection: 25e9, InterNodeLatency: 2500 * time.Nanosecond}); c != want {
		t.Fatalf("got %+v, want %+v", c, want)
	}
	c, err = ParseCluster([]byte("inter_node: {gbps: 400}\n"))
	if err != nil || c.GPUsPerNode != 0 || c.InterNodePerDirection != 50e9 || c.InterNodeLatency != 0 {
		t.Fatalf("got %+v, %v", c, err)
	}
}

func TestParseClusterBadInput(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"", "inter_node.gbps is required"},
		{"gpus_per_node: 8\n", "inter_node.gbps is required"},
		{"inter_node: {latency_us: 3}\n", "inter_node.gbps is required"},
		{"inter_node: {gbps: 0}\n", "inter_node.gbps must be between 0.1 and 100000 Gb/s, got 0"},
		{"inter_node: {gbps: -400}\n", "inter_node.gbps must be between 0.1 and 100000 Gb/s"},
		{"inter_node: {gbps: 1e-300}\n", "inter_node.gbps must be between 0.1 and 100000 Gb/s, got 1e-300"},
		{"inter_node: {gbps: 0.09}\n", "inter_node.gbps must be between"},
		{"inter_node: {gbps: 1e300}\n", "inter_node.gbps must be between 0.1 and 100000 Gb/s, got 1e+300"},
		{"gpus_per_node: 4097\ninter_node: {gbps: 400}\n", "gpus_per_node must be between 1 and 4096, got 4097"},
		{"gpus_per_node: 9223372036854775807\ninter_node: {gbps: 400}\n", "gpus_per_node must be between 1 and 4096"},
		{"inter_node: {gbps: .nan}\n", "not a cluster file"},
		{"inter_node: {gbps: 400, latency_us: -1}\n", "inter_node.latency_us must be between"},
		{"inter_node: {gbps: 400, latency_us: 1e9}\n", "inter_node.latency_us must be between"},
		{"gpus_per_node: 0\ninter_node: {gbps: 400}\n", "gpus_per_node must be between 1 and 4096, got 0"},
		{"gpus_per_node: eight\ninter_node: {gbps: 400}\n", "not a cluster file: gpus_per_node: want a whole number, got a string"},
		{"gpus_per_node: 4.5\ninter_node: {gbps: 400}\n", "not a cluster file: gpus_per_node: want a whole number, got a number (4.5)"},
		{"gpus_per_node: 1e20\ninter_node: {gbps: 400}\n", "gpus_per_node: want a whole number, got a number (100000000000000000000)"},
		{"inter_node: 5\n", "not a cluster file: inter_node: want a mapping, got a number"},
		{"42\n", "not a cluster file: the document: want a mapping, got a number"},
		{"inter_node: {gbps: 400, bandwidth: 3}\n", "not a cluster file"},
		{"nodes: 2\ninter_node: {gbps: 400}\n", "not a cluster file"},
		{"[1, 2]\n", "not a cluster file: the document: want a mapping, got a list"},
		{"inter_node: {gbps: \"400Gb/s\"}\n", "not a cluster file: inter_node.gbps: want a number, got a string"},
		// Aliases bounded by the file's 1 MiB, keys strings.
		{"x: &x \"" + strings.Repeat("x", 64<<10) + "\"\ny: [" + strings.Repeat("*x,", 20) + "*x]\ninter_node: {gbps: 400}\n", "not a cluster file: YAML aliases expand to more than 1 MiB"},
		{"?\n", "not a cluster file: a mapping key must be a string (line 1)"},
		{"inter_node: {gbps: 400, [a]: 1}\n", "not a cluster file: a mapping key must be a string (line 1)"},
	} {
		_, err := ParseCluster([]byte(c.in))
		if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") || strings.Contains(err.Error(), "Go ") {
			t.Errorf("%q: got %v, want one line containing %q", c.in, err, c.want)
		}
	}
}

func FuzzParseCluster(f *testing.F) {
	f.Add([]byte("gpus_per_node: 8\ninter_node: {gbps: 400, latency_us: 5}\n"))
	// Extreme values (issue 15): past int64, 2^62, non-finite, negative.
	f.Add([]byte("gpus_per_node: 9223372036854775808\ninter_node: {gbps: 1e309, latency_us: -1}\n"))
	f.Add([]byte("gpus_per_node: 4611686018427387904\ninter_node: {gbps: .nan, latency_us: .inf}\n"))
	f.Add([]byte("gpus_per_node: 2147483647\ninter_node: {gbps: 5e-324, latency_us: 9223372036854775807}\n"))
	// Aliases and keys that are not strings (yamlerr.UnmarshalStrict).
	f.Add([]byte("gpus_per_node: &n 8\ninter_node: {gbps: *n, latency_us: *n}\n"))
	f.Add([]byte("a: &a [x, x, x]\nb: [*a, *a, *a]\ninter_node: {gbps: 400}\n"))
	f.Add([]byte("?\n"))
	f.Add([]byte("? [a]\n: 1\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := ParseCluster(data)
		if err == nil && (c.InterNodePerDirection <= 0 || c.GPUsPerNode < 0 || c.InterNodeLatency < 0) {
			t.Fatalf("accepted %+v", c)
		}
	})
}

// The DGX nodes' network is NVIDIA's DGX BasePOD reference architecture's
// (one 400 Gb/s ConnectX-7 adapter per GPU, eight GPUs).
func TestCatalogNodes(t *testing.T) {
	for _, name := range []string{"h100-sxm", "h200", "b200"} {
		g, err := Lookup(name)
		if err != nil {
			t.Fatal(err)
		}
		if g.Node == nil || g.Node.GPUs != 8 || g.Node.NetworkPerDirection != 50e9 || !strings.Contains(g.Node.Source, "ConnectX-7") {
			t.Errorf("%s: node %+v", name, g.Node)
		}
	}
	g, _ := Lookup("rtx-4090")
	if g.Node != nil {
		t.Errorf("rtx-4090 has a node: %+v", g.Node)
	}
	a, _ := Lookup("h100-sxm")
	a.Node.GPUs = 1
	b, _ := Lookup("h100-sxm")
	if b.Node.GPUs != 8 {
		t.Error("Lookup shares the catalog's node")
	}
}
