// Package rancher gathers our own types of the Rancher kinds the Harvester cluster
// upgrade drives (subpackages provisioningv1, managementv3 and catalogv1) and the names
// of the objects Harvester keeps of them (shared/facts/harvester-node-upgrade.md,
// section F).
package rancher

import (
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher/catalogv1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher/fleetv1alpha1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher/managementv3"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher/provisioningv1"
)

// Names of the Rancher objects of a Harvester cluster (facts 41.4, 41.8, 41.9, 41.11).
const (
	// FleetLocal is the namespace of the local cluster's provisioning Cluster and of the
	// ManagedCharts, and the Fleet workspace of the local cluster.
	FleetLocal = "fleet-local"
	// LocalCluster is the provisioning Cluster that stands for the Harvester cluster.
	LocalCluster = "local"
	// CattleSystem is Rancher's namespace.
	CattleSystem = "cattle-system"
	// RancherDeployment is Rancher's Deployment in CattleSystem.
	RancherDeployment = "rancher"
	// ClusterRepoDeployment serves the harvester-charts Helm repository, in CattleSystem.
	ClusterRepoDeployment = "harvester-cluster-repo"
	// RancherChartsRepo is the ClusterRepo of Rancher's own charts.
	RancherChartsRepo = "rancher-charts"
	// RancherRKE2ChartsRepo and RancherPartnerChartsRepo are Rancher's other chart
	// repositories, which it creates when it starts.
	RancherRKE2ChartsRepo    = "rancher-rke2-charts"
	RancherPartnerChartsRepo = "rancher-partner-charts"
	// ChartDefaultBranchSetting is Rancher's Setting of the branch its chart repositories
	// follow.
	ChartDefaultBranchSetting = "chart-default-branch"
	// LocalRKEStateSecret, in FleetLocal, holds the local cluster's RKE2 state; Rancher
	// v2.7 and later require its type to be RKEClusterStateType (fact 18).
	LocalRKEStateSecret = "local-rke-state"
	RKEClusterStateType = "rke.cattle.io/cluster-state"
	// HarvesterChartsRepo is the ClusterRepo of Harvester's charts.
	HarvesterChartsRepo = "harvester-charts"
	// ServerVersionSetting is the Setting holding the running Rancher version.
	ServerVersionSetting = "server-version"
	// HarvesterChart and HarvesterCRDChart are Harvester's ManagedCharts.
	HarvesterChart    = "harvester"
	HarvesterCRDChart = "harvester-crd"
	// MonitoringCRDChart and LoggingCRDChart are the addon CRD ManagedCharts.
	MonitoringCRDChart = "rancher-monitoring-crd"
	LoggingCRDChart    = "rancher-logging-crd"
	// ManagementClusterNameLabel links a provisioning Cluster to its management cluster
	// (fact 41.9).
	ManagementClusterNameLabel = "provisioning.cattle.io/management-cluster-name"
)

// AddToScheme registers every kind of the subpackages.
func AddToScheme(s *runtime.Scheme) error {
	for _, add := range []func(*runtime.Scheme) error{provisioningv1.AddToScheme, managementv3.AddToScheme, catalogv1.AddToScheme, fleetv1alpha1.AddToScheme} {
		if err := add(s); err != nil {
			return err
		}
	}
	return nil
}
