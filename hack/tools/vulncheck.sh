#!/usr/bin/env bash
# Usage: hack/tools/vulncheck.sh BIN MODULE-DIR...
#
# govulncheck on each module against the Go vulnerability database pinned
# in hack/tools/vuln/go.mod (golang.org/x/vulndb's OSV data, indexed by its
# indexdb into a cache directory once per version), so the check needs no
# internet access. VULNDB=https://vuln.go.dev uses the live database
# instead. Fails on every reachable vulnerability not listed, with its
# reason, in hack/tools/vuln/accepted.txt, and on every listed one that is
# no longer found. BIN holds govulncheck and indexdb (make builds them).
set -euo pipefail
bin=$(cd "$1" && pwd); shift
tools=$(cd "$(dirname "$0")/vuln" && pwd)
accepted=$tools/accepted.txt

# localdb prints the file: URL of the pinned snapshot, indexing it first.
localdb() {
  local version dir cache
  version=$(cd "$tools" && go list -m -f '{{.Version}}' golang.org/x/vulndb)
  cache=${XDG_CACHE_HOME:-$HOME/.cache}/steward-trustd/vulndb-$version
  if [ ! -f "$cache/index/db.json" ]; then
    dir=$(cd "$tools" && go mod download -json golang.org/x/vulndb | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
    rm -rf "$cache.tmp" && mkdir -p "$cache.tmp"
    "$bin/indexdb" -vulns "$dir/data/osv" -out "$cache.tmp" >&2
    # The repository's OSV files carry no dates; the snapshot's is its
    # pseudo-version's commit time, which govulncheck shows as the DB's.
    local ts=${version:(-27):14}
    printf '{"modified":"%s-%s-%sT%s:%s:%sZ"}' "${ts:0:4}" "${ts:4:2}" "${ts:6:2}" "${ts:8:2}" "${ts:10:2}" "${ts:12:2}" >"$cache.tmp/index/db.json"
    gzip -kf "$cache.tmp/index/db.json"
    rm -rf "$cache" && mv "$cache.tmp" "$cache"
  fi
  echo "vulnerability database: golang.org/x/vulndb $version (pinned in hack/tools/vuln/go.mod)" >&2
  echo "file://$cache"
}

db=${VULNDB:-$(localdb)}
found=$(mktemp) && trap 'rm -f "$found"' EXIT
for m in "$@"; do
  out=$(cd "$m" && "$bin/govulncheck" -db "$db" -format json ./...)
  # Reachable findings only: a trace down to a called function.
  jq -r --arg m "$m" 'select(.finding and .finding.trace[0].function) | .finding | "\(.osv) \($m) \(.trace[0].package) fixed in \(.fixed_version)"' <<<"$out" | sort -u >>"$found"
done
status=0
while read -r id rest; do
  if grep -q "^$id " "$accepted"; then
    echo "accepted, not fixed: $id $rest (hack/tools/vuln/accepted.txt)" >&2
  else
    echo "VULNERABLE: $id $rest: upgrade the module (go get MODULE@FIXED), or see https://pkg.go.dev/vuln/$id" >&2
    status=1
  fi
done < <(sort -u -k1,2 "$found")
for id in $(grep -o '^GO-[0-9-]*' "$accepted"); do
  if ! grep -q "^$id " "$found"; then
    echo "STALE: $id in hack/tools/vuln/accepted.txt is no longer found; remove its line" >&2
    status=1
  fi
done
[ "$status" -eq 0 ] && echo "govulncheck: no reachable vulnerability outside hack/tools/vuln/accepted.txt" >&2
exit "$status"
