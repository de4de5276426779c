# syntax=docker/dockerfile:1
# For users with Docker or Podman/Buildah (`make docker-build`). Without
# either, `make image` assembles the same kind of image offline (hack/image)
# and `make test` runs it.
#
# Build: cgo is on because the PKCS#11 backend dlopen()s the HSM vendor's
# module, which needs glibc; the TPM backend talks to /dev/tpmrm0 directly.
# Image names are fully qualified: Podman and Buildah refuse short names.
FROM docker.io/library/golang:1.26-bookworm AS build
ARG VERSION=dev
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
# .dockerignore keeps .local/ (the dev CA key and token) and bin/ out.
COPY . .
RUN CGO_ENABLED=1 go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" \
      -o /out/ ./cmd/steward-trustd ./cmd/steward-trustd-gencreds ./cmd/steward-trustd-ceremony
# The authorizer is a module of its own (client-go stays out of the daemon's graph).
RUN cd cmd/steward-trustd-authorizer && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/ .

# Run: distroless cc = glibc + libstdc++ + libgcc_s (C++ PKCS#11 modules
# such as SoftHSM need the last two; distroless/base lacks them), no shell,
# no package manager, as the unprivileged "nonroot" user 65532.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/ /usr/local/bin/
USER 65532:65532
EXPOSE 50001 50002
ENTRYPOINT ["/usr/local/bin/steward-trustd"]
