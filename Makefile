# The README's two commands are `make demo` and `make test`.
.PHONY: demo test build bench fuzz

build:
	go build -o bin/memplan ./cmd/memplan

demo:
	go run ./cmd/memplan plan --model llama-3-8b --gpu h100 --micro-batch 1 --seq 4096 --precision bf16

test:
	./scripts/test.sh

bench:
	go test -run '^$$' -bench . -benchmem -count 6 ./... | tee bench.txt

fuzz:
	go test ./models -run '^$$' -fuzz FuzzParseHFConfig -fuzztime 60s
