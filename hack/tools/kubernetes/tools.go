//go:build tools

// Package tools pins the kube-apiserver that the test control plane runs, the kubectl
// of the same release that the demo and the tests use to show what an operator sees, and
// the kubeadm of the same release that make check-real-kubeadm runs against a test API
// server. It is a module of its own so that k8s.io/kubernetes and its staging
// replacements never reach the project's own dependency graph.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kubeadm"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
