# The front door. Every target installs what it needs on a fresh Debian
# machine: redis-server/redis-tools and binaryen (wasm-opt) from apt, Go
# modules through the module proxy. Tool versions are pinned here.

GO          ?= go
BUILD       ?= build
# Go 1.26 or newer builds the filter (go:wasmexport, wasip1 c-shared).
GO_MIN      := 1.26
APT_PKGS    := redis-server redis-tools binaryen
# Bounded fuzzing inside `make test`; `make fuzz` runs longer.
FUZZTIME    ?= 3s
FUZZTIME_LONG ?= 2m

SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

# The filter's packages with files only a wasip1 build compiles (the
# module's main package, the ABI's imports and exports), for go vet under
# GOOS=wasip1. Every other package of the filter has the same files on
# both platforms and the native go vet checks them; vetting them for
# wasip1 would compile their tests' libraries (the sidecar's server,
# go-redis) for a platform those tests never run on.
WASIP1_VET = $$($(GO) list -f '{{if .IgnoredGoFiles}}{{.ImportPath}}{{end}}' ./filter/...)

export EDGELIMIT_BIN_DIR := $(abspath $(BUILD))

.PHONY: all build test test-envoy check bench demo fuzz deps clean help

all: build

help:
	@echo "make demo   build everything, start Redis, the sidecar, two services and the gateway, send a burst"
	@echo "make test   vet and test every package, with -race but for the system tests of ./e2e (installs redis-server when missing)"
	@echo "make test-envoy  the system tests against a real Envoy (ENVOY_BIN, or envoy on the PATH)"
	@echo "make build  build/filter.wasm, build/sidecar, build/gateway"
	@echo "make bench  the benchmark harness"
	@echo "make check  gofmt, vet, go mod tidy: fail on any diff"
	@echo "make fuzz   every fuzz target for $(FUZZTIME_LONG)"
	@echo "make chart  render the Helm chart with Helm's Go API and check every object against the Kubernetes types"
	@echo "make alerts evaluate the chart's alert rules with Prometheus's engine on the metrics of the built binaries under faults"
	@echo "make mesh   decode the Istio and Envoy Gateway examples and check how they fit"
	@echo "make deps   install what the other targets need: redis-server, redis-tools, binaryen (wasm-opt); Go's modules"

## deps: system packages the build, tests, benchmarks and demo run (real
## Redis; wasm-opt for the module).
deps:
	@if ! command -v redis-server >/dev/null || ! command -v redis-cli >/dev/null || ! command -v redis-benchmark >/dev/null || ! command -v wasm-opt >/dev/null; then \
		echo "installing $(APT_PKGS)"; \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(APT_PKGS) >/dev/null; \
	fi
	@$(GO) version | awk -v min=$(GO_MIN) '{ v=$$3; sub(/^go/,"",v); split(v,a,"."); split(min,b,"."); \
		if (a[1]<b[1] || (a[1]==b[1] && a[2]<b[2])) { print "Go " min " or newer is needed, found " v; exit 1 } }'
	@$(GO) mod download

## build: the three deliverables.
build: $(BUILD)/filter.wasm $(BUILD)/sidecar $(BUILD)/gateway

# The go tool decides what is stale; these always ask it.
.PHONY: $(BUILD)/filter.wasm $(BUILD)/sidecar $(BUILD)/gateway
# The module: GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -trimpath,
# then wasm-opt (internal/gotool: the tests build it the same way).
$(BUILD)/filter.wasm: deps
	$(GO) run ./internal/gotool/wasmbuild -o $@ ./filter
	@ls -l $@ | awk '{ printf "filter.wasm: %d bytes\n", $$5 }'
$(BUILD)/sidecar:
	$(GO) build -trimpath -o $@ ./sidecar
$(BUILD)/gateway:
	$(GO) build -trimpath -o $@ ./envoy/gateway

