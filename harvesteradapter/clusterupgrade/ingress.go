package clusterupgrade

import (
	"context"
	"fmt"
	"sort"

	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// RancherExposeKey is the Ingress through which Harvester exposes Rancher.
var RancherExposeKey = client.ObjectKey{Namespace: "cattle-system", Name: "rancher-expose"}

const (
	// defaultIngressClassAnnotation marks a default IngressClass; the script selects
	// every class that has the annotation, whatever its value.
	defaultIngressClassAnnotation = "ingressclass.kubernetes.io/is-default-class"
	// fallbackIngressClass is the class the script names when no class is the default.
	fallbackIngressClass = "nginx"
)

// ensureIngressClassName is ensure_ingress_class_name (harvester-release-steps.md fact 21;
// Harvester's upgrade_manifests.sh at v1.8.2): the rancher-expose Ingress gets an
// ingressClassName when it has none, the oldest IngressClass carrying the default-class
// annotation, else nginx, so that Rancher stays reachable through an ingress controller
// that serves only Ingresses of its class. A name already set is kept. Where the script
// would fail on a missing rancher-expose, the sub-step is Skipped and says so: the
// Ingress is Harvester's, and the upgrade does not depend on it.
func (r *runner) ensureIngressClassName(ctx context.Context) (StepState, string, error) {
	ing := &networkingv1.Ingress{}
	if err := r.c.Get(ctx, RancherExposeKey, ing); err != nil {
		if apierrors.IsNotFound(err) {
			return StateSkipped, fmt.Sprintf("Ingress %s does not exist: no ingress class to set", RancherExposeKey), nil
		}
		return "", "", fmt.Errorf("read Ingress %s: %w", RancherExposeKey, err)
	}
	if name := ing.Spec.IngressClassName; name != nil && *name != "" {
		return r.already(StepEnsureIngressClassName, fmt.Sprintf("Ingress %s has ingress class %s", RancherExposeKey, *name), ing.Annotations[lastUpgradeNameAnnotation] == r.in.Plan)
	}
	classes := &networkingv1.IngressClassList{}
	if err := r.c.List(ctx, classes); err != nil {
		return "", "", fmt.Errorf("list the IngressClasses: %w", err)
	}
	sort.SliceStable(classes.Items, func(i, j int) bool {
		return classes.Items[i].CreationTimestamp.Before(&classes.Items[j].CreationTimestamp)
	})
	class, why := fallbackIngressClass, "no IngressClass is the default"
	for _, c := range classes.Items {
		if _, ok := c.Annotations[defaultIngressClassAnnotation]; ok {
			class, why = c.Name, "the oldest default IngressClass"
			break
		}
	}
	before := ing.DeepCopy()
	ing.Spec.IngressClassName = &class
	if ing.Annotations == nil {
		ing.Annotations = map[string]string{}
	}
	ing.Annotations[lastUpgradeNameAnnotation] = r.in.Plan
	if err := r.c.Patch(ctx, ing, client.MergeFrom(before)); err != nil {
		return "", "", fmt.Errorf("set the ingress class of Ingress %s to %s: %w", RancherExposeKey, class, err)
	}
	return StateDone, fmt.Sprintf("Ingress %s given ingress class %s (%s)", RancherExposeKey, class, why), nil
}
