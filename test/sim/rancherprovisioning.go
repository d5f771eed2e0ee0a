package sim

import (
	"context"
	"fmt"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher/provisioningv1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher/rkev1"
)

// controlPlaneSpec is what Rancher's planner reads of the RKEControlPlane
// fleet-local/local's spec: the RKE2 version and the part of the cluster configuration
// (rancher@v2.14.4 pkg/apis/rke.cattle.io/v1 ClusterConfiguration, inlined in
// RKEControlPlaneSpec) that goes into the plans and the roll (planner.go fullReconcile
// reads controlPlane.Spec.UpgradeStrategy; fact 58).
type controlPlaneSpec struct {
	KubernetesVersion   string                                `json:"kubernetesVersion,omitempty"`
	ProvisionGeneration int                                   `json:"provisionGeneration,omitempty"`
	Registries          *apiextensionsv1.JSON                 `json:"registries,omitempty"`
	UpgradeStrategy     provisioningv1.ClusterUpgradeStrategy `json:"upgradeStrategy,omitempty"`
}

// specOf is what Rancher's provisioningcluster controller renders of the provisioning
// Cluster into the RKEControlPlane (template.go rkeControlPlane: the rkeConfig's
// ClusterConfiguration and spec.kubernetesVersion).
func specOf(cl *provisioningv1.Cluster) controlPlaneSpec {
	rc := ptrDeref(cl.Spec.RKEConfig)
	return controlPlaneSpec{KubernetesVersion: cl.Spec.KubernetesVersion, ProvisionGeneration: rc.ProvisionGeneration,
		Registries: rc.Registries, UpgradeStrategy: rc.UpgradeStrategy}
}

// view is the provisioning Cluster as the planner sees it: its spec's version and
// rkeConfig replaced by what the RKEControlPlane carries.
func (s controlPlaneSpec) view(cl *provisioningv1.Cluster) *provisioningv1.Cluster {
	v := cl.DeepCopy()
	v.Spec.KubernetesVersion = s.KubernetesVersion
	v.Spec.RKEConfig = &provisioningv1.RKEConfig{ProvisionGeneration: s.ProvisionGeneration, Registries: s.Registries, UpgradeStrategy: s.UpgradeStrategy}
	return v
}

// readControlPlane reads the RKEControlPlane fleet-local/local; nil when there is none.
func (p *RancherPlanner) readControlPlane(ctx context.Context) (*unstructured.Unstructured, controlPlaneSpec, error) {
	cp := &unstructured.Unstructured{}
	cp.SetGroupVersionKind(rkev1.GroupVersion.WithKind(rkev1.RKEControlPlaneKind))
	if err := p.Client.Get(ctx, localClusterKey, cp); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, controlPlaneSpec{}, nil
		}
		return nil, controlPlaneSpec{}, err
	}
	var s controlPlaneSpec
	if spec, ok := cp.Object["spec"].(map[string]any); ok {
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(spec, &s); err != nil {
			return nil, controlPlaneSpec{}, fmt.Errorf("read the spec of RKEControlPlane %s: %w", localClusterKey, err)
		}
	}
	return cp, s, nil
}

// copyPass is Rancher's provisioningcluster controller keeping the RKEControlPlane
// fleet-local/local generated from the provisioning Cluster of the same name
// (rancher@v2.14.4 pkg/controllers/provisioningv2/provisioningcluster/template.go
// rkeControlPlane; harvester-release-steps.md fact 58: "Rancher copies it into the
// RKEControlPlane"). It is a controller of its own, on the provisioning Cluster's events:
// the planner, which reads the version and the upgrade strategy from the RKEControlPlane
// (planner.go fullReconcile, controlPlane.Spec.UpgradeStrategy), sees a change of the
// provisioning Cluster only once this copy is written, CopyDelay after it was first
// seen. Wrangler's apply leaves the annotations it did not set (the Cluster API pause
// among them) and removes what it set before and no longer renders: the copied fields
// are replaced whole.
func (p *RancherPlanner) copyPass(ctx context.Context, force bool) error {
	cl := &provisioningv1.Cluster{}
	if err := p.Client.Get(ctx, localClusterKey, cl); err != nil {
		return client.IgnoreNotFound(err)
	}
	want := specOf(cl)
	cp, have, err := p.readControlPlane(ctx)
	if err != nil {
		return err
	}
	if cp != nil && equality.Semantic.DeepEqual(have, want) {
		p.mu.Lock()
		p.copySeen = time.Time{}
		p.mu.Unlock()
		return nil
	}
	if !force {
		p.mu.Lock()
		if p.copySeen.IsZero() {
			p.copySeen = time.Now()
		}
		due := p.copySeen.Add(p.CopyDelay)
		p.mu.Unlock()
		if time.Now().Before(due) {
			p.copier.dueAt(due)
			return nil
		}
	}
	fields, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&want)
	if err != nil {
		return err
	}
	// The strategy renders whole, its zero drain options included, as Rancher's typed
	// apply writes them.
	strategy, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&want.UpgradeStrategy)
	if err != nil {
		return err
	}
	fields["upgradeStrategy"] = strategy
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur := &unstructured.Unstructured{}
		cur.SetGroupVersionKind(rkev1.GroupVersion.WithKind(rkev1.RKEControlPlaneKind))
		if err := p.Client.Get(ctx, localClusterKey, cur); err != nil {
			if !apierrors.IsNotFound(err) {
				return err
			}
			cur.SetNamespace(rancher.FleetLocal)
			cur.SetName(rancher.LocalCluster)
			cur.Object["spec"] = fields
			return p.Client.Create(ctx, cur)
		}
		spec, _ := cur.Object["spec"].(map[string]any)
		if spec == nil {
			spec = map[string]any{}
		}
		for _, k := range []string{"kubernetesVersion", "provisionGeneration", "registries", "upgradeStrategy"} {
			if v, ok := fields[k]; ok {
				spec[k] = v
			} else {
				delete(spec, k)
			}
		}
		cur.Object["spec"] = spec
		return p.Client.Update(ctx, cur)
	})
	if err != nil {
		return fmt.Errorf("copy fleet-local/local into its RKEControlPlane: %w", err)
	}
	p.mu.Lock()
	p.copySeen = time.Time{}
	p.mu.Unlock()
	p.loop.wake()
	return nil
}