## test: vet, the system tests, then every native package with the race
## detector; the wasm module is tested inside the headless host
## (envoy/wasmhost, from e2e/filterwasm and the system tests). The system
## tests of ./e2e run first, alone and without the race detector, before
## the race run has loaded the machine and its memory: what they test are
## the built binaries in processes of their own, with the shipped 5 ms
## callout timeout, and a load generator slowed tenfold by the detector, or
## other packages' tests running beside them, would take the machine's time
## from the system under test. The packages they drive in-process (the
## harness, the host) are raced in the race run. Their gateways are
## build/gateway, even where an Envoy is installed (ENVOY_BIN set empty):
## make test-envoy runs them against Envoy. Every go command here builds
## with -trimpath, as make build does, so that the system tests reuse
## the packages the build compiled instead of compiling them again
## under other paths (measured once with every cache empty on 2 cores:
## 12 min 57 s against 14 min 10 s without -trimpath). The go test runs
## after `go vet ./...` pass -vet=off: the checks go test would run are a
## subset of what go vet has just run on the same packages and their
## tests, and each build flavour (race, fuzzing) would run them again
## over every dependency. go vet itself runs with -race: it compiles every
## dependency to check a package, and with the race detector's flag those
## are the packages the race run then links instead of compiling them
## again; it checks the same files, but for the one pair chosen by the
## race build tag (make check vets the other). Compiling is most of a
## first run: RATIONALE.md, "What does `make test` cost on a fresh
## machine?".
test: export GOFLAGS := $(strip $(GOFLAGS) -trimpath)
test: deps build
	$(GO) vet -race ./...
	GOOS=wasip1 GOARCH=wasm $(GO) vet $(WASIP1_VET)
	ENVOY_BIN= $(GO) test -vet=off -count=1 -timeout 10m ./e2e
	$(GO) test -race -vet=off -count=1 -timeout 10m $$($(GO) list ./... | grep -v '/e2e$$')
	@$(MAKE) --no-print-directory fuzz FUZZTIME_LONG=$(FUZZTIME)
	@$(MAKE) --no-print-directory chart
	@$(MAKE) --no-print-directory alerts

## test-envoy: the system tests of ./e2e with a real Envoy as every
## gateway, in place of build/gateway: ENVOY_BIN (a path or a command
## name), else the envoy on the PATH. Each gateway runs a bootstrap the
## harness writes from envoy/envoy.yaml (its ports, the module's absolute
## path); tests of what only build/gateway does skip, saying why. Not part
## of make test; .github/workflows/envoy.yml runs it against the oldest
## supported Envoy and the latest.
test-envoy:
	@bin="$(ENVOY_BIN)"; [ -n "$$bin" ] || bin=$$(command -v envoy) || true; \
	if [ -z "$$bin" ]; then \
		echo "make test-envoy: no Envoy: set ENVOY_BIN to an envoy binary or put envoy on the PATH (make test runs these tests against build/gateway)" >&2; exit 1; \
	fi; \
	command -v "$$bin" >/dev/null || { echo "make test-envoy: ENVOY_BIN=$$bin is not an executable" >&2; exit 1; }
	@$(MAKE) --no-print-directory deps build
	@bin="$(ENVOY_BIN)"; [ -n "$$bin" ] || bin=$$(command -v envoy); bin=$$(realpath "$$(command -v "$$bin")"); \
	echo "test-envoy: $$bin, $$("$$bin" --version | tr -s '\n' ' ')"; \
	echo "ENVOY_BIN=$$bin $(GO) test -count=1 -timeout 15m ./e2e"; \
	ENVOY_BIN="$$bin" $(GO) test -count=1 -timeout 15m ./e2e

## check: formatting, vet and module tidiness; fails on any diff.
check: deps
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	GOOS=wasip1 GOARCH=wasm $(GO) vet $(WASIP1_VET)
	$(GO) mod tidy -diff

## bench: the benchmark harness. What a system call and a hop between
## processes cost on this machine; the script and the sidecar beside
## redis-benchmark, the sidecar beside envoyproxy/ratelimit (at 50 clients
## over 10,000 keys, 10 over 1,000 and 200 over 100,000), the filter in
## wazero beside its native path, the memory of the filter, the sidecar and
## Redis, then the scenarios (incident, noisy neighbour, latency budget,
## throughput, fail open), the burst sweep, the callouts-together sweep and
## Redis flapping under a bursting client, on_failure open against local,
## side by side; writes e2e/bench/results/ and BENCHMARKS.md from the run.
## envoyproxy/ratelimit and its gRPC load generator come from the bench's
## own module (e2e/bench/rls/go.mod pins the version), so the main module
## does not pull their dependencies.
bench: deps build
	@command -v wrk >/dev/null || { echo "installing wrk (the sidecar benchmark's load generator)"; \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk >/dev/null; }
	$(GO) build -C e2e/bench/rls -trimpath -o $(EDGELIMIT_BIN_DIR)/ratelimit github.com/envoyproxy/ratelimit/src/service_cmd
	$(GO) build -C e2e/bench/rls -trimpath -o $(EDGELIMIT_BIN_DIR)/rlsload ./rlsload
	$(GO) run ./e2e/bench/machinecost -out e2e/bench/results/machinecost.txt
	$(GO) run ./e2e/bench/scriptbench -out e2e/bench/results/scriptbench.txt
	$(GO) run ./e2e/bench/sidecarbench -out e2e/bench/results/sidecarbench.txt
	$(GO) run ./e2e/bench/sidecarbench -c 10 -keys 1000 -out e2e/bench/results/sidecarbench-c10.txt
	$(GO) run ./e2e/bench/sidecarbench -c 200 -keys 100000 -out e2e/bench/results/sidecarbench-c200.txt
	$(GO) run ./e2e/bench/filtercost -out e2e/bench/results/filtercost.txt
	$(GO) run ./e2e/bench/memory all -bin $(EDGELIMIT_BIN_DIR) -out e2e/bench/results/memory.txt
	$(GO) run ./e2e/bench -bin $(EDGELIMIT_BIN_DIR)

