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

.PHONY: test-k8s test-image e2e vulncheck
.PHONY: test-authorizer build-authorizer
.PHONY: all deps build build-all build-gencreds build-ceremony run-local run-local-notice clean-local test-alerts test test-unit test-talos test-attack bench-attack test-deploy test-coverage lint fuzz bench fleet-boot image image-smoke docker-build docker-buildx clean

all: build-all

# hack/deps.sh runs once per version of it: a stamp named by its content's
# hash, in a cache directory outside the repository, records that it
# succeeded on this machine (run ./hack/deps.sh itself to check again).
DEPS_STAMP := $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/steward-trustd/deps-$(shell sha256sum hack/deps.sh | cut -c1-16)

deps: $(DEPS_STAMP)

$(DEPS_STAMP):
	@./hack/deps.sh
	@mkdir -p $(dir $@) && touch $@

build:
	$(GO) build -trimpath -ldflags "$(LDFLAGS)" -o $(BIN)/ ./cmd/steward-trustd

build-gencreds:
	$(GO) build -trimpath -ldflags "$(LDFLAGS)" -o $(BIN)/ ./cmd/steward-trustd-gencreds

build-ceremony:
	$(GO) build -trimpath -ldflags "$(LDFLAGS)" -o $(BIN)/ ./cmd/steward-trustd-ceremony

build-all:
	$(GO) build $(BUILDFLAGS) -trimpath -ldflags "$(LDFLAGS)" -o $(BIN)/ ./cmd/...

# steward-trustd-authorizer is its own module (client-go stays out of the
# daemon's graph).
build-authorizer:
	cd cmd/steward-trustd-authorizer && $(GO) build -trimpath -ldflags "$(LDFLAGS)" -o $(abspath $(BIN))/ .

# Its Kubernetes sources run against a real kube-apiserver (hack/k8s-build.sh,
# cached) and etcd, with Cluster API's Machine CRD from the module cache.
test-authorizer: deps
	cd cmd/steward-trustd-authorizer && bin=$$(../../hack/k8s-build.sh kube-apiserver) && STEWARD_K8S_BIN=$$bin $(GO) test -race -count=1 ./...

# A real trustd on 127.0.0.1:$(PORT) with credentials made on first run;
# swtpm sits behind steward-tpm-relay so the ceremony can run alongside.
# The build lists each package it compiles (-v): the first one fetches
# modules and compiles the Talos machinery for a few minutes.
run-local: BUILDFLAGS = -v
run-local: deps run-local-notice build-all
	@./hack/run-local.sh "$(BIN)" "$(LOCAL)" "$(PORT)"

run-local-notice:
	@echo "building $(BIN)/steward-trustd, the ceremony and steward-tpm-relay (the first build takes a few minutes; packages are listed as they compile)" >&2

test: deps lint test-unit test-authorizer test-talos test-attack test-deploy test-k8s test-image e2e

test-unit:
	$(GO) test -race -count=1 ./...

# Talos's own worker client against the daemon (separate module); also
# runs the image (TestImage) and the systemd unit's sandbox (TestSystemdUnit).
test-talos:
	cd test/talos && $(GO) test -race -count=1 $$($(GO) list ./... | grep -v /attack)

# Talos's worker code against the daemon under hostile clients (loopback,
# ~90 s with the storm against swtpm); without -race, since it measures the
# daemon's memory and latency.
test-attack:
	cd test/talos && $(GO) test -count=1 ./attack

# The README's front-door benchmark: 200 worker attempts per attack, the
# front-door cases for 30 s each, and issue 19's 1,000-worker storms (-long).
bench-attack:
	cd test/talos && $(GO) test -count=1 -timeout 30m -v ./attack -args -attempts=200 -long -front-duration=30s

# The Prometheus alerts against recorded samples (promtool, Debian's
# prometheus package); make test runs the same through server's TestAlertRules.
test-alerts: deps
	cd deploy/prometheus && promtool check rules alerts.yaml && promtool test rules alerts_test.yaml

# The Kubernetes overlays rendered with kustomize and strictly decoded
# (separate module: kustomize and k8s.io stay out of the daemon's graph).
test-deploy:
	cd test/deploy && $(GO) test -race -count=1 ./...

