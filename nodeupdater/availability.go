package nodeupdater

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
)

var crdListGVK = schema.GroupVersionKind{Group: "apiextensions.k8s.io", Version: "v1", Kind: "CustomResourceDefinitionList"}

// resolveUpdater finds who serves the NodeUpdate's updaterRef (an Updater the manager
// runs, or an external controller whose CRD carries NodeUpdaterCRDLabel) and whether
// the configuration object exists, and says so in the UpdaterAvailable condition.
// Errors reading the API are returned; a missing updater is a condition, not an error.
func (r *Reconciler) resolveUpdater(ctx context.Context, s *scope) error {
	ref := s.nu.Spec.UpdaterRef
	key := client.ObjectKey{Namespace: s.nu.Namespace, Name: ref.Name}

	reg, found, err := r.Registry.Lookup(ref)
	if err != nil {
		r.setUpdaterAvailable(s, false, inplacev1.UpdaterNotFoundReason, err.Error())
		return nil
	}
	if found {
		s.reg = &reg
		if err := r.Client.Get(ctx, key, reg.NewConfig()); err != nil {
			if apierrors.IsNotFound(err) {
				r.setUpdaterAvailable(s, false, inplacev1.UpdaterNotFoundReason,
					fmt.Sprintf("%s %s does not exist in namespace %s: create it, or name an existing %s in spec.updaterRef",
						reg.GroupKind.Kind, ref.Name, s.nu.Namespace, reg.GroupKind.Kind))
				return nil
			}
			r.setUpdaterAvailable(s, false, inplacev1.UpdaterErrorReason,
				fmt.Sprintf("cannot read %s %s: %v", reg.GroupKind.Kind, ref.Name, err))
			return fmt.Errorf("read updater configuration %s %s/%s: %w", reg.GroupKind, s.nu.Namespace, ref.Name, err)
		}
		s.available = true
		r.setUpdaterAvailable(s, true, inplacev1.UpdaterFoundReason,
			fmt.Sprintf("%s %s is served by the manager", reg.GroupKind, ref.Name))
		return nil
	}

	matches, err := externalUpdaterKinds(ctx, r.APIReader, ref)
	if err != nil {
		return err
	}
	// None, or several groups while the reference names none: no choice is safe.
	if len(matches) != 1 {
		r.setUpdaterAvailable(s, false, inplacev1.UpdaterNotFoundReason, r.noUpdaterMessage(ref))
		return nil
	}
	gvk := matches[0]
	s.external = true
	obj := &unstructured.Unstructured{}
	obj.SetGroupVersionKind(gvk)
	if err := r.APIReader.Get(ctx, key, obj); err != nil {
		if apierrors.IsNotFound(err) {
			r.setUpdaterAvailable(s, false, inplacev1.UpdaterNotFoundReason,
				fmt.Sprintf("%s %s does not exist in namespace %s: create it, or name an existing %s in spec.updaterRef",
					gvk.GroupKind(), ref.Name, s.nu.Namespace, gvk.Kind))
			return nil
		}
		r.setUpdaterAvailable(s, false, inplacev1.UpdaterErrorReason,
			fmt.Sprintf("cannot read %s %s (the manager needs get on it): %v", gvk.GroupKind(), ref.Name, err))
		return nil
	}
	s.externalConfig = obj.Object
	s.available = true
	r.setUpdaterAvailable(s, true, inplacev1.ExternalUpdaterReason,
		fmt.Sprintf("%s %s is served by an external controller (CRD labelled %s=%s); it drives the steps and the result",
			gvk.GroupKind(), ref.Name, inplacev1.NodeUpdaterCRDLabel, inplacev1.NodeUpdaterContractVersion))
	return nil
}

// externalUpdaterKinds lists the kinds of the CRDs, labelled as NodeUpdate updaters of
// this contract version, that serve the reference's kind (one per API group), each at
// the version to read it with. More than one means the reference must name its group.
func externalUpdaterKinds(ctx context.Context, reader client.Reader, ref inplacev1.UpdaterReference) ([]schema.GroupVersionKind, error) {
	crds := &unstructured.UnstructuredList{}
	crds.SetGroupVersionKind(crdListGVK)
	if err := reader.List(ctx, crds, client.MatchingLabels{inplacev1.NodeUpdaterCRDLabel: inplacev1.NodeUpdaterContractVersion}); err != nil {
		return nil, fmt.Errorf("list CRDs labelled %s: %w", inplacev1.NodeUpdaterCRDLabel, err)
	}
	var matches []schema.GroupVersionKind
	for _, crd := range crds.Items {
		kind, _, _ := unstructured.NestedString(crd.Object, "spec", "names", "kind")
		group, _, _ := unstructured.NestedString(crd.Object, "spec", "group")
		if kind != ref.Kind || (ref.APIGroup != "" && group != ref.APIGroup) {
			continue
		}
		if version := crdReadVersion(crd.Object); version != "" {
			matches = append(matches, schema.GroupVersionKind{Group: group, Version: version, Kind: kind})
		}
	}
	return matches, nil
}

// crdReadVersion is the version to read a CRD's objects with: the storage version, else
// the first served one.
func crdReadVersion(crd map[string]any) string {
	versions, _, _ := unstructured.NestedSlice(crd, "spec", "versions")
	first := ""
	for _, v := range versions {
		m, ok := v.(map[string]any)
		if !ok {
			continue
		}
		name, _ := m["name"].(string)
		served, _ := m["served"].(bool)
		storage, _ := m["storage"].(bool)
		if served && storage {
			return name
		}
		if served && first == "" {
			first = name
		}
	}
	return first
}

// externalNodeTimeout reads spec.nodeTimeout (a duration such as 45m) of an external
// updater's configuration, which the contract lets it set.
func externalNodeTimeout(obj map[string]any) (time.Duration, bool) {
	s, found, err := unstructured.NestedString(obj, "spec", "nodeTimeout")
	if err != nil || !found {
		return 0, false
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		return 0, false
	}
	return d, true
}

func (r *Reconciler) noUpdaterMessage(ref inplacev1.UpdaterReference) string {
	kinds := r.Registry.Kinds()
	names := make([]string, 0, len(kinds))
	for _, k := range kinds {
		names = append(names, k.Kind)
	}
	sort.Strings(names)
	runs := "no updater"
	if len(names) > 0 {
		runs = strings.Join(names, ", ")
	}
	kind := ref.Kind
	if ref.APIGroup != "" {
		kind += "." + ref.APIGroup
	}
	return fmt.Sprintf("no updater serves kind %s: the manager runs %s, and no CRD labelled %s=%s (exactly one, or set updaterRef.apiGroup) serves it",
		kind, runs, inplacev1.NodeUpdaterCRDLabel, inplacev1.NodeUpdaterContractVersion)
}

func (r *Reconciler) setUpdaterAvailable(s *scope, available bool, reason, message string) {
	status := metav1.ConditionFalse
	if available {
		status = metav1.ConditionTrue
	}
	meta.SetStatusCondition(&s.nu.Status.Conditions, metav1.Condition{
		Type:               inplacev1.UpdaterAvailableCondition,
		Status:             status,
		Reason:             reason,
		Message:            truncate(message, 32768),
		ObservedGeneration: s.nu.Generation,
	})
}
