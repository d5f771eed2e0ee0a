// Package kube holds the few helpers about Kubernetes objects of a workload cluster that
// the Harvester updater's packages share.
package kube

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// NodeReady reports whether the node's Ready condition is True.
func NodeReady(node *corev1.Node) bool {
	for _, c := range node.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// KindServed says whether the cluster c reaches serves the kind gk at version.
func KindServed(c client.Client, gk schema.GroupKind, version string) (bool, error) {
	_, err := c.RESTMapper().RESTMapping(gk, version)
	switch {
	case err == nil:
		return true, nil
	case meta.IsNoMatchError(err):
		return false, nil
	default:
		return false, fmt.Errorf("ask the workload cluster whether it serves %s: %w", gk, err)
	}
}

// WorkloadClients hands out clients of workload clusters (see package workloadcluster).
type WorkloadClients interface {
	Client(ctx context.Context, cluster types.NamespacedName) (client.Client, error)
}
