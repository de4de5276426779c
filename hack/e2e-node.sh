#!/usr/bin/env bash
# make e2e: a real single-node Kubernetes v1.37.2 (etcd, kube-apiserver,
# controller-manager, scheduler, containerd, kubelet, kube-proxy) inside a
# network namespace this script creates, then test/k8s's TestNodeE2E run
# inside that namespace against it. Needs root. The machine's network is
# untouched: loopback and a bridge exist only inside the namespace; every
# process is started here and stopped by its PID; all state lives under one
# directory, removed at the end; every wait is bounded; on failure the API
# server's, kubelet's and containerd's logs are printed.
# Recipe and the settings this kind of machine needs (cgroup v1:
# failCgroupV1: false; no CAP_SYS_RESOURCE: containerd
# restrict_oom_score_adj = true, kubelet oomScoreAdj: 0):
# ../shared/docs/kubernetes-e2e/NOTES.md §3.2.
#   usage: hack/e2e-node.sh BIN CTRD IMAGE GENCREDS
#     BIN       directory of kube-* (hack/k8s-build.sh prints it)
#     CTRD      directory of containerd 2's containerd, shim and ctr
#               (hack/containerd-build.sh prints it)
#     IMAGE     the OCI layout `make image IMAGE_ARCHS=amd64` wrote
#     GENCREDS  the steward-trustd-gencreds binary
#   env: E2E_STATE (default: a new directory under /tmp), E2E_KEEP=1 leaves
#        everything up (then: hack/e2e-node.sh down STATE)
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
NODE_IP=10.213.0.1 POD_CIDR=10.213.0.0/24 NODE_NAME=e2e-node SVC_CIDR=10.0.0.0/24

log() { echo "e2e-node: +$(( SECONDS - t0 ))s $*" >&2; }
t0=$SECONDS
inns() { nsenter --net="/run/netns/$NS" "$@"; }
# start NAME CMD...: runs CMD in the namespace, logs to $RUN/NAME.log, PID in $RUN/NAME.pid.
start() {
  local name=$1; shift
  nsenter --net="/run/netns/$NS" "$@" >"$RUN/$name.log" 2>&1 &
  echo $! >"$RUN/$name.pid"
  echo "$name" >>"$RUN/order"
}
# alive PID: running and not a zombie (this machine's init reaps orphans late).
alive() { [ -r "/proc/$1/stat" ] && [ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" != Z ]; }
# wait_for WHAT SECONDS WATCH CMD...: polls CMD every 0.5 s; fails at once
# when the process WATCH has exited.
wait_for() {
  local what=$1 secs=$2 watch=$3 t=$SECONDS; shift 3
  until "$@" >/dev/null 2>&1; do
    alive "$(cat "$RUN/$watch.pid")" || { log "$watch exited"; return 1; }
    (( SECONDS - t < secs )) || { log "$what not ready after ${secs}s"; return 1; }
    sleep 0.5
  done
  log "$what ready after $(( SECONDS - t ))s"
}
ctr() { "$CTRD/ctr" --address "$RUN/containerd.sock" -n k8s.io "$@"; }
token() { od -An -N16 -tx1 /dev/urandom | tr -d ' \n'; }
kubeconfig() { # FILE USER TOKEN
  cat >"$1" <<EOF
apiVersion: v1
kind: Config
clusters: [{name: e2e, cluster: {server: "https://127.0.0.1:6443", certificate-authority: "$RUN/pki/apiserver.crt"}}]
users: [{name: $2, user: {token: "$3"}}]
contexts: [{name: e2e, context: {cluster: e2e, user: $2}}]
current-context: e2e
EOF
}
apiserver_ready() {
  inns curl -sf --max-time 2 --cacert "$RUN/pki/apiserver.crt" -H "Authorization: Bearer $(cat "$RUN/admin.token")" \
    https://127.0.0.1:6443/readyz
}
node_ready() {
  inns curl -sf --max-time 2 --cacert "$RUN/pki/apiserver.crt" -H "Authorization: Bearer $(cat "$RUN/admin.token")" \
    "https://127.0.0.1:6443/api/v1/nodes/$NODE_NAME" | tr -d ' \n' | grep -q '"type":"Ready","status":"True"'
}

# pause_image OUT.tar: the pause container, built as build/pause/Makefile
# does from the pause.c inside the k8s.io/kubernetes module (Go module
# proxy), as a one-layer OCI archive (tar, gzip, sha256sum; reproducible).
pause_image() {
  local src tag tmp
  src=$(cd "$repo/test/k8s" && go mod download -json k8s.io/kubernetes | sed -n 's/.*"Dir": "\(.*\)",/\1/p')
  tag=$(sed -n 's/^TAG ?= //p' "$src/build/pause/Makefile")
  [ "$tag" = "$PAUSE_TAG" ] || { log "pause is $tag in the module: set PAUSE_TAG in $0"; return 1; }
  tmp=$STATE/pause; mkdir -p "$tmp/rootfs" "$tmp/blobs/sha256"
  gcc -Os -Wall -Werror -static -DVERSION="v$tag-local" -o "$tmp/rootfs/pause" "$src/build/pause/linux/pause.c"
  tar -C "$tmp/rootfs" --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -cf "$tmp/layer.tar" .
  local diffid layer config manifest
  diffid=$(sha256sum "$tmp/layer.tar" | cut -d' ' -f1)
  gzip -n "$tmp/layer.tar"; layer=$(blob "$tmp" "$tmp/layer.tar.gz")
  printf '{"architecture":"amd64","os":"linux","config":{"User":"65535:65535","Entrypoint":["/pause"]},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' "$diffid" >"$tmp/config.json"
  config=$(blob "$tmp" "$tmp/config.json")
  printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%s},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":"sha256:%s","size":%s}]}' \
    "$config" "$(stat -c %s "$tmp/blobs/sha256/$config")" "$layer" "$(stat -c %s "$tmp/blobs/sha256/$layer")" >"$tmp/manifest.json"
  manifest=$(blob "$tmp" "$tmp/manifest.json")
  printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%s,"annotations":{"io.containerd.image.name":"%s"}}]}' \
    "$manifest" "$(stat -c %s "$tmp/blobs/sha256/$manifest")" "$PAUSE" >"$tmp/index.json"
  echo '{"imageLayoutVersion":"1.0.0"}' >"$tmp/oci-layout"
  tar -C "$tmp" --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -cf "$1" oci-layout index.json blobs
}
blob() { local d; d=$(sha256sum "$2" | cut -d' ' -f1); mv "$2" "$1/blobs/sha256/$d"; echo "$d"; }

