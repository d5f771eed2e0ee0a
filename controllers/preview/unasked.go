package preview

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/core/reconcilers/machinedeployment/mdutil"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
)

// The paths below are where Cluster API v1.14 replaces or deletes a machine without
// asking capi-inplace's CanUpdate hooks, or on an answer it keeps: the hooks' answer,
// and a fail-closed Cluster's Failure, cannot stop them (docs/capi-hooks.md). The preview
// names each such machine Replaced, with the path, as Cluster API would judge it at the
// preview's computation time. Each follows the Cluster API source it cites
// (sigs.k8s.io/cluster-api v1.14.2).

// unasked marks the machines Cluster API would replace or delete without asking.
func (r *Reconciler) unasked(ctx context.Context, s *previewScope) error {
	now := metav1.NewTime(r.Clock.Now())
	for _, t := range s.targets {
		if t.ref.IsControlPlane() {
			r.unaskedControlPlane(ctx, s, t, now)
			continue
		}
		if err := r.unaskedMachineDeployment(ctx, s, t, now); err != nil {
			return err
		}
	}
	return nil
}

// replaceUnasked makes an entry Replaced by a path of Cluster API. What the hooks would
// have answered is kept after the reason, as it is not what decides.
func replaceUnasked(e *entry, path inplacev1.UnaskedPath, reason string) {
	if e.status.Outcome != inplacev1.MachineOutcomeReplaced || e.status.UnaskedPath == "" {
		was := string(e.status.Outcome)
		if e.status.Reason != "" {
			was += ": " + e.status.Reason
		}
		reason += " (the hooks' answer, which does not decide it: " + was + ")"
	}
	e.status.Outcome, e.status.UnaskedPath, e.status.Reason = inplacev1.MachineOutcomeReplaced, path, reason
}

// decidedByHooks reports whether the hooks' answer still decides an entry: not at the
// version already and not yet marked by a path of Cluster API.
func decidedByHooks(e *entry) bool {
	return e.status.UnaskedPath == "" && e.status.Outcome != inplacev1.MachineOutcomeAtTarget
}

// kubeadmControlPlane reads the target's KubeadmControlPlane; nil for another kind of
// control plane (whose rollout paths capi-inplace does not know), or when it cannot be
// read as v1beta2 (noted).
func (r *Reconciler) kubeadmControlPlane(ctx context.Context, s *previewScope, t *target) *controlplanev1.KubeadmControlPlane {
	cp := t.ref.ControlPlaneRef
	if cp.Kind != "KubeadmControlPlane" || cp.APIGroup != controlplanev1.GroupVersion.Group {
		return nil
	}
	mapping, err := r.mapping(s, schema.GroupKind{Group: cp.APIGroup, Kind: cp.Kind})
	if err != nil {
		s.note("cannot read KubeadmControlPlane %s: %v; its rollout paths (rollout.before and after, maxSurge, the preflight fallback) are not judged", cp.Name, err)
		return nil
	}
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(mapping.GroupVersionKind)
	if err := r.Client.Get(ctx, client.ObjectKey{Namespace: s.cluster.Namespace, Name: cp.Name}, u); err != nil {
		s.note("cannot read KubeadmControlPlane %s/%s: %v; its rollout paths are not judged", s.cluster.Namespace, cp.Name, err)
		return nil
	}
	kcp := &controlplanev1.KubeadmControlPlane{}
	if mapping.GroupVersionKind.Version != controlplanev1.GroupVersion.Version {
		s.note("KubeadmControlPlane %s is served as %s, not %s: its rollout paths are not judged", cp.Name, mapping.GroupVersionKind.Version, controlplanev1.GroupVersion.Version)
		return nil
	}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, kcp); err != nil {
		s.note("cannot read KubeadmControlPlane %s: %v; its rollout paths are not judged", cp.Name, err)
		return nil
	}
	return kcp
}

