//go:build tools

// Package tools pins the Cluster API controllers that the end-to-end tests and
// `make demo ARGS=--via=capi` run as processes against the test API server: the core
// manager, the KubeadmControlPlane and kubeadm bootstrap managers, and the Docker
// infrastructure provider (CAPD), whose in-memory backend needs no Docker. It is a module
// of its own so that CAPD's dependencies never reach the project's own graph; the
// versions follow the project's go.mod (cluster-api and cluster-api/test).
package tools

import (
	_ "sigs.k8s.io/cluster-api/bootstrap/kubeadm"
	_ "sigs.k8s.io/cluster-api/controlplane/kubeadm"
	_ "sigs.k8s.io/cluster-api/core"
	_ "sigs.k8s.io/cluster-api/test/infrastructure/docker"
)
