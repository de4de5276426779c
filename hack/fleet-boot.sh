#!/usr/bin/env bash
# Fleet-boot benchmark: WORKERS simulated Talos workers arrive within RAMP
# (a datacenter power-up) and retry like Talos until each has its apid
# certificate, against the daemon on each backend (file, SoftHSMv2, swtpm).
# Loopback only; every run is bounded by DURATION.
#   hack/fleet-boot.sh [bin-dir]      (make fleet-boot)
set -euo pipefail
bin=${1:-bin}
WORKERS=${WORKERS:-5000}
RAMP=${RAMP:-10s}
DURATION=${DURATION:-5m}
BACKENDS=${BACKENDS:-file softhsm swtpm}
work=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
port=50101

run_daemon() { # dir signer env...
  local dir=$1 signer=$2; shift 2
  env "$@" TRUSTD_CERT_DIR="$dir" TRUSTD_SIGNER="$signer" TRUSTD_LISTEN_ADDRESS=127.0.0.1 \
    TRUSTD_PORT=$port "$bin/steward-trustd" 2>"$work/daemon.log" &
  daemon=$!
  pids+=("$daemon")
  for _ in $(seq 200); do grep -q "steward-trustd listening" "$work/daemon.log" 2>/dev/null && return 0; sleep 0.05; done
  echo "daemon did not start:" >&2; cat "$work/daemon.log" >&2; return 1
}

for backend in $BACKENDS; do
  dir=$work/$backend
  extra=()
  case $backend in
  file)
    "$bin/steward-trustd-gencreds" -cluster fleet -output "$dir" >/dev/null
    rm "$dir/server.crt" "$dir/server.key"
    signer="file:$dir/os-ca.key"
    ;;
  softhsm)
    mkdir -p "$work/hsm/tokens"
    printf 'directories.tokendir = %s\nobjectstore.backend = file\nlog.level = ERROR\n' "$work/hsm/tokens" >"$work/hsm/softhsm2.conf"
    export SOFTHSM2_CONF=$work/hsm/softhsm2.conf
    softhsm2-util --init-token --free --label fleet --so-pin 87654321 --pin 12345678 >/dev/null
    printf '12345678\n' >"$work/hsm/pin"; chmod 600 "$work/hsm/pin"
    module=$(ls /usr/lib/softhsm/libsofthsm2.so /usr/lib/x86_64-linux-gnu/softhsm/libsofthsm2.so 2>/dev/null | head -1)
    signer="pkcs11:token=fleet;object=os-ca?module-path=$module&pin-source=file:$work/hsm/pin"
    "$bin/steward-trustd-ceremony" init --signer "$signer" --cluster fleet --out "$dir" >/dev/null
    extra=(SOFTHSM2_CONF="$SOFTHSM2_CONF")
    ;;
  swtpm)
    mkdir -p "$work/tpm"
    swtpm socket --tpm2 --tpmstate "dir=$work/tpm" --server "type=unixio,path=$work/tpm/sock" \
      --ctrl "type=unixio,path=$work/tpm/ctrl" --flags not-need-init,startup-clear &
    pids+=($!)
    for _ in $(seq 100); do [ -S "$work/tpm/sock" ] && break; sleep 0.05; done
    signer="tpm:path=$work/tpm/os-ca.tpmkey;socket=$work/tpm/sock"
    "$bin/steward-trustd-ceremony" init --signer "$signer" --cluster fleet --out "$dir" >/dev/null
    ;;
  esac
  run_daemon "$dir" "$signer" "${extra[@]}"
  echo "== $backend: $WORKERS workers arriving within $RAMP"
  "$bin/load" -addr 127.0.0.1:$port -certs "$dir" -workers "$WORKERS" -requests "$WORKERS" -ramp "$RAMP" \
    -retry -spread-sources -duration "$DURATION" -daemon-pid "$daemon"
  kill -INT "$daemon"; wait "$daemon" 2>/dev/null || true
  port=$((port + 1))
done
