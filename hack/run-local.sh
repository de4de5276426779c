#!/usr/bin/env bash
# Runs a real steward-trustd on loopback. Default: the OS CA key lives in a
# swtpm TPM simulator (state in $LOCAL/swtpm) behind steward-tpm-relay, so
# the ceremony can use the TPM while the daemon runs; the key is created on
# the first run by the key ceremony. RUN_LOCAL_SIGNER=file uses file
# credentials instead.
# Ctrl-C stops the daemon and the simulator.
set -euo pipefail
bin=$1 local=$2 port=$3
mode=${RUN_LOCAL_SIGNER:-tpm}
mkdir -p "$local"
local=$(cd "$local" && pwd)
health=127.0.0.1:$((port + 1))

case "$mode" in
file)
  certs=$local/certs
  if [ ! -f "$certs/os-ca.crt" ]; then
    "$bin/steward-trustd-gencreds" -cluster local -output "$certs" -san 127.0.0.1 -san localhost
  fi
  signer="file:$certs/os-ca.key"
  ;;
tpm)
  certs=$local/tpm-certs
  state=$local/swtpm
  mkdir -p "$state"
  # swtpm serves one connection at a time; steward-tpm-relay shares it
  # like /dev/tpmrm0 does a chip, so the ceremony (status, rotate, …) can
  # use the TPM at $sock while the daemon holds its connection.
  raw=$state/swtpm.sock sock=$state/tpm.sock
  rm -f "$raw" "$sock" "$state/ctrl.sock"
  swtpm socket --tpm2 --tpmstate "dir=$state" \
    --server "type=unixio,path=$raw" --ctrl "type=unixio,path=$state/ctrl.sock" \
    --flags not-need-init,startup-clear --log "file=$state/swtpm.log" &
  swtpm_pid=$!
  trap 'kill $swtpm_pid 2>/dev/null || true' EXIT
  for _ in $(seq 100); do [ -S "$raw" ] && break; sleep 0.05; done
  # tpm2-tools reach the same TPM with TPM2TOOLS_TCTI=swtpm:host=127.0.0.1,port=$tcti_port
  # (its control channel is the next port); the relay keeps them off the daemon's objects.
  tcti_port=${RUN_LOCAL_TCTI_PORT:-2321}
  "$bin/steward-tpm-relay" --upstream "$raw" --listen "$sock" --tcti-listen "127.0.0.1:$tcti_port" 2>>"$state/relay.log" &
  relay_pid=$!
  trap 'kill $relay_pid $swtpm_pid 2>/dev/null || true' EXIT
  for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.05; done
  [ -S "$sock" ] || { echo "steward-tpm-relay did not start; see $state/relay.log" >&2; exit 1; }
  signer="tpm:path=$local/os-ca.tpmkey;socket=$sock;pcrs=7"
  if [ ! -f "$certs/os-ca.crt" ]; then
    "$bin/steward-trustd-ceremony" init --signer "$signer" --cluster local --out "$certs"
  fi
  ;;
*)
  echo "RUN_LOCAL_SIGNER must be tpm or file, not $mode" >&2
  exit 2
  ;;
esac

cat >&2 <<MSG

steward-trustd on 127.0.0.1:$port, signer $mode ($signer)
credentials in $certs; health and metrics on http://$health (/healthz /readyz /metrics)
Request a certificate as a Talos worker would, from another terminal:
  go run ./test/load -addr 127.0.0.1:$port -certs $certs -workers 1 -requests 1 -print
${sock:+The ceremony shares the TPM with the running daemon through the relay, e.g.:
  $bin/steward-trustd-ceremony status --signer '$signer' --ca $certs/os-ca.crt
and so do tpm2-tools: TPM2TOOLS_TCTI=swtpm:host=127.0.0.1,port=$tcti_port tpm2_pcrread sha256:7
}
MSG
export TRUSTD_CERT_DIR=$certs TRUSTD_SIGNER=$signer TRUSTD_LISTEN_ADDRESS=127.0.0.1 TRUSTD_PORT=$port \
  TRUSTD_HEALTH_ADDR=$health TRUSTD_CERT_SANS=localhost
"$bin/steward-trustd"
