# One Go module per folder; `go test ./...` does not work at a workspace
# root, so every target walks the modules.
MODULES := core client adapters/nethttp adapters/gin adapters/echo adapters/fiber adapters/grpc stores/internal stores/pgx stores/sql stores/gorm stores/redis cmd/idemctl observers/prometheus observers/otel conformance examples
GO      ?= go
BIN     := $(CURDIR)/bin
STATICCHECK_VERSION := v0.8.2

# make fuzz runs each fuzz target for FUZZTIME (default 30s each, about 5 minutes in all).
FUZZTIME ?= 30s
# make soak runs the long crash and contention soaks for SOAKTIME (default 10m).
SOAKTIME ?= 10m

.PHONY: test services lint fuzz bench soak tidy nemesis nemesis-short nemesis-deps

## test: start the services the tests need, then test every module with -race,
## three modules at a time (TESTJOBS; scripts/test.sh prints each module's
## output when it ends and the time of each), then the bench module's
## round-trip bounds on MariaDB, SQLite and Redis (about 5 s; its own tables
## and keys) and its pgbench scripts against the stores' schema (it replaces
## the idem_bench tables: not beside the load generator), and last a 60 s
## round of make nemesis (nemesis-short: its own PostgreSQL cluster and
## network namespace; needs root and iptables, installed when missing).
TESTJOBS ?= 3
# Slowest first, so that the parallel lanes end together.
TEST_ORDER := stores/sql examples stores/redis stores/gorm stores/pgx conformance core cmd/idemctl client adapters/nethttp adapters/gin adapters/echo adapters/fiber adapters/grpc stores/internal observers/prometheus observers/otel
ifneq ($(sort $(MODULES)),$(sort $(TEST_ORDER)))
$(error TEST_ORDER must list every module of MODULES, and only those)
endif
test: services nemesis-deps
	@JOBS=$(TESTJOBS) GO=$(GO) bash scripts/test.sh $(TEST_ORDER)
	@echo "== bench (TestRoundTripsOtherStores, TestPgbenchScripts)"
	@cd bench && $(GO) test -race -count=1 -timeout 5m -run '^(TestRoundTripsOtherStores|TestPgbenchScripts)$$' .
	@echo "== nemesis-short"
	@cd examples && $(GO) run ./nemesis $(NEMESIS_SHORT)

## services: make sure PostgreSQL, MariaDB, Redis and a three-node Redis Cluster are up (installs them if missing).
services:
	@bash scripts/services.sh

$(BIN)/staticcheck:
	GOBIN=$(BIN) $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)

## lint: go vet, gofmt and staticcheck on every module; the modules require
## their siblings at one release version and go mod tidy changes nothing.
lint: $(BIN)/staticcheck
	@set -e; out=$$(gofmt -l $(MODULES)); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	@bash scripts/release.sh --check
	@set -e; for m in $(MODULES); do \
		echo "== lint $$m"; \
		(cd $$m && $(GO) vet ./... && $(BIN)/staticcheck ./...); \
	done

## tidy: go mod tidy in every module (GOWORK=off, as make lint checks it).
tidy:
	@set -e; for m in $$(git ls-files '*go.mod' | xargs -n1 dirname | sort -u); do \
		echo "== tidy $$m"; (cd $$m && GOWORK=off $(GO) mod tidy); \
	done

## fuzz: run every fuzz target (scripts/fuzz.sh finds them) for FUZZTIME each.
fuzz:
	@GO=$(GO) FUZZTIME=$(FUZZTIME) bash scripts/fuzz.sh

## bench: the short benchmark run (see BENCHMARKS.md for the long form).
bench: services
	@set -e; for m in $(MODULES); do \
		(cd $$m && $(GO) test -run '^$$' -bench . -benchmem -benchtime 2000x ./...); \
	done
	cd bench && $(GO) test -count=1 -v -run 'TestRoundTrips|TestWALPerRequest' . && $(GO) test -run '^$$' -bench Fiber -benchmem -benchtime 2000x . && (cd fiberv3 && GOWORK=off $(GO) test -run '^$$' -bench . -benchmem -benchtime 2000x .) && $(GO) run ./cmd/loadgen -duration 3s -warmup 500ms

## nemesis: the example service through faults outside its process (its own
## PostgreSQL crashed and restarted, a partition, packet loss, latency, a link
## down, an instance SIGKILLed), then the history checked key by key; about 5
## minutes, NEMESISFLAGS for more (-duration 1m -stores pgx). Needs root and
## iptables (installed when missing). make nemesis-short runs a 60 s round of it.
NEMESISFLAGS ?=
# The short round: 30 s per store, every fault once, shorter.
NEMESIS_SHORT := -duration 60s -gap 1s -partition 7s -hold 4s
nemesis: nemesis-deps
	cd examples && $(GO) run ./nemesis $(NEMESISFLAGS)

## nemesis-short: a 60 s round of make nemesis, about 2 minutes with the build.
nemesis-short: nemesis-deps
	cd examples && $(GO) run ./nemesis $(NEMESIS_SHORT)

nemesis-deps:
	@command -v iptables >/dev/null || (DEBIAN_FRONTEND=noninteractive apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iptables)

## soak: long crash and contention soaks, bounded by SOAKTIME.
soak: services
	@set -e; for m in $(MODULES); do \
		(cd $$m && IDEM_SOAK=$(SOAKTIME) $(GO) test -race -count=1 -v -timeout 60m -run 'Soak|ManyInstances' ./...); \
	done
