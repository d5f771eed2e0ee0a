package clusterupgrade

import (
	"context"
	"encoding/json"
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher"
)

// The local cluster's RKE state Secret and the type Rancher requires of it since v2.7
// (harvester-release-steps.md fact 18; rancher/rancher PR #41088, harvester/harvester
// issue #3858).
var (
	localRKEStateKey  = client.ObjectKey{Namespace: rancher.FleetLocal, Name: rancher.LocalRKEStateSecret}
	rkeStateBackupKey = client.ObjectKey{Namespace: rancher.FleetLocal, Name: "capi-inplace-local-rke-state-backup"}
)

// FieldRancherReplicas is the rancher Deployment's spec.replicas, which
// UpdateLocalRKEStateSecret scales to 0 while it re-creates the state Secret (fact 18).
const FieldRancherReplicas = "deployment.spec.replicas"

// updateLocalRKEStateSecret is update_local_rke_state_secret (fact 18): a local-rke-state
// Secret of type Opaque (clusters installed before Rancher v2.7) blocks every later RKE2
// upgrade through Rancher, which requires the type rke.cattle.io/cluster-state; a
// Secret's type cannot be changed, so the release re-creates it with that type while
// Rancher is scaled to 0, and brings Rancher back. Skipped when the type is already
// another.
//
// The script keeps the Secret in a file of its pod between deleting and re-creating it;
// a pod that dies there loses the local cluster's state. This keeps it in a backup Secret
// (fleet-local/capi-inplace-local-rke-state-backup) first, and records Rancher's
// replicas, so that a run that resumes, or Restore when the plan ends, finishes the
// conversion and brings Rancher back.
func (r *runner) updateLocalRKEStateSecret(ctx context.Context) (StepState, string, error) {
	cur := &corev1.Secret{}
	err := r.c.Get(ctx, localRKEStateKey, cur)
	missing := apierrors.IsNotFound(err)
	if err != nil && !missing {
		return "", "", fmt.Errorf("read the Secret %s: %w", localRKEStateKey, err)
	}
	backup := &corev1.Secret{}
	err = r.c.Get(ctx, rkeStateBackupKey, backup)
	noBackup := apierrors.IsNotFound(err)
	if err != nil && !noBackup {
		return "", "", fmt.Errorf("read the Secret %s: %w", rkeStateBackupKey, err)
	}
	if noBackup {
		if missing {
			return "", "", fmt.Errorf("the Secret %s does not exist: Rancher keeps the local cluster's RKE2 state (its join tokens) there and cannot provision the cluster without it; restore it from a backup of the cluster, then run the upgrade again", localRKEStateKey)
		}
		if cur.Type != corev1.SecretTypeOpaque {
			return r.already(StepUpdateLocalRKEStateSecret, fmt.Sprintf("the Secret %s is of type %s", localRKEStateKey, cur.Type), false)
		}
		dep := &appsv1.Deployment{}
		if err := r.c.Get(ctx, rancherKey, dep); err != nil {
			return "", "", fmt.Errorf("read Rancher's Deployment %s: %w", rancherKey, err)
		}
		replicas := ptr.Deref(dep.Spec.Replicas, 1)
		before, err := json.Marshal(replicas)
		if err != nil {
			return "", "", err
		}
		if err := r.remember(ctx, rancherKey, FieldRancherReplicas, before); err != nil {
			return "", "", err
		}
		backup = &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: rkeStateBackupKey.Namespace, Name: rkeStateBackupKey.Name, Labels: cur.Labels, Annotations: cur.Annotations},
			Type:       corev1.SecretTypeOpaque,
			Data:       cur.Data,
		}
		if err := r.c.Create(ctx, backup); err != nil {
			return "", "", fmt.Errorf("keep a copy of the Secret %s in %s before re-creating it: %w", localRKEStateKey, rkeStateBackupKey, err)
		}
	}
	replicas, err := r.recordedRancherReplicas(ctx)
	if err != nil {
		return "", "", err
	}
	if missing || cur.Type == corev1.SecretTypeOpaque {
		if err := r.scaleRancher(ctx, 0); err != nil {
			return "", "", err
		}
		if err := recreateRKEState(ctx, r.c, backup, cur, missing); err != nil {
			return "", "", err
		}
	}
	if err := finishRKEState(ctx, r.c, replicas); err != nil {
		return "", "", err
	}
	if err := r.waitRolledOut(ctx, rancherKey); err != nil {
		return "", "", err
	}
	return StateDone, fmt.Sprintf("the Secret %s re-created with type %s (it was Opaque); Rancher scaled to 0 meanwhile and back to %d", localRKEStateKey, rancher.RKEClusterStateType, replicas), nil
}

