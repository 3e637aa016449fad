# The README's two commands are `make demo` and `make test`.
.PHONY: demo test build bench fuzz probes loadtest loadtest-short

build:
	go build -ldflags "-X github.com/memplan/memplan/cli.Version=$$(git describe --always --dirty 2>/dev/null || echo unknown)" -o bin/memplan ./cmd/memplan

# The demo job does not fit one H100 (its next step says what would): memplan exits 3 for that answer, which
# is the demo working, not make failing; any other non-zero status still fails the target.
# (go run reports any non-zero status as 1, so the binary is built first.)
demo:
	@go build -o bin/memplan ./cmd/memplan
	@bin/memplan plan --model llama-3-8b --gpu h100 --micro-batch 1 --seq 4096 --precision bf16; \
	s=$$?; if [ $$s -eq 3 ]; then echo "(exit status 3: the job does not fit, as the demo shows)"; exit 0; fi; exit $$s

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

# Issue 15's adversarial corpus alone (testdata/probes/*.txt, also part of `make test`): every probe as a built
# binary, two at a time, each under 10 s and 2 GiB; -v prints the count, the time and the eight slowest probes.
probes:
	go test ./cmd/memplan -run '^TestProbes$$' -count=1 -v

# Every fuzz target, one at a time. FUZZTIME is each target's budget: an exec count (1000000x, the issue-15
# long run) or a duration (60s); FUZZPARALLEL the worker processes (default 1: the machine is shared).
# -fuzzminimizetime bounds the shrinking of a new input, which for a trace once took the whole run.
# `make fuzz FUZZTIME=30s` is the short run; README's "Fuzzing" table has the long run's numbers.
FUZZTIME ?= 1000000x
FUZZPARALLEL ?= 1
FUZZMINIMIZE ?= 10s
FUZZ_TARGETS = units:FuzzParseBytes allocator:FuzzParseConf hw:FuzzParseCluster recipe:FuzzParse \
	published:FuzzRead snapshot:FuzzParse snapshot:FuzzParseTimeline pack:FuzzParse pack:FuzzParseArrivals \
	k8s:FuzzParseWorkload k8s:FuzzDecodePods workload:FuzzParse cli:FuzzParseAPIRequest models:FuzzParseHFConfig \
	importer/torchtrace:FuzzParse server:FuzzPagePath engine:FuzzPlanTraceSizes cli:FuzzPlanFlags \
	internal/yamlerr:FuzzToJSON validate:FuzzParseMeasured
fuzz:
	@set -e; for t in $(FUZZ_TARGETS); do \
		echo "== ./$${t%%:*} $${t##*:}"; \
		go test ./$${t%%:*} -run '^$$' -fuzz "^$${t##*:}\$$" -fuzztime $(FUZZTIME) \
			-fuzzminimizetime $(FUZZMINIMIZE) -parallel $(FUZZPARALLEL); \
	done
