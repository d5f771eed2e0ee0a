package preview

import (
	"context"
	"errors"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/version"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/controllers/cascade"
	"github.com/capi-inplace/capi-inplace/controllers/disruption"
	"github.com/capi-inplace/capi-inplace/controllers/preflight"
	"github.com/capi-inplace/capi-inplace/controllers/upgraderequest"
	"github.com/capi-inplace/capi-inplace/nodeupdater"
)

// previewScope is everything one computation reads, before it judges anything.
type previewScope struct {
	preview *inplacev1.UpgradePreview
	cluster *clusterv1.Cluster
	version *version.Version
	// updaterRef is the updater the run would use; empty when the Cluster has none.
	updaterRef inplacev1.UpdaterReference
	// targets are the control plane, then the MachineDeployments, in the cascade's order.
	targets []*target
	// nodes are the workload cluster's Nodes by name.
	nodes map[string]*corev1.Node
	// nodeUpdates are every NodeUpdate of the Cluster.
	nodeUpdates []inplacev1.NodeUpdate
	budget      *disruption.Budget
	// total and estimateSource are the estimate of the whole upgrade.
	total          *metav1.Duration
	estimateSource string
	// mappings are the kinds mapped in this computation (Reconciler.mapping).
	mappings map[schema.GroupKind]mappingResult
	// notes say what the preview could not read, and judged without.
	notes []string
	// problem, when set, is why the run would refuse the upgrade: the preview Failed.
	problem string
}

// target is a control plane or MachineDeployment with its machines and their judgement.
type target struct {
	ref            upgraderequest.Target
	machines       []clusterv1.Machine
	maxUnavailable int
	entries        []*entry
}

// display names the target as PreviewMachine.target shows it.
func (t *target) display() string {
	if t.ref.ControlPlaneRef != nil {
		return t.ref.ControlPlaneRef.Kind + "/" + t.ref.ControlPlaneRef.Name
	}
	return "MachineDeployment/" + t.ref.Name()
}

// entry is one machine of the preview.
type entry struct {
	machine *clusterv1.Machine
	node    *corev1.Node
	paused  bool
	status  inplacev1.PreviewMachine
}

// note records what the preview could not read, once however many machines share it.
func (s *previewScope) note(format string, args ...any) {
	if n := fmt.Sprintf(format, args...); !slices.Contains(s.notes, n) {
		s.notes = append(s.notes, n)
	}
}

// readScope reads what the run would read. A request the run would refuse (a version
// that does not parse, a downgrade, a Cluster that does not exist) sets problem.
func (r *Reconciler) readScope(ctx context.Context, p *inplacev1.UpgradePreview) (*previewScope, error) {
	s := &previewScope{preview: p}
	v, d := upgraderequest.ParseTargetVersion(p.Spec.Version)
	if d != nil {
		s.problem = "spec.version: " + d.Message
		return s, nil
	}
	s.version = v

	s.cluster = &clusterv1.Cluster{}
	if err := r.Client.Get(ctx, client.ObjectKey{Namespace: p.Namespace, Name: p.Spec.ClusterName}, s.cluster); err != nil {
		if apierrors.IsNotFound(err) {
			s.problem = fmt.Sprintf("Cluster %s/%s not found: set spec.clusterName to a Cluster in the preview's namespace", p.Namespace, p.Spec.ClusterName)
			return s, nil
		}
		return nil, fmt.Errorf("read Cluster %s/%s: %w", p.Namespace, p.Spec.ClusterName, err)
	}
	if err := r.readTargets(ctx, s); err != nil || s.problem != "" {
		return s, err
	}
	r.resolveUpdater(ctx, s)

	clusterMachines, err := upgraderequest.ClusterMachines(ctx, r.Client, p.Namespace, p.Spec.ClusterName)
	if err != nil {
		return nil, err
	}
	nus := &inplacev1.NodeUpdateList{}
	if err := r.Client.List(ctx, nus, client.InNamespace(p.Namespace)); err != nil {
		return nil, fmt.Errorf("list NodeUpdates in namespace %s: %w", p.Namespace, err)
	}
	for i := range nus.Items {
		// By spec.clusterName, as the run keeps them: a hand-made NodeUpdate has no label.
		if nus.Items[i].Spec.ClusterName == p.Spec.ClusterName {
			s.nodeUpdates = append(s.nodeUpdates, nus.Items[i])
		}
	}
	s.nodes = r.readNodes(ctx, s)
	s.budget = disruption.Compute(clusterMachines, s.nodes, s.nodeUpdates)
	return s, nil
}

