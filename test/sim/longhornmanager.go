package sim

import (
	"context"
	"fmt"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capi-inplace/capi-inplace/harvesteradapter/clusterupgrade"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher/managementv3"
)

// Longhorn's manager as a Harvester chart deploys it, played by the Rancher simulator
// (harvester-release-steps.md facts 25 and 74):
//   - the harvester chart carries Longhorn (LonghornOfChart); Fleet's Helm apply of a
//     deployed harvester chart renders the longhorn-manager DaemonSet of
//     longhorn-system with the Longhorn chart's images: the longhorn-manager container's
//     image and its --instance-manager-image argument (the Longhorn chart's
//     daemonset-sa.yaml; global.imageRegistry docker.io in Harvester's values.yaml at
//     v1.8.2). A changed template is a new generation;
//   - the DaemonSet controller and the kubelets roll a new generation out after
//     RolloutDelay: one pod per Node but witness nodes (Harvester's wait compares
//     numberReady with the managed non-witness nodes: no longhorn-manager runs on a
//     witness), every pod updated, a pod ready where its Node is Ready; numberReady
//     follows the Nodes' readiness from then on;
//   - each new longhorn-manager writes its --instance-manager-image into the Longhorn
//     setting default-instance-manager-image at start (longhorn-manager app/daemon.go;
//     longhorn_released.go), here once per rolled out generation, when Longhorn's
//     settings kind is served. What released Longhorn then does to its instance managers
//     is the Longhorn simulator's (syncReleased).

// LonghornOfChart is the Longhorn version the harvester chart of version chart carries:
// the newest release of each Harvester minor's Longhorn chart (fact 74: v1.4.3 1.7.3,
// v1.5.2 1.8.2, v1.6.1 1.9.2, v1.7.3 1.10.2, v1.8.2 1.11.2, v1.9.0-rc6 1.12.1); the
// simulator gives every patch of a minor its newest's Longhorn.
func LonghornOfChart(chart string) string {
	parts := strings.SplitN(strings.TrimPrefix(chart, "v"), ".", 3)
	switch strings.Join(parts[:min(2, len(parts))], ".") {
	case "1.4":
		return "v1.7.3"
	case "1.5":
		return "v1.8.2"
	case "1.6":
		return "v1.9.2"
	case "1.7":
		return "v1.10.2"
	case "1.8":
		return "v1.11.2"
	default:
		return "v1.12.1"
	}
}

// LonghornManagerImage and LonghornInstanceManagerImage are the images of a Longhorn
// version as Harvester's chart renders them.
func LonghornManagerImage(longhorn string) string {
	return "docker.io/longhornio/longhorn-manager:" + longhorn
}

func LonghornInstanceManagerImage(longhorn string) string {
	return "docker.io/longhornio/longhorn-instance-manager:" + longhorn
}

// seedLonghornManager is the longhorn-manager DaemonSet of the chart chart, not yet rolled
// out (the Rancher simulator rolls it out).
func seedLonghornManager(chart string) *appsv1.DaemonSet {
	labels := map[string]string{"app": "longhorn-manager"}
	ds := &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: clusterupgrade.LonghornManagerKey.Namespace, Name: clusterupgrade.LonghornManagerKey.Name},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}},
		},
	}
	renderLonghornManager(ds, LonghornOfChart(chart))
	return ds
}

// renderLonghornManager writes Longhorn version longhorn's images into ds's template, as
// the Longhorn chart renders them; it says whether anything changed.
func renderLonghornManager(ds *appsv1.DaemonSet, longhorn string) bool {
	image, imImage := LonghornManagerImage(longhorn), LonghornInstanceManagerImage(longhorn)
	command := []string{"longhorn-manager", "-d", "daemon", "--engine-image", "docker.io/longhornio/longhorn-engine:" + longhorn,
		"--instance-manager-image", imImage, "--manager-image", image, "--service-account", "longhorn-service-account"}
	cs := ds.Spec.Template.Spec.Containers
	if len(cs) == 1 && cs[0].Image == image && strings.Join(cs[0].Command, " ") == strings.Join(command, " ") {
		return false
	}
	ds.Spec.Template.Spec.Containers = []corev1.Container{{Name: "longhorn-manager", Image: image, Command: command}}
	return true
}

// applyLonghornChart plays Helm applying the harvester chart mc that Fleet deployed to
// the longhorn-manager DaemonSet: the Longhorn of mc's version rendered into its template.
// Another chart, or a cluster without the DaemonSet, is left alone.
func applyLonghornChart(ctx context.Context, c client.Client, mc *managementv3.ManagedChart) error {
	if mc.Name != rancher.HarvesterChart {
		return nil
	}
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		ds := &appsv1.DaemonSet{}
		if err := c.Get(ctx, clusterupgrade.LonghornManagerKey, ds); err != nil {
			return client.IgnoreNotFound(err)
		}
		if !renderLonghornManager(ds, LonghornOfChart(mc.Spec.Version)) {
			return nil
		}
		return c.Update(ctx, ds)
	})
}