// recordedRancherReplicas is Rancher's replica count recorded before it was scaled to 0.
func (r *runner) recordedRancherReplicas(ctx context.Context) (int32, error) {
	changes, err := ReadChanges(ctx, r.c, r.p.ConfigMap)
	if err != nil {
		return 0, err
	}
	for _, ch := range changes {
		if ch.Object == rancherKey.String() && ch.Field == FieldRancherReplicas {
			var n int32
			if err := json.Unmarshal(ch.Before, &n); err != nil {
				return 0, fmt.Errorf("the recorded replicas of Rancher %s are not a number: %w", ch.Before, err)
			}
			return n, nil
		}
	}
	return 0, fmt.Errorf("the Secret %s exists, so an earlier run started re-creating %s, but the progress ConfigMap %s has no record of Rancher's replicas: scale the rancher Deployment back by hand, check %s, delete %s and run the upgrade again", rkeStateBackupKey, localRKEStateKey, r.p.ConfigMap, localRKEStateKey, rkeStateBackupKey)
}

// scaleRancher sets the rancher Deployment's replicas and, for 0, waits until no pod of
// it is left (the Secret is replaced while Rancher does not run).
func (r *runner) scaleRancher(ctx context.Context, replicas int32) error {
	if err := setRancherReplicas(ctx, r.c, replicas); err != nil {
		return err
	}
	return r.poll(ctx, fmt.Sprintf("Rancher's Deployment %s to have %d replicas", rancherKey, replicas), "look at its pods (kubectl -n cattle-system get pods -l app=rancher)",
		func(ctx context.Context) (bool, string, error) {
			dep := &appsv1.Deployment{}
			if err := r.c.Get(ctx, rancherKey, dep); err != nil {
				return false, "", fmt.Errorf("read Rancher's Deployment %s: %w", rancherKey, err)
			}
			st := dep.Status
			return st.ObservedGeneration >= dep.Generation && st.Replicas == replicas, fmt.Sprintf("%d replicas", st.Replicas), nil
		})
}

func setRancherReplicas(ctx context.Context, c client.Client, replicas int32) error {
	dep := &appsv1.Deployment{}
	if err := c.Get(ctx, rancherKey, dep); err != nil {
		return fmt.Errorf("read Rancher's Deployment %s: %w", rancherKey, err)
	}
	if ptr.Deref(dep.Spec.Replicas, 1) == replicas {
		return nil
	}
	before := dep.DeepCopy()
	dep.Spec.Replicas = ptr.To(replicas)
	if err := c.Patch(ctx, dep, client.MergeFrom(before)); err != nil {
		return fmt.Errorf("scale Rancher's Deployment %s to %d: %w", rancherKey, replicas, err)
	}
	return nil
}

// recreateRKEState replaces the Opaque state Secret (cur, unless missing) by one of type
// rke.cattle.io/cluster-state with the backup's content.
func recreateRKEState(ctx context.Context, c client.Client, backup, cur *corev1.Secret, missing bool) error {
	if !missing {
		if err := c.Delete(ctx, cur, client.Preconditions{UID: &cur.UID}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete the Opaque Secret %s to re-create it: %w", localRKEStateKey, err)
		}
	}
	typed := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: localRKEStateKey.Namespace, Name: localRKEStateKey.Name, Labels: backup.Labels, Annotations: backup.Annotations},
		Type:       rancher.RKEClusterStateType,
		Data:       backup.Data,
	}
	if err := c.Create(ctx, typed); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("re-create the Secret %s with type %s (its content is kept in %s): %w", localRKEStateKey, rancher.RKEClusterStateType, rkeStateBackupKey, err)
	}
	return nil
}

// finishRKEState brings Rancher back to replicas and drops the backup, once the state
// Secret is there with its new type.
func finishRKEState(ctx context.Context, c client.Client, replicas int32) error {
	if err := setRancherReplicas(ctx, c, replicas); err != nil {
		return err
	}
	backup := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: rkeStateBackupKey.Namespace, Name: rkeStateBackupKey.Name}}
	if err := c.Delete(ctx, backup); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete the copy %s of the state Secret: %w", rkeStateBackupKey, err)
	}
	return nil
}

// restoreRancherReplicas is Restore's part for a conversion a run left half-way: the
// state Secret is re-created from the backup if it is missing, Rancher brought back to
// the recorded replicas if it is still at 0, and the backup dropped.
func restoreRancherReplicas(ctx context.Context, c client.Client, before json.RawMessage) error {
	var replicas int32
	if err := json.Unmarshal(before, &replicas); err != nil {
		return fmt.Errorf("the recorded value %s is not a number: %w", before, err)
	}
	backup := &corev1.Secret{}
	if err := c.Get(ctx, rkeStateBackupKey, backup); err == nil {
		cur := &corev1.Secret{}
		err := c.Get(ctx, localRKEStateKey, cur)
		if apierrors.IsNotFound(err) {
			if err := recreateRKEState(ctx, c, backup, cur, true); err != nil {
				return err
			}
		} else if err != nil {
			return fmt.Errorf("read the Secret %s: %w", localRKEStateKey, err)
		}
	} else if !apierrors.IsNotFound(err) {
		return fmt.Errorf("read the Secret %s: %w", rkeStateBackupKey, err)
	}
	dep := &appsv1.Deployment{}
	if err := c.Get(ctx, rancherKey, dep); err != nil {
		return client.IgnoreNotFound(err)
	}
	if current := ptr.Deref(dep.Spec.Replicas, 1); current != 0 {
		replicas = current // Rancher already back (or scaled by someone since)
	}
	return finishRKEState(ctx, c, replicas)
}
