#!/usr/bin/env bash
# Fleet-boot benchmark: WORKERS simulated Talos workers arrive within RAMP
# (a datacenter power-up) and retry like Talos until each has its apid
# certificate, against the daemon on each backend:
#   file     file key
#   softhsm  SoftHSMv2 token
#   swtpm    swtpm behind steward-tpm-relay
#   tpm60    swtpm behind steward-tpm-relay --latency Sign=60ms: a discrete
#            TPM chip's speed (TPM_WORKERS workers, default 1000: 60 s of
#            signing, the storm of issue 15)
# and two steady-state comparisons (not in the default BACKENDS):
#   tpm60-kept    16 kept-alive clients against the 60 ms chip: the share
#                 of the device's 16.7 signatures/s the daemon delivers
#   file-anchor   light clients (load -light: CSRs made and 32 connections
#                 set up before the clock starts), file key, against the
#                 daemon and against a bare Talos-style server
#                 (load -serve-anchor), alternating ROUNDS (default 3) times
#                 in the same run, and the local CPU bound (load -cpu-bound:
#                 parse + verify CSR + sign on all cores, in-process); prints
#                 daemon ÷ anchor per round and daemon ÷ bound
# Workers wait between attempts as Talos does (BACKOFF=talos; fast: the load
# tool's 250 ms doubling). Loopback only; every run is bounded by DURATION.
#   hack/fleet-boot.sh [bin-dir]      (make fleet-boot)
#   BACKENDS=tpm60 TPM_WORKERS=1000 hack/fleet-boot.sh bin
set -euo pipefail
bin=${1:-bin}
WORKERS=${WORKERS:-5000}
TPM_WORKERS=${TPM_WORKERS:-1000}
TPM_SIGN=${TPM_SIGN:-60ms}
RAMP=${RAMP:-10s}
DURATION=${DURATION:-5m}
BACKENDS=${BACKENDS:-file softhsm swtpm tpm60}
work=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
port=50101

wait_for() { # file pattern what
  for _ in $(seq 200); do grep -q "$2" "$1" 2>/dev/null && return 0; sleep 0.05; done
  echo "$3 did not start:" >&2; cat "$1" >&2; return 1
}

run_daemon() { # dir signer env...
  local dir=$1 signer=$2; shift 2
  env "$@" TRUSTD_CERT_DIR="$dir" TRUSTD_SIGNER="$signer" TRUSTD_LISTEN_ADDRESS=127.0.0.1 \
    TRUSTD_PORT=$port TRUSTD_HEALTH_ADDR=127.0.0.1:$((port + 1000)) "$bin/steward-trustd" 2>"$work/daemon.log" &
  daemon=$!
  pids+=("$daemon")
  wait_for "$work/daemon.log" "steward-trustd listening" daemon
}

# start_tpm DIR [LATENCY]: swtpm, and the relay in front of it (so the
# ceremony and the daemon can share it), as a slow chip if LATENCY is set.
start_tpm() {
  local d=$1 latency=${2:-}
  mkdir -p "$d"
  swtpm socket --tpm2 --tpmstate "dir=$d" --server "type=unixio,path=$d/sock" \
    --ctrl "type=unixio,path=$d/ctrl" --flags not-need-init,startup-clear &
  pids+=($!)
  for _ in $(seq 100); do [ -S "$d/sock" ] && break; sleep 0.05; done
  "$bin/steward-tpm-relay" --upstream "$d/sock" --listen "$d/relay.sock" ${latency:+--latency "Sign=$latency"} ${RELAY_FLAGS:-} 2>"$d/relay.log" &
  pids+=($!)
  wait_for "$d/relay.log" "steward-tpm-relay listening" relay
}

# steady LABEL ARGS...: one kept-alive load run.
# Kept-alive clients share one source address: no per-address limit there.
steady() { local label=$1; shift; echo "== $label"; "$bin/load" -reuse -duration "$DURATION" "$@" || true; }

# rate OUTPUT: the certificates/s of a load run ("(123.4/s)"); cpu OUTPUT:
# the server's CPU ms per certificate (load -daemon-pid).
rate() { sed -n 's/^certificates:.*(\([0-9.]*\)\/s).*$/\1/p' <<<"$1" | head -1; }
cpu() { sed -n 's/^server CPU per certificate: \([0-9.]*\) ms.*$/\1/p' <<<"$1" | head -1; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "" || b == "" || b == 0) print "n/a"; else printf "%.2f", a / b }'; }

# light LABEL ARGS...: one light-client run; prints its output, sets $out.
light() { local label=$1; shift; echo "== $label"; out=$("$bin/load" -light -duration "$DURATION" "$@" 2>&1 || true); echo "$out"; }

