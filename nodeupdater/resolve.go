package nodeupdater

import (
	"context"
	"fmt"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
)

// UpdaterSource says where a resolved updater reference came from, for messages.
type UpdaterSource string

const (
	// UpdaterFromClusterAnnotation: the Cluster's inplace.cluster.x-k8s.io/updater annotation.
	UpdaterFromClusterAnnotation UpdaterSource = "the Cluster's " + inplacev1.UpdaterAnnotation + " annotation"
	// UpdaterFromRequest: the request's updaterRef (or the ExtensionConfig's settings).
	UpdaterFromRequest UpdaterSource = "the request's updaterRef"
	// UpdaterFromDefault: the manager's --default-updater flag.
	UpdaterFromDefault UpdaterSource = "the manager's --default-updater"
)

// NoUpdaterError says that no updater is configured for a Cluster. It is a distinct type
// because "no updater" is an answer (no in-place upgrade), not a failure.
type NoUpdaterError struct {
	// Cluster is the Cluster's namespace/name.
	Cluster string
}

func (e *NoUpdaterError) Error() string {
	return fmt.Sprintf("no updater configured for Cluster %s: set the annotation %s: <Kind>/<name> on the Cluster (for example HarvesterUpgrader/default), pass updaterRef in the request, or start the manager with --default-updater",
		e.Cluster, inplacev1.UpdaterAnnotation)
}

// ResolveUpdater decides which updater configuration does the work for a Cluster, the same
// way on every path: the Cluster's updater annotation, else the reference the request
// carries, else the manager's --default-updater (defaultRef, in Kind/name form; empty for
// none). It returns a *NoUpdaterError when none applies, and an error naming the source
// when that source holds a malformed reference.
func ResolveUpdater(cluster *clusterv1.Cluster, requested *inplacev1.UpdaterReference, defaultRef string) (inplacev1.UpdaterReference, UpdaterSource, error) {
	if v, ok := cluster.GetAnnotations()[inplacev1.UpdaterAnnotation]; ok && strings.TrimSpace(v) != "" {
		ref, err := inplacev1.ParseUpdaterReference(v)
		if err != nil {
			return inplacev1.UpdaterReference{}, UpdaterFromClusterAnnotation, fmt.Errorf("%s of Cluster %s: %w", UpdaterFromClusterAnnotation, client.ObjectKeyFromObject(cluster), err)
		}
		return ref, UpdaterFromClusterAnnotation, nil
	}
	if requested != nil && requested.Kind != "" && requested.Name != "" {
		return *requested, UpdaterFromRequest, nil
	}
	if strings.TrimSpace(defaultRef) != "" {
		ref, err := inplacev1.ParseUpdaterReference(defaultRef)
		if err != nil {
			return inplacev1.UpdaterReference{}, UpdaterFromDefault, fmt.Errorf("%s: %w", UpdaterFromDefault, err)
		}
		return ref, UpdaterFromDefault, nil
	}
	return inplacev1.UpdaterReference{}, "", &NoUpdaterError{Cluster: client.ObjectKeyFromObject(cluster).String()}
}

// UnavailableUpdaterError says that an updater reference names a kind nobody serves, or
// an object that does not exist. Its message is written for the operator.
type UnavailableUpdaterError struct {
	// Message says what is missing and what to do.
	Message string
}

func (e *UnavailableUpdaterError) Error() string { return e.Message }

// CheckUpdaterAvailable verifies that the updater ref names is served, either by an
// Updater the manager runs (registry) or by an external controller whose CRD carries the
// label inplace.cluster.x-k8s.io/node-updater, and that its configuration object exists
// in namespace. It returns an *UnavailableUpdaterError when it is not, and another error
// when the API server could not be asked.
func CheckUpdaterAvailable(ctx context.Context, c client.Reader, registry *Registry, namespace string, ref inplacev1.UpdaterReference) error {
	if registry != nil {
		reg, found, err := registry.Lookup(ref)
		if err != nil {
			return &UnavailableUpdaterError{Message: err.Error()}
		}
		if found {
			obj := reg.NewConfig()
			if err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: ref.Name}, obj); err != nil {
				if apierrors.IsNotFound(err) {
					return &UnavailableUpdaterError{Message: fmt.Sprintf("updater %s not found in namespace %s: create the %s object or name another updater", ref, namespace, reg.GroupKind)}
				}
				return fmt.Errorf("read updater %s in namespace %s: %w", ref, namespace, err)
			}
			return nil
		}
	}

	gvk, err := externalUpdaterKind(ctx, c, ref)
	if err != nil {
		return err
	}
	obj := &unstructured.Unstructured{}
	obj.SetGroupVersionKind(gvk)
	if err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: ref.Name}, obj); err != nil {
		if apierrors.IsNotFound(err) {
			return &UnavailableUpdaterError{Message: fmt.Sprintf("updater %s not found in namespace %s: create the %s object or name another updater", ref, namespace, gvk.GroupKind())}
		}
		return fmt.Errorf("read updater %s in namespace %s: %w", ref, namespace, err)
	}
	return nil
}

// externalUpdaterKind returns the one external kind that serves ref, or an
// *UnavailableUpdaterError that says why there is none to choose.
func externalUpdaterKind(ctx context.Context, c client.Reader, ref inplacev1.UpdaterReference) (schema.GroupVersionKind, error) {
	matches, err := externalUpdaterKinds(ctx, c, ref)
	if err != nil {
		return schema.GroupVersionKind{}, err
	}
	switch len(matches) {
	case 1:
		return matches[0], nil
	case 0:
		return schema.GroupVersionKind{}, &UnavailableUpdaterError{Message: fmt.Sprintf(
			"updater kind %s (from %s) is not served: the manager runs no updater for it and no CustomResourceDefinition of that kind carries the label %s=%s; install its updater or name another",
			ref.Kind, ref, inplacev1.NodeUpdaterCRDLabel, inplacev1.NodeUpdaterContractVersion)}
	default:
		return schema.GroupVersionKind{}, &UnavailableUpdaterError{Message: fmt.Sprintf(
			"updater kind %s is served by several API groups; name the group as Kind.group/name", ref.Kind)}
	}
}
