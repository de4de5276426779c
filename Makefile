# steward-trustd. `make run-local` runs a real trustd on loopback; `make test`
# runs every test (race detector on, swtpm and SoftHSMv2 required).

GO        ?= go
BIN       ?= bin
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS   := -s -w -X main.version=$(VERSION)
IMAGE     ?= ghcr.io/steward-trustd/steward-trustd
PLATFORMS ?= linux/amd64,linux/arm64
LOCAL     ?= .local
PORT      ?= 50001
# Tests that need swtpm or SoftHSMv2 fail instead of skipping when set.
export STEWARD_REQUIRE_DEVICES = 1

.PHONY: all deps build build-all build-gencreds build-ceremony run-local test test-unit test-talos test-attack bench-attack test-coverage lint fuzz bench fleet-boot docker-build docker-buildx clean

all: build-all

deps:
	@./hack/deps.sh

build:
	$(GO) build -trimpath -ldflags "$(LDFLAGS)" -o $(BIN)/ ./cmd/steward-trustd

build-gencreds:
	$(GO) build -trimpath -ldflags "$(LDFLAGS)" -o $(BIN)/ ./cmd/steward-trustd-gencreds

build-ceremony:
	$(GO) build -trimpath -ldflags "$(LDFLAGS)" -o $(BIN)/ ./cmd/steward-trustd-ceremony

build-all:
	$(GO) build -trimpath -ldflags "$(LDFLAGS)" -o $(BIN)/ ./cmd/...

# A real trustd on 127.0.0.1:$(PORT) with credentials made on first run.
run-local: deps build-all
	@./hack/run-local.sh "$(BIN)" "$(LOCAL)" "$(PORT)"

test: deps lint test-unit test-talos test-attack

test-unit:
	$(GO) test -race -count=1 ./...

# Talos's own worker client against the daemon (separate module).
test-talos:
	cd test/talos && $(GO) test -race -count=1 $$($(GO) list ./... | grep -v /attack)

# Talos's worker code against the daemon under hostile clients (loopback,
# ~20 s); without -race, since it measures the daemon's memory and latency.
test-attack:
	cd test/talos && $(GO) test -count=1 ./attack

# The README's front-door benchmark: 200 worker attempts per attack.
bench-attack:
	cd test/talos && $(GO) test -count=1 -run TestAttacks -v ./attack -args -attempts=200

test-coverage: deps
	$(GO) test -race -count=1 -coverprofile=coverage.out ./...
	$(GO) tool cover -func=coverage.out | tail -1

# gofmt, go vet and golangci-lint (errorlint, cyclop 20, gocognit 30, …;
# see .golangci.yml) on both modules. golangci-lint is pinned in
# hack/tools/go.mod and built into $(BIN) on first use.
GOLANGCI_LINT := $(BIN)/golangci-lint

$(GOLANGCI_LINT): hack/tools/go.mod hack/tools/go.sum
	@echo "building golangci-lint (pinned in hack/tools/go.mod; first time takes a few minutes)"
	cd hack/tools && $(GO) build -o $(abspath $(GOLANGCI_LINT)) github.com/golangci/golangci-lint/v2/cmd/golangci-lint

lint: $(GOLANGCI_LINT)
	@bad=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	  if [ -n "$$bad" ]; then echo "gofmt needed:"; echo "$$bad"; exit 1; fi
	$(GO) vet ./...
	cd test/talos && $(GO) vet ./...
	$(GOLANGCI_LINT) run ./...
	cd test/talos && $(abspath $(GOLANGCI_LINT)) run --config ../../.golangci.yml ./...

# Short fuzzing runs of every fuzz target.
fuzz:
	@for p in $$($(GO) list ./...); do \
	  for f in $$($(GO) test -list '^Fuzz' $$p 2>/dev/null | grep '^Fuzz'); do \
	    echo "== $$p $$f"; $(GO) test -run=XXX -fuzz="^$$f$$" -fuzztime=20s $$p || exit 1; \
	  done; \
	done

bench: deps
	$(GO) test -run=XXX -bench=. -benchtime=2s ./...
	cd test/talos && $(GO) test -run=XXX -bench=. -benchtime=3s ./...

# 5,000 workers arriving within 10 s against the file, SoftHSM and swtpm backends,
# and 1,000 against swtpm slowed to a 60 ms TPM chip (hack/fleet-boot.sh: BACKENDS, WORKERS, TPM_WORKERS).
fleet-boot: deps build-all
	$(GO) build -o $(BIN)/ ./test/load
	./hack/fleet-boot.sh $(BIN)

docker-build:
	docker build --build-arg VERSION=$(VERSION) -t $(IMAGE):$(VERSION) .

docker-buildx:
	docker buildx build --platform $(PLATFORMS) --build-arg VERSION=$(VERSION) -t $(IMAGE):$(VERSION) --push .

clean:
	rm -rf $(BIN) $(LOCAL) coverage.out