## demo: a real burst against the limiter.
demo: deps build
	$(GO) run ./e2e/demo -bin $(EDGELIMIT_BIN_DIR)

## fuzz: every fuzz target (found in the sources) for FUZZTIME_LONG each;
## `make test` runs them for FUZZTIME. A failing input is written under the
## package's testdata/fuzz/, where it stays as a regression case. A run that
## fails without writing one is the fuzzing engine's own failure, not the
## target's: Go before 1.27 can report the -fuzztime deadline itself as
## "context deadline exceeded" (go.dev/issue/75804), more often on a starved
## machine. Such a run is tried up to twice more before it counts. Vet is
## make check's and make test's job, not fuzzing's (-vet=off).
fuzz:
	@set -e; log=$$(mktemp); trap 'rm -f $$log' EXIT; \
	for f in $$(grep -rl --include='*_test.go' '^func Fuzz' .); do \
		dir=$$(dirname $$f); \
		for t in $$(sed -n 's/^func \(Fuzz[A-Za-z0-9_]*\)(.*/\1/p' $$f); do \
			echo "fuzz $$dir $$t ($(FUZZTIME_LONG))"; \
			for try in 1 2 3; do \
				before=$$(ls $$dir/testdata/fuzz/$$t 2>/dev/null | wc -l); \
				if $(GO) test -vet=off -run '^$$' -fuzz "^$$t$$" -fuzztime $(FUZZTIME_LONG) $$dir >$$log 2>&1; then break; fi; \
				after=$$(ls $$dir/testdata/fuzz/$$t 2>/dev/null | wc -l); \
				if [ $$try = 3 ] || [ $$after != $$before ]; then tail -40 $$log; exit 1; fi; \
				echo "fuzz $$dir $$t: the engine failed without a failing input; once more"; tail -5 $$log; \
			done; \
		done; \
	done

## chart: render deploy/helm/edgelimit with Helm's Go API and check every
## object against the Kubernetes types (deploy/charttest, a module of its
## own so the main module does not pull Helm; `go tool helm` there too),
## and the pod lookups it shares with deploy/meshtest (deploy/podspec).
## The rendered sidecar and bootstrap go through build/sidecar -check and
## build/gateway -check.
.PHONY: chart
chart: build
	cd deploy/podspec && $(GO) test -count=1 ./...
	cd deploy/charttest && $(GO) test -count=1 ./...

## alerts: the chart's alert rules evaluated with Prometheus's query
## engine against the metrics of build/gateway and build/sidecar scraped
## under normal traffic and under faults (deploy/alerttest, a module of its
## own so the main module does not pull Prometheus; deploy/README.md, "The
## alerts' test").
.PHONY: alerts
alerts: build
	cd deploy/alerttest && $(GO) test -count=1 ./...

## mesh: decode deploy/mesh's Istio and Envoy Gateway examples with those
## projects' Go API types and check that their pieces fit, and parse the
## Wasm image's Dockerfile stage with BuildKit's parser (deploy/meshtest, a
## module of its own so the main module does not pull them). The examples'
## filter configurations go through filter/configcheck, run in the main
## module. Not part of make test: compiling those API packages on a fresh
## machine takes over two minutes, which make test's 15-minute budget on 2
## cores does not have to spare.
.PHONY: mesh
mesh:
	cd deploy/meshtest && GO=$(GO) $(GO) test -count=1 ./...

clean:
	rm -rf $(BUILD)
