#!/usr/bin/env bash
# make image-smoke: runs each platform of the image that is not this
# machine's under qemu-user, from the unpacked root file system alone
# (qemu -L: the loader and every library come from the image): gencreds
# writes file credentials, the daemon serves them on a loopback port, and
# test/load's simulated workers get certificates over TLS. This machine's
# own platform is run-tested by `make test` (test/talos TestImage).
# Needs qemu-user-static (Debian).
#   usage: hack/image-smoke.sh LAYOUT TAG ARCH...
set -euo pipefail
layout=$1 tag=$2
shift 2
native=$(go env GOARCH)
# free_port: a loopback port nothing answers on now.
free_port() {
  local p
  while :; do
    p=$((20000 + RANDOM % 40000))
    (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || { echo "$p"; return; }
  done
}
for arch in "$@"; do
  [ "$arch" = "$native" ] && continue
  case $arch in
    arm64) qemu=qemu-aarch64-static ;;
    amd64) qemu=qemu-x86_64-static ;;
    *) echo "image-smoke: no qemu for $arch" >&2; exit 1 ;;
  esac
  command -v "$qemu" >/dev/null || { echo "image-smoke: $qemu missing; as root: apt-get install -y qemu-user-static" >&2; exit 1; }
  work=$(mktemp -d)
  trap 'kill "${pid:-}" 2>/dev/null || true; rm -rf "$work"' EXIT
  (cd hack/image && go run . -out "$layout" -tag "$tag" -unpack "$work/rootfs" -arch "$arch")
  "$qemu" -L "$work/rootfs" "$work/rootfs/usr/local/bin/steward-trustd-gencreds" -cluster smoke -output "$work/certs" >/dev/null 2>&1
  port=$(free_port)
  TRUSTD_CERT_DIR="$work/certs" TRUSTD_SIGNER="file:$work/certs/os-ca.key" TRUSTD_LISTEN_ADDRESS=127.0.0.1 TRUSTD_PORT=$port \
    "$qemu" -L "$work/rootfs" "$work/rootfs/usr/local/bin/steward-trustd" >"$work/log" 2>&1 &
  pid=$!
  addr=
  for _ in $(seq 100); do
    addr=$(grep -o '"msg":"steward-trustd listening","address":"[^"]*"' "$work/log" | sed 's/.*"address":"\(.*\)"/\1/' || true)
    [ -n "$addr" ] && break
    kill -0 "$pid" 2>/dev/null || { cat "$work/log" >&2; exit 1; }
    sleep 0.2
  done
  [ -n "$addr" ] || { echo "image-smoke: linux/$arch daemon did not listen" >&2; cat "$work/log" >&2; exit 1; }
  go run ./test/load -addr "$addr" -certs "$work/certs" -workers 2 -requests 5
  kill -INT "$pid"; wait "$pid"
  echo "image-smoke: linux/$arch image served certificates under $qemu"
  rm -rf "$work"
  trap - EXIT
done
