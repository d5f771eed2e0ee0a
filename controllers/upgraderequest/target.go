package upgraderequest

import (
	"context"
	"fmt"
	"slices"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/version"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/internal/kubeversion"
	"github.com/capi-inplace/capi-inplace/nodeupdater"
)

// Target is the control plane or MachineDeployment an upgrade is for.
type Target struct {
	// ControlPlaneRef is set for a control plane.
	ControlPlaneRef *inplacev1.ControlPlaneReference
	// MachineDeploymentRef is set for a MachineDeployment.
	MachineDeploymentRef *inplacev1.MachineDeploymentReference
}

// TargetOf returns the target of a task.
func TargetOf(task *inplacev1.UpgradeTask) Target {
	return Target{ControlPlaneRef: task.Spec.ControlPlaneRef, MachineDeploymentRef: task.Spec.MachineDeploymentRef}
}

// IsControlPlane reports whether the target is a control plane.
func (t Target) IsControlPlane() bool { return t.ControlPlaneRef != nil }

// Name is the name of the control plane or MachineDeployment.
func (t Target) Name() string {
	if t.ControlPlaneRef != nil {
		return t.ControlPlaneRef.Name
	}
	if t.MachineDeploymentRef != nil {
		return t.MachineDeploymentRef.Name
	}
	return ""
}

// String renders the target for messages, for example "MachineDeployment workers".
func (t Target) String() string {
	if t.ControlPlaneRef != nil {
		return t.ControlPlaneRef.Kind + " " + t.ControlPlaneRef.Name
	}
	if t.MachineDeploymentRef != nil {
		return "MachineDeployment " + t.MachineDeploymentRef.Name
	}
	return "no target"
}

// Same reports whether two targets name the same object.
func (t Target) Same(o Target) bool {
	switch {
	case t.ControlPlaneRef != nil && o.ControlPlaneRef != nil:
		return *t.ControlPlaneRef == *o.ControlPlaneRef
	case t.MachineDeploymentRef != nil && o.MachineDeploymentRef != nil:
		return t.MachineDeploymentRef.Name == o.MachineDeploymentRef.Name
	}
	return false
}

// ClusterMachines lists every Machine of a Cluster as the cache holds them, not copied:
// the caller only reads them (the disruption budget of the whole Cluster).
func ClusterMachines(ctx context.Context, c client.Reader, namespace, clusterName string) ([]clusterv1.Machine, error) {
	machines := &clusterv1.MachineList{}
	if err := c.List(ctx, machines, client.InNamespace(namespace), client.MatchingLabels{clusterv1.ClusterNameLabel: clusterName}, client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("list machines of Cluster %s/%s: %w", namespace, clusterName, err)
	}
	return machines.Items, nil
}

// TargetMachines lists the Machines of a target, sorted by name: for a control plane the
// machines it owns, for a MachineDeployment the machines of the MachineSets it owns. They
// are the caller's own copies.
func TargetMachines(ctx context.Context, c client.Reader, namespace, clusterName string, t Target) ([]clusterv1.Machine, error) {
	// The Cluster's Machines as the cache holds them, not copied: only those of the target
	// are copied, below.
	shared, err := sharedTargetMachines(ctx, c, namespace, clusterName, t)
	if err != nil {
		return nil, err
	}
	out := make([]clusterv1.Machine, len(shared))
	for i := range shared {
		shared[i].DeepCopyInto(&out[i])
	}
	return out, nil
}

// sharedTargetMachines is TargetMachines for a caller that only reads them: the cached
// Machines themselves, not copies (a copy of every Machine of the target was a sixth of a
// CanUpdateMachineSet call's CPU time in make bench).
func sharedTargetMachines(ctx context.Context, c client.Reader, namespace, clusterName string, t Target) ([]clusterv1.Machine, error) {
	all, err := ClusterMachines(ctx, c, namespace, clusterName)
	if err != nil {
		return nil, err
	}
	return TargetMachinesOf(ctx, c, namespace, clusterName, all, t)
}

// TargetMachinesOf picks the Machines of a target out of the Cluster's Machines (all,
// from ClusterMachines), sorted by name, without copying them: each shares its maps and
// slices with all (and the cache all came from), so the caller only reads them, and
// copies one before it changes it. A reconcile of a task of hundreds of machines copies
// only the few it writes (issue #55).
func TargetMachinesOf(ctx context.Context, c client.Reader, namespace, clusterName string, all []clusterv1.Machine, t Target) ([]clusterv1.Machine, error) {
	var in []*clusterv1.Machine
	switch {
	case t.ControlPlaneRef != nil:
		for i := range all {
			if m := &all[i]; ownedBy(m.OwnerReferences, t.ControlPlaneRef.APIGroup, t.ControlPlaneRef.Kind, t.ControlPlaneRef.Name) {
				in = append(in, m)
			}
		}
	case t.MachineDeploymentRef != nil:
		sets := &clusterv1.MachineSetList{}
		if err := c.List(ctx, sets, client.InNamespace(namespace), client.MatchingLabels{clusterv1.ClusterNameLabel: clusterName}, client.UnsafeDisableDeepCopy); err != nil {
			return nil, fmt.Errorf("list machine sets of Cluster %s/%s: %w", namespace, clusterName, err)
		}
		ownSets := map[string]bool{}
		for _, ms := range sets.Items {
			if ownedBy(ms.OwnerReferences, clusterv1.GroupVersion.Group, "MachineDeployment", t.MachineDeploymentRef.Name) {
				ownSets[ms.Name] = true
			}
		}
		for i := range all {
			m := &all[i]
			for _, ref := range m.OwnerReferences {
				if ref.Kind == "MachineSet" && groupOf(ref.APIVersion) == clusterv1.GroupVersion.Group && ownSets[ref.Name] {
					in = append(in, m)
					break
				}
			}
		}
	}
	// Sorted as pointers: sorting the Machines would move whole structs.
	slices.SortFunc(in, func(a, b *clusterv1.Machine) int { return strings.Compare(a.Name, b.Name) })
	out := make([]clusterv1.Machine, len(in))
	for i, m := range in {
		out[i] = *m
	}
	return out, nil
}