// unaskedControlPlane follows KubeadmControlPlane's rollout (controlplane/kubeadm/
// reconcilers/kubeadmcontrolplane/update.go: rollingUpdate).
func (r *Reconciler) unaskedControlPlane(ctx context.Context, s *previewScope, t *target, now metav1.Time) {
	kcp := r.kubeadmControlPlane(ctx, s, t)
	if kcp == nil {
		return
	}
	name := "KubeadmControlPlane " + kcp.Name
	// controlplane/kubeadm/pkg/filters.go: UpToDate: a machine whose certificates expire
	// within rollout.before.certificatesExpiryDays, or created before a passed
	// rollout.after, is not eligible for an in-place update: rollingUpdate scales it down.
	for _, e := range t.entries {
		switch {
		case shouldRolloutBefore(now, kcp.Spec.Rollout.Before, e.machine):
			replaceUnasked(e, inplacev1.UnaskedPathRolloutBefore, fmt.Sprintf(
				"Cluster API replaces the machine without asking capi-inplace: its certificates expire at %s, within the %d days of %s's spec.rollout.before.certificatesExpiryDays, which makes it not eligible for an in-place update",
				e.machine.Status.CertificatesExpiryDate.UTC().Format(time.RFC3339), kcp.Spec.Rollout.Before.CertificatesExpiryDays, name))
		case shouldRolloutAfter(now, kcp.Spec.Rollout.After, e.machine):
			replaceUnasked(e, inplacev1.UnaskedPathRolloutAfter, fmt.Sprintf(
				"Cluster API replaces the machine without asking capi-inplace: %s's spec.rollout.after (%s) has passed and the machine is older, which makes it not eligible for an in-place update",
				name, kcp.Spec.Rollout.After.UTC().Format(time.RFC3339)))
		case !kcp.Spec.Rollout.After.IsZero() && e.machine.CreationTimestamp.Before(&kcp.Spec.Rollout.After) && decidedByHooks(e):
			e.status.Reason = joinReason(e.status.Reason, fmt.Sprintf("from %s (%s's spec.rollout.after) Cluster API replaces it without asking, upgraded in place or not",
				kcp.Spec.Rollout.After.UTC().Format(time.RFC3339), name))
		}
	}

	var inPlace []*entry
	for _, e := range t.entries {
		if decidedByHooks(e) && e.status.Outcome == inplacev1.MachineOutcomeInPlace {
			inPlace = append(inPlace, e)
		}
	}
	if len(inPlace) == 0 {
		return
	}
	r.preflightFallback(kcp, t, inPlace)

	// rollingUpdate scales up to replicas+maxSurge first, updates the oldest outdated
	// machines in place while fewer than replicas are up to date, and scales down the
	// machine left: with maxSurge 1 the newest outdated machine is deleted, not updated.
	// (selectMachineForInPlaceUpdateOrScaleDown picks the oldest of the failure domain
	// with the most machines, so with failure domains it may be another.)
	if surge := kcp.Spec.Rollout.Strategy.RollingUpdate.MaxSurge; surge != nil && surge.IntValue() >= 1 {
		var left []*entry
		for _, e := range inPlace {
			if decidedByHooks(e) {
				left = append(left, e)
			}
		}
		if last := newest(left); last != nil {
			replaceUnasked(last, inplacev1.UnaskedPathMaxSurge, fmt.Sprintf(
				"Cluster API deletes the machine without asking capi-inplace: %s's rollout.strategy.rollingUpdate.maxSurge is %s, so it first creates a new control plane machine, updates the older machines in place, and deletes the last outdated one, the newest",
				name, surge.String()))
		}
	}
}

