package upgradetask

import (
	"context"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// WorkloadClusters gives clients of the workload clusters, to read their Nodes.
// *workloadcluster.Clients (built from CAPI's kubeconfig Secrets) satisfies it.
type WorkloadClusters interface {
	// Client returns a client of the workload cluster of the Cluster namespace/name.
	Client(ctx context.Context, cluster types.NamespacedName) (client.Client, error)
}

// SameCluster is a WorkloadClusters whose workload clusters are all reached with one
// client: the management cluster itself (a self-managed Harvester cluster), or the test
// API server.
type SameCluster struct {
	// Management reads Nodes.
	Management client.Client
}

// Client implements WorkloadClusters.
func (s SameCluster) Client(context.Context, types.NamespacedName) (client.Client, error) {
	return s.Management, nil
}
