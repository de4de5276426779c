#!/usr/bin/env bash
# Builds the Kubernetes commands test/k8s runs, offline from the Go module
# proxy alone: test/k8s/go.mod requires k8s.io/kubernetes and replaces each
# of its staging modules (k8s.io/api, k8s.io/apiserver, ...) by the same
# release published on its own, the usual way of using k8s.io/kubernetes as
# a library; go.sum pins every module. The binaries go to a cache directory
# that survives between runs and are rebuilt only when test/k8s/go.sum
# changes (the stamp file records its hash).
#   usage: hack/k8s-build.sh [CMD...]   (default: kube-apiserver)
#   CMD:   kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy
#   env:   K8S_BIN (default ${XDG_CACHE_HOME:-$HOME/.cache}/steward-trustd/k8s-<version>/bin)
#   prints the binary directory on stdout (progress goes to stderr).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
mod=$repo/test/k8s
version=$(sed -n 's#^\(require \)\?\s*k8s.io/kubernetes \(v[0-9.]*\)\s*$#\2#p' "$mod/go.mod" | head -1)
[ -n "$version" ] || { echo "k8s-build: no k8s.io/kubernetes requirement in $mod/go.mod" >&2; exit 1; }
bin=${K8S_BIN:-${XDG_CACHE_HOME:-$HOME/.cache}/steward-trustd/k8s-$version/bin}
cmds=("$@")
[ ${#cmds[@]} -gt 0 ] || cmds=(kube-apiserver)
minor=${version#v1.}; minor=${minor%%.*}
sum=$(sha256sum "$mod/go.sum" | cut -d' ' -f1)
ld="-s -w -X k8s.io/component-base/version.gitVersion=$version -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/component-base/version.gitTreeState=clean -X k8s.io/client-go/pkg/version.gitVersion=$version"
mkdir -p "$bin"
for c in "${cmds[@]}"; do
  grep -q "\"k8s.io/kubernetes/cmd/$c\"" "$mod/tools.go" || { echo "k8s-build: $c is not listed in $mod/tools.go; add it there (and run go mod tidy)" >&2; exit 2; }
  if [ -x "$bin/$c" ] && [ "$(cat "$bin/$c.gosum" 2>/dev/null)" = "$sum" ]; then continue; fi
  start=$SECONDS
  echo "k8s-build: building $c $version into $bin (cold: several minutes on 2 cores)" >&2
  (cd "$mod" && CGO_ENABLED=0 GOTOOLCHAIN=local go build -trimpath -ldflags "$ld" -o "$bin/$c.tmp" "k8s.io/kubernetes/cmd/$c")
  mv "$bin/$c.tmp" "$bin/$c"
  echo "$sum" >"$bin/$c.gosum"
  echo "k8s-build: $c built in $(( SECONDS - start ))s ($(du -h "$bin/$c" | cut -f1))" >&2
done
echo "$bin"