# Every kustomization judged by a real kube-apiserver and Debian's etcd on
# loopback (test/k8s, its own module; no root). hack/k8s-build.sh builds
# kube-apiserver from the Go module proxy into a cache directory that
# survives between runs (cold: minutes; warm: nothing to do). No -race:
# what is under test is the manifests.
test-k8s: deps
	cd test/k8s && bin=$$(../../hack/k8s-build.sh kube-apiserver) && STEWARD_K8S_BIN=$$bin $(GO) test -count=1 -v ./...

# The node level (root; the last step of `make test`): hack/e2e-node.sh starts
# etcd, kube-apiserver, controller-manager, scheduler, containerd, kubelet
# and kube-proxy in a network namespace of its own and runs test/k8s's
# TestNodeE2E there: overlays/file deployed with the image from `make
# image` (tagged as deploy/kubernetes/base names it), pod Ready, TLS through
# the Service verifying to os-ca.crt; then overlays/pkcs11 (SoftHSMv2 module
# image) and overlays/ha-pkcs11 (eviction, PDB, rolling update). containerd
# v2.4.2 comes from hack/containerd-build.sh (Go module proxy, cached).
# Overwrites $(BIN)/image.
E2E_TAG = $(shell sed -n 's/^ *newTag: *//p' deploy/kubernetes/base/kustomization.yaml | head -1)
e2e: deps
	$(MAKE) image IMAGE_ARCHS=amd64 VERSION=$(E2E_TAG)
	bin=$$(./hack/k8s-build.sh kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy) && \
	  ctrd=$$(./hack/containerd-build.sh) && \
	  ./hack/e2e-node.sh $$bin $$ctrd $(abspath $(BIN))/image $(abspath $(BIN))/linux-amd64/steward-trustd-gencreds

# The image writer's unit checks (hack/image, its own module): the config's
# rootfs.diff_ids match the layers, as container runtimes require.
test-image:
	cd hack/image && $(GO) test -count=1 ./...

test-coverage: deps
	$(GO) test -race -count=1 -coverprofile=coverage.out ./...
	$(GO) tool cover -func=coverage.out | tail -1

# gofmt, go vet, golangci-lint (errorlint, errcheck, cyclop 20, gocognit 30, …;
# see .golangci.yml) and govulncheck on every module (root, test/talos, test/deploy, hack/image). golangci-lint is pinned in
# hack/tools/go.mod and built into $(BIN) on first use.
GOLANGCI_LINT := $(BIN)/golangci-lint

# Another golangci-lint on the machine (another checkout, an editor) holds
# a lock that would make this run fail: runs may go in parallel.
GOLANGCI_RUN := $(abspath $(GOLANGCI_LINT)) run --allow-parallel-runners

$(GOLANGCI_LINT): hack/tools/go.mod hack/tools/go.sum
	@echo "building golangci-lint (pinned in hack/tools/go.mod; first time takes a few minutes)"
	cd hack/tools && $(GO) build -o $(abspath $(GOLANGCI_LINT)) github.com/golangci/golangci-lint/v2/cmd/golangci-lint

# govulncheck against the Go vulnerability database snapshot pinned in
# hack/tools/vuln/go.mod (no internet needed; VULNDB=https://vuln.go.dev
# for the live one): fails on any reachable vulnerability not listed with
# its reason in hack/tools/vuln/accepted.txt. Needs jq (hack/deps.sh).
GOVULNCHECK := $(BIN)/govulncheck

$(GOVULNCHECK): hack/tools/vuln/go.mod hack/tools/vuln/go.sum
	@echo "building govulncheck and the vulnerability database indexer (pinned in hack/tools/vuln/go.mod; first time takes a few minutes)"
	cd hack/tools/vuln && $(GO) build -o $(abspath $(BIN))/ golang.org/x/vuln/cmd/govulncheck golang.org/x/vulndb/cmd/indexdb

vulncheck: deps $(GOVULNCHECK)
	./hack/tools/vulncheck.sh $(BIN) . test/talos test/deploy hack/image test/k8s cmd/steward-trustd-authorizer

