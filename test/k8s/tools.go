//go:build tools

// Package k8s tests the deploy/ layouts against a real Kubernetes. This file
// pins the Kubernetes commands hack/k8s-build.sh builds from this module, so
// their versions (k8s.io/kubernetes and its staging modules, replaced by
// the same releases published on their own) live in go.mod and go.sum.
package k8s

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
