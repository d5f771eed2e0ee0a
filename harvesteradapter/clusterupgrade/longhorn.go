package clusterupgrade

import (
	"context"
	"crypto/sha512"
	"encoding/hex"
	"fmt"
	"sort"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capi-inplace/capi-inplace/harvesteradapter/harvesterapi"
)

// What wait_longhorn_upgrade reads (harvester-release-steps.md fact 25; Harvester's
// upgrade_manifests.sh at v1.8.2, wait_longhorn_manager and
// wait_longhorn_instance_manager_aio).
var (
	// LonghornManagerKey is the longhorn-manager DaemonSet the harvester chart deploys.
	LonghornManagerKey = client.ObjectKey{Namespace: "longhorn-system", Name: "longhorn-manager"}

	longhornNodeGVK = schema.GroupVersionKind{Group: "longhorn.io", Version: "v1beta2", Kind: "NodeList"}
	longhornIMGVK   = schema.GroupVersionKind{Group: "longhorn.io", Version: "v1beta2", Kind: "InstanceManagerList"}
)

const (
	// LabelManagedNode marks a node Harvester manages; with LabelWitnessNode not "true"
	// it is a node that runs a longhorn-manager the upgrade waits for (the script's
	// selector harvesterhci.io/managed=true,node-role.harvesterhci.io/witness!=true).
	LabelManagedNode = "harvesterhci.io/managed"
	// LabelWitnessNode marks a witness node, which holds no Longhorn data.
	LabelWitnessNode = "node-role.harvesterhci.io/witness"
	// SettingV2DataEngineEnabled is Harvester's setting that, "true", makes the wait look
	// at the v2 instance managers too.
	SettingV2DataEngineEnabled = "longhorn-v2-data-engine-enabled"

	// Longhorn's instance manager labels (longhorn-manager types/types.go
	// GetInstanceManagerLabels), which the script selects on.
	labelIMNode       = "longhorn.io/node"
	labelIMType       = "longhorn.io/instance-manager-type"
	labelIMDataEngine = "longhorn.io/data-engine"
	labelIMImage      = "longhorn.io/instance-manager-image"

	instanceManagerImageFlag = "--instance-manager-image"
)

// InstanceManagerImageChecksum is the value of an instance manager's
// longhorn.io/instance-manager-image label for image: "imi-" and the first 8 hex digits
// of the SHA-512 of the image with ':' and '/' replaced by '-' (longhorn-manager
// types/types.go GetInstanceManagerLabels, GetImageCanonicalName and
// GetInstanceManagerImageChecksumName; the script computes the same with openssl).
func InstanceManagerImageChecksum(image string) string {
	canonical := strings.ReplaceAll(strings.ReplaceAll(strings.TrimSpace(image), ":", "-"), "/", "-")
	sum := sha512.Sum512([]byte(canonical))
	return "imi-" + hex.EncodeToString(sum[:])[:8]
}

// longhornImages reads, from the longhorn-manager DaemonSet, the images the deployed
// chart asks for: its longhorn-manager container's image and the argument of
// --instance-manager-image (the Longhorn chart's daemonset-sa.yaml renders both from the
// same values the script reads with `helm get values harvester -a`).
func longhornImages(ds *appsv1.DaemonSet) (manager, instanceManager string, err error) {
	for _, c := range ds.Spec.Template.Spec.Containers {
		if c.Name != "longhorn-manager" {
			continue
		}
		words := append(append([]string{}, c.Command...), c.Args...)
		for i, w := range words {
			if v, ok := strings.CutPrefix(w, instanceManagerImageFlag+"="); ok {
				instanceManager = v
			} else if w == instanceManagerImageFlag && i+1 < len(words) {
				instanceManager = words[i+1]
			}
		}
		if instanceManager == "" {
			return "", "", fmt.Errorf("the longhorn-manager container of DaemonSet %s has no %s argument: it is not the DaemonSet the Longhorn chart renders", LonghornManagerKey, instanceManagerImageFlag)
		}
		return c.Image, instanceManager, nil
	}
	return "", "", fmt.Errorf("DaemonSet %s has no longhorn-manager container: it is not the DaemonSet the Longhorn chart renders", LonghornManagerKey)
}

