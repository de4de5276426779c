#!/usr/bin/env bash
# Builds containerd, its runc shim and ctr, pinned to CONTAINERD_VERSION,
# offline from the Go module proxy alone (`go install pkg@version`: the
# module's own go.mod and go.sum pin every dependency; the proxy's checksum
# database verifies the module). make e2e needs containerd >= 2.1 for the
# kubelet's image volumes (the pkcs11 overlay's module volume); Debian 12
# ships 1.6, which fails such a container with `failed to mkdir ""`.
# The binaries go to a cache directory beside the kube binaries and are
# rebuilt only when the version changes.
#   usage: hack/containerd-build.sh
#   env:   CONTAINERD_BIN (default ${XDG_CACHE_HOME:-$HOME/.cache}/steward-trustd/containerd-<version>/bin)
#   prints the binary directory on stdout (progress goes to stderr).
set -euo pipefail
CONTAINERD_VERSION=v2.4.2
mod=github.com/containerd/containerd/v2
bin=${CONTAINERD_BIN:-${XDG_CACHE_HOME:-$HOME/.cache}/steward-trustd/containerd-$CONTAINERD_VERSION/bin}
cmds=(containerd containerd-shim-runc-v2 ctr)
done=1
for c in "${cmds[@]}"; do [ -x "$bin/$c" ] || done=0; done
if [ "$done" = 1 ] && [ "$(cat "$bin/version" 2>/dev/null)" = "$CONTAINERD_VERSION" ]; then echo "$bin"; exit 0; fi
mkdir -p "$bin"
start=$SECONDS
echo "containerd-build: building ${cmds[*]} $CONTAINERD_VERSION into $bin (cold: a few minutes on 2 cores)" >&2
pkgs=()
for c in "${cmds[@]}"; do pkgs+=("$mod/cmd/$c@$CONTAINERD_VERSION"); done
tmp=$(mktemp -d "$bin/.build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
# Outside any module: go install pkg@version resolves the pinned module alone.
(cd "$tmp" && CGO_ENABLED=0 GOBIN=$tmp GOTOOLCHAIN=local go install -trimpath \
  -ldflags "-s -w -X $mod/version.Version=$CONTAINERD_VERSION" "${pkgs[@]}")
for c in "${cmds[@]}"; do mv "$tmp/$c" "$bin/$c"; done
echo "$CONTAINERD_VERSION" >"$bin/version"
echo "containerd-build: built in $(( SECONDS - start ))s" >&2
echo "$bin"
