//go:build tools

// Package tools pins the kube-apiserver that the test control plane runs. It is a
// module of its own so that k8s.io/kubernetes and its staging replacements never
// reach the project's own dependency graph.
package tools

import _ "k8s.io/kubernetes/cmd/kube-apiserver"
