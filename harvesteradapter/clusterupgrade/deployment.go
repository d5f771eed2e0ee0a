package clusterupgrade

import (
	"context"
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// container is the container of dep named name, else its first one.
func container(dep *appsv1.Deployment, name string) (*corev1.Container, error) {
	cs := dep.Spec.Template.Spec.Containers
	for i := range cs {
		if cs[i].Name == name {
			return &cs[i], nil
		}
	}
	if len(cs) == 0 {
		return nil, fmt.Errorf("the Deployment %s/%s has no container", dep.Namespace, dep.Name)
	}
	return &cs[0], nil
}

// rolledOut says whether dep's rollout is complete, as `kubectl rollout status` decides:
// the Deployment controller saw the current generation, every replica is updated, no old
// one is left and the updated ones are available. A Progressing condition False with
// reason ProgressDeadlineExceeded is a failed rollout.
func rolledOut(dep *appsv1.Deployment) (bool, string, error) {
	for _, c := range dep.Status.Conditions {
		if c.Type == appsv1.DeploymentProgressing && c.Status == corev1.ConditionFalse && c.Reason == "ProgressDeadlineExceeded" {
			return false, "", fmt.Errorf("the rollout of Deployment %s/%s failed: %s; look at its pods (kubectl -n %s describe deployment %s) and run the upgrade again once it is fixed", dep.Namespace, dep.Name, c.Message, dep.Namespace, dep.Name)
		}
	}
	want := int32(1)
	if dep.Spec.Replicas != nil {
		want = *dep.Spec.Replicas
	}
	st := dep.Status
	switch {
	case st.ObservedGeneration < dep.Generation:
		return false, fmt.Sprintf("generation %d not yet observed (observed %d)", dep.Generation, st.ObservedGeneration), nil
	case st.UpdatedReplicas < want:
		return false, fmt.Sprintf("%d of %d replicas updated", st.UpdatedReplicas, want), nil
	case st.Replicas > st.UpdatedReplicas:
		return false, fmt.Sprintf("%d old replicas pending termination", st.Replicas-st.UpdatedReplicas), nil
	case st.AvailableReplicas < st.UpdatedReplicas:
		return false, fmt.Sprintf("%d of %d updated replicas available", st.AvailableReplicas, st.UpdatedReplicas), nil
	}
	return true, "rolled out", nil
}

// setImage sets the image of dep's container (named name, else the first) and records
// why in an annotation, as a strategic merge patch of that one container.
func (r *runner) setImage(ctx context.Context, dep *appsv1.Deployment, name, image string) error {
	before := dep.DeepCopy()
	ctr, err := container(dep, name)
	if err != nil {
		return err
	}
	ctr.Image = image
	if dep.Annotations == nil {
		dep.Annotations = map[string]string{}
	}
	dep.Annotations[lastUpgradeNameAnnotation] = r.in.Plan
	dep.Annotations[lastUpgradeTargetAnnotation] = r.in.HarvesterVersion
	if err := r.c.Patch(ctx, dep, client.StrategicMergeFrom(before)); err != nil {
		return fmt.Errorf("set the image of Deployment %s/%s container %s to %s: %w", dep.Namespace, dep.Name, ctr.Name, image, err)
	}
	r.logf("Deployment %s/%s container %s: image %s", dep.Namespace, dep.Name, ctr.Name, image)
	return nil
}

// waitRollout waits until the Deployment key has rolled out with image.
func (r *runner) waitRollout(ctx context.Context, key client.ObjectKey, ctrName, image string) error {
	what := fmt.Sprintf("Deployment %s to roll out image %s", key, image)
	return r.poll(ctx, what, fmt.Sprintf("look at its pods (kubectl -n %s get pods; image pulls, scheduling) and run the upgrade again", key.Namespace),
		func(ctx context.Context) (bool, string, error) {
			dep := &appsv1.Deployment{}
			if err := r.c.Get(ctx, key, dep); err != nil {
				return false, "", fmt.Errorf("read Deployment %s: %w", key, err)
			}
			ctr, err := container(dep, ctrName)
			if err != nil {
				return false, "", err
			}
			if ctr.Image != image {
				return false, "", fmt.Errorf("the Deployment %s: container %s runs image %s while the upgrade set %s: someone else changed it; find out who and run the upgrade again", key, ctr.Name, ctr.Image, image)
			}
			return rolledOut(dep)
		})
}

// waitRolledOut waits until the Deployment key exists and has rolled out (`kubectl
// rollout status`, fact 16.12).
func (r *runner) waitRolledOut(ctx context.Context, key client.ObjectKey) error {
	return r.poll(ctx, fmt.Sprintf("Deployment %s to roll out", key), fmt.Sprintf("look at its pods (kubectl -n %s get pods) and Rancher's logs", key.Namespace),
		func(ctx context.Context) (bool, string, error) {
			dep := &appsv1.Deployment{}
			if err := r.c.Get(ctx, key, dep); apierrors.IsNotFound(err) {
				return false, "not found", nil
			} else if err != nil {
				return false, "", fmt.Errorf("read Deployment %s: %w", key, err)
			}
			return rolledOut(dep)
		})
}