file_anchor() {
  local dir=$work/anchor n=${FILE_REQUESTS:-6000} clients=${FILE_CLIENTS:-32} anchor d a ratios="" cpus="" rates="" bound
  "$bin/steward-trustd-gencreds" -cluster anchor -output "$dir" >/dev/null
  run_daemon "$dir" "file:$dir/os-ca.key" TRUSTD_PEER_RATE=-1
  "$bin/load" -serve-anchor -addr 127.0.0.1:$((port + 2000)) -certs "$dir" -duration "$DURATION" 2>"$work/anchor.log" &
  anchor=$!
  pids+=("$anchor")
  wait_for "$work/anchor.log" "anchor listening" anchor
  echo "== file-anchor: load average $(cut -d' ' -f1-3 /proc/loadavg)"
  for round in $(seq "${ROUNDS:-3}"); do
    light "file-anchor round $round: steward-trustd, file key" -addr 127.0.0.1:$port -certs "$dir" -workers "$clients" -requests "$n" -daemon-pid "$daemon"
    d=$(rate "$out") dc=$(cpu "$out")
    light "file-anchor round $round: bare Talos-style server" -addr 127.0.0.1:$((port + 2000)) -certs "$dir" -workers "$clients" -requests "$n" -daemon-pid "$anchor"
    a=$(rate "$out")
    ratios+=" $(ratio "$d" "$a")"; cpus+=" $(ratio "$(cpu "$out")" "$dc")"; rates+=" $d"
  done
  kill -INT "$daemon" "$anchor"; wait "$daemon" "$anchor" 2>/dev/null || true
  echo "== file-anchor: local CPU bound"
  out=$("$bin/load" -cpu-bound -certs "$dir" -requests "$n" 2>&1 || true); echo "$out"
  bound=$(sed -n 's/^local CPU bound.*(\([0-9.]*\)\/s).*$/\1/p' <<<"$out")
  local bratios=""
  for d in $rates; do bratios+=" $(ratio "$d" "$bound")"; done
  echo "== file-anchor summary: daemon ÷ anchor in certificates/s per round:$ratios; in CPU per certificate (anchor's ÷ daemon's):$cpus; daemon ÷ local CPU bound ($bound/s):$bratios; load average $(cut -d' ' -f1-3 /proc/loadavg)"
}

tpm60_kept() {
  local dir=$work/kept
  RELAY_FLAGS=--log-commands start_tpm "$work/kept-tpm" "$TPM_SIGN"
  # connections=2: the relay stands for the kernel resource manager, where
  # that is the default (the next request's policy session is prepared
  # while the current TPM2_Sign runs).
  local signer="tpm:path=$work/kept-tpm/os-ca.tpmkey;socket=$work/kept-tpm/relay.sock;connections=2"
  "$bin/steward-trustd-ceremony" init --signer "$signer" --cluster fleet --out "$dir" >/dev/null
  run_daemon "$dir" "$signer" TRUSTD_PEER_RATE=-1
  steady "tpm60-kept: 16 kept-alive clients, Sign=$TPM_SIGN" -addr 127.0.0.1:$port -certs "$dir" -workers 16 -requests "${KEPT_REQUESTS:-500}" \
    -metrics "http://127.0.0.1:$((port + 1000))/metrics"
  echo "== tpm60-kept: the device, from the relay's command log: $(go run ./tpmsim/relaystat -sign "$TPM_SIGN" <"$work/kept-tpm/relay.log")"
  kill -INT "$daemon"; wait "$daemon" 2>/dev/null || true
}

for backend in $BACKENDS; do
  case $backend in
  file-anchor) file_anchor; port=$((port + 1)); continue ;;
  tpm60-kept) tpm60_kept; port=$((port + 1)); continue ;;
  esac
  dir=$work/$backend
  extra=()
  workers=$WORKERS
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
  swtpm | tpm60)
    latency=""
    if [ "$backend" = tpm60 ]; then latency=$TPM_SIGN; workers=$TPM_WORKERS; fi
    start_tpm "$work/$backend-tpm" "$latency"
    signer="tpm:path=$work/$backend-tpm/os-ca.tpmkey;socket=$work/$backend-tpm/relay.sock"
    "$bin/steward-trustd-ceremony" init --signer "$signer" --cluster fleet --out "$dir" >/dev/null
    ;;
  esac
  run_daemon "$dir" "$signer" "${extra[@]}"
  sleep 2
  echo "== $backend: idle daemon $(grep VmRSS /proc/$daemon/status | tr -s ' \t' ' ')"
  echo "== $backend: $workers workers arriving within $RAMP"
  "$bin/load" -addr 127.0.0.1:$port -certs "$dir" -workers "$workers" -requests "$workers" -ramp "$RAMP" \
    -retry -backoff "${BACKOFF:-talos}" -spread-sources -duration "$DURATION" -daemon-pid "$daemon" -metrics "http://127.0.0.1:$((port + 1000))/metrics"
  kill -INT "$daemon"; wait "$daemon" 2>/dev/null || true
  port=$((port + 1))
done