up_api() {
  mkdir -p "$RUN/pki" "$RUN/etcd"
  ip netns add "$NS"
  echo "$NS" >"$STATE/netns"
  ip -n "$NS" link set lo up
  # The node's address: the CNI bridge, made before the plugin does (the
  # kubelet refuses a loopback node IP).
  ip -n "$NS" link add cni0 type bridge
  ip -n "$NS" addr add "$NODE_IP/24" dev cni0
  ip -n "$NS" link set cni0 up
  openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=e2e-apiserver \
    -addext "subjectAltName=IP:127.0.0.1,IP:$NODE_IP,IP:10.0.0.1,DNS:localhost" \
    -keyout "$RUN/pki/apiserver.key" -out "$RUN/pki/apiserver.crt" 2>/dev/null
  openssl genrsa -out "$RUN/pki/sa.key" 2048 2>/dev/null
  openssl rsa -in "$RUN/pki/sa.key" -pubout -out "$RUN/pki/sa.pub" 2>/dev/null
  (umask 077; : >"$RUN/pki/tokens.csv")
  local t name user group
  while read -r name user group; do
    t=$(token)
    echo "$t,$user,$user${group:+,\"$group\"}" >>"$RUN/pki/tokens.csv"
    kubeconfig "$RUN/$name.kubeconfig" "$user" "$t"
    [ "$name" = admin ] && (umask 077; echo -n "$t" >"$RUN/admin.token")
  done <<EOF
admin admin system:masters
controller-manager system:kube-controller-manager
scheduler system:kube-scheduler
kubelet system:node:$NODE_NAME system:nodes
kube-proxy system:kube-proxy
EOF
  start etcd etcd --name e2e --data-dir "$RUN/etcd" \
    --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
    --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
    --initial-cluster e2e=http://127.0.0.1:2380 --listen-metrics-urls http://127.0.0.1:2381
  wait_for etcd 30 etcd inns curl -sf --max-time 2 http://127.0.0.1:2379/health
  start kube-apiserver "$BIN/kube-apiserver" --etcd-servers=http://127.0.0.1:2379 \
    --bind-address=127.0.0.1 --advertise-address="$NODE_IP" --secure-port=6443 \
    --tls-cert-file="$RUN/pki/apiserver.crt" --tls-private-key-file="$RUN/pki/apiserver.key" \
    --token-auth-file="$RUN/pki/tokens.csv" --authorization-mode=Node,RBAC \
    --enable-admission-plugins=NodeRestriction \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --service-account-key-file="$RUN/pki/sa.pub" --service-account-signing-key-file="$RUN/pki/sa.key" \
    --service-cluster-ip-range="$SVC_CIDR" --kubelet-preferred-address-types=InternalIP --profiling=false
  wait_for kube-apiserver 300 kube-apiserver apiserver_ready
  start kube-controller-manager "$BIN/kube-controller-manager" \
    --kubeconfig="$RUN/controller-manager.kubeconfig" \
    --authentication-kubeconfig="$RUN/controller-manager.kubeconfig" \
    --authorization-kubeconfig="$RUN/controller-manager.kubeconfig" \
    --bind-address=127.0.0.1 --secure-port=10257 --leader-elect=false \
    --service-account-private-key-file="$RUN/pki/sa.key" --root-ca-file="$RUN/pki/apiserver.crt" \
    --use-service-account-credentials=true --controllers='*,-nodeipam'
  start kube-scheduler "$BIN/kube-scheduler" --kubeconfig="$RUN/scheduler.kubeconfig" \
    --authentication-kubeconfig="$RUN/scheduler.kubeconfig" --authorization-kubeconfig="$RUN/scheduler.kubeconfig" \
    --bind-address=127.0.0.1 --secure-port=10259 --leader-elect=false
}