// preflightFallback follows rollingUpdate's fallback: the machine KubeadmControlPlane
// picks for the next in-place update (selectMachineForInPlaceUpdateOrScaleDown: an
// outdated machine with unhealthy control plane components first, else the oldest) is
// deleted instead when the preflight checks fail for the control plane and pass without
// it (preflight.go: preflightChecks, checkHealthiness: every machine has a node and its
// health conditions True).
func (r *Reconciler) preflightFallback(kcp *controlplanev1.KubeadmControlPlane, t *target, inPlace []*entry) {
	etcdManaged := !kcp.Spec.KubeadmConfigSpec.ClusterConfiguration.Etcd.External.IsDefined()
	var picked *entry
	var unhealthy []*entry
	for _, e := range inPlace {
		if hasUnhealthyControlPlaneComponents(e.machine, etcdManaged) {
			unhealthy = append(unhealthy, e)
		}
	}
	if len(unhealthy) > 0 {
		picked = oldest(unhealthy)
	} else {
		picked = oldest(inPlace)
	}
	var failing []string
	for i := range t.machines {
		if why := kcpPreflightFailure(&t.machines[i], etcdManaged); why != "" {
			failing = append(failing, t.machines[i].Name)
		}
	}
	if len(failing) != 1 || failing[0] != picked.machine.Name {
		return
	}
	replaceUnasked(picked, inplacev1.UnaskedPathPreflightFallback, fmt.Sprintf(
		"Cluster API deletes the machine without asking capi-inplace: KubeadmControlPlane %s picks it for the next in-place update, and it alone fails KubeadmControlPlane's preflight checks (%s), so KubeadmControlPlane scales it down instead",
		kcp.Name, kcpPreflightFailure(picked.machine, etcdManaged)))
}

// kcpHealthConditions are the machine conditions KubeadmControlPlane's preflight checks
// require True (preflight.go: checkHealthiness).
func kcpHealthConditions(etcdManaged bool) []string {
	out := []string{
		controlplanev1.KubeadmControlPlaneMachineAPIServerPodHealthyCondition,
		controlplanev1.KubeadmControlPlaneMachineControllerManagerPodHealthyCondition,
		controlplanev1.KubeadmControlPlaneMachineSchedulerPodHealthyCondition,
	}
	if etcdManaged {
		out = append(out, controlplanev1.KubeadmControlPlaneMachineEtcdPodHealthyCondition, controlplanev1.KubeadmControlPlaneMachineEtcdMemberHealthyCondition)
	}
	return out
}

// kcpPreflightFailure says why a machine fails KubeadmControlPlane's preflight checks;
// empty when it passes.
func kcpPreflightFailure(m *clusterv1.Machine, etcdManaged bool) string {
	if !m.Status.NodeRef.IsDefined() {
		return "it has no node yet"
	}
	var bad []string
	for _, c := range kcpHealthConditions(etcdManaged) {
		switch got := apimeta.FindStatusCondition(m.Status.Conditions, c); {
		case got == nil:
			bad = append(bad, c+" not set")
		case got.Status != metav1.ConditionTrue:
			bad = append(bad, fmt.Sprintf("%s %s", c, got.Status))
		}
	}
	return strings.Join(bad, ", ")
}

func oldest(entries []*entry) *entry {
	return pick(entries, func(a, b *entry) bool {
		return a.machine.CreationTimestamp.Before(&b.machine.CreationTimestamp) ||
			(a.machine.CreationTimestamp.Equal(&b.machine.CreationTimestamp) && a.machine.Name < b.machine.Name)
	})
}

func newest(entries []*entry) *entry {
	return pick(entries, func(a, b *entry) bool {
		return b.machine.CreationTimestamp.Before(&a.machine.CreationTimestamp) ||
			(a.machine.CreationTimestamp.Equal(&b.machine.CreationTimestamp) && a.machine.Name > b.machine.Name)
	})
}

// pick returns the entry no other beats; nil for none.
func pick(entries []*entry, beats func(a, b *entry) bool) *entry {
	var best *entry
	for _, e := range entries {
		if best == nil || beats(e, best) {
			best = e
		}
	}
	return best
}

