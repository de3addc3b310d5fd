# ratelimit-authz — `make help` lists the targets.
SHELL := bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

GO       ?= go
VERSION  ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS  := -s -w -X main.version=$(VERSION)
BIN      := bin/ratelimit-authz
PKGS     := ./...
# The packaging module (image builder, manifest and dashboard validators):
# its own go.mod, so its dependencies stay out of the server's.
DEPLOY   := deploy
# Whole suite under the race detector; every test has its own timeouts too.
TESTFLAGS ?= -race -count=1 -shuffle=on -timeout 10m

.PHONY: help
help: ## list the targets
	@grep -hE '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

.PHONY: build
build: ## build bin/ratelimit-authz (static, version stamped)
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN) ./cmd/ratelimit-authz

.PHONY: run
run: build ## serve with config/ratelimit.yaml on 127.0.0.1:9001 (gRPC), :9002 (lean Check listener, envoy/ratelimit-authz.yaml's ext_authz target) and :9090 (HTTP); the live view on :9095 (/ and /v1/top)
	./$(BIN) serve --config config/ratelimit.yaml --check-addr 127.0.0.1:9002 --log-level $${LOG_LEVEL:-info}

.PHONY: app
app: ## serve the example app behind envoy/ratelimit-authz.yaml on 127.0.0.1:8080 (200 for everything, 401 for a bad login)
	$(GO) -C $(DEPLOY) run ./cmd/exampleapp --addr 127.0.0.1:8080

.PHONY: tools
tools: ## install what the tests need: Envoy, nats-server and h2spec (into .tools/), PostgreSQL and Chromium (apt, when missing)
	@scripts/install-envoy.sh >/dev/null
	@scripts/install-postgres.sh >/dev/null
	@scripts/install-nats.sh >/dev/null
	@scripts/install-h2spec.sh >/dev/null
	@scripts/install-chromium.sh >/dev/null

.PHONY: test
test: lint tools ## vet, format and tidy checks, every test under -race (server and deploy/), then a short run of every fuzz target
	$(GO) test $(TESTFLAGS) $$($(GO) list $(PKGS) | grep -vx '$(E2EPKG)')
	$(GO) test -count=1 -timeout 2m ./internal/sockio/ # its raw system calls are the build without -race
	$(GO) test -count=1 -timeout 2m -run 'Allocations' ./internal/checkh2/ ./internal/rls/ ./internal/checkwire/ ./internal/authz/ # allocation budgets, judged without -race
	$(GO) test -count=1 -timeout 2m -run 'TestStallAtEnvoyRateKeepsTheConnection' ./internal/checkh2/ # its load, judged without -race
	$(GO) test $(TESTFLAGS) ./test/e2e/
	$(GO) test -count=1 -timeout 5m -run 'TestLeanListenerSurvivesStallThroughEnvoy' ./test/e2e/ # its load, judged without -race
	$(GO) -C $(DEPLOY) test $(TESTFLAGS) ./...
	FUZZTIME=$(FUZZTIME) scripts/fuzz.sh

# The end-to-end tests run alone, after the others: they judge admissions
# per second through real Envoy, NATS and Postgres processes, which a
# machine also running the race-enabled unit tests can starve.
E2EPKG := github.com/ratelimit-authz/ratelimit-authz/test/e2e

# Inputs each fuzz target runs in `make test` (a count: see scripts/fuzz.sh);
# `make fuzz FUZZTIME=5m` for a longer run.
FUZZTIME ?= 10000x

.PHONY: fuzz
fuzz: ## run every fuzz target for FUZZTIME (default 10000x inputs) each
	FUZZTIME=$(FUZZTIME) scripts/fuzz.sh

.PHONY: e2e
e2e: tools ## only the end-to-end tests through a real Envoy
	$(GO) test -count=1 -v -timeout 10m ./test/e2e/

# The demo installs the pinned Envoy itself (scripts/install-envoy.sh);
# it needs no PostgreSQL or NATS. DEMOFLAGS=--keep-logs keeps the logs.
.PHONY: demo
demo: build ## one node, Envoy and an app on free ports: burst every bucket, print allowed vs 429
	$(GO) run ./cmd/ratelimit-demo --server-bin $(BIN) $(DEMOFLAGS)

.PHONY: up
up: build ## the demo's stack (node, Envoy, the example app, the live view) kept up until Ctrl-C, with what to try against it
	$(GO) run ./cmd/ratelimit-demo --server-bin $(BIN) --stay $(DEMOFLAGS)

.PHONY: bench
bench: ## benchmarks (~10 min, a quiet machine): microbenchmarks, the floor (CPU per check pinned, vs no-ops, the baseline commit and the anchors), memory, cluster accuracy, Envoy end to end, replication at scale; writes bench/results/REPORT.md
	bench/run.sh $(BENCHFLAGS)

.PHONY: lint
lint: fmt-check vet tidy-check ## gofmt, go vet, go mod tidy checks

.PHONY: vet
vet:
	$(GO) vet $(PKGS)
	$(GO) -C $(DEPLOY) vet ./...

.PHONY: fmt-check
fmt-check:
	@out=$$(gofmt -l $$(git ls-files --cached --others --exclude-standard '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi

.PHONY: tidy-check
tidy-check:
	$(GO) mod tidy -diff
	$(GO) -C $(DEPLOY) mod tidy -diff

# The image is built without a container engine: the static binary on an
# empty base, written reproducibly (same commit, same digest) as an OCI
# layout (bin/image: skopeo copy oci:bin/image:$(VERSION) docker://…) and a
# tarball for `docker load`. IMAGE_LICENSE is the SPDX licence label.
IMAGE_LICENSE ?= NOASSERTION
IMAGE_ARCH    ?= $(shell $(GO) env GOARCH)

.PHONY: image
image: ## build the container image without an engine: bin/image (OCI layout) and bin/ratelimit-authz-image.tar
	CGO_ENABLED=0 GOARCH=$(IMAGE_ARCH) $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o bin/image-$(IMAGE_ARCH)/ratelimit-authz ./cmd/ratelimit-authz
	rm -rf bin/image bin/ratelimit-authz-image.tar
	$(GO) -C $(DEPLOY) run ./cmd/build-image \
		--binary $(CURDIR)/bin/image-$(IMAGE_ARCH)/ratelimit-authz --config $(CURDIR)/config/ratelimit.yaml \
		--version $(VERSION) --revision $$(git rev-parse HEAD 2>/dev/null || echo unknown) \
		--license '$(IMAGE_LICENSE)' --arch $(IMAGE_ARCH) \
		--layout $(CURDIR)/bin/image --tarball $(CURDIR)/bin/ratelimit-authz-image.tar

.PHONY: check-config
check-config: build ## validate config/ratelimit.yaml
	./$(BIN) check-config --config config/ratelimit.yaml

.PHONY: clean
clean: ## remove build output (keeps .tools)
	rm -rf bin