# cgroot: the cgroup every pod and containerd shim goes under: below this
# shell's own memory cgroup (so the machine's limits still apply), named
# after the state directory so that down finds every PID in it.
cgroot() {
  local p
  p=$(awk -F: '$2=="memory"{print $3}' /proc/self/cgroup)
  [ -n "$p" ] || p=$(awk -F: '$1=="0"{print $3}' /proc/self/cgroup)
  echo "${p%/}/$NS"
}
cgdirs() { # every hierarchy's directory for cgroup $1
  if [ -f /sys/fs/cgroup/cgroup.controllers ]; then echo "/sys/fs/cgroup$1"; return; fi
  local h
  for h in /sys/fs/cgroup/*/; do case $h in */unified/) continue ;; esac; echo "$h${1#/}"; done
}
cgmem() { if [ -f /sys/fs/cgroup/cgroup.controllers ]; then echo "/sys/fs/cgroup$1"; else echo "/sys/fs/cgroup/memory$1"; fi; }

up_node() {
  mkdir -p "$STATE/containerd/root" "$STATE/containerd/state" "$RUN/cni/net.d" "$STATE/kubelet" "$STATE/pod-logs" "$RUN/runc"
  local cg d; cg=$(cgroot); echo "$cg" >"$STATE/cgroot"
  for d in $(cgdirs "$cg"); do mkdir -p "$d"; done
  # containerd 2 (hack/containerd-build.sh), config version 3: image
  # volumes (the pkcs11 overlay's module) need containerd >= 2.1.
  cat >"$RUN/containerd.toml" <<EOF
version = 3
root = "$STATE/containerd/root"
state = "$STATE/containerd/state"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.erofs", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]
[grpc]
  address = "$RUN/containerd.sock"
[ttrpc]
  address = "$RUN/containerd.ttrpc.sock"
[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "$PAUSE"
[plugins."io.containerd.cri.v1.runtime"]
  # No CAP_SYS_RESOURCE on this kind of machine: runc cannot lower the pause
  # container's oom_score_adj to -998 ("Permission denied").
  restrict_oom_score_adj = true
  enable_cdi = false
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      runtime_path = "$CTRD/containerd-shim-runc-v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = "$(command -v runc)"
        Root = "$RUN/runc"
        SystemdCgroup = false
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["/usr/lib/cni"]
    conf_dir = "$RUN/cni/net.d"
EOF
  cat >"$RUN/cni/net.d/10-e2e.conflist" <<EOF
{"cniVersion": "0.4.0", "name": "e2e", "plugins": [
  {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
   "ipam": {"type": "host-local", "dataDir": "$RUN/cni/ipam", "ranges": [[{"subnet": "$POD_CIDR", "gateway": "$NODE_IP"}]]}}
]}
EOF
  local rt; rt=$(cgmem "$cg")/runtime; mkdir -p "$rt"
  # containerd, and so every shim, in $cg/runtime: down kills that tree.
  start containerd bash -c 'echo $$ >"$1/cgroup.procs" && shift && exec "$@"' sh "$rt" \
    "$CTRD/containerd" --config "$RUN/containerd.toml"
  wait_for containerd 30 containerd ctr version
  local base
  base=$(sed -n 's/^ *newName: *//p' "$repo/deploy/kubernetes/base/kustomization.yaml" | head -1)
  pause_image "$STATE/pause.tar"
  ctr images import "$STATE/pause.tar" >&2
  tar -C "$IMAGE" -cf "$STATE/image.tar" .
  ctr images import --base-name "$base" "$STATE/image.tar" >&2
  # The same image under a second tag: the HA layout's rolling update.
  local tag; tag=$(sed -n 's/^ *newTag: *//p' "$repo/deploy/kubernetes/base/kustomization.yaml" | head -1)
  ROLLOUT_IMAGE=$base:$tag-e2e-rollout
  ctr images tag "$base:$tag" "$ROLLOUT_IMAGE" >&2
  log "images imported"
  : >"$RUN/resolv.conf"
  cat >"$RUN/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $NODE_IP
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication: {anonymous: {enabled: false}, webhook: {enabled: false}, x509: {}}
authorization: {mode: AlwaysAllow}
containerRuntimeEndpoint: unix://$RUN/containerd.sock
imageServiceEndpoint: unix://$RUN/containerd.sock
cgroupDriver: cgroupfs
cgroupRoot: $cg
failCgroupV1: false
failSwapOn: false
# Not -999 (the default): lowering it needs CAP_SYS_RESOURCE.
oomScoreAdj: 0
resolvConf: $RUN/resolv.conf
podLogsDir: $STATE/pod-logs
registerNode: true
# The disk is shared: never evict for disk, never collect images.
evictionHard: {memory.available: 100Mi}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
EOF
  # kube-proxy (nftables): the node's own connections to Service IPs need
  # a route to be DNATed.
  ip -n "$NS" route add "$SVC_CIDR" dev cni0
  cat >"$RUN/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: nftables
clientConnection: {kubeconfig: $RUN/kube-proxy.kubeconfig}
hostnameOverride: $NODE_NAME
clusterCIDR: $POD_CIDR
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
conntrack: {maxPerCore: 0}
EOF
  start kube-proxy "$BIN/kube-proxy" --config="$RUN/kube-proxy.yaml"
  start kubelet "$BIN/kubelet" --config="$RUN/kubelet.yaml" --kubeconfig="$RUN/kubelet.kubeconfig" \
    --root-dir="$STATE/kubelet" --hostname-override="$NODE_NAME" --node-ip="$NODE_IP" --v=1
  wait_for "node $NODE_NAME Ready" 180 kubelet node_ready
}

# hsm_module: the SoftHSMv2 "vendor module" the pkcs11 overlays mount as an
# image volume at /opt/hsm: Debian's libsofthsm2.so as the overlay's
# lib/libvendor.so, the libraries it needs beyond the image's C/C++ runtime
# (OpenSSL's libcrypto) beside it, its configuration and a token made the
# documented way (softhsm2-util --init-token, then steward-trustd-ceremony
# init with the overlay's token and object labels), built with hack/image
# -data and imported with ctr. The token is read-only in the pod (SoftHSM
# signs from a read-only token directory); both pkcs11 layouts share it,
# as replicas share a clustered HSM's key. The PIN stays in $STATE/hsm.
hsm_module() {
  local hsm=$STATE/hsm so=/usr/lib/softhsm/libsofthsm2.so l
  local mod=$hsm/module
  mkdir -p "$mod/lib" "$mod/etc" "$mod/tokens"
  cp "$so" "$mod/lib/libvendor.so"
  for l in $(ldd "$so" | awk '$2 == "=>" {print $3}'); do
    case ${l##*/} in libc.so.*|libm.so.*|libstdc++.so.*|libgcc_s.so.*|ld-linux*) continue ;; esac
    cp "$l" "$mod/lib/"
  done
  printf 'directories.tokendir = /opt/hsm/tokens\nobjectstore.backend = file\nlog.level = ERROR\n' >"$mod/etc/softhsm2.conf"
  printf 'directories.tokendir = %s\nobjectstore.backend = file\nlog.level = ERROR\n' "$mod/tokens" >"$hsm/softhsm2.conf"
  (umask 077; token >"$hsm/pin"; token >"$hsm/so-pin")
  SOFTHSM2_CONF=$hsm/softhsm2.conf timeout 30 softhsm2-util --init-token --free --label trustd \
    --so-pin "$(cat "$hsm/so-pin")" --pin "$(cat "$hsm/pin")" >/dev/null
  SOFTHSM2_CONF=$hsm/softhsm2.conf timeout 60 "$CEREMONY" init --cluster example --out "$hsm/certs" \
    --signer "pkcs11:token=trustd;object=os-ca?module-path=$so&pin-source=file:$hsm/pin" >&2
  (cd "$repo/hack/image" && timeout 120 go run . -data "$mod" -arch amd64 -out "$hsm/image" -tag "$HSM_TAG")
  tar -C "$hsm/image" -cf "$hsm/image.tar" .
  ctr images import --base-name "${HSM_IMAGE%:*}" "$hsm/image.tar" >&2
  log "SoftHSM module image $HSM_IMAGE imported"
}

logs() {
  local n
  for n in kube-apiserver kubelet containerd kube-proxy kube-controller-manager kube-scheduler; do
    [ -f "$RUN/$n.log" ] || continue
    echo "----- $n (last 60 lines) -----" >&2; tail -60 "$RUN/$n.log" >&2
  done
  local f
  for f in "$STATE"/pod-logs/*/*/*.log; do
    [ -f "$f" ] && { echo "----- container $f -----" >&2; tail -60 "$f" >&2; }
  done
  return 0
}

down() {
  set +e
  local name pid pids phase netns
  netns=$(pod_netns)   # before the pause containers are killed
  # etcd last: kube-apiserver's graceful shutdown writes to it.
  for phase in rest etcd; do
    pids=""
    for name in $(tac "$RUN/order" 2>/dev/null); do
      { [ "$phase" = etcd ] && [ "$name" != etcd ]; } && continue
      { [ "$phase" = rest ] && [ "$name" = etcd ]; } && continue
      pid=$(cat "$RUN/$name.pid" 2>/dev/null) && kill -TERM "$pid" 2>/dev/null && pids="$pids $pid"
    done
    local t=$SECONDS
    for pid in $pids; do
      while alive "$pid" && (( SECONDS - t < 10 )); do sleep 0.1; done
      kill -KILL "$pid" 2>/dev/null
    done
  done
  # Shims and containers outlive containerd: kill every PID in the tree.
  local cg=""
  if [ -f "$STATE/cgroot" ]; then
    cg=$(cat "$STATE/cgroot")
    for _ in 1 2 3 4 5; do
      pids=$(find "$(cgmem "$cg")" -name cgroup.procs -exec cat {} + 2>/dev/null)
      [ -n "$pids" ] || break
      kill -KILL $pids 2>/dev/null; sleep 0.5
    done
  fi
  # Mounts under the state directory (overlay roots, secret tmpfs, shm) and
  # the pod network namespaces containerd made there.
  grep -F " $STATE" /proc/self/mounts | awk '{print $2}' | sort -r | while read -r m; do umount -l "$m"; done
  local f
  for f in $netns; do umount -l "$f" 2>/dev/null; rm -f "$f"; done
  [ -f "$STATE/netns" ] && ip netns del "$(cat "$STATE/netns")"
  if [ -n "$cg" ]; then
    # Every hierarchy, the unified one too (the kubelet makes its cgroups there as well).
    for d in /sys/fs/cgroup/*/"${cg#/}" "/sys/fs/cgroup${cg}"; do
      [ -d "$d" ] && find "$d" -depth -type d -exec rmdir {} \; 2>/dev/null
    done
  fi
  rm -rf "$STATE" && echo "e2e-node: down ($STATE removed)" >&2
}

# pod_netns: the pods' network namespaces, the /run/netns/cni-* files
# containerd made for them: those whose inode is the network namespace of
# a process in this run's cgroup tree (the pause containers), so that no
# other job's namespace is touched.
pod_netns() {
  [ -f "$STATE/cgroot" ] || return 0
  local pid f ino inos=" "
  for pid in $(find "$(cgmem "$(cat "$STATE/cgroot")")" -name cgroup.procs -exec cat {} + 2>/dev/null); do
    ino=$(stat -L -c %i "/proc/$pid/ns/net" 2>/dev/null) && inos="$inos$ino "
  done
  for f in /run/netns/cni-*; do
    [ -e "$f" ] || continue
    ino=$(stat -L -c %i "$f" 2>/dev/null) && [[ $inos == *" $ino "* ]] && echo "$f"
  done
  return 0
}

if [ "${1:-}" = down ]; then STATE=${2:?usage: e2e-node.sh down STATE}; RUN=$STATE/run; down; exit; fi
[ "$(id -u)" -eq 0 ] || { echo "e2e-node: needs root (network namespace, cgroups, mounts)" >&2; exit 2; }
BIN=$(realpath "${1:?usage: e2e-node.sh BIN CTRD IMAGE GENCREDS}") CTRD=$(realpath "${2:?}") IMAGE=$(realpath "${3:?}") GENCREDS=$(realpath "${4:?}")
CEREMONY=$(dirname "$GENCREDS")/steward-trustd-ceremony
for b in kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy; do
  [ -x "$BIN/$b" ] || { echo "e2e-node: $BIN/$b missing: hack/k8s-build.sh $b" >&2; exit 2; }
done
for b in containerd containerd-shim-runc-v2 ctr; do
  [ -x "$CTRD/$b" ] || { echo "e2e-node: $CTRD/$b missing: hack/containerd-build.sh" >&2; exit 2; }
done
[ -f /usr/lib/softhsm/libsofthsm2.so ] || { echo "e2e-node: SoftHSMv2's module missing: run hack/deps.sh" >&2; exit 2; }
for c in etcd runc nft curl openssl gcc softhsm2-util "$CEREMONY" /usr/lib/cni/bridge; do
  command -v "$c" >/dev/null || { echo "e2e-node: $c missing: run hack/deps.sh" >&2; exit 2; }
done
PAUSE_TAG=3.10.2 PAUSE=localhost/e2e/pause:3.10.2
HSM_TAG=$(dpkg-query -W -f '${Version}' softhsm2 | tr -c 'A-Za-z0-9._\n-' _) HSM_IMAGE=localhost/e2e/softhsm-module:$HSM_TAG
STATE=${E2E_STATE:-$(mktemp -d /tmp/steward-e2e.XXXXXX)}; RUN=$STATE/run
mkdir -p "$RUN"; : >"$RUN/order"
NS=steward-e2e-$$
trap 'rc=$?; [ $rc -eq 0 ] || logs; if [ -n "${E2E_KEEP:-}" ]; then log "kept: hack/e2e-node.sh down $STATE"; else down; fi; exit $rc' EXIT
up_api
up_node
hsm_module
# Talos v1.14.1's worker code (test/deploy's TestTalosWorkerThroughService)
# as a test binary TestNodeE2E runs against each layout's Service; it
# lives in test/deploy because Talos's module graph would change the
# Kubernetes binaries test/k8s builds.
(cd "$repo/test/deploy" && timeout 300 go test -c -o "$STATE/talos-worker.test" .)
log "cluster up"
# The tests run inside the namespace (the API server, the pod and the
# Service are reachable only there).
export STEWARD_K8S_E2E=1 E2E_STATE=$STATE E2E_GENCREDS=$GENCREDS E2E_TALOS_WORKER=$STATE/talos-worker.test \
  E2E_HSM=$STATE/hsm E2E_HSM_IMAGE=$HSM_IMAGE E2E_ROLLOUT_IMAGE=$ROLLOUT_IMAGE
(cd "$repo/test/k8s" && timeout 900 nsenter --net="/run/netns/$NS" go test -count=1 -v -timeout 840s -run '^TestNodeE2E$' .)
log "TestNodeE2E passed"