// unaskedMachineDeployment follows the MachineDeployment's rollout planner
// (core/reconcilers/machinedeployment).
func (r *Reconciler) unaskedMachineDeployment(ctx context.Context, s *previewScope, t *target, now metav1.Time) error {
	md := &clusterv1.MachineDeployment{}
	if err := r.Client.Get(ctx, client.ObjectKey{Namespace: s.cluster.Namespace, Name: t.ref.Name()}, md); err != nil {
		return client.IgnoreNotFound(err)
	}
	sets := &clusterv1.MachineSetList{}
	if err := r.Client.List(ctx, sets, client.InNamespace(s.cluster.Namespace), client.MatchingLabels{clusterv1.ClusterNameLabel: s.cluster.Name}); err != nil {
		return fmt.Errorf("list MachineSets of Cluster %s/%s: %w", s.cluster.Namespace, s.cluster.Name, err)
	}
	byName := map[string]*clusterv1.MachineSet{}
	for i := range sets.Items {
		if ownedByMachineDeployment(&sets.Items[i], md.Name) {
			byName[sets.Items[i].Name] = &sets.Items[i]
		}
	}
	name := "MachineDeployment " + md.Name
	after := md.Spec.Rollout.After
	for _, e := range t.entries {
		ms := byName[machineSetOf(e.machine)]
		if ms == nil {
			continue
		}
		// mdutil/util.go: FindNewAndOldMachineSets: once rollout.after has passed, a
		// MachineSet created before it is not eligible for an in-place update.
		if !after.IsZero() && ms.CreationTimestamp.Before(&after) {
			if after.Before(&now) {
				replaceUnasked(e, inplacev1.UnaskedPathRolloutAfter, fmt.Sprintf(
					"Cluster API replaces the machine without asking capi-inplace: %s's spec.rollout.after (%s) has passed and its MachineSet %s is older, which makes it not eligible for an in-place update",
					name, after.UTC().Format(time.RFC3339), ms.Name))
				continue
			}
			if decidedByHooks(e) {
				e.status.Reason = joinReason(e.status.Reason, fmt.Sprintf("from %s (%s's spec.rollout.after) Cluster API replaces it without asking, upgraded in place or not", after.UTC().Format(time.RFC3339), name))
			}
		}
		// machinedeployment_canupdatemachineset.go: canUpdateMachineSetInPlace keeps
		// an answer for a pair of MachineSets 24 hours (CAPIAnswerCacheTTL) and does not
		// ask again: a "not in place" capi-inplace gave is what Cluster API acts on, even
		// where the hooks would now answer in place or Failure (a fail-closed Cluster).
		if r.Hooks != nil && decidedByHooks(e) {
			refusals, err := r.Hooks.Refusals.Of(ctx, client.ObjectKeyFromObject(ms), now.Time)
			if err != nil {
				return err
			}
			for _, ref := range refusals {
				if ref.NewMachineSet.Namespace != ms.Namespace || byName[ref.NewMachineSet.Name] == nil {
					continue
				}
				replaceUnasked(e, inplacev1.UnaskedPathCachedRefusal, fmt.Sprintf(
					"Cluster API replaces the machine without asking again: capi-inplace answered CanUpdateMachineSet for MachineSet %s to %s at %s with %q, a \"not in place\" that Cluster API's MachineDeployment controller keeps until %s (or until it restarts)",
					ms.Name, ref.NewMachineSet.Name, ref.At.UTC().Format(time.RFC3339), ref.Message, ref.Until().UTC().Format(time.RFC3339)))
				break
			}
		}
	}
	r.machineDeploymentSurge(md, byName, t)
	return nil
}

