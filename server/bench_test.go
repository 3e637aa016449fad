package server_test

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/memplan/memplan/server"
)

// BenchmarkCachedPlan: one request for a plan the server has cached, over
// loopback HTTP (the load test's cached requests, one at a time).
func BenchmarkCachedPlan(b *testing.B) {
	ts := newServer(b, server.Config{})
	body := `{"model": "llama-3-70b", "gpu": "h100", "tp": 8, "pp": 4, "micro_batch": 1, "seq": 4096, "no_timeline": true}`
	post(b, ts.URL+"/v1/plan", body)
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
	for b.Loop() {
		seq += 8
		r := post(b, ts.URL+"/v1/plan", fmt.Sprintf(`{"model": "llama-3-70b", "gpu": "h100", "tp": 8, "pp": 4, "micro_batch": 1, "seq": %d, "no_timeline": true}`, seq))
		if r.status != 200 || r.header.Get("Memplan-Cache") != "miss" {
			b.Fatalf("%d %s", r.status, r.body)
		}
	}
}