lint: $(GOLANGCI_LINT) vulncheck
	@bad=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	  if [ -n "$$bad" ]; then echo "gofmt needed:"; echo "$$bad"; exit 1; fi
	$(GO) vet ./...
	cd test/talos && $(GO) vet ./...
	cd test/deploy && $(GO) vet ./...
	cd hack/image && $(GO) vet ./...
	cd test/k8s && $(GO) vet ./...
	cd cmd/steward-trustd-authorizer && $(GO) vet ./...
	$(GOLANGCI_RUN) ./...
	cd test/talos && $(GOLANGCI_RUN) --config ../../.golangci.yml ./...
	cd test/deploy && $(GOLANGCI_RUN) --config ../../.golangci.yml ./...
	cd hack/image && $(GOLANGCI_RUN) --config ../../.golangci.yml ./...
	cd test/k8s && $(GOLANGCI_RUN) --config ../../.golangci.yml ./...
	cd cmd/steward-trustd-authorizer && $(GOLANGCI_RUN) --config ../../.golangci.yml ./...

# Every fuzz target of every module (test/talos, tpmsim, … included), 60 s each.
FUZZTIME ?= 60s
fuzz:
	GO=$(GO) FUZZTIME=$(FUZZTIME) ./hack/fuzz.sh

bench: deps
	$(GO) test -run=XXX -bench=. -benchtime=2s ./...
	cd test/talos && $(GO) test -run=XXX -bench=. -benchtime=3s ./...

# 5,000 workers arriving within 10 s against the file, SoftHSM and swtpm backends,
# and 1,000 against swtpm slowed to a 60 ms TPM chip (hack/fleet-boot.sh: BACKENDS, WORKERS, TPM_WORKERS).
fleet-boot: deps build-all
	$(GO) build -o $(BIN)/ ./test/load
	./hack/fleet-boot.sh $(BIN)

# The OCI image, offline and without Docker: binaries cross-built with cgo
# for each of IMAGE_ARCHS (arm64 with Debian's gcc-aarch64-linux-gnu), then
# hack/image adds exactly the shared libraries they need plus the C++
# runtime PKCS#11 modules need, and writes an OCI layout to $(BIN)/image
# (push it with e.g. `skopeo copy --all oci:$(BIN)/image:$(VERSION) docker://REGISTRY/steward-trustd:$(VERSION)`).
IMAGE_ARCHS ?= amd64 arm64
CC_amd64    ?= gcc
CC_arm64    ?= aarch64-linux-gnu-gcc
SOURCE_DATE_EPOCH ?= $(shell git log -1 --format=%ct 2>/dev/null || echo 0)

image: deps
	$(foreach a,$(IMAGE_ARCHS),CGO_ENABLED=1 GOOS=linux GOARCH=$(a) CC=$(CC_$(a)) $(GO) build -trimpath -ldflags "$(LDFLAGS)" -o $(BIN)/linux-$(a)/ ./cmd/... &&) true
	$(foreach a,$(IMAGE_ARCHS),(cd cmd/steward-trustd-authorizer && CGO_ENABLED=0 GOOS=linux GOARCH=$(a) $(GO) build -trimpath -ldflags "$(LDFLAGS)" -o $(abspath $(BIN))/linux-$(a)/ .) &&) true
	cd hack/image && SOURCE_DATE_EPOCH=$(SOURCE_DATE_EPOCH) $(GO) run . -out $(abspath $(BIN))/image -tag $(VERSION) \
	  $(foreach a,$(IMAGE_ARCHS),-bin linux/$(a)=$(abspath $(BIN))/linux-$(a))

# Runs the image's other platforms (arm64 here) under qemu-user from the
# unpacked root file system; the native one is run by make test (TestImage).
image-smoke: image
	./hack/image-smoke.sh $(abspath $(BIN))/image $(VERSION) $(IMAGE_ARCHS)

# DOCKER=podman works too (the Dockerfile names every image fully).
DOCKER ?= docker

docker-build:
	$(DOCKER) build --build-arg VERSION=$(VERSION) -t $(IMAGE):$(VERSION) .

docker-buildx:
	$(DOCKER) buildx build --platform $(PLATFORMS) --build-arg VERSION=$(VERSION) -t $(IMAGE):$(VERSION) --push .

# Keeps $(LOCAL): it holds run-local's CA key (the swtpm state or the file
# key) and worker token; `make clean-local` removes it.
clean:
	rm -rf $(BIN) coverage.out

clean-local:
	@echo "removing $(LOCAL)/: run-local's dev OS CA key (swtpm state, key files) and worker token; the next run-local makes a new CA, and workers trusting the old one must be given the new one" >&2
	rm -rf $(LOCAL)
