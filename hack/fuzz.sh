#!/bin/sh
# Runs every fuzz target of every Go module in the repository, one after
# the other, for FUZZTIME each (default 60s): a fuzzer that stops early
# (a crash, a tripped limit) fails the run. A crash leaves its input in
# the package's testdata/fuzz/FuzzX/; keep it there as a seed once fixed.
#   FUZZTIME=60s hack/fuzz.sh [MODULE_DIR ...]
set -eu
GO=${GO:-go}
FUZZTIME=${FUZZTIME:-60s}
root=$(cd "$(dirname "$0")/.." && pwd)
if [ $# -eq 0 ]; then
	set -- $(cd "$root" && find . -name go.mod -not -path './.local/*' -exec dirname {} \; | sort)
fi
for mod in "$@"; do
	cd "$root/$mod"
	for p in $($GO list ./...); do
		list=$($GO test -list '^Fuzz' "$p")
		for f in $(echo "$list" | grep '^Fuzz' || true); do
			echo "== $mod $p $f ($FUZZTIME)"
			$GO test -run='^$' -fuzz="^$f\$" -fuzztime="$FUZZTIME" "$p"
		done
	done
done
echo "fuzz: every target ran $FUZZTIME"