// waitLonghorn is wait_longhorn_upgrade (fact 25): once the harvester chart is deployed,
// Longhorn upgrades itself, and the cluster upgrade ends only when it is done, so that
// nothing that follows it (the VMs it stopped started again, the first node drained) meets
// a Longhorn half-way. It waits, without a timeout of its own (the script has none; the
// run's timeout bounds it), for
//   - the longhorn-manager DaemonSet rolled out: its template observed, every pod updated,
//     and as many ready as the cluster has managed non-witness nodes;
//   - with at least two such nodes, on every Longhorn node exactly one AllInOne v1
//     instance manager of the chart's instance-manager image, running; and the same for v2
//     when Harvester's longhorn-v2-data-engine-enabled is "true".
//
// The script compares the DaemonSet's image with `helm get values harvester -a`; the
// program carries no Helm, so it reads the images from the DaemonSet itself, which the
// harvester chart's deployment (the sub-step before, which waits for the chart's Fleet
// bundle to be ready at the release's version) has rendered from those same values.
func (r *runner) waitLonghorn(ctx context.Context) (StepState, string, error) {
	ds := &appsv1.DaemonSet{}
	if err := r.c.Get(ctx, LonghornManagerKey, ds); err != nil {
		if apierrors.IsNotFound(err) {
			return "", "", fmt.Errorf("DaemonSet %s does not exist: a Harvester cluster has it (the harvester chart deploys Longhorn); look at the harvester chart's deployment", LonghornManagerKey)
		}
		return "", "", fmt.Errorf("read DaemonSet %s: %w", LonghornManagerKey, err)
	}
	managerImage, imImage, err := longhornImages(ds)
	if err != nil {
		return "", "", err
	}
	remedy := "Longhorn upgrades its managers and instance managers after the harvester chart; look at longhorn-system (kubectl -n longhorn-system get ds longhorn-manager; kubectl -n longhorn-system get instancemanagers.longhorn.io)"
	var nodes int
	err = r.poll(ctx, fmt.Sprintf("DaemonSet %s rolled out and ready on every managed non-witness node", LonghornManagerKey), remedy,
		func(ctx context.Context) (bool, string, error) {
			n, err := r.longhornNodeCount(ctx)
			if err != nil {
				return false, "", err
			}
			nodes = n
			cur := &appsv1.DaemonSet{}
			if err := r.c.Get(ctx, LonghornManagerKey, cur); err != nil {
				return false, "", fmt.Errorf("read DaemonSet %s: %w", LonghornManagerKey, err)
			}
			// What the DaemonSet asks for now: a chart deployed again meanwhile is waited for.
			if managerImage, imImage, err = longhornImages(cur); err != nil {
				return false, "", err
			}
			st := cur.Status
			status := fmt.Sprintf("%s: observed generation %d of %d, %d of %d pods updated, %d ready of %d managed non-witness nodes",
				managerImage, st.ObservedGeneration, cur.Generation, st.UpdatedNumberScheduled, st.DesiredNumberScheduled, st.NumberReady, n)
			done := st.ObservedGeneration >= cur.Generation && st.UpdatedNumberScheduled == st.DesiredNumberScheduled && int(st.NumberReady) == n
			return done, status, nil
		})
	if err != nil {
		return "", "", err
	}
	message := fmt.Sprintf("longhorn-manager %s ready on %d nodes", managerImage, nodes)
	// Done when this upgrade deployed the harvester chart that upgraded Longhorn.
	ours := r.current[StepUpgradeHarvesterChart].State == StateDone
	if nodes < 2 {
		// The script skips the instance managers below two such nodes.
		return r.already(StepWaitLonghorn, message+"; instance managers not looked at on fewer than 2 managed non-witness nodes, as Harvester's script", ours)
	}
	engines := []string{"v1"}
	v2, err := r.v2DataEngineEnabled(ctx)
	if err != nil {
		return "", "", err
	}
	if v2 {
		engines = append(engines, "v2")
	}
	checksum := InstanceManagerImageChecksum(imImage)
	var checked int
	err = r.poll(ctx, fmt.Sprintf("one running AllInOne instance manager of %s (%s) per Longhorn node and data engine %s", imImage, checksum, strings.Join(engines, ", ")), remedy,
		func(ctx context.Context) (bool, string, error) {
			pending, n, err := r.pendingInstanceManagers(ctx, checksum, engines)
			checked = n
			if err != nil || len(pending) > 0 {
				return false, strings.Join(pending, "; "), err
			}
			return true, "", nil
		})
	if err != nil {
		return "", "", err
	}
	return r.already(StepWaitLonghorn, fmt.Sprintf("%s; instance manager %s running on %d Longhorn nodes for data engine %s", message, imImage, checked, strings.Join(engines, ", ")), ours)
}

