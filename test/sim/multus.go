package sim

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// The kinds the Multus simulator works with, as unstructured objects: helm-controller's
// (github.com/k3s-io/helm-controller pkg/apis/helm.cattle.io/v1, CRDs in test/crds/helm) and
// Multus's NetworkAttachmentDefinition (test/crds/multus).
var (
	HelmChartGVK       = schema.GroupVersionKind{Group: "helm.cattle.io", Version: "v1", Kind: "HelmChart"}
	HelmChartConfigGVK = schema.GroupVersionKind{Group: "helm.cattle.io", Version: "v1", Kind: "HelmChartConfig"}
	NADGVK             = schema.GroupVersionKind{Group: "k8s.cni.cncf.io", Version: "v1", Kind: "NetworkAttachmentDefinition"}
)

const (
	// MultusChart is the name of RKE2's multus HelmChart, of its HelmChartConfig, and of the
	// manifest rke2-multus.yaml in /var/lib/rancher/rke2/server/manifests.
	MultusChart = "rke2-multus"
	// NADCRD is the NetworkAttachmentDefinition CRD, which the rke2-multus chart carries.
	NADCRD = "network-attachment-definitions.k8s.cni.cncf.io"
	// Helm-controller's failure policies (helm-controller pkg/apis/helm.cattle.io/v1 types.go
	// FailurePolicy; the CRD's enum and default).
	FailurePolicyAbort     = "abort"
	FailurePolicyReinstall = "reinstall"
	FailurePolicyRetry     = "retry"
)

// Multus plays, for the rke2-multus chart, what RKE2 and its helm-controller do when RKE2
// starts on a server node (harvester-release-steps.md facts 9 and 34; issue harvester#10359,
// PR harvester#10366, PR harvester#10402):
//
//   - RKE2's deploy controller applies the manifests in /var/lib/rancher/rke2/server/manifests
//     at start, among them rke2-multus.yaml, a HelmChart kube-system/rke2-multus of the
//     version RKE2 ships; a manifest next to which a <name>.skip file exists is not applied
//     (fact 34: that is what Harvester's skip-manifests Plan relies on). Skipped, which a
//     test wires to the node's host state, says whether the node has rke2-multus.yaml.skip.
//
//   - helm-controller runs its helm-install Job only when the HelmChart changed (a new
//     version): the same version applied again runs nothing. The Job's FAILURE_POLICY is
//     the HelmChart's spec.failurePolicy (default reinstall), overridden by the
//     HelmChartConfig of the same name and namespace when its spec.failurePolicy is set
//     (helm-controller v0.17.9 pkg/controllers/chart/chart.go getJobAndRelatedResources).
//     The HelmChartConfig CRD defaults the field to reinstall (+kubebuilder:default).
//
//   - The Job's script (k3s-io/klipper-helm entry, helm_update, at v0.13.3-build20260727)
//     upgrades a deployed release; if that fails the release is failed and the Job's pod
//     fails; the Job retries (backoffLimit 1000, chart.go defaultBackOffLimit), and the next
//     run finds the release failed and applies the policy: abort exits 1 and leaves
//     everything as it is ("waiting for operator intervention"); reinstall runs helm
//     uninstall --wait and installs the chart again; retry upgrades again.
//
//   - helm uninstall deletes the chart's resources. The rke2-multus chart has carried the
//     NetworkAttachmentDefinition CRD among its templates (issue harvester#10359 points at
//     rke2-charts rke2-multus v4.2.314 templates/customResourceDefinition.yaml), so the
//     uninstall deletes the CRD, and the API server deletes every NetworkAttachmentDefinition
//     with it: every VM network. The simulator does exactly that on the test API server:
//     it deletes the CRD, waits until the API server has removed it with all its objects,
//     and creates it again as the install does. With SeparateCRDChart (rancher/rke2#8628
//     moved the CRDs into an rke2-multus-crd chart) the uninstall leaves the CRD.
//
//   - While RKE2 runs, its deploy controller lists the manifests directory again every 15
//     seconds; a manifest it has not applied since it started (its modification time not
//     recorded) and whose content differs from what the Addon kube-system/<name> last
//     applied (checksum) is applied; a skipped one is ignored on every pass (k3s-io/k3s
//     pkg/deploy/controller.go, watcher.start, listFilesIn, shouldSkipFile, deploy). So
//     when a node's rke2-multus.yaml.skip is removed, its RKE2 applies the rke2-multus.yaml
//     of the version it runs at the next pass: SkipRemoved. (Read at k3s commit 43bde46;
//     RKE2 embeds this controller.)
//
// FailInstall makes the next upgrade fail (say, a hook or a timeout); the reinstall's fresh
// install, and a retry's second upgrade, succeed. The simulator runs the Job's runs
// synchronously within RKE2Restarted and SkipRemoved, one call at a time (helm-controller
// runs one Job per chart): the real ones run as a Job's pods after the manifest is applied.
// Helm's release records (Secrets) are kept in memory.
type Multus struct {
	// Client reaches the workload cluster.
	Client client.Client
	// Namespace holds the HelmChart and HelmChartConfig rke2-multus. Default kube-system.
	Namespace string
	// Skipped says whether node has /var/lib/rancher/rke2/server/manifests/rke2-multus.yaml.skip;
	// nil means no node has it.
	Skipped func(node string) bool
	// SeparateCRDChart says the NetworkAttachmentDefinition CRD is in its own chart, so an
	// uninstall of rke2-multus leaves it.
	SeparateCRDChart bool

	// applying serializes RKE2Restarted and SkipRemoved.
	applying sync.Mutex

	mu       sync.Mutex
	deployed string // the release's chart version, "" before the first install
	failNext string
	installs []MultusInstall
	lost     []string
}

