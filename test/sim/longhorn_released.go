package sim

import (
	"context"
	"crypto/sha512"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	longhornv1 "github.com/longhorn/longhorn-manager/k8s/pkg/apis/longhorn/v1beta2"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// This file plays what released Longhorn (longhorn-manager v1.9.2 to v1.12.1, the same
// rule in each: shared/facts/harvester-release-steps.md, fact 69) does to its instance
// managers when its default instance-manager image changes, as a chart upgrade changes
// it. "Fact N" below without a sheet is a fact of harvester-release-steps.md; "LH fact N"
// one of longhorn-v2-live-upgrade.md. The code it follows was read at longhorn-manager
// v1.10.0 (the module the project pins, in the module cache) and compared with v1.12.1
// (8320238): the functions named below.
//
// What a chart upgrade changes: the longhorn-manager DaemonSet's --instance-manager-image
// argument. Each new longhorn-manager writes it into the setting
// default-instance-manager-image at start (app/daemon.go, defaultImageSettings and
// UpdateCustomizedSettings), and the node and instance-manager controllers read only the
// setting. The simulator plays from the setting on (UpgradeLonghorn writes it, and so does
// the Rancher simulator once it has rolled out the longhorn-manager DaemonSet a harvester
// chart deploy rendered: longhornmanager.go); the managers' rolling update itself is not
// played here (see syncInstanceManagers for what v1.12.1 does during that roll).

const (
	// SettingDefaultInstanceManagerImage is the setting a new longhorn-manager writes from
	// its --instance-manager-image argument (types/setting.go, app/daemon.go).
	SettingDefaultInstanceManagerImage = "default-instance-manager-image"
	// SettingV1DataEngine and SettingV2DataEngine switch Longhorn's data engines on
	// (types/setting.go); the node controller manages instance managers only for the
	// enabled ones (node_controller.go getImTypeDataEngines).
	SettingV1DataEngine = "v1-data-engine"
	SettingV2DataEngine = "v2-data-engine"
	// LabelDisableV2DataEngine on a Kubernetes Node, "true", disables v2 on that node
	// (types/types.go NodeDisableV2DataEngineLabelKey; datastore IsV2DataEngineDisabledForNode).
	LabelDisableV2DataEngine = "node.longhorn.io/disable-v2-data-engine"
	// LabelIMImage is the instance manager's image checksum label (types/types.go
	// GetInstanceManagerLabels), which Harvester's wait_longhorn_instance_manager_aio
	// selects on (fact 25).
	LabelIMImage = "longhorn.io/instance-manager-image"

	labelComponent = "longhorn.io/component"
	labelManagedBy = "longhorn.io/managed-by"
	imTypeAIO      = string(longhornv1.InstanceManagerTypeAllInOne)
)

// InstanceManagerImageChecksum is the value of LabelIMImage for image: "imi-" and the
// first 8 hex digits of the SHA-512 of the image's canonical name, ':' and '/' replaced by
// '-' (types/types.go GetInstanceManagerLabels, GetImageCanonicalName,
// GetInstanceManagerImageChecksumName; util/util.go GetStringChecksum). LH fact 29 leaves
// out the canonical-name step: the checksum is of "longhornio-longhorn-instance-manager-v1.12.1",
// not of "longhornio/longhorn-instance-manager:v1.12.1".
func InstanceManagerImageChecksum(image string) string {
	canonical := strings.ReplaceAll(strings.ReplaceAll(image, ":", "-"), "/", "-")
	return "imi-" + sha512Hex(strings.TrimSpace(canonical))[:8]
}

// InstanceManagerName is the name Longhorn gives node's AllInOne instance manager of
// image and dataEngine: "instance-manager-" and the first 32 hex digits of the SHA-512 of
// node+image+dataEngine (types/types.go GetInstanceManagerName).
func InstanceManagerName(node, image string, dataEngine longhornv1.DataEngineType) string {
	return "instance-manager-" + sha512Hex(node + image + string(dataEngine))[:32]
}

func sha512Hex(s string) string {
	sum := sha512.Sum512([]byte(s))
	return hex.EncodeToString(sum[:])
}

// instanceManagerLabels are Longhorn's labels of an AllInOne instance manager (types/types.go
// GetInstanceManagerLabels with GetBaseLabelsForSystemManagedComponent; LH fact 29).
func instanceManagerLabels(node, image string, dataEngine longhornv1.DataEngineType) map[string]any {
	return map[string]any{
		labelManagedBy: "longhorn-manager", labelComponent: "instance-manager",
		labelIMType: imTypeAIO, labelIMNode: node, LabelIMImage: InstanceManagerImageChecksum(image),
		labelIMDataEngine: string(dataEngine),
	}
}

// UpgradeLonghorn plays a Longhorn chart upgrade whose instance-manager image is imImage:
// it writes the setting default-instance-manager-image, as each new longhorn-manager does
// at start (app/daemon.go), and makes imImage the live upgrade's target image too (LH fact
// 11, SetTargetImage). From then on Run replaces the instance managers as released Longhorn
// does (syncInstanceManagers), or, where the cluster serves the live-upgrade kinds, leaves
// the v2 ones to the live upgrade.
func (l *Longhorn) UpgradeLonghorn(ctx context.Context, imImage string) error {
	if err := SetLonghornSetting(ctx, l.Client, l.Namespace, SettingDefaultInstanceManagerImage, imImage); err != nil {
		return fmt.Errorf("set Longhorn's %s to %s: %w", SettingDefaultInstanceManagerImage, imImage, err)
	}
	l.SetTargetImage(imImage)
	// The pass that this wakes reads the setting from the cache: it waits until the cache
	// has it, or finds nothing to play and looks again only a second later.
	if l.Cache != nil {
		deadline := time.Now().Add(cacheCatchUp)
		for time.Now().Before(deadline) {
			if v, found, err := l.settingValue(ctx, SettingDefaultInstanceManagerImage); err != nil || (found && v == imImage) {
				break
			}
			time.Sleep(2 * time.Millisecond)
		}
	}
	l.loop.wake()
	return nil
}

// DetachLonghornVolume plays what Longhorn does when the workload of a volume stops (a
// VM shut down, its PVC unpublished): the volume detaches, its engines and then its
// replicas stop. Longhorn's volume controller sets the engine's and the replicas'
// spec.desireState to stopped when the volume detaches; their controllers stop the
// instances and report status.currentState stopped, and clear status.instanceManagerName
// once stopped (controller/instance_handler.go syncStatusWithInstanceManager). The
// volume then reads state detached, currentNodeID empty and robustness unknown (LH fact 25).
// The intermediate states (detaching, stopping) are written too, in that order.
func DetachLonghornVolume(ctx context.Context, c client.Client, namespace, volume string) error {
	key := client.ObjectKey{Namespace: namespace, Name: volume}
	if err := patchLonghorn(ctx, c, "Volume", key, false, map[string]any{"spec": map[string]any{"nodeID": ""}}); err != nil {
		return fmt.Errorf("detach Longhorn volume %s: %w", volume, err)
	}
	if err := patchLonghorn(ctx, c, "Volume", key, true, map[string]any{"status": map[string]any{"state": "detaching"}}); err != nil {
		return fmt.Errorf("detach Longhorn volume %s: %w", volume, err)
	}
	for _, kind := range []string{"Engine", "Replica"} {
		list := &unstructured.UnstructuredList{}
		list.SetAPIVersion(longhornv1.SchemeGroupVersion.String())
		list.SetKind(kind + "List")
		if err := c.List(ctx, list, client.InNamespace(namespace), client.MatchingLabels{"longhornvolume": volume}); err != nil {
			return fmt.Errorf("detach Longhorn volume %s: list its %ss: %w", volume, kind, err)
		}
		for _, o := range list.Items {
			k := client.ObjectKeyFromObject(&o)
			if err := patchLonghorn(ctx, c, kind, k, false, map[string]any{"spec": map[string]any{"desireState": "stopped"}}); err != nil {
				return fmt.Errorf("stop Longhorn %s %s: %w", kind, k.Name, err)
			}
			if err := patchLonghorn(ctx, c, kind, k, true, map[string]any{"status": map[string]any{"currentState": "stopped", "instanceManagerName": "", "started": false}}); err != nil {
				return fmt.Errorf("stop Longhorn %s %s: %w", kind, k.Name, err)
			}
		}
	}
	if err := patchLonghorn(ctx, c, "Volume", key, true, map[string]any{"status": map[string]any{"state": "detached", "currentNodeID": "", "robustness": "unknown"}}); err != nil {
		return fmt.Errorf("detach Longhorn volume %s: %w", volume, err)
	}
	return nil
}

// patchLonghorn merge-patches a Longhorn object of kind (its status when status is true).
// A merge patch sends only the fields given: a typed update would send Longhorn's enums
// empty, which its CRDs refuse.
func patchLonghorn(ctx context.Context, c client.Client, kind string, key client.ObjectKey, status bool, patch map[string]any) error {
	data, err := json.Marshal(patch)
	if err != nil {
		return err
	}
	o := &unstructured.Unstructured{}
	o.SetAPIVersion(longhornv1.SchemeGroupVersion.String())
	o.SetKind(kind)
	o.SetNamespace(key.Namespace)
	o.SetName(key.Name)
	if status {
		return c.Status().Patch(ctx, o, client.RawPatch(types.MergePatchType, data))
	}
	return c.Patch(ctx, o, client.RawPatch(types.MergePatchType, data))
}

// released is one look at the objects released Longhorn's node and instance-manager
// controllers read.
type released struct {
	defaultImage       string
	v1, v2             bool
	nodes              []longhornv1.Node
	ims                []longhornv1.InstanceManager
	engines            []longhornv1.Engine
	replicas           []longhornv1.Replica
	kubeNodesDisableV2 map[string]bool
}

// settingValue reads a Longhorn setting; found is false when it does not exist.
func (l *Longhorn) settingValue(ctx context.Context, name string) (value string, found bool, err error) {
	s := &longhornv1.Setting{}
	err = l.others().Get(ctx, client.ObjectKey{Namespace: l.Namespace, Name: name}, s)
	if apierrors.IsNotFound(err) {
		return "", false, nil
	}
	if err != nil {
		return "", false, err
	}
	return s.Value, true, nil
}

// syncReleased plays one pass of released Longhorn's node controller
// (syncInstanceManagers), its instance-manager controller (syncInstanceManager) and the
// part of the engine and replica controllers and of the instance-manager monitor that
// says which instance manager runs which instance. liveServed says the cluster serves the
// live-upgrade kinds: then the v2 instance managers are the live upgrade's (the pass in
// longhorn.go) and this one leaves them alone (LH fact 23: with the live upgrade built in,
// the node controller keeps the old v2 IM and creates no second one). It reports false
// when there is nothing to play: the setting default-instance-manager-image does not
// exist, which a Longhorn install always writes (app/daemon.go), so a cluster without it
// is one whose test did not ask for this (the fixtures of the live upgrade's specs).
func (l *Longhorn) syncReleased(ctx context.Context, liveServed bool) bool {
	defaultImage, found, err := l.settingValue(ctx, SettingDefaultInstanceManagerImage)
	if err != nil || !found || defaultImage == "" {
		return err != nil // an error: look again soon
	}
	s, err := l.readReleased(ctx, defaultImage)
	if err != nil {
		return true
	}
	engines := []longhornv1.DataEngineType{}
	if s.v1 {
		engines = append(engines, longhornv1.DataEngineTypeV1)
	}
	if s.v2 && !liveServed {
		engines = append(engines, longhornv1.DataEngineTypeV2)
	}
	if len(engines) == 0 {
		return true
	}
	l.assignInstances(ctx, s, engines)
	l.monitorInstances(ctx, s, engines)
	for _, n := range s.nodes {
		for _, e := range engines {
			l.syncInstanceManagers(ctx, s, n.Name, e)
		}
	}
	for i := range s.ims {
		if containsEngine(engines, s.ims[i].Spec.DataEngine) {
			l.syncInstanceManager(ctx, s, &s.ims[i])
		}
	}
	return true
}

func containsEngine(engines []longhornv1.DataEngineType, e longhornv1.DataEngineType) bool {
	for _, x := range engines {
		if x == e {
			return true
		}
	}
	return false
}

func (l *Longhorn) readReleased(ctx context.Context, defaultImage string) (*released, error) {
	s := &released{defaultImage: defaultImage, v1: true, v2: true, kubeNodesDisableV2: map[string]bool{}}
	// Longhorn creates every setting with its default: v1-data-engine true, v2-data-engine
	// false (types/setting.go). The simulator's fixtures create v2 instance managers
	// without the setting, so an absent v2-data-engine counts as enabled here; "false"
	// disables, as in Longhorn.
	for _, x := range []struct {
		name string
		on   *bool
	}{{SettingV1DataEngine, &s.v1}, {SettingV2DataEngine, &s.v2}} {
		v, found, err := l.settingValue(ctx, x.name)
		if err != nil {
			return nil, err
		}
		if found {
			*x.on = v == "true"
		}
	}
	nodes := &longhornv1.NodeList{}
	ims := &longhornv1.InstanceManagerList{}
	engines := &longhornv1.EngineList{}
	replicas := &longhornv1.ReplicaList{}
	for _, list := range []client.ObjectList{nodes, ims, engines, replicas} {
		if err := l.Client.List(ctx, list, client.InNamespace(l.Namespace)); err != nil {
			return nil, err
		}
	}
	s.nodes, s.ims, s.engines, s.replicas = nodes.Items, ims.Items, engines.Items, replicas.Items
	for _, n := range s.nodes {
		kn := &corev1.Node{}
		err := l.others().Get(ctx, client.ObjectKey{Name: n.Name}, kn)
		switch {
		case apierrors.IsNotFound(err):
			// Longhorn's datastore fails the node's sync then; the simulator's fixtures
			// often have no Kubernetes Node, and count as not disabled.
		case err != nil:
			return nil, err
		default:
			s.kubeNodesDisableV2[n.Name] = kn.Labels[LabelDisableV2DataEngine] == "true"
		}
	}
	return s, nil
}

// instanceActive: an instance Longhorn counts as running or starting
// (node_controller.go syncInstanceManagers).
func instanceActive(state longhornv1.InstanceState) bool {
	return state == longhornv1.InstanceStateRunning || state == longhornv1.InstanceStateStarting
}

// assignInstances plays the engine and replica controllers' choice of instance manager:
// an engine or replica that runs and names no instance manager is started in the running
// AllInOne instance manager of its node and data engine, for v2 the node's only one, for
// v1 the one on the default image (datastore/longhorn.go GetInstanceManagerByInstanceRO,
// listInstanceManagers; controller/engine_controller.go CreateInstance records it in
// status.instanceManagerName).
func (l *Longhorn) assignInstances(ctx context.Context, s *released, engines []longhornv1.DataEngineType) {
	pick := func(node string, engine longhornv1.DataEngineType) string {
		for _, im := range s.ims {
			if im.Spec.NodeID == node && dataEngineOf(im.Spec.DataEngine) == engine && string(im.Spec.Type) == imTypeAIO &&
				im.Status.CurrentState == longhornv1.InstanceManagerStateRunning && im.DeletionTimestamp == nil &&
				(engine == longhornv1.DataEngineTypeV2 || im.Spec.Image == s.defaultImage) {
				return im.Name
			}
		}
		return ""
	}
	for i := range s.engines {
		e := &s.engines[i]
		if e.Status.InstanceManagerName != "" || !instanceActive(e.Status.CurrentState) || !containsEngine(engines, dataEngineOf(e.Spec.DataEngine)) {
			continue
		}
		if name := pick(e.Spec.NodeID, dataEngineOf(e.Spec.DataEngine)); name != "" &&
			patchLonghorn(ctx, l.Client, "Engine", client.ObjectKeyFromObject(e), true, map[string]any{"status": map[string]any{"instanceManagerName": name}}) == nil {
			e.Status.InstanceManagerName = name
		}
	}
	for i := range s.replicas {
		r := &s.replicas[i]
		if r.Status.InstanceManagerName != "" || !instanceActive(r.Status.CurrentState) || !containsEngine(engines, dataEngineOf(r.Spec.DataEngine)) {
			continue
		}
		if name := pick(r.Spec.NodeID, dataEngineOf(r.Spec.DataEngine)); name != "" &&
			patchLonghorn(ctx, l.Client, "Replica", client.ObjectKeyFromObject(r), true, map[string]any{"status": map[string]any{"instanceManagerName": name}}) == nil {
			r.Status.InstanceManagerName = name
		}
	}
}

// dataEngineOf: Longhorn leaves the data engine empty on objects older than v2, which are v1.
func dataEngineOf(e longhornv1.DataEngineType) longhornv1.DataEngineType {
	if e == "" {
		return longhornv1.DataEngineTypeV1
	}
	return e
}

// monitorInstances plays the instance-manager monitor: a running instance manager's
// status.instanceEngines and status.instanceReplicas list the engine and replica
// processes it runs, here the engines and replicas that name it and run or start. A
// stopped, starting or errored one lists none (instance_manager_controller.go
// syncInstanceStatus). The node controller reads these lists, not the Engines and
// Replicas (node_controller.go syncInstanceManagers).
func (l *Longhorn) monitorInstances(ctx context.Context, s *released, engines []longhornv1.DataEngineType) {
	for i := range s.ims {
		im := &s.ims[i]
		if !containsEngine(engines, dataEngineOf(im.Spec.DataEngine)) {
			continue
		}
		want := map[string]map[string]longhornv1.InstanceProcess{"instanceEngines": {}, "instanceReplicas": {}}
		if im.Status.CurrentState == longhornv1.InstanceManagerStateRunning {
			for _, e := range s.engines {
				if e.Status.InstanceManagerName == im.Name && instanceActive(e.Status.CurrentState) {
					want["instanceEngines"][e.Name] = process(e.Name, im.Spec.DataEngine, e.Status.CurrentState, longhornv1.InstanceTypeEngine)
				}
			}
			for _, r := range s.replicas {
				if r.Status.InstanceManagerName == im.Name && instanceActive(r.Status.CurrentState) {
					want["instanceReplicas"][r.Name] = process(r.Name, im.Spec.DataEngine, r.Status.CurrentState, longhornv1.InstanceTypeReplica)
				}
			}
		}
		have := map[string]map[string]longhornv1.InstanceProcess{"instanceEngines": im.Status.InstanceEngines, "instanceReplicas": im.Status.InstanceReplicas}
		patch := map[string]any{}
		for field, w := range want {
			if sameProcesses(have[field], w) {
				continue
			}
			if len(w) == 0 {
				patch[field] = nil
				continue
			}
			m := map[string]any{}
			for name := range have[field] {
				m[name] = nil // a merge patch merges maps: a process gone is removed by name
			}
			for name, p := range w {
				m[name] = p
			}
			patch[field] = m
		}
		if len(patch) == 0 {
			continue
		}
		if patchLonghorn(ctx, l.Client, "InstanceManager", client.ObjectKeyFromObject(im), true, map[string]any{"status": patch}) == nil {
			im.Status.InstanceEngines, im.Status.InstanceReplicas = want["instanceEngines"], want["instanceReplicas"]
		}
	}
}

func process(name string, engine longhornv1.DataEngineType, state longhornv1.InstanceState, t longhornv1.InstanceType) longhornv1.InstanceProcess {
	return longhornv1.InstanceProcess{
		Spec:   longhornv1.InstanceProcessSpec{Name: name, DataEngine: engine},
		Status: longhornv1.InstanceProcessStatus{State: state, Type: t},
	}
}

func sameProcesses(a, b map[string]longhornv1.InstanceProcess) bool {
	if len(a) != len(b) {
		return false
	}
	for k, p := range a {
		q, ok := b[k]
		if !ok || p.Status.State != q.Status.State {
			return false
		}
	}
	return true
}

// syncInstanceManagers plays released Longhorn's node controller for one node and data
// engine (controller/node_controller.go syncInstanceManagers, v1.10.0 and v1.12.1; fact 69):
//   - an AllInOne instance manager on the default image is kept; for v2 on a node where
//     v2 is disabled it is deleted once it runs no instance (fact 71);
//   - one on another image is deleted unless it is running and runs a running or
//     starting instance (engine or replica; v1.12.1 counts engine frontends too, which
//     the simulator does not have), or is in state unknown;
//   - when there is none on the default image, one is created, named and labelled as
//     Longhorn does, with no status (the instance-manager controller makes it stopped),
//     except for v2 on a node where v2 is disabled (fact 71).
//
// Decided where the sources are silent or the simulator is smaller: v1.12.1 also keeps
// the IM of the node's own longhorn-manager argument image and creates none while that
// argument differs from the setting (during the DaemonSet's rolling update); the
// simulator plays every node's manager as already rolled once the setting changed. The
// instance managers of types engine and replica (pre-1.5) are not played.
func (l *Longhorn) syncInstanceManagers(ctx context.Context, s *released, node string, engine longhornv1.DataEngineType) {
	disabled := engine == longhornv1.DataEngineTypeV2 && s.kubeNodesDisableV2[node]
	haveDefault := false
	for i := range s.ims {
		im := &s.ims[i]
		if im.Spec.NodeID != node || string(im.Spec.Type) != imTypeAIO || dataEngineOf(im.Spec.DataEngine) != engine || im.DeletionTimestamp != nil {
			continue
		}
		active := false
		if im.Status.CurrentState == longhornv1.InstanceManagerStateRunning {
			for _, p := range im.Status.InstanceEngines {
				active = active || instanceActive(p.Status.State)
			}
			for _, p := range im.Status.InstanceReplicas {
				active = active || instanceActive(p.Status.State)
			}
		}
		cleanup := true
		if im.Spec.Image == s.defaultImage {
			haveDefault = true
			cleanup = disabled && !active
		} else if active || im.Status.CurrentState == longhornv1.InstanceManagerStateUnknown {
			cleanup = false
		}
		if cleanup {
			if err := l.Client.Delete(ctx, im); err == nil || apierrors.IsNotFound(err) {
				now := metav1.Now()
				im.DeletionTimestamp = &now
				l.forgetIM(im.Name)
			}
		}
	}
	if haveDefault || disabled {
		return
	}
	name := InstanceManagerName(node, s.defaultImage, engine)
	im := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": longhornv1.SchemeGroupVersion.String(), "kind": "InstanceManager",
		"metadata": map[string]any{"name": name, "namespace": l.Namespace, "labels": instanceManagerLabels(node, s.defaultImage, engine)},
		"spec":     map[string]any{"nodeID": node, "type": imTypeAIO, "dataEngine": string(engine), "image": s.defaultImage},
	}}
	if err := l.Client.Create(ctx, im); err != nil {
		return // already there (an earlier pass): the next list shows it
	}
	s.ims = append(s.ims, longhornv1.InstanceManager{})
	last := &s.ims[len(s.ims)-1]
	last.Name, last.Namespace = name, l.Namespace
	last.Spec.NodeID, last.Spec.Type, last.Spec.DataEngine, last.Spec.Image = node, longhornv1.InstanceManagerTypeAllInOne, engine, s.defaultImage
}

