# syntax=docker/dockerfile:1
# Build: cgo is on because the PKCS#11 backend dlopen()s the HSM vendor's
# module, which needs glibc; the TPM backend talks to /dev/tpmrm0 directly.
FROM golang:1.26-bookworm AS build
ARG VERSION=dev
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=1 go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" \
      -o /out/ ./cmd/steward-trustd ./cmd/steward-trustd-gencreds ./cmd/steward-trustd-ceremony

# Run: distroless base (glibc for cgo and PKCS#11 modules, CA roots, no
# shell, no package manager), as the unprivileged "nonroot" user 65532.
FROM gcr.io/distroless/base-debian12:nonroot
COPY --from=build /out/ /usr/local/bin/
USER 65532:65532
EXPOSE 50001 50002
ENTRYPOINT ["/usr/local/bin/steward-trustd"]