// Causes of a MultusInstall.
const (
	// MultusOnRestart: RKE2 started on the node (RKE2Restarted).
	MultusOnRestart = "rke2-restart"
	// MultusOnSkipRemoved: the node's rke2-multus.yaml.skip was removed while RKE2 ran
	// (SkipRemoved).
	MultusOnSkipRemoved = "skip-removed"
)

// MultusInstall is what one application of a node's rke2-multus.yaml (or its skip) did to
// the chart.
type MultusInstall struct {
	Node, Version string
	// Cause is MultusOnRestart or MultusOnSkipRemoved.
	Cause string
	// Outcome is "skipped" (the .skip file), "unchanged" (the same version: no Job),
	// "installed", "upgraded", "aborted" (a failed upgrade under abort), "reinstalled"
	// (uninstalled and installed again) or "retried" (upgraded on the second run).
	Outcome string
	// Policy is the Job's FAILURE_POLICY; empty when no Job ran.
	Policy string
	// Failure is the message of the failed upgrade, if one failed.
	Failure string
	At      time.Time
}

// FailInstall makes the next helm upgrade of the chart fail with message.
func (m *Multus) FailInstall(message string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.failNext = message
}

// Installs returns what each RKE2 start did to the chart, in order.
func (m *Multus) Installs() []MultusInstall {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]MultusInstall(nil), m.installs...)
}

// NetworksLost returns namespace/name of every NetworkAttachmentDefinition that a reinstall
// of the chart deleted, sorted.
func (m *Multus) NetworksLost() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := append([]string(nil), m.lost...)
	sort.Strings(out)
	return out
}

func (m *Multus) namespace() string {
	if m.Namespace == "" {
		return "kube-system"
	}
	return m.Namespace
}

func (m *Multus) record(in MultusInstall) {
	m.mu.Lock()
	defer m.mu.Unlock()
	in.At = time.Now()
	m.installs = append(m.installs, in)
}

// RKE2Restarted plays RKE2 starting on node at version (its rke2-multus chart's version is
// named after it): the manifest is applied unless skipped, and helm-controller's Job runs
// if the chart changed.
func (m *Multus) RKE2Restarted(ctx context.Context, node, version string) error {
	m.applying.Lock()
	defer m.applying.Unlock()
	in := MultusInstall{Node: node, Version: version, Cause: MultusOnRestart}
	if m.Skipped != nil && m.Skipped(node) {
		in.Outcome = "skipped"
		m.record(in)
		return nil
	}
	return m.apply(ctx, in)
}

// SkipRemoved plays RKE2's deploy controller on node, running version, at its first pass
// after rke2-multus.yaml.skip was removed: the manifest, ignored until then, is applied,
// and helm-controller's Job runs if the chart changed.
func (m *Multus) SkipRemoved(ctx context.Context, node, version string) error {
	m.applying.Lock()
	defer m.applying.Unlock()
	return m.apply(ctx, MultusInstall{Node: node, Version: version, Cause: MultusOnSkipRemoved})
}

// apply applies the chart at in.Version and runs helm-controller's Job if it changed.
func (m *Multus) apply(ctx context.Context, in MultusInstall) error {
	version := in.Version
	changed, err := m.applyChart(ctx, version)
	if err != nil {
		return err
	}
	if !changed {
		in.Outcome = "unchanged"
		m.record(in)
		return nil
	}
	policy, err := m.failurePolicy(ctx)
	if err != nil {
		return err
	}
	in.Policy = policy

	m.mu.Lock()
	deployed, failure := m.deployed, m.failNext
	m.failNext = ""
	m.mu.Unlock()
	switch {
	case deployed == "":
		in.Outcome = "installed" // no release yet: helm install
	case failure == "":
		in.Outcome = "upgraded"
	default:
		// The upgrade failed; the release is failed; the Job's next run applies the policy.
		in.Failure = failure
		switch policy {
		case FailurePolicyAbort:
			in.Outcome = "aborted"
			m.record(in)
			return nil
		case FailurePolicyRetry:
			in.Outcome = "retried"
		default: // reinstall, the script's default
			if err := m.uninstall(ctx); err != nil {
				return err
			}
			in.Outcome = "reinstalled"
		}
	}
	m.mu.Lock()
	m.deployed = version
	m.mu.Unlock()
	m.record(in)
	return nil
}

