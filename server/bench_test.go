package server_test

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/memplan/memplan/server"
)

// BenchmarkCachedPlan: one request for a plan the server has cached, over
// loopback HTTP (the load test's cached requests, one at a time).
func BenchmarkCachedPlan(b *testing.B) {
	ts := newServer(b, server.Config{})
	body := `{"model": "llama-3-70b", "gpu": "h100", "tp": 8, "pp": 4, "micro_batch": 1, "seq": 4096, "no_timeline": true}`
	post(b, ts.URL+"/v1/plan", body)
	defer cpuPerOp(b)()
	for b.Loop() {
		resp, err := http.Post(ts.URL+"/v1/plan", "application/json", strings.NewReader(body))
		if err != nil || resp.StatusCode != 200 || resp.Header.Get("Memplan-Cache") != "hit" {
			b.Fatalf("%v %v", err, resp)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
}

// BenchmarkNewPlan70B: one request for a llama-3-70b plan (tp 8 × pp 4,
// every stage, with the reserved replay) the server has not seen (the load
// test's new plans, one at a time).
func BenchmarkNewPlan70B(b *testing.B) {
	ts := newServer(b, server.Config{})
	seq := 1024
	defer cpuPerOp(b)()
	for b.Loop() {
		seq += 8
		r := post(b, ts.URL+"/v1/plan", fmt.Sprintf(`{"model": "llama-3-70b", "gpu": "h100", "tp": 8, "pp": 4, "micro_batch": 1, "seq": %d, "no_timeline": true}`, seq))
		if r.status != 200 || r.header.Get("Memplan-Cache") != "miss" {
			b.Fatalf("%d %s", r.status, r.body)
		}
	}
}

// cpuPerOp reports the process's CPU time (user and system, server and
// client together) per operation as cpu-ns/op: on a shared machine the
// wall time per operation measures the other sessions' load, the CPU time
// what a request costs. Call the function it returns when the loop ends.
func cpuPerOp(b *testing.B) func() {
	start := cpuTime()
	return func() {
		if b.N > 0 {
			b.ReportMetric(float64(cpuTime()-start)/float64(b.N), "cpu-ns/op")
		}
	}
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