// syncInstanceManager plays released Longhorn's instance-manager controller for one
// instance manager (controller/instance_manager_controller.go syncInstanceManager,
// v1.10.0 and v1.12.1; fact 70). The simulator has no pods; it keeps, per instance
// manager it started, when it created the "pod":
//   - without a pod, a new instance manager (no state) or a stopped one is stopped
//     (syncStatusWithPod);
//   - a v2 one that is stopped is not synced further while another v2 AllInOne instance
//     manager of the node is not stopped, nor when it is not on the default image
//     (canProceedWithInstanceManagerSync);
//   - otherwise the controller creates its pod (handlePod): starting, then running once
//     StateDuration has passed (the pod's readiness).
//
// Instance managers the simulator did not start (a fixture's, running) are left as they are.
func (l *Longhorn) syncInstanceManager(ctx context.Context, s *released, im *longhornv1.InstanceManager) {
	if im.DeletionTimestamp != nil {
		return
	}
	state := im.Status.CurrentState
	started, podAt := l.imPod(im.Name)
	if state != "" && state != longhornv1.InstanceManagerStateStopped && !started {
		return // not the simulator's to run
	}
	var next longhornv1.InstanceManagerState
	if !started {
		next = longhornv1.InstanceManagerStateStopped
		syncable := true
		if dataEngineOf(im.Spec.DataEngine) == longhornv1.DataEngineTypeV2 {
			for _, other := range s.ims {
				if other.Name != im.Name && other.Spec.NodeID == im.Spec.NodeID && string(other.Spec.Type) == imTypeAIO &&
					other.Spec.DataEngine == longhornv1.DataEngineTypeV2 && other.DeletionTimestamp == nil &&
					other.Status.CurrentState != longhornv1.InstanceManagerStateStopped {
					syncable = false
				}
			}
			syncable = syncable && im.Spec.Image == s.defaultImage
		}
		if syncable {
			l.startIMPod(im.Name)
			next = longhornv1.InstanceManagerStateStarting
		}
	} else {
		duration := l.StateDuration
		if duration == 0 {
			duration = 100 * time.Millisecond
		}
		if time.Since(podAt) >= duration {
			next = longhornv1.InstanceManagerStateRunning
		} else {
			next = longhornv1.InstanceManagerStateStarting
		}
	}
	if next == state && im.Status.OwnerID == im.Spec.NodeID {
		return
	}
	status := map[string]any{"currentState": string(next), "ownerID": im.Spec.NodeID}
	if next != longhornv1.InstanceManagerStateRunning {
		status["instanceEngines"], status["instanceReplicas"] = nil, nil // syncInstanceStatus
	}
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		return patchLonghorn(ctx, l.Client, "InstanceManager", client.ObjectKeyFromObject(im), true, map[string]any{"status": status})
	}); err == nil {
		im.Status.CurrentState, im.Status.OwnerID = next, im.Spec.NodeID
	}
}

func (l *Longhorn) imPod(name string) (bool, time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	at, ok := l.imPods[name]
	return ok, at
}

func (l *Longhorn) startIMPod(name string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.imPods == nil {
		l.imPods = map[string]time.Time{}
	}
	l.imPods[name] = time.Now()
}

func (l *Longhorn) forgetIM(name string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.imPods, name)
}
