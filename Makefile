# The README's two commands are `make demo` and `make test`.
.PHONY: demo test build bench fuzz loadtest loadtest-short

build:
	go build -ldflags "-X github.com/memplan/memplan/cli.Version=$$(git describe --always --dirty 2>/dev/null || echo unknown)" -o bin/memplan ./cmd/memplan

demo:
	go run ./cmd/memplan plan --model llama-3-8b --gpu h100 --micro-batch 1 --seq 4096 --precision bf16

test:
	./scripts/test.sh

# Compare two runs with benchstat (go run golang.org/x/perf/cmd/benchstat old.txt new.txt).
# The fit search over ~20,000 plans takes seconds, so it runs five times.
bench:
	go test -run '^$$' -bench . -benchmem -count 6 $$(go list ./... | grep -v '/search$$') | tee bench.txt
	go test -run '^$$' -bench FitLlama3_70B -benchtime 1x -benchmem -count 5 ./search | tee -a bench.txt
	go test -run '^$$' -bench 'Max.*Llama3_70B' -benchmem -count 6 ./search | tee -a bench.txt

# memplan serve under load on loopback (cmd/loadtest): 200 clients for 60 s asking for a cached plan, new
# llama-3-70b plans at 2 per second; prints a JSON summary, exits 1 on an error or a p99 over its target.
loadtest:
	go run ./cmd/loadtest --clients 200 --duration 60s --new-rate 2 --check

loadtest-short:
	go run ./cmd/loadtest --clients 200 --duration 15s --new-rate 2 --check

fuzz:
	go test ./cli -run '^$$' -fuzz FuzzParseAPIRequest -fuzztime 60s
	go test ./models -run '^$$' -fuzz FuzzParseHFConfig -fuzztime 60s
	go test ./published -run '^$$' -fuzz FuzzRead -fuzztime 60s
	go test ./recipe -run '^$$' -fuzz FuzzParse -fuzztime 60s
	go test ./snapshot -run '^$$' -fuzz '^FuzzParse$$' -fuzztime 60s
	go test ./snapshot -run '^$$' -fuzz FuzzParseTimeline -fuzztime 60s
	go test ./allocator -run '^$$' -fuzz FuzzParseConf -fuzztime 60s
	go test ./engine -run '^$$' -fuzz FuzzPlanTraceSizes -fuzztime 60s -fuzzminimizetime 10s