func ownedBy(refs []metav1.OwnerReference, group, kind, name string) bool {
	for _, ref := range refs {
		if ref.Kind == kind && ref.Name == name && groupOf(ref.APIVersion) == group {
			return true
		}
	}
	return false
}

func groupOf(apiVersion string) string {
	gv, err := schema.ParseGroupVersion(apiVersion)
	if err != nil {
		return ""
	}
	return gv.Group
}

// CurrentVersion is the Kubernetes version a machine runs: the newer of the version
// reached in place (in-place-upgrade-release annotation) and the kubelet version Cluster
// API last saw on its Node (status.nodeInfo), else Machine.spec.version. Empty when none
// is known. spec.version comes last because Cluster API writes the desired version there
// before it asks an extension to update the machine in place. The newer record wins
// because the annotation lags the node when the NodeUpdate that upgraded it ended without
// its success being written to the Machine (its task was aborted or deleted in the same
// moment): the soak's seed 2 upgraded such a node a second time because the older
// annotation hid the kubelet's report (ReachedInPlace had the same fault, seed 235).
// When the two cannot be ordered (build metadata without an order) the annotation wins.
func CurrentVersion(m *clusterv1.Machine) string {
	release := m.Annotations[inplacev1.UpgradeReleaseAnnotation]
	kubelet := nodeKubeletVersion(m)
	rv, rerr := kubeversion.ParseSemantic(release)
	kv, kerr := kubeversion.ParseSemantic(kubelet)
	switch {
	case rerr == nil && kerr == nil:
		if order, err := kubeversion.Compare(kv, rv); err == nil && order > 0 {
			return kubelet
		}
		return release
	case release != "":
		return release
	case kubelet != "":
		return kubelet
	}
	return m.Spec.Version
}

// RequiresUpgrade reports whether a machine is not at target yet: its version is older by
// kubeversion.Compare (v1.33.3 to v1.34.1, v1.33.3+rke2r1 to v1.33.3+rke2r2). A machine
// whose version is unknown or unparsable requires the upgrade. A machine whose version
// differs from target only in build metadata that has no order (+foo, or none, against
// +rke2r2) does not: it is not known to be older, and a change that may be a downgrade is
// never made in place (the Requester declines such a request up front).
func RequiresUpgrade(m *clusterv1.Machine, target *version.Version) bool {
	cur, err := kubeversion.ParseSemantic(CurrentVersion(m))
	if err != nil {
		return true
	}
	order, err := kubeversion.Compare(cur, target)
	return err == nil && order < 0
}

// ReachedInPlace reports whether a machine is known to run target from what the node
// says or what an in-place upgrade recorded (the release annotation, the kubelet version
// in status.nodeInfo); Machine.spec.version is not evidence, since Cluster API sets it to
// the desired version before the update. A machine Cluster API hands over for an update
// is upgraded unless this holds.
//
// Either record is enough: the release annotation lags the node when the NodeUpdate that
// upgraded it ended without its success being written to the Machine (its task was
// aborted in the same moment: the soak's seed 235 upgraded such a node a second time
// because an older release annotation hid the kubelet's report). A kubelet that reports
// the target without the annotation is then judged by the updater (AtTarget), so a node
// whose later step failed is still upgraded again.
func ReachedInPlace(m *clusterv1.Machine, target *version.Version) bool {
	for _, v := range []string{m.Annotations[inplacev1.UpgradeReleaseAnnotation], nodeKubeletVersion(m)} {
		if cur, err := kubeversion.ParseSemantic(v); err == nil && sameRelease(cur, target) {
			return true
		}
	}
	return false
}

func nodeKubeletVersion(m *clusterv1.Machine) string {
	if m.Status.NodeInfo == nil {
		return ""
	}
	return m.Status.NodeInfo.KubeletVersion
}

// sameRelease reports whether two versions are the same release, build metadata included
// (kubeversion.Compare says 0).
func sameRelease(a, b *version.Version) bool {
	return kubeversion.SameRelease(a, b)
}

// AtTarget reports whether machine m runs target as its updater upgrades it. The release
// annotation, written when a NodeUpdate of capi-inplace finished well, is the record of
// that. A kubelet that reports the target without that record (a machine never upgraded
// in place, or one whose kubelet was upgraded and whose later step failed) counts only if
// the updater, when it judges (nodeupdater.TargetJudge), agrees; why says what is missing.
func AtTarget(ctx context.Context, registry *nodeupdater.Registry, target nodeupdater.PreflightTarget, m *clusterv1.Machine, v *version.Version) (bool, string, error) {
	if rel, err := kubeversion.ParseSemantic(m.Annotations[inplacev1.UpgradeReleaseAnnotation]); err == nil && sameRelease(rel, v) {
		return true, "", nil
	}
	if !ReachedInPlace(m, v) {
		return false, "", nil
	}
	return registry.AtTarget(ctx, target)
}
