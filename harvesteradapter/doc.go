// Package harvesteradapter is capi-inplace's Harvester updater: it upgrades one node of a
// Harvester / RKE2 cluster in place per NodeUpdate, configured by a HarvesterUpgrader.
//
// This package holds the Updater and the steps of one node (step_*.go, in the order of
// the pipeline in steps.go). The rest is split by concern:
//   - upgradeplan: the cluster's UpgradePlan (once per cluster and release) and its phases;
//   - clusterupgrade: the cluster step the plan runs as a Job on the workload cluster;
//   - clusterchecks: the cluster preflight the plan runs first;
//   - releases: release metadata, versions, whether a node runs a release;
//   - repository: the pod-based upgrade repository and the reading of its metadata;
//   - suc, kubevirt, longhorn, rancher: the workload-side clients of System Upgrade
//     Controller's Plans, KubeVirt, Longhorn and Rancher;
//   - api/v1alpha1: the HarvesterUpgrader and UpgradePlan kinds; harvesterapi,
//     longhornlive: the few foreign kinds the updater reads.
package harvesteradapter