// longhornManagerRollout plays the DaemonSet controller and the kubelets for the
// longhorn-manager DaemonSet: a new generation is rolled out after RolloutDelay, and the
// new managers write their instance-manager image into Longhorn's setting; numberReady
// follows the Nodes' readiness.
func (r *Rancher) longhornManagerRollout(ctx context.Context) error {
	ds := &appsv1.DaemonSet{}
	if err := r.Client.Get(ctx, clusterupgrade.LonghornManagerKey, ds); err != nil {
		return client.IgnoreNotFound(err)
	}
	nodes := &corev1.NodeList{}
	if err := r.Client.List(ctx, nodes); err != nil {
		return err
	}
	var desired, ready int32
	for i := range nodes.Items {
		if nodes.Items[i].DeletionTimestamp != nil || nodes.Items[i].Labels[clusterupgrade.LabelWitnessNode] == "true" {
			continue
		}
		desired++
		if nodeReadyCondition(&nodes.Items[i]) {
			ready++
		}
	}
	st := ds.Status
	newGeneration := st.ObservedGeneration < ds.Generation
	if newGeneration && !r.due(fmt.Sprintf("daemonset/%s/%d", ds.UID, ds.Generation), orDefault(r.LonghornRolloutDelay, orDefault(r.RolloutDelay, 50*time.Millisecond))) {
		return nil
	}
	if !newGeneration && st.DesiredNumberScheduled == desired && st.UpdatedNumberScheduled == desired && st.NumberReady == ready {
		return nil
	}
	ds.Status = appsv1.DaemonSetStatus{
		ObservedGeneration: ds.Generation, DesiredNumberScheduled: desired, CurrentNumberScheduled: desired,
		UpdatedNumberScheduled: desired, NumberReady: ready, NumberAvailable: ready, NumberUnavailable: desired - ready,
	}
	if err := r.Client.Status().Update(ctx, ds); err != nil {
		return client.IgnoreNotFound(err)
	}
	if !newGeneration {
		return nil
	}
	_, imImage, err := longhornImagesOf(ds)
	if err != nil {
		return err
	}
	if err := SetLonghornSetting(ctx, r.Client, clusterupgrade.LonghornManagerKey.Namespace, SettingDefaultInstanceManagerImage, imImage); err != nil && !noKind(err) {
		return fmt.Errorf("the new longhorn-manager writes %s: %w", SettingDefaultInstanceManagerImage, err)
	}
	return nil
}

// longhornImagesOf reads the images rendered into the DaemonSet's template.
func longhornImagesOf(ds *appsv1.DaemonSet) (manager, instanceManager string, err error) {
	for _, c := range ds.Spec.Template.Spec.Containers {
		for i, w := range c.Command {
			if w == "--instance-manager-image" && i+1 < len(c.Command) {
				return c.Image, c.Command[i+1], nil
			}
		}
	}
	return "", "", fmt.Errorf("DaemonSet %s renders no --instance-manager-image", clusterupgrade.LonghornManagerKey)
}

// seedLonghornManagerObjects creates the longhorn-manager DaemonSet of rel's chart in a
// namespace longhorn-system created when missing, rolled out (its generation observed):
// Longhorn's own settings and instance managers are left to the spec's fixtures.
func seedLonghornManagerObjects(ctx context.Context, c client.Client, rel HarvesterRelease) error {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: clusterupgrade.LonghornManagerKey.Namespace}}
	if err := c.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create namespace %s: %w", ns.Name, err)
	}
	ds := seedLonghornManager(rel.Chart)
	if err := recreate(ctx, c, ds); err != nil {
		return err
	}
	ds.Status.ObservedGeneration = ds.Generation
	if err := c.Status().Update(ctx, ds); err != nil {
		return fmt.Errorf("seed the status of DaemonSet %s: %w", clusterupgrade.LonghornManagerKey, err)
	}
	return nil
}

// HarvesterNodeLabels are the labels every node of a Harvester cluster carries: it is
// managed by Harvester (harvesterhci.io/managed=true, which Harvester's node selectors
// and its wait for Longhorn select on; harvester-release-steps.md facts 12 and 25). A
// simulated kubelet of a Harvester cluster gives its nodes these (Kubelet.Labels).
func HarvesterNodeLabels(more map[string]string) map[string]string {
	out := map[string]string{clusterupgrade.LabelManagedNode: "true"}
	for k, v := range more {
		out[k] = v
	}
	return out
}

// DeployedInstanceManagerImage is the instance-manager image the longhorn-manager
// DaemonSet on c renders now: the image of the v1 instance managers a settled Longhorn
// runs on each of its nodes.
func DeployedInstanceManagerImage(ctx context.Context, c client.Client) (string, error) {
	ds := &appsv1.DaemonSet{}
	if err := c.Get(ctx, clusterupgrade.LonghornManagerKey, ds); err != nil {
		return "", fmt.Errorf("read DaemonSet %s: %w", clusterupgrade.LonghornManagerKey, err)
	}
	_, image, err := longhornImagesOf(ds)
	return image, err
}