// applyChart creates or updates the HelmChart at version; it says whether it changed.
func (m *Multus) applyChart(ctx context.Context, version string) (bool, error) {
	hc := &unstructured.Unstructured{}
	hc.SetGroupVersionKind(HelmChartGVK)
	err := m.Client.Get(ctx, client.ObjectKey{Namespace: m.namespace(), Name: MultusChart}, hc)
	if apierrors.IsNotFound(err) {
		hc.SetNamespace(m.namespace())
		hc.SetName(MultusChart)
		_ = unstructured.SetNestedField(hc.Object, MultusChart, "spec", "chart")
		_ = unstructured.SetNestedField(hc.Object, version, "spec", "version")
		_ = unstructured.SetNestedField(hc.Object, true, "spec", "bootstrap")
		return true, m.Client.Create(ctx, hc)
	}
	if err != nil {
		return false, err
	}
	if v, _, _ := unstructured.NestedString(hc.Object, "spec", "version"); v == version {
		return false, nil
	}
	_ = unstructured.SetNestedField(hc.Object, version, "spec", "version")
	return true, m.Client.Update(ctx, hc)
}

// failurePolicy is the Job's FAILURE_POLICY: the HelmChart's, overridden by a non-empty
// HelmChartConfig one, default reinstall.
func (m *Multus) failurePolicy(ctx context.Context) (string, error) {
	policy := FailurePolicyReinstall
	key := client.ObjectKey{Namespace: m.namespace(), Name: MultusChart}
	hc := &unstructured.Unstructured{}
	hc.SetGroupVersionKind(HelmChartGVK)
	if err := m.Client.Get(ctx, key, hc); err != nil {
		return "", err
	}
	if p, _, _ := unstructured.NestedString(hc.Object, "spec", "failurePolicy"); p != "" {
		policy = p
	}
	cfg := &unstructured.Unstructured{}
	cfg.SetGroupVersionKind(HelmChartConfigGVK)
	switch err := m.Client.Get(ctx, key, cfg); {
	case apierrors.IsNotFound(err):
	case err != nil:
		return "", err
	default:
		if p, _, _ := unstructured.NestedString(cfg.Object, "spec", "failurePolicy"); p != "" {
			policy = p
		}
	}
	return policy, nil
}

// uninstall plays helm uninstall --wait of the chart, then the install's creation of its
// CRD: unless SeparateCRDChart, the NetworkAttachmentDefinition CRD is deleted, and with it,
// by the API server, every NetworkAttachmentDefinition; they are recorded as lost.
func (m *Multus) uninstall(ctx context.Context) error {
	if m.SeparateCRDChart {
		return nil
	}
	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := m.Client.Get(ctx, client.ObjectKey{Name: NADCRD}, crd); err != nil {
		return fmt.Errorf("get the NetworkAttachmentDefinition CRD: %w", err)
	}
	nads := &unstructured.UnstructuredList{}
	nads.SetGroupVersionKind(NADGVK.GroupVersion().WithKind(NADGVK.Kind + "List"))
	if err := m.Client.List(ctx, nads); err != nil {
		return fmt.Errorf("list NetworkAttachmentDefinitions: %w", err)
	}
	if err := m.Client.Delete(ctx, crd); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete the NetworkAttachmentDefinition CRD: %w", err)
	}
	// helm uninstall --wait: until the CRD, and so every object of it, is gone.
	if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		err := m.Client.Get(ctx, client.ObjectKey{Name: NADCRD}, &apiextensionsv1.CustomResourceDefinition{})
		return apierrors.IsNotFound(err), client.IgnoreNotFound(err)
	}); err != nil {
		return fmt.Errorf("wait for the NetworkAttachmentDefinition CRD to be deleted: %w", err)
	}
	m.mu.Lock()
	for _, n := range nads.Items {
		m.lost = append(m.lost, n.GetNamespace()+"/"+n.GetName())
	}
	m.mu.Unlock()
	// The install creates the CRD again, empty.
	again := &apiextensionsv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: crd.Name, Labels: crd.Labels, Annotations: crd.Annotations},
		Spec:       crd.Spec,
	}
	if err := m.Client.Create(ctx, again); err != nil {
		return fmt.Errorf("create the NetworkAttachmentDefinition CRD again: %w", err)
	}
	return wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		got := &apiextensionsv1.CustomResourceDefinition{}
		if err := m.Client.Get(ctx, client.ObjectKey{Name: NADCRD}, got); err != nil {
			return false, client.IgnoreNotFound(err)
		}
		for _, c := range got.Status.Conditions {
			if c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue {
				return true, nil
			}
		}
		return false, nil
	})
}
