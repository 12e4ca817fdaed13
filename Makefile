# devicehub: `make run` and `make test` are all a new user needs.
GO        ?= go
PKGS      := ./...
HTTP_ADDR ?= 127.0.0.1:8848
export DEVICEHUB_MQTT_PORT ?= 1884

.PHONY: run test services build fmt vet lint fuzz bench bench-go clean cluster cluster-stop test-cluster

## services: install (if missing) and start PostgreSQL, ClickHouse and Mosquitto; idempotent.
services:
	@bash .ci/services

## build: the server and tools into bin/.
build:
	$(GO) build -o bin/ ./cmd/...

## run: bring up the services, migrate, and serve on $(HTTP_ADDR) (login admin / admin123).
run: services build
	DEVICEHUB_HTTP_ADDR=$(HTTP_ADDR) ./bin/devicehub

## test: vet, every test with the race detector against the real services,
## then each fuzz target for FUZZ_SHORT. Tests that own their databases and
## servers call t.Parallel: they mostly wait (on PostgreSQL, ClickHouse, the
## broker), so TEST_PARALLEL of them run at once in a package, more than
## go test's default (GOMAXPROCS). TEST_P packages run at once (go test's
## -p, 2 by default here): with 4 on 2 cores the whole run took 8 min 29 s
## against 10 min 6 s with 2 (the same code, the same hour), but tests'
## own time bounds (a 10,000-device bulk create, an export's deadline, the
## dashboard bench's) ran out under the contention. TEST_PKGS names the longest packages first so that they
## start first and the short ones fill in beside them (go test starts
## packages in the order named; ./... adds the rest once). bench leads:
## alone here it takes about 2 min, most of it two serial scenario tests
## that wait on pacing, api about 1 min since its databases are in tmpfs.
TEST_PARALLEL ?= 4
TEST_P        ?= 2
TEST_PKGS     ?= ./bench ./api ./cmd/devicehub ./tsdb ./meta ./ingest/alarm ./ingest ./api/dashboard $(PKGS)
test: services vet
	$(GO) test -race -count=1 -timeout 45m -p $(TEST_P) -parallel $(TEST_PARALLEL) $(TEST_PKGS)
	@$(MAKE) --no-print-directory fuzz FUZZTIME=$(FUZZ_SHORT)

fmt:
	gofmt -w $$(git ls-files '*.go')

vet:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || (gofmt -l $$(git ls-files '*.go'); echo "gofmt needed"; exit 1)
	$(GO) vet $(PKGS)

## lint: vet and the gofmt check, go.mod and go.sum tidy, staticcheck (a
## pinned version, built by `go run` from the module proxy; .ci/run runs it),
## and the OpenAPI document linted by Redocly CLI (a pinned npm package that
## .ci/openapi-lint installs into .ci/.tools/ on first use; needs Node.js 20+).
STATICCHECK ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2
lint: vet
	@$(GO) mod tidy -diff || (echo "go.mod or go.sum is not tidy: run go mod tidy"; exit 1)
	$(GO) run $(STATICCHECK) $(PKGS)
	bash .ci/openapi-lint

## fuzz: run each fuzz target for FUZZTIME (default 30s); `make test` runs
## them for FUZZ_SHORT executions. A crash is saved under testdata/fuzz: commit it.
## A package's test binary is built once with the fuzzing instrumentation
## (`go test -c -fuzz .`) and run for each of its targets from the package's
## folder, with the corpus cache `go test -fuzz` uses ($GOCACHE/fuzz/<import
## path>): the same fuzzing as one `go test -fuzz` per target, without
## linking the binary again for each (ingest/wire has 8 targets).
## FUZZ_SHORT is a count, not a duration: in Go 1.26 a duration -fuzztime can
## fail a clean target with a bare "context deadline exceeded" when the
## deadline fires while a worker is mid-call (golang/go#75804, fixed in Go
## 1.27); a count has no deadline to race. 10000x takes 1-6 s per target here.
FUZZTIME   ?= 30s
FUZZ_SHORT ?= 10000x
FUZZ_TARGETS := \
	./meta/:FuzzCompileQuery \
	./meta/:FuzzDecodeDevicesCSV \
	./schema/:FuzzParseThingModel \
	./ingest/wire/:FuzzParseTopic \
	./ingest/wire/:FuzzDecodeReport \
	./ingest/wire/:FuzzParseNumber \
	./ingest/wire/:FuzzDecodeEvent \
	./ingest/wire/:FuzzDecodePresence \
	./ingest/wire/:FuzzDecodeReply \
	./ingest/wire/:FuzzDecodeFirmwareProgress \
	./ingest/wire/:FuzzDecodeFirmwareVersion \
	./api/:FuzzCheckJSONText \
	./api/dashboard/:FuzzDashboardQuery \
	./api/dashboard/:FuzzDecodeQueriesFast \
	./bench/mqttc/:FuzzDecode
fuzz:
	@set -e; bin=$$(mktemp -d); trap 'rm -rf "$$bin"' EXIT; \
	cache=$$($(GO) env GOCACHE)/fuzz; \
	for t in $(FUZZ_TARGETS); do \
		pkg=$${t%%:*}; fn=$${t##*:}; exe=$$bin/$$(echo "$$pkg" | tr -c 'A-Za-z0-9\n' _)test; \
		if [ ! -x "$$exe" ]; then \
			if ! out=$$($(GO) test -c -fuzz . -o "$$exe" $$pkg 2>&1); then echo "$$out" | tail -40; exit 1; fi; \
		fi; \
		echo "fuzz $$fn ($$pkg) for $(FUZZTIME)"; \
		corpus=$$cache/$$($(GO) list $$pkg); \
		if ! out=$$(cd $$pkg && "$$exe" -test.paniconexit0 -test.run '^$$' -test.fuzz "^$$fn\$$" -test.fuzztime $(FUZZTIME) \
				-test.fuzzcachedir "$$corpus" 2>&1); then \
			echo "$$out" | tail -40; exit 1; fi; \
		case "$$out" in *"no fuzz tests to fuzz"*) echo "$$pkg has no fuzz target $$fn: FUZZ_TARGETS is out of date"; exit 1;; esac; \
	done

## cluster: a local scale-out setup (REFERENCE.md "Scaling out"): ZooKeeper, ClickHouse
## 2 shards x 2 replicas and two devicehub instances (:8851, :8852); cluster-stop
## stops it. It keeps a small machine busy: stop it when done.
cluster: services
	@bash .ci/cluster start

cluster-stop:
	@bash .ci/cluster stop

## test-cluster: the cluster tests (tsdb, cmd/devicehub TestCluster) against
## the local ClickHouse cluster, started for them and stopped after
## (unless it was running).
test-cluster: services
	@bash .ci/cluster test

## bench: every scenario of cmd/bench with its ceilings; report in bench/results/.
## The dashboard's mixed run (distinct queries under live ingest) is small
## here (200,000 messages, 5,000 requests a run); BENCHMARKS.md's figures
## come from `go run ./cmd/bench dashboard-mixed -dash-mixed-msgs N
## -dash-mixed-kinds counts,aggs -dash-mixed-requests 150000
## -dash-mixed-uncached-requests 300` at 1M and, with -dash-keep, 100M.
bench: services
	$(GO) run ./cmd/bench all

## bench-go: the in-process Go benchmarks.
bench-go: services
	$(GO) test -run '^$$' -bench . -benchmem $(PKGS)

clean:
	rm -rf bin
