#!/usr/bin/env bash
# Installs the system packages the tests and run-local need: swtpm (TPM
# simulator), SoftHSMv2 (PKCS#11 token), tpm2-tools, libssl-dev (cgo for
# the in-process TPM simulator), bubblewrap, systemd (systemd-analyze) and
# linux-libc-dev (syscall numbers) for the systemd unit's sandbox in
# TestSystemdUnit, and the arm64 cgo cross-compiler and C/C++ runtime for
# `make image` (gcc-aarch64-linux-gnu, libc6-dev-arm64-cross,
# libstdc++6-arm64-cross, libgcc-s1-arm64-cross), and prometheus for its
# promtool, which evaluates deploy/prometheus/alerts.yaml in the tests
# (Debian ships promtool only in that package, with the server; on a host
# with systemd, `systemctl disable --now prometheus` if you do not want it
# running). As root it runs apt-get; otherwise it says exactly what to run.
set -euo pipefail
pkgs=(swtpm swtpm-tools softhsm2 tpm2-tools libssl-dev gcc bubblewrap systemd linux-libc-dev
  gcc-aarch64-linux-gnu libc6-dev-arm64-cross libstdc++6-arm64-cross libgcc-s1-arm64-cross prometheus)
# PKCS#11 conformance matrix (test/talos TestPKCS11Matrix): opencryptoki
# (its soft token and pkcsslotd), tpm2-pkcs11 with tpm2_ptool, tpm2-abrmd
# and its TCTI plus dbus-daemon (the resource manager tpm2-pkcs11 needs in
# front of swtpm), gnutls-bin for p11tool, which reads the tokens.
pkgs+=(opencryptoki libtpm2-pkcs11-1 libtpm2-pkcs11-tools tpm2-abrmd libtss2-tcti-tabrmd0 dbus-daemon gnutls-bin)
# etcd-server: the etcd that test/k8s starts beside kube-apiserver (on its
# own loopback ports; on a host with systemd, `systemctl disable --now etcd`
# if you do not want Debian's service running).
pkgs+=(etcd-server)
# containerd, runc: hack/image's TestContainerdImports hands the image to a
# real containerd (its own root and socket; no service is used).
pkgs+=(containerd runc)
# containernetworking-plugins (bridge, host-local), nftables (kube-proxy's
# nftables mode), curl: make e2e's node (hack/e2e-node.sh), which runs
# containerd and kube-proxy inside a network namespace of its own.
pkgs+=(containernetworking-plugins nftables curl iproute2)
# jq: make vulncheck (part of make lint) reads govulncheck's JSON findings.
pkgs+=(jq)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
  echo "missing packages: ${missing[*]}" >&2
  echo "run as root: apt-get update && apt-get install -y ${missing[*]}" >&2
  exit 1
fi
echo "installing: ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq "${missing[@]}" >/dev/null