// readTargets reads the control plane and the MachineDeployments with their machines,
// checks the version against every machine as the Requester does, and resolves
// maxUnavailable per target as the task does (a control plane always 1).
func (r *Reconciler) readTargets(ctx context.Context, s *previewScope) error {
	var refs []upgraderequest.Target
	if cp := s.cluster.Spec.ControlPlaneRef; cp.IsDefined() {
		refs = append(refs, upgraderequest.Target{ControlPlaneRef: &inplacev1.ControlPlaneReference{APIGroup: cp.APIGroup, Kind: cp.Kind, Name: cp.Name}})
	}
	mds, err := cascade.MachineDeploymentsInOrder(ctx, r.Client, s.cluster)
	if err != nil {
		return err
	}
	for _, md := range mds {
		refs = append(refs, upgraderequest.Target{MachineDeploymentRef: &inplacev1.MachineDeploymentReference{Name: md.Name}})
	}
	if len(refs) == 0 {
		s.problem = fmt.Sprintf("Cluster %s has neither a control plane (spec.controlPlaneRef) nor MachineDeployments: nothing to upgrade", s.cluster.Name)
		return nil
	}
	for _, ref := range refs {
		machines, err := upgraderequest.TargetMachines(ctx, r.Client, s.cluster.Namespace, s.cluster.Name, ref)
		if err != nil {
			return err
		}
		if d := upgraderequest.CheckMachineVersions(s.preview.Spec.Version, s.version, machines, ref.IsControlPlane()); d != nil {
			s.problem = fmt.Sprintf("%s: %s (%s)", ref, d.Message, d.Reason)
			return nil
		}
		n, err := preflight.ResolveMaxUnavailable(s.preview.Spec.MaxUnavailable, len(machines))
		if err != nil {
			s.problem = fmt.Sprintf("spec.%v: give a whole number of at least 1 or a percentage from 1%% to 100%%", err)
			return nil
		}
		if ref.IsControlPlane() {
			// One control plane node at a time keeps etcd's and the API servers' quorum,
			// whatever maxUnavailable says.
			n = 1
		}
		s.targets = append(s.targets, &target{ref: ref, machines: machines, maxUnavailable: n})
	}
	return nil
}

// resolveUpdater resolves the updater the run would use: the Cluster's annotation, else
// spec.updaterRef, else the manager's default. Without one nothing is in place, which
// the hooks' answers say machine by machine; an unusable one is noted.
func (r *Reconciler) resolveUpdater(ctx context.Context, s *previewScope) {
	ref, source, err := nodeupdater.ResolveUpdater(s.cluster, s.preview.Spec.UpdaterRef, r.DefaultUpdater)
	if err != nil {
		var none *nodeupdater.NoUpdaterError
		if !errors.As(err, &none) {
			s.note("updater: %v", err)
		}
		return
	}
	if err := nodeupdater.CheckUpdaterAvailable(ctx, r.Client, r.Registry, s.cluster.Namespace, ref); err != nil {
		s.note("updater %s (named by %s): %v", ref, source, err)
	}
	s.updaterRef = ref
}

// readNodes lists the workload cluster's Nodes. An unreachable workload cluster is noted,
// and every node then shows held by NodeReady, as the run would hold it.
func (r *Reconciler) readNodes(ctx context.Context, s *previewScope) map[string]*corev1.Node {
	out := map[string]*corev1.Node{}
	key := client.ObjectKeyFromObject(s.cluster)
	workload, err := r.Workload.Client(ctx, key)
	if err != nil {
		s.note("cannot reach the workload cluster of Cluster %s: %v; no node would start until it is reachable", key, err)
		return out
	}
	nodes := &corev1.NodeList{}
	if err := workload.List(ctx, nodes); err != nil {
		s.note("cannot list the Nodes of the workload cluster of Cluster %s: %v; no node would start until they can be read", key, err)
		return out
	}
	for i := range nodes.Items {
		out[nodes.Items[i].Name] = &nodes.Items[i]
	}
	return out
}

// pausedNode reports whether spec.pauseNodes names the machine or its node, as the task
// judges it.
func pausedNode(p *inplacev1.UpgradePreview, m *clusterv1.Machine) bool {
	return slices.Contains(p.Spec.PauseNodes, m.Status.NodeRef.Name) || slices.Contains(p.Spec.PauseNodes, m.Name)
}