// longhornNodeCount counts the managed non-witness nodes.
func (r *runner) longhornNodeCount(ctx context.Context) (int, error) {
	sel, err := labels.Parse(LabelManagedNode + "=true," + LabelWitnessNode + "!=true")
	if err != nil {
		return 0, err
	}
	list := &corev1.NodeList{}
	if err := r.c.List(ctx, list, client.MatchingLabelsSelector{Selector: sel}); err != nil {
		return 0, fmt.Errorf("list the managed non-witness nodes: %w", err)
	}
	return len(list.Items), nil
}

// v2DataEngineEnabled reads Harvester's longhorn-v2-data-engine-enabled; a cluster
// without it (older Harvester) has no v2 data engine to wait for.
func (r *runner) v2DataEngineEnabled(ctx context.Context) (bool, error) {
	s := &harvesterapi.Setting{}
	if err := r.c.Get(ctx, client.ObjectKey{Name: SettingV2DataEngineEnabled}, s); err != nil {
		if apierrors.IsNotFound(err) || meta.IsNoMatchError(err) {
			return false, nil
		}
		return false, fmt.Errorf("read Harvester setting %s: %w", SettingV2DataEngineEnabled, err)
	}
	return s.Value == "true", nil
}

// pendingInstanceManagers names, per Longhorn node and data engine, what is not yet as
// the script wants it: not exactly one AllInOne instance manager labelled with checksum,
// or that one not running. n is the number of Longhorn nodes looked at.
func (r *runner) pendingInstanceManagers(ctx context.Context, checksum string, engines []string) (pending []string, n int, err error) {
	nodes := &unstructured.UnstructuredList{}
	nodes.SetGroupVersionKind(longhornNodeGVK)
	if err := r.c.List(ctx, nodes, client.InNamespace(LonghornManagerKey.Namespace)); err != nil {
		return nil, 0, fmt.Errorf("list the Longhorn nodes: %w", err)
	}
	ims := &unstructured.UnstructuredList{}
	ims.SetGroupVersionKind(longhornIMGVK)
	if err := r.c.List(ctx, ims, client.InNamespace(LonghornManagerKey.Namespace),
		client.MatchingLabels{labelIMType: "aio", labelIMImage: checksum}); err != nil {
		return nil, 0, fmt.Errorf("list the Longhorn instance managers: %w", err)
	}
	names := make([]string, 0, len(nodes.Items))
	for _, node := range nodes.Items {
		names = append(names, node.GetName())
	}
	sort.Strings(names)
	for _, node := range names {
		for _, engine := range engines {
			var found []unstructured.Unstructured
			for _, im := range ims.Items {
				l := im.GetLabels()
				if l[labelIMNode] == node && l[labelIMDataEngine] == engine {
					found = append(found, im)
				}
			}
			switch {
			case len(found) != 1:
				pending = append(pending, fmt.Sprintf("node %s: %d %s instance managers of the new image", node, len(found), engine))
			default:
				if state, _, _ := unstructured.NestedString(found[0].Object, "status", "currentState"); state != "running" {
					pending = append(pending, fmt.Sprintf("node %s: %s instance manager %s is %q", node, engine, found[0].GetName(), state))
				}
			}
		}
	}
	return pending, len(names), nil
}
