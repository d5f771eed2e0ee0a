//go:build tools

// Package crds holds CustomResourceDefinitions that the test API servers install and
// that their projects ship in no usable form: System Upgrade Controller's Plan,
// Longhorn's v1beta2 kinds, KubeVirt's VirtualMachine, VirtualMachineInstance and
// VirtualMachineInstanceMigration (KubeVirt's operator builds its CRDs in code),
// Harvester's VirtualMachineBackup and ScheduleVMBackup, and the Rancher kinds the
// Harvester cluster upgrade drives (provisioning Cluster, ManagedChart, Setting,
// ClusterRepo, and Fleet's Bundle). Harvester's and Rancher's Go modules are not served by the module proxy:
// the updater's own types of them (harvesteradapter/harvesterapi, harvesteradapter/rancher)
// are the source. They are generated from Go types with controller-gen (make test-crds)
// and checked in. KubeVirt's (with the install CR KubeVirt) get the status subresource
// KubeVirt gives them (virt-operator's resource/generate/components/crds.go) added by the
// Makefile. RKE2's helm-controller HelmChart and HelmChartConfig (helm/) are the CRDs its Go
// module ships, generated there from its types with controller-gen, copied by the Makefile.
// One is written by hand: Multus's NetworkAttachmentDefinition (multus/), whose Go module
// the module proxy does not serve: a minimal definition of the kind's shape.
package crds

import (
	_ "github.com/longhorn/longhorn-manager/k8s/pkg/apis/longhorn/v1beta2"
	_ "github.com/rancher/system-upgrade-controller/pkg/apis/upgrade.cattle.io/v1"
	_ "kubevirt.io/api/core/v1"
)