// machineDeploymentSurge follows machinedeployment_rollout_rollingupdate.go:
// reconcileInPlaceUpdateIntent: with maxUnavailable 0 and maxSurge 1 or more, the planner
// creates one new machine ("surge 1 allowed to create availability for in-place
// updates"), moves the old machines to the new MachineSet one at a time in the
// MachineSet's deletion order, and once the new MachineSet has every replica, scales the
// old one down by deleting the machine left: the last in that order.
func (r *Reconciler) machineDeploymentSurge(md *clusterv1.MachineDeployment, sets map[string]*clusterv1.MachineSet, t *target) {
	if md.Spec.Replicas == nil || mdutil.MaxSurge(*md) < 1 || mdutil.MaxUnavailable(*md) != 0 {
		return
	}
	var inPlace []*entry
	for _, e := range t.entries {
		if decidedByHooks(e) && e.status.Outcome == inplacev1.MachineOutcomeInPlace {
			inPlace = append(inPlace, e)
		}
	}
	if len(inPlace) == 0 {
		return
	}
	// machineset_deletion_order.go: Random (the default) ranks healthy machines alike and
	// then by name; Oldest takes the oldest first, Newest the newest first. Machines
	// marked for deletion, being updated or unhealthy go first whatever the order.
	rank := func(e *entry) int {
		m := e.machine
		switch {
		case !m.DeletionTimestamp.IsZero():
			return 0
		case hasKey(m.Annotations, clusterv1.DeleteMachineAnnotation):
			return 1
		case hasKey(m.Annotations, clusterv1.UpdateInProgressAnnotation):
			return 2
		case !m.Status.NodeRef.IsDefined() || isFalse(m, clusterv1.MachineNodeHealthyCondition) || isFalse(m, clusterv1.MachineHealthCheckSucceededCondition):
			return 3
		}
		return 4
	}
	order := clusterv1.RandomMachineSetDeletionOrder
	if ms := sets[machineSetOf(inPlace[0].machine)]; ms != nil && ms.Spec.Deletion.Order != "" {
		order = ms.Spec.Deletion.Order
	}
	sort.SliceStable(inPlace, func(i, j int) bool {
		a, b := inPlace[i], inPlace[j]
		if ra, rb := rank(a), rank(b); ra != rb {
			return ra < rb
		}
		ta, tb := a.machine.CreationTimestamp, b.machine.CreationTimestamp
		switch {
		case order == clusterv1.OldestMachineSetDeletionOrder && !ta.Equal(&tb):
			return ta.Before(&tb)
		case order == clusterv1.NewestMachineSetDeletionOrder && !ta.Equal(&tb):
			return tb.Before(&ta)
		}
		return a.machine.Name < b.machine.Name
	})
	last := inPlace[len(inPlace)-1]
	replaceUnasked(last, inplacev1.UnaskedPathMaxSurge, fmt.Sprintf(
		"Cluster API deletes the machine without asking capi-inplace: MachineDeployment %s surges (maxSurge %d, maxUnavailable 0), so it creates one new machine first, moves the others to the new MachineSet in the %s deletion order, and deletes the one left, this one",
		md.Name, mdutil.MaxSurge(*md), order))
}

func hasKey(m map[string]string, key string) bool {
	_, ok := m[key]
	return ok
}

// shouldRolloutBefore is util/collections/machine_filters.go: ShouldRolloutBefore: the
// machine's certificates expire within certificatesExpiryDays of now (0 is unset).
func shouldRolloutBefore(now metav1.Time, before controlplanev1.KubeadmControlPlaneRolloutBeforeSpec, m *clusterv1.Machine) bool {
	if before.CertificatesExpiryDays == 0 || m.Status.CertificatesExpiryDate.IsZero() {
		return false
	}
	return now.Add(time.Duration(before.CertificatesExpiryDays) * 24 * time.Hour).After(m.Status.CertificatesExpiryDate.Time)
}

// shouldRolloutAfter is util/collections/machine_filters.go: ShouldRolloutAfter: the
// machine was created before rollout.after, which has passed.
func shouldRolloutAfter(now metav1.Time, after metav1.Time, m *clusterv1.Machine) bool {
	if after.IsZero() {
		return false
	}
	return m.CreationTimestamp.Before(&after) && after.Before(&now)
}

// hasUnhealthyControlPlaneComponents is util/collections/machine_filters.go:
// HasUnhealthyControlPlaneComponents: a health condition False (not unset, not Unknown).
func hasUnhealthyControlPlaneComponents(m *clusterv1.Machine, etcdManaged bool) bool {
	for _, c := range kcpHealthConditions(etcdManaged) {
		if isFalse(m, c) {
			return true
		}
	}
	return false
}

func isFalse(m *clusterv1.Machine, condition string) bool {
	c := apimeta.FindStatusCondition(m.Status.Conditions, condition)
	return c != nil && c.Status == metav1.ConditionFalse
}
