#!/usr/bin/env bash
# Runs a real steward-trustd on loopback with credentials generated on the
# first run (kept in $LOCAL/certs). Ctrl-C stops it.
set -euo pipefail
bin=$1 local=$2 port=$3
certs=$local/certs
if [ ! -f "$certs/os-ca.crt" ]; then
  "$bin/steward-trustd-gencreds" -cluster local -output "$certs" -san 127.0.0.1 -san localhost
fi
cat >&2 <<MSG

steward-trustd on 127.0.0.1:$port (file signer, credentials in $certs).
Request a certificate as a Talos worker would, from another terminal:
  go run ./test/load -addr 127.0.0.1:$port -certs $certs -workers 1 -requests 1 -print

MSG
export TRUSTD_CERT_DIR=$certs TRUSTD_LISTEN_ADDRESS=127.0.0.1 TRUSTD_PORT=$port
exec "$bin/steward-trustd"
