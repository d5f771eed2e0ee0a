package extension_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	runtimecatalog "sigs.k8s.io/cluster-api/api/runtime/catalog"
	runtimehooksv1 "sigs.k8s.io/cluster-api/api/runtime/hooks/v1alpha1"
	runtimev1 "sigs.k8s.io/cluster-api/api/runtime/v1beta2"

	hooksv1 "github.com/capi-inplace/capi-inplace/api/hooks/v1alpha1"
	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/controllers/upgraderequest"
	"github.com/capi-inplace/capi-inplace/controllers/upgradetask"
	"github.com/capi-inplace/capi-inplace/extension"
	"github.com/capi-inplace/capi-inplace/nodeupdater"
	"github.com/capi-inplace/capi-inplace/test/capisim"
	"github.com/capi-inplace/capi-inplace/test/fixtures"
)

// declaringUpdater is an updater that, besides the version, changes the CPU count of a
// HarvesterMachine in place.
type declaringUpdater struct{ noopUpdater }

func (declaringUpdater) InPlaceFields() []nodeupdater.InPlaceField {
	return []nodeupdater.InPlaceField{{Object: nodeupdater.InfrastructureMachineObject, Kinds: []string{"HarvesterMachine"}, Path: []string{"cpuCount"}}}
}

// inPlaceRegistry runs ConfigMap (an updater that declares nothing beyond the version)
// and Secret (declaringUpdater) as updater configuration kinds.
func inPlaceRegistry() *nodeupdater.Registry {
	reg := newRegistry()
	Expect(reg.Register(nodeupdater.Registration{
		GroupKind: schema.GroupKind{Kind: "Secret"},
		NewConfig: func() client.Object { return &corev1.Secret{} },
		Updater:   declaringUpdater{},
	})).To(Succeed())
	return reg
}

func newInPlaceHooks(defaultUpdater string) *extension.InPlaceHooks {
	reg := inPlaceRegistry()
	return &extension.InPlaceHooks{
		Client:         k8s,
		Requester:      &upgraderequest.Requester{Client: k8s, Registry: reg, DefaultUpdater: defaultUpdater},
		Registry:       reg,
		DefaultUpdater: defaultUpdater,
	}
}

const (
	fromVersion = "v1.33.3+rke2r1"
	toVersion   = "v1.34.1+rke2r1"
)

// rawObject is an object of a hook request the way Cluster API sends it: apiVersion, kind,
// name, namespace, labels and annotations, and spec; no status.
func rawObject(apiVersion, kind, ns, name string, spec map[string]any) runtime.RawExtension {
	raw, err := json.Marshal(map[string]any{
		"apiVersion": apiVersion, "kind": kind,
		"metadata": map[string]any{"name": name, "namespace": ns},
		"spec":     spec,
	})
	Expect(err).NotTo(HaveOccurred())
	return runtime.RawExtension{Raw: raw}
}

func template(spec map[string]any) map[string]any {
	return map[string]any{"template": map[string]any{"spec": spec}}
}

// kubeadmConfigSpec is a KubeadmConfig spec as KubeadmControlPlane derives it for a
// Kubernetes minor: from v1.31 up to v1.35 it carries the ControlPlaneKubeletLocalMode gate.
func kubeadmConfigSpec(minor int) map[string]any {
	spec := map[string]any{
		"clusterConfiguration": map[string]any{"apiServer": map[string]any{"extraArgs": []any{map[string]any{"name": "audit-log-maxage", "value": "30"}}}},
		"joinConfiguration":    map[string]any{"nodeRegistration": map[string]any{"kubeletExtraArgs": []any{map[string]any{"name": "max-pods", "value": "200"}}}},
		"files":                []any{map[string]any{"path": "/etc/motd", "content": "hello"}},
	}
	if minor >= 31 && minor < 36 {
		spec["clusterConfiguration"].(map[string]any)["featureGates"] = map[string]any{"ControlPlaneKubeletLocalMode": true}
	}
	return spec
}

// askSet, askMachine and askUpdate call a hook's handler as Cluster API's runtime client
// does and return its answer as read off the wire.
func askSet(hooks *extension.InPlaceHooks, req *runtimehooksv1.CanUpdateMachineSetRequest) *runtimehooksv1.CanUpdateMachineSetResponse {
	resp := &runtimehooksv1.CanUpdateMachineSetResponse{}
	hooks.CanUpdateMachineSet(ctx, req, resp)
	return viaWire(resp)
}

func askMachine(hooks *extension.InPlaceHooks, req *runtimehooksv1.CanUpdateMachineRequest) *runtimehooksv1.CanUpdateMachineResponse {
	resp := &runtimehooksv1.CanUpdateMachineResponse{}
	hooks.CanUpdateMachine(ctx, req, resp)
	return viaWire(resp)
}

func askUpdate(hooks *extension.InPlaceHooks, req *runtimehooksv1.UpdateMachineRequest) *runtimehooksv1.UpdateMachineResponse {
	resp := &runtimehooksv1.UpdateMachineResponse{}
	hooks.UpdateMachine(ctx, req, resp)
	return viaWire(resp)
}

// viaWire sends a request through JSON, as the runtime SDK server receives it.
func viaWire[T any](in *T) *T {
	raw, err := json.Marshal(in)
	Expect(err).NotTo(HaveOccurred())
	out := new(T)
	Expect(json.Unmarshal(raw, out)).To(Succeed())
	return out
}

// canUpdateMachineSetRequest builds what the MachineDeployment controller sends when the
// MachineDeployment's version goes from `from` to `to`: the old and the new MachineSet
// (spec only), their KubeadmConfigTemplate and infrastructure template. mutate changes
// the desired objects further.
func canUpdateMachineSetRequest(ns, from, to string, settings map[string]string, mutate func(ms *clusterv1.MachineSet, bootstrap, infra map[string]any)) *runtimehooksv1.CanUpdateMachineSetRequest {
	GinkgoHelper()
	current := &clusterv1.MachineSet{}
	Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "workers-ms"}, current)).To(Succeed())
	cur := clusterv1.MachineSet{
		TypeMeta:   metav1.TypeMeta{APIVersion: clusterv1.GroupVersion.String(), Kind: "MachineSet"},
		ObjectMeta: metav1.ObjectMeta{Name: current.Name, Namespace: ns, Labels: current.Labels, Annotations: current.Annotations},
		Spec:       *current.Spec.DeepCopy(),
	}
	cur.Spec.Template.Spec.Version = from
	want := *cur.DeepCopy()
	want.Name = "workers-ms-new"
	want.Spec.Template.Spec.Version = to

	bootstrap := kubeadmConfigSpec(34)
	wantBootstrap := kubeadmConfigSpec(34)
	infra := map[string]any{"cpuCount": int64(4), "memory": "8Gi", "networks": []any{"mgmt"}}
	wantInfra := map[string]any{"cpuCount": int64(4), "memory": "8Gi", "networks": []any{"mgmt"}}
	if mutate != nil {
		mutate(&want, wantBootstrap, wantInfra)
	}
	req := &runtimehooksv1.CanUpdateMachineSetRequest{
		CommonRequest: runtimehooksv1.CommonRequest{Settings: settings},
		Current: runtimehooksv1.CanUpdateMachineSetRequestObjects{
			MachineSet:                    cur,
			BootstrapConfigTemplate:       rawObject("bootstrap.cluster.x-k8s.io/v1beta2", "KubeadmConfigTemplate", ns, "workers-bootstrap", template(bootstrap)),
			InfrastructureMachineTemplate: rawObject("infrastructure.cluster.x-k8s.io/v1beta1", "HarvesterMachineTemplate", ns, "workers-infra", template(infra)),
		},
		Desired: runtimehooksv1.CanUpdateMachineSetRequestObjects{
			MachineSet:                    want,
			BootstrapConfigTemplate:       rawObject("bootstrap.cluster.x-k8s.io/v1beta2", "KubeadmConfigTemplate", ns, "workers-bootstrap", template(wantBootstrap)),
			InfrastructureMachineTemplate: rawObject("infrastructure.cluster.x-k8s.io/v1beta1", "HarvesterMachineTemplate", ns, "workers-infra", template(wantInfra)),
		},
	}
	req.SetGroupVersionKind(runtimehooksv1.GroupVersion.WithKind("CanUpdateMachineSetRequest"))
	return viaWire(req)
}

// canUpdateMachineRequest builds what KubeadmControlPlane sends for machine cp-1 when its
// version goes from `from` to `to` (minors fromMinor, toMinor): the Machine, its
// KubeadmConfig as KCP derives it for each version, and its infrastructure machine.
func canUpdateMachineRequest(w *world, from, to string, fromMinor, toMinor int, settings map[string]string, mutate func(m *clusterv1.Machine, bootstrap, infra map[string]any)) *runtimehooksv1.CanUpdateMachineRequest {
	GinkgoHelper()
	current := &clusterv1.Machine{}
	Expect(k8s.Get(ctx, client.ObjectKeyFromObject(w.cps[0]), current)).To(Succeed())
	cur := clusterv1.Machine{
		TypeMeta:   metav1.TypeMeta{APIVersion: clusterv1.GroupVersion.String(), Kind: "Machine"},
		ObjectMeta: metav1.ObjectMeta{Name: current.Name, Namespace: w.ns, Labels: current.Labels, Annotations: current.Annotations},
		Spec:       *current.Spec.DeepCopy(),
	}
	cur.Spec.Version = from
	want := *cur.DeepCopy()
	want.Spec.Version = to
	wantBootstrap := kubeadmConfigSpec(toMinor)
	infra := map[string]any{"cpuCount": int64(8), "memory": "16Gi"}
	wantInfra := map[string]any{"cpuCount": int64(8), "memory": "16Gi"}
	if mutate != nil {
		mutate(&want, wantBootstrap, wantInfra)
	}
	req := &runtimehooksv1.CanUpdateMachineRequest{
		CommonRequest: runtimehooksv1.CommonRequest{Settings: settings},
		Current: runtimehooksv1.CanUpdateMachineRequestObjects{
			Machine:               cur,
			BootstrapConfig:       rawObject("bootstrap.cluster.x-k8s.io/v1beta2", "KubeadmConfig", w.ns, "cp-1", kubeadmConfigSpec(fromMinor)),
			InfrastructureMachine: rawObject("infrastructure.cluster.x-k8s.io/v1beta1", "HarvesterMachine", w.ns, "cp-1", infra),
		},
		Desired: runtimehooksv1.CanUpdateMachineRequestObjects{
			Machine:               want,
			BootstrapConfig:       rawObject("bootstrap.cluster.x-k8s.io/v1beta2", "KubeadmConfig", w.ns, "cp-1", wantBootstrap),
			InfrastructureMachine: rawObject("infrastructure.cluster.x-k8s.io/v1beta1", "HarvesterMachine", w.ns, "cp-1", wantInfra),
		},
	}
	req.SetGroupVersionKind(runtimehooksv1.GroupVersion.WithKind("CanUpdateMachineRequest"))
	return viaWire(req)
}

// snapshot is the resourceVersion of every object of the namespace the hooks could touch.
func snapshot(ns string) map[string]string {
	GinkgoHelper()
	out := map[string]string{}
	lists := []client.ObjectList{&clusterv1.ClusterList{}, &clusterv1.MachineList{}, &clusterv1.MachineSetList{}, &clusterv1.MachineDeploymentList{}, &inplacev1.UpgradeTaskList{}, &inplacev1.NodeUpdateList{}}
	for _, l := range lists {
		Expect(k8s.List(ctx, l, client.InNamespace(ns))).To(Succeed())
		items, err := apimeta.ExtractList(l)
		Expect(err).NotTo(HaveOccurred())
		for _, item := range items {
			o, err := apimeta.Accessor(item)
			Expect(err).NotTo(HaveOccurred())
			out[fmt.Sprintf("%T/%s", l, o.GetName())] = o.GetResourceVersion()
		}
	}
	return out
}

var _ = Describe("CanUpdateMachineSet and CanUpdateMachine", func() {
	var (
		w     *world
		hooks *extension.InPlaceHooks
	)
	BeforeEach(func() {
		w = newWorld(map[string]string{inplacev1.UpdaterAnnotation: updaterAnnotation})
		hooks = newInPlaceHooks("")
	})

	It("covers a version bump of a MachineSet, so Cluster API finds nothing left and updates in place, and writes nothing", func() {
		w.controlPlaneRuns(toVersion) // else the workers' skew is refused (judge_test.go)
		before := snapshot(w.ns)
		req := canUpdateMachineSetRequest(w.ns, fromVersion, toVersion, nil, nil)
		resp := askSet(hooks, req)
		Expect(resp.Status).To(Equal(runtimehooksv1.ResponseStatusSuccess), resp.Message)
		Expect(resp.MachineSetPatch.PatchType).To(Equal(runtimehooksv1.JSONPatchType))
		Expect(string(resp.MachineSetPatch.Patch)).To(MatchJSON(`[{"op":"replace","path":"/spec/template/spec/version","value":"v1.34.1+rke2r1"}]`))
		Expect(resp.BootstrapConfigTemplatePatch.IsDefined()).To(BeFalse())
		Expect(resp.InfrastructureMachineTemplatePatch.IsDefined()).To(BeFalse())
		Expect(resp.Message).To(Equal("capi-inplace covers MachineSet version in place with updater ConfigMap/upgrader"))

		inPlace, left, err := capisim.VerdictMachineSet(req, resp)
		Expect(err).NotTo(HaveOccurred())
		Expect(inPlace).To(BeTrue(), "left: %v", left)
		Expect(snapshot(w.ns)).To(Equal(before), "CanUpdateMachineSet must not write")
	})

	It("leaves out a change it cannot do, so Cluster API replaces the machines", func() {
		By("a new file in the KubeadmConfigTemplate next to the version")
		req := canUpdateMachineSetRequest(w.ns, fromVersion, toVersion, nil, func(_ *clusterv1.MachineSet, bootstrap, _ map[string]any) {
			bootstrap["files"] = append(bootstrap["files"].([]any), map[string]any{"path": "/etc/new", "content": "x"})
		})
		resp := askSet(hooks, req)
		Expect(resp.Status).To(Equal(runtimehooksv1.ResponseStatusSuccess), resp.Message)
		Expect(resp.MachineSetPatch.IsDefined()).To(BeTrue(), "the version is still covered")
		inPlace, left, err := capisim.VerdictMachineSet(req, resp)
		Expect(err).NotTo(HaveOccurred())
		Expect(inPlace).To(BeFalse())
		Expect(left).To(ConsistOf("BootstrapConfigTemplate spec.template.spec"))

		By("a new failure domain next to the version")
		req = canUpdateMachineSetRequest(w.ns, fromVersion, toVersion, nil, func(ms *clusterv1.MachineSet, _, _ map[string]any) {
			ms.Spec.Template.Spec.FailureDomain = "zone-b"
		})
		resp = askSet(hooks, req)
		inPlace, left, err = capisim.VerdictMachineSet(req, resp)
		Expect(err).NotTo(HaveOccurred())
		Expect(inPlace).To(BeFalse())
		Expect(left).To(ConsistOf("MachineSet spec.template.spec"))
	})

	It("answers without a patch when the cluster has no updater configured", func() {
		w2 := newWorld(nil)
		req := canUpdateMachineSetRequest(w2.ns, fromVersion, toVersion, nil, nil)
		resp := askSet(hooks, req)
		Expect(resp.Status).To(Equal(runtimehooksv1.ResponseStatusSuccess), resp.Message)
		Expect(resp.MachineSetPatch.IsDefined()).To(BeFalse())
		Expect(resp.BootstrapConfigTemplatePatch.IsDefined()).To(BeFalse())
		Expect(resp.InfrastructureMachineTemplatePatch.IsDefined()).To(BeFalse())
		Expect(resp.Message).To(HavePrefix("not in place: no updater configured for Cluster " + w2.ns + "/harvester"))
		inPlace, _, err := capisim.VerdictMachineSet(req, resp)
		Expect(err).NotTo(HaveOccurred())
		Expect(inPlace).To(BeFalse())

		By("the ExtensionConfig's defaultUpdater setting configures one")
		w2.controlPlaneRuns(toVersion)
		req = canUpdateMachineSetRequest(w2.ns, fromVersion, toVersion, map[string]string{extension.DefaultUpdaterSetting: "ConfigMap/upgrader"}, nil)
		resp = askSet(hooks, req)
		inPlace, left, err := capisim.VerdictMachineSet(req, resp)
		Expect(err).NotTo(HaveOccurred())
		Expect(inPlace).To(BeTrue(), "left: %v; message: %s", left, resp.Message)
	})

	DescribeTable("does not cover a version change it must not do in place",
		func(from, to, message string) {
			req := canUpdateMachineSetRequest(w.ns, from, to, nil, nil)
			resp := askSet(hooks, req)
			Expect(resp.Status).To(Equal(runtimehooksv1.ResponseStatusSuccess), resp.Message)
			Expect(resp.MachineSetPatch.IsDefined()).To(BeFalse())
			Expect(resp.Message).To(Equal(message))
			inPlace, _, err := capisim.VerdictMachineSet(req, resp)
			Expect(err).NotTo(HaveOccurred())
			Expect(inPlace).To(BeFalse())
		},
		Entry("a downgrade", "v1.34.1+rke2r1", "v1.33.3+rke2r1",
			"capi-inplace cannot do this change in place: v1.34.1+rke2r1 to v1.33.3+rke2r1 is a downgrade; in-place downgrades are not supported; Cluster API rolls it out by replacing machines"),
		Entry("a version that is not semver", "v1.33.3+rke2r1", "1.34",
			`capi-inplace cannot do this change in place: the desired version "1.34" is not a valid semantic version (MAJOR.MINOR.PATCH, for example v1.33.3+rke2r1); Cluster API rolls it out by replacing machines`),
		Entry("a downgrade that string comparison would call an upgrade", "v1.10.0", "v1.9.0",
			"capi-inplace cannot do this change in place: v1.10.0 to v1.9.0 is a downgrade; in-place downgrades are not supported; Cluster API rolls it out by replacing machines"),
		Entry("a downgrade of the RKE2 build", "v1.33.3+rke2r2", "v1.33.3+rke2r1",
			"capi-inplace cannot do this change in place: v1.33.3+rke2r2 to v1.33.3+rke2r1 is a downgrade; in-place downgrades are not supported; Cluster API rolls it out by replacing machines"),
		Entry("a downgrade of the K3s build", "v1.33.3+k3s10", "v1.33.3+k3s9",
			"capi-inplace cannot do this change in place: v1.33.3+k3s10 to v1.33.3+k3s9 is a downgrade; in-place downgrades are not supported; Cluster API rolls it out by replacing machines"),
		Entry("build metadata that has no order", "v1.33.3+foo", "v1.33.3+bar",
			"capi-inplace cannot do this change in place: v1.33.3+foo to v1.33.3+bar cannot be ordered: they differ only in build metadata (+foo and +bar), which has no order: capi-inplace orders only +rke2rN and +k3sN, by N, between two versions of the same form; Cluster API rolls it out by replacing machines"),
		Entry("build metadata added", "v1.33.3", "v1.33.3+rke2r1",
			"capi-inplace cannot do this change in place: v1.33.3 to v1.33.3+rke2r1 cannot be ordered: they differ only in build metadata (none and +rke2r1), which has no order: capi-inplace orders only +rke2rN and +k3sN, by N, between two versions of the same form; Cluster API rolls it out by replacing machines"),
	)

	It("covers a worker's version skipping a minor (kubelet skew allows it) and a build-metadata-only bump", func() {
		w.controlPlaneRuns("v1.35.0+rke2r1")
		for _, to := range []string{"v1.35.0+rke2r1", "v1.33.3+rke2r2", "v1.33.3+rke2r10"} {
			req := canUpdateMachineSetRequest(w.ns, fromVersion, to, nil, nil)
			resp := askSet(hooks, req)
			inPlace, left, err := capisim.VerdictMachineSet(req, resp)
			Expect(err).NotTo(HaveOccurred())
			Expect(inPlace).To(BeTrue(), "%s: left %v, message %s", to, left, resp.Message)
		}
	})

	It("covers a control plane machine's version bump together with the KubeadmConfig change KubeadmControlPlane derives from it (v1.35 to v1.36)", func() {
		w.controlPlaneRuns("v1.35.2")
		req := canUpdateMachineRequest(w, "v1.35.2", "v1.36.0", 35, 36, nil, nil)
		resp := askMachine(hooks, req)
		Expect(resp.Status).To(Equal(runtimehooksv1.ResponseStatusSuccess), resp.Message)
		Expect(string(resp.MachinePatch.Patch)).To(MatchJSON(`[{"op":"replace","path":"/spec/version","value":"v1.36.0"}]`))
		Expect(string(resp.BootstrapConfigPatch.Patch)).To(MatchJSON(`[{"op":"remove","path":"/spec/clusterConfiguration/featureGates"}]`), "the emptied featureGates goes too: desired has none")
		Expect(resp.InfrastructureMachinePatch.IsDefined()).To(BeFalse())
		inPlace, left, err := capisim.VerdictMachine(req, resp)
		Expect(err).NotTo(HaveOccurred())
		Expect(inPlace).To(BeTrue(), "left: %v", left)

		By("the same KubeadmConfig change without a version change is not covered")
		req = canUpdateMachineRequest(w, "v1.36.0", "v1.36.0", 35, 36, nil, nil)
		resp = askMachine(hooks, req)
		Expect(resp.BootstrapConfigPatch.IsDefined()).To(BeFalse())
		inPlace, left, err = capisim.VerdictMachine(req, resp)
		Expect(err).NotTo(HaveOccurred())
		Expect(inPlace).To(BeFalse())
		Expect(left).To(ConsistOf("BootstrapConfig spec"))
	})

	It("never lets a control plane skip a minor version", func() {
		req := canUpdateMachineRequest(w, "v1.33.3+rke2r1", "v1.35.0+rke2r1", 33, 35, nil, nil)
		resp := askMachine(hooks, req)
		Expect(resp.Status).To(Equal(runtimehooksv1.ResponseStatusSuccess), resp.Message)
		Expect(resp.MachinePatch.IsDefined()).To(BeFalse())
		Expect(resp.Message).To(ContainSubstring("skips a minor version, which Kubernetes does not support for a control plane; upgrade to v1.34 first"))
		inPlace, _, err := capisim.VerdictMachine(req, resp)
		Expect(err).NotTo(HaveOccurred())
		Expect(inPlace).To(BeFalse())
	})

	It("covers the fields the cluster's updater declares, and no others", func() {
		Expect(k8s.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: w.ns, Name: "declaring"}})).To(Succeed())
		w.annotateCluster(inplacev1.UpdaterAnnotation, "Secret/declaring")

		req := canUpdateMachineRequest(w, "v1.33.3+rke2r1", "v1.34.1+rke2r1", 33, 34, nil, func(_ *clusterv1.Machine, _, infra map[string]any) {
			infra["cpuCount"] = int64(16)
		})
		resp := askMachine(hooks, req)
		Expect(string(resp.InfrastructureMachinePatch.Patch)).To(MatchJSON(`[{"op":"replace","path":"/spec/cpuCount","value":16}]`))
		inPlace, left, err := capisim.VerdictMachine(req, resp)
		Expect(err).NotTo(HaveOccurred())
		Expect(inPlace).To(BeTrue(), "left: %v", left)
		Expect(resp.Message).To(Equal("capi-inplace covers Machine version, HarvesterMachine cpuCount in place with updater Secret/declaring"))

		req = canUpdateMachineRequest(w, "v1.33.3+rke2r1", "v1.34.1+rke2r1", 33, 34, nil, func(_ *clusterv1.Machine, _, infra map[string]any) {
			infra["memory"] = "32Gi"
		})
		resp = askMachine(hooks, req)
		inPlace, left, err = capisim.VerdictMachine(req, resp)
		Expect(err).NotTo(HaveOccurred())
		Expect(inPlace).To(BeFalse())
		Expect(left).To(ConsistOf("InfrastructureMachine spec"))

		By("the same field is not covered with an updater that does not declare it")
		w.annotateCluster(inplacev1.UpdaterAnnotation, updaterAnnotation)
		req = canUpdateMachineRequest(w, "v1.33.3+rke2r1", "v1.34.1+rke2r1", 33, 34, nil, func(_ *clusterv1.Machine, _, infra map[string]any) {
			infra["cpuCount"] = int64(16)
		})
		resp = askMachine(hooks, req)
		Expect(resp.InfrastructureMachinePatch.IsDefined()).To(BeFalse())
		inPlace, _, err = capisim.VerdictMachine(req, resp)
		Expect(err).NotTo(HaveOccurred())
		Expect(inPlace).To(BeFalse())
	})

	It("answers Failure with a clear message for a request it cannot read or a configured updater it cannot use, and writes nothing", func() {
		before := snapshot(w.ns)
		cases := map[string]struct {
			req  func() *runtimehooksv1.CanUpdateMachineSetRequest
			want string
		}{
			"another hook's body": {func() *runtimehooksv1.CanUpdateMachineSetRequest {
				r := canUpdateMachineSetRequest(w.ns, fromVersion, toVersion, nil, nil)
				r.Kind = "UpdateMachineRequest"
				return r
			}, "the request body is a hooks.runtime.cluster.x-k8s.io/v1alpha1 UpdateMachineRequest, but this hook takes a hooks.runtime.cluster.x-k8s.io/v1alpha1 CanUpdateMachineSetRequest"},
			"no current MachineSet": {func() *runtimehooksv1.CanUpdateMachineSetRequest {
				r := canUpdateMachineSetRequest(w.ns, fromVersion, toVersion, nil, nil)
				r.Current.MachineSet = clusterv1.MachineSet{}
				return r
			}, "the request's current MachineSet has no namespace or name: Cluster API sends metadata.namespace and metadata.name of the object it plans to update"},
			"an undecodable template": {func() *runtimehooksv1.CanUpdateMachineSetRequest {
				r := canUpdateMachineSetRequest(w.ns, fromVersion, toVersion, nil, nil)
				r.Desired.BootstrapConfigTemplate = runtime.RawExtension{Raw: []byte(`["not","an","object"]`)}
				return r
			}, "desired.bootstrapConfigTemplate is not a JSON object: json: cannot unmarshal array into Go value of type map[string]interface {}"},
			"a cluster that does not exist": {func() *runtimehooksv1.CanUpdateMachineSetRequest {
				r := canUpdateMachineSetRequest(w.ns, fromVersion, toVersion, nil, nil)
				r.Current.MachineSet.Spec.ClusterName = "ghost"
				return r
			}, "Cluster " + w.ns + "/ghost not found"},
			"a malformed defaultUpdater setting": {func() *runtimehooksv1.CanUpdateMachineSetRequest {
				w.annotateCluster(inplacev1.UpdaterAnnotation, "")
				return canUpdateMachineSetRequest(w.ns, fromVersion, toVersion, map[string]string{extension.DefaultUpdaterSetting: "HarvesterUpgrader"}, nil)
			}, `the ExtensionConfig's settings.defaultUpdater: updater reference "HarvesterUpgrader" is not of the form`},
			"a configured updater whose object is missing": {func() *runtimehooksv1.CanUpdateMachineSetRequest {
				w.annotateCluster(inplacev1.UpdaterAnnotation, "ConfigMap/missing")
				return canUpdateMachineSetRequest(w.ns, fromVersion, toVersion, nil, nil)
			}, "updater ConfigMap/missing not found in namespace " + w.ns + ": create the ConfigMap object or name another updater (named by the Cluster's inplace.cluster.x-k8s.io/updater annotation); fix it, or remove it to let Cluster API replace machines"},
		}
		for name, c := range cases {
			req := c.req()
			resp := askSet(hooks, req)
			Expect(resp.Status).To(Equal(runtimehooksv1.ResponseStatusFailure), name)
			Expect(resp.Message).To(HavePrefix(c.want), name)
			Expect(resp.MachineSetPatch.IsDefined()).To(BeFalse(), name)
		}
		w.annotateCluster(inplacev1.UpdaterAnnotation, updaterAnnotation)
		after := snapshot(w.ns)
		delete(after, "*v1beta2.ClusterList/harvester")
		delete(before, "*v1beta2.ClusterList/harvester")
		Expect(after).To(Equal(before), "a bad request changes nothing (the test itself edited the Cluster's annotation)")
	})
})

// annotateCluster sets (or, with an empty value, removes) an annotation of the Cluster.
func (w *world) annotateCluster(key, value string) {
	GinkgoHelper()
	Expect(retry.RetryOnConflict(retry.DefaultRetry, func() error {
		c := &clusterv1.Cluster{}
		if err := k8s.Get(ctx, client.ObjectKey{Namespace: w.ns, Name: "harvester"}, c); err != nil {
			return err
		}
		if value == "" {
			delete(c.Annotations, key)
		} else {
			if c.Annotations == nil {
				c.Annotations = map[string]string{}
			}
			c.Annotations[key] = value
		}
		return k8s.Update(ctx, c)
	})).To(Succeed())
}

// startTaskController runs the UpgradeTask controller (no NodeUpdate controller: the tests
// play the updater by writing NodeUpdate status) until the spec ends. It watches only ns,
// so that it does not take up the tasks other specs left behind.
func startTaskController(ns string) {
	GinkgoHelper()
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{
		Scheme:                 env.Scheme,
		Cache:                  cache.Options{DefaultNamespaces: map[string]cache.Config{ns: {}}},
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Controller:             config.Controller{SkipNameValidation: ptr.To(true)},
	})
	Expect(err).NotTo(HaveOccurred())
	r := &upgradetask.Reconciler{Workload: upgradetask.SameCluster{Management: k8s}, Registry: inPlaceRegistry(), PollInterval: 100 * time.Millisecond}
	Expect(r.SetupWithManager(ctx, mgr, controller.Options{MaxConcurrentReconciles: 2})).To(Succeed())
	mctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer GinkgoRecover()
		defer close(done)
		Expect(mgr.Start(mctx)).To(Succeed())
	}()
	Expect(mgr.GetCache().WaitForCacheSync(mctx)).To(BeTrue())
	DeferCleanup(func() {
		cancel()
		Eventually(done, 30*time.Second).Should(BeClosed())
	})
}

// setDesiredVersion does what Cluster API does before it calls UpdateMachine
// (shared/facts/capi-inplace-updates.md, E.17-19): it marks the Machine with the
// update-in-progress annotation, writes the desired version into its spec, and marks the
// UpdateMachine hook pending.
func setDesiredVersion(m *clusterv1.Machine, v string) *clusterv1.Machine {
	GinkgoHelper()
	return editMachine(m, func(got *clusterv1.Machine) {
		got.Annotations[clusterv1.UpdateInProgressAnnotation] = ""
		got.Annotations[runtimev1.PendingHooksAnnotation] = runtimecatalog.HookName(runtimehooksv1.UpdateMachine)
		got.Spec.Version = v
	})
}

// editMachine changes the Machine as it is stored (its annotations never nil) and returns it.
func editMachine(m *clusterv1.Machine, edit func(*clusterv1.Machine)) *clusterv1.Machine {
	GinkgoHelper()
	got := &clusterv1.Machine{}
	Expect(retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(m), got); err != nil {
			return err
		}
		if got.Annotations == nil {
			got.Annotations = map[string]string{}
		}
		edit(got)
		return k8s.Update(ctx, got)
	})).To(Succeed())
	return got
}

func updateMachineRequest(m *clusterv1.Machine, settings map[string]string) *runtimehooksv1.UpdateMachineRequest {
	req := &runtimehooksv1.UpdateMachineRequest{
		CommonRequest: runtimehooksv1.CommonRequest{Settings: settings},
		Desired: runtimehooksv1.UpdateMachineRequestObjects{
			Machine: clusterv1.Machine{
				TypeMeta:   metav1.TypeMeta{APIVersion: clusterv1.GroupVersion.String(), Kind: "Machine"},
				ObjectMeta: metav1.ObjectMeta{Name: m.Name, Namespace: m.Namespace, Labels: m.Labels, Annotations: m.Annotations},
				Spec:       *m.Spec.DeepCopy(),
			},
			InfrastructureMachine: rawObject("infrastructure.cluster.x-k8s.io/v1beta1", "HarvesterMachine", m.Namespace, m.Name, map[string]any{"cpuCount": int64(4)}),
			BootstrapConfig:       rawObject("bootstrap.cluster.x-k8s.io/v1beta2", "KubeadmConfig", m.Namespace, m.Name, kubeadmConfigSpec(34)),
		},
	}
	req.SetGroupVersionKind(runtimehooksv1.GroupVersion.WithKind("UpdateMachineRequest"))
	return viaWire(req)
}

func (w *world) nodeUpdatesOf(machine string) []inplacev1.NodeUpdate {
	GinkgoHelper()
	list := &inplacev1.NodeUpdateList{}
	Expect(k8s.List(ctx, list, client.InNamespace(w.ns))).To(Succeed())
	var out []inplacev1.NodeUpdate
	for _, nu := range list.Items {
		if nu.Spec.MachineName == machine {
			out = append(out, nu)
		}
	}
	return out
}

// setNodeUpdateStatus plays the updater: it writes the NodeUpdate's status.
func (w *world) setNodeUpdateStatus(machine string, edit func(*inplacev1.NodeUpdateStatus)) {
	GinkgoHelper()
	Expect(retry.RetryOnConflict(retry.DefaultRetry, func() error {
		nus := w.nodeUpdatesOf(machine)
		if len(nus) != 1 {
			return fmt.Errorf("machine %s has %d NodeUpdates", machine, len(nus))
		}
		nu := nus[0]
		edit(&nu.Status)
		return k8s.Status().Update(ctx, &nu)
	})).To(Succeed())
}

func running(step string) func(*inplacev1.NodeUpdateStatus) {
	return func(s *inplacev1.NodeUpdateStatus) {
		now := metav1.Now()
		s.Phase = inplacev1.NodeUpdatePhaseInProgress
		s.CurrentStep = step
		s.StartTime = &now
		s.Steps = []inplacev1.NodeUpdateStep{
			{Name: "Drain", State: inplacev1.StepStateSucceeded},
			{Name: step, State: inplacev1.StepStateRunning, StartTime: &now},
			{Name: "Finish", State: inplacev1.StepStatePending},
		}
	}
}

var _ = Describe("UpdateMachine", func() {
	var (
		w     *world
		hooks *extension.InPlaceHooks
	)
	BeforeEach(func() {
		w = newWorld(map[string]string{inplacev1.UpdaterAnnotation: updaterAnnotation})
		hooks = newInPlaceHooks("")
		startTaskController(w.ns)
	})

	call := func(req *runtimehooksv1.UpdateMachineRequest) *runtimehooksv1.UpdateMachineResponse {
		resp := &runtimehooksv1.UpdateMachineResponse{}
		hooks.UpdateMachine(ctx, req, resp)
		return viaWire(resp)
	}

	It("hands the machine to one externally paced task, creates one NodeUpdate however often it is called, and answers from it until done", func() {
		w.controlPlaneRuns(toVersion)
		m := setDesiredVersion(w.workers[1], toVersion)
		req := updateMachineRequest(m, nil)

		var wg sync.WaitGroup
		responses := make(chan *runtimehooksv1.UpdateMachineResponse, 100)
		for range 10 {
			wg.Go(func() {
				defer GinkgoRecover()
				for range 10 {
					responses <- call(updateMachineRequest(m, nil))
				}
			})
		}
		wg.Wait()
		close(responses)
		for resp := range responses {
			Expect(resp.Status).To(Equal(runtimehooksv1.ResponseStatusSuccess), resp.Message)
			Expect(resp.RetryAfterSeconds).To(BeNumerically(">", 0), resp.Message)
		}
		Eventually(func() int { return len(w.nodeUpdatesOf(m.Name)) }).WithPolling(100 * time.Millisecond).Should(Equal(1))
		for range 20 {
			Expect(call(req).Status).To(Equal(runtimehooksv1.ResponseStatusSuccess))
		}
		Consistently(func() int { return len(w.nodeUpdatesOf(m.Name)) }, time.Second, 100*time.Millisecond).Should(Equal(1))

		tasks := w.tasks()
		Expect(tasks).To(HaveLen(1))
		task := tasks[0]
		Expect(task.Spec.Pacing).To(Equal(inplacev1.PacingExternal))
		Expect(task.Spec.MachineDeploymentRef).To(Equal(&inplacev1.MachineDeploymentReference{Name: "workers"}))
		Expect(task.Spec.Machines).To(Equal([]string{m.Name}))
		Expect(task.Spec.Version).To(Equal(toVersion))
		Expect(task.Spec.UpdaterRef).To(Equal(inplacev1.UpdaterReference{Kind: "ConfigMap", Name: "upgrader"}))
		Expect(task.Spec.MaxUnavailable).To(Equal(ptr.To(intstr.FromString("100%"))), "Cluster API paces a MachineDeployment")
		nu := w.nodeUpdatesOf(m.Name)[0]
		Expect(nu.Name).To(Equal(upgraderequest.NodeUpdateName(task.Name, m.Name)))
		for _, other := range []*clusterv1.Machine{w.workers[0], w.workers[2]} {
			Expect(w.nodeUpdatesOf(other.Name)).To(BeEmpty(), "Cluster API did not hand %s over", other.Name)
		}

		By("the NodeUpdate runs")
		w.setNodeUpdateStatus(m.Name, running("KubernetesUpgrade"))
		resp := call(req)
		Expect(resp.Status).To(Equal(runtimehooksv1.ResponseStatusSuccess))
		Expect(resp.RetryAfterSeconds).To(Equal(int32(15)))
		Expect(resp.Message).To(Equal(fmt.Sprintf("node %s: step KubernetesUpgrade (2/3) of NodeUpdate %s", fixtures.NodeName(w.ns, m.Name), nu.Name)))

		By("the NodeUpdate succeeds")
		w.setNodeUpdateStatus(m.Name, func(s *inplacev1.NodeUpdateStatus) {
			s.Phase = inplacev1.NodeUpdatePhaseSucceeded
			s.CurrentStep = ""
		})
		resp = call(req)
		Expect(resp.Status).To(Equal(runtimehooksv1.ResponseStatusSuccess))
		Expect(resp.RetryAfterSeconds).To(BeZero())
		Expect(resp.Message).To(ContainSubstring("upgraded in place to " + toVersion))
		Eventually(func() map[string]string {
			got := &clusterv1.Machine{}
			Expect(k8s.Get(ctx, client.ObjectKeyFromObject(m), got)).To(Succeed())
			return got.Annotations
		}).WithPolling(100 * time.Millisecond).Should(HaveKeyWithValue(inplacev1.UpgradeReleaseAnnotation, toVersion))

		By("the next machine Cluster API hands over joins the same task")
		m2 := setDesiredVersion(w.workers[2], toVersion)
		Expect(call(updateMachineRequest(m2, nil)).RetryAfterSeconds).To(BeNumerically(">", 0))
		Eventually(func() int { return len(w.nodeUpdatesOf(m2.Name)) }).WithPolling(100 * time.Millisecond).Should(Equal(1))
		Expect(w.tasks()).To(HaveLen(1))
		Expect(w.tasks()[0].Spec.Machines).To(Equal([]string{m.Name, m2.Name}))
	})

	It("answers Failure with the node's own error when its NodeUpdate failed, every time it is asked", func() {
		m := setDesiredVersion(w.cps[0], toVersion)
		req := updateMachineRequest(m, nil)
		Expect(call(req).Status).To(Equal(runtimehooksv1.ResponseStatusSuccess))
		Eventually(func() int { return len(w.nodeUpdatesOf(m.Name)) }).WithPolling(100 * time.Millisecond).Should(Equal(1))
		Expect(w.tasks()[0].Spec.ControlPlaneRef).NotTo(BeNil())
		Expect(w.tasks()[0].Spec.MaxUnavailable).To(Equal(ptr.To(intstr.FromInt32(1))), "a control plane goes one node at a time")
		w.setNodeUpdateStatus(m.Name, running("KubernetesUpgrade"))
		w.setNodeUpdateStatus(m.Name, func(s *inplacev1.NodeUpdateStatus) {
			s.Phase = inplacev1.NodeUpdatePhaseFailed
			s.FailureReason = "PlanJobFailed"
			s.FailureMessage = "job apply-capi-inplace-rke2 on node cp-1 failed: BackoffLimitExceeded"
		})
		nu := w.nodeUpdatesOf(m.Name)[0]
		want := fmt.Sprintf("in-place upgrade of node %s to %s failed at step KubernetesUpgrade (PlanJobFailed): job apply-capi-inplace-rke2 on node cp-1 failed: BackoffLimitExceeded; see NodeUpdate %s/%s. Delete that NodeUpdate to try again",
			fixtures.NodeName(w.ns, m.Name), toVersion, w.ns, nu.Name)
		for range 5 {
			resp := call(req)
			Expect(resp.Status).To(Equal(runtimehooksv1.ResponseStatusFailure))
			Expect(resp.Message).To(Equal(want))
		}
		Expect(w.nodeUpdatesOf(m.Name)).To(HaveLen(1))
	})

	It("answers Failure naming the blocking pods when drainPolicy Skip put its node back: Cluster API picks the machines, so capi-inplace does not go on with others", func() {
		m := setDesiredVersion(w.cps[0], toVersion)
		req := updateMachineRequest(m, nil)
		Expect(call(req).Status).To(Equal(runtimehooksv1.ResponseStatusSuccess))
		Eventually(func() int { return len(w.nodeUpdatesOf(m.Name)) }).WithPolling(100 * time.Millisecond).Should(Equal(1))
		w.setNodeUpdateStatus(m.Name, running("KubernetesUpgrade"))
		const blocked = "drainPolicy Skip: the drain of node cp-1 was blocked for more than 10m0s by pod default/web (PodDisruptionBudget web); the node is put back"
		w.setNodeUpdateStatus(m.Name, func(s *inplacev1.NodeUpdateStatus) {
			s.Phase = inplacev1.NodeUpdatePhaseSkipped
			s.FailureReason = inplacev1.NodeSkippedReason
			s.FailureMessage = blocked
		})
		nu := w.nodeUpdatesOf(m.Name)[0]
		for range 3 {
			resp := call(req)
			Expect(resp.Status).To(Equal(runtimehooksv1.ResponseStatusFailure))
			Expect(resp.Message).To(And(ContainSubstring("was skipped (NodeSkipped, drainPolicy Skip): "+blocked),
				ContainSubstring(fmt.Sprintf("see NodeUpdate %s/%s", w.ns, nu.Name)), ContainSubstring("delete that NodeUpdate to try again")))
		}
		Expect(w.nodeUpdatesOf(m.Name)).To(HaveLen(1), "no second NodeUpdate: Cluster API decides what next")
	})

	It("answers retry with the preflight check that holds the node, and starts it once the check passes", func() {
		w.controlPlaneRuns(toVersion)
		m := setDesiredVersion(w.workers[0], toVersion)
		node := fixtures.NodeName(w.ns, m.Name)
		Expect(fixtures.SetNodeReady(ctx, k8s, node, false)).To(Succeed())
		req := updateMachineRequest(m, nil)
		Eventually(func() string {
			resp := call(req)
			Expect(resp.Status).To(Equal(runtimehooksv1.ResponseStatusSuccess))
			Expect(resp.RetryAfterSeconds).To(Equal(int32(10)))
			return resp.Message
		}).WithPolling(200 * time.Millisecond).Should(And(HavePrefix("waiting in UpgradeTask "), ContainSubstring("node "+node+" is not Ready")))
		Consistently(func() int { return len(w.nodeUpdatesOf(m.Name)) }, time.Second, 100*time.Millisecond).Should(BeZero())

		Expect(fixtures.SetNodeReady(ctx, k8s, node, true)).To(Succeed())
		Eventually(func() int { return len(w.nodeUpdatesOf(m.Name)) }).WithPolling(100 * time.Millisecond).Should(Equal(1))
		resp := call(req)
		Expect(resp.RetryAfterSeconds).To(Equal(int32(15)))
		Expect(resp.Message).To(ContainSubstring("is starting"))
	})

	It("answers Failure with a clear message, and creates nothing, for a request it cannot carry out", func() {
		setDesiredVersion(w.workers[0], w.workers[0].Spec.Version)
		before := snapshot(w.ns)
		ghost := w.workers[0].DeepCopy()
		ghost.Name = "ghost"
		other := w.workers[0].DeepCopy()
		other.Spec.ClusterName = "other"
		downgrade := w.workers[0].DeepCopy()
		downgrade.Spec.Version = "v1.32.9+rke2r1"
		noVersion := w.workers[0].DeepCopy()
		noVersion.Spec.Version = ""
		wrongKind := updateMachineRequest(w.workers[0], nil)
		wrongKind.Kind = "CanUpdateMachineRequest"
		badSetting := updateMachineRequest(w.workers[0], map[string]string{extension.DefaultUpdaterSetting: "ConfigMap/"})

		cases := map[string]struct {
			req  *runtimehooksv1.UpdateMachineRequest
			want string
		}{
			"an unknown machine":           {updateMachineRequest(ghost, nil), "Machine " + w.ns + "/ghost not found"},
			"a machine of another cluster": {updateMachineRequest(other, nil), "Machine " + w.ns + "/workers-1 belongs to Cluster harvester, not to Cluster other named in the request"},
			"a downgrade":                  {updateMachineRequest(downgrade, nil), "capi-inplace declines to update Machine " + w.ns + "/workers-1 in place (Downgrade): version v1.32.9+rke2r1 is older than v1.33.3+rke2r1, which machine workers-1 already runs: in-place downgrades are not supported"},
			"no version":                   {updateMachineRequest(noVersion, nil), "Machine " + w.ns + "/workers-1: desired.machine.spec.version is empty"},
			"another hook's body":          {wrongKind, "the request body is a hooks.runtime.cluster.x-k8s.io/v1alpha1 CanUpdateMachineRequest, but this hook takes"},
			"a malformed setting":          {badSetting, `the ExtensionConfig's settings.defaultUpdater: updater reference "ConfigMap/"`},
			"no machine at all":            {&runtimehooksv1.UpdateMachineRequest{}, "the request's desired.machine has no namespace or name"},
		}
		for name, c := range cases {
			resp := call(c.req)
			Expect(resp.Status).To(Equal(runtimehooksv1.ResponseStatusFailure), name)
			Expect(resp.Message).To(HavePrefix(c.want), name)
			Expect(resp.RetryAfterSeconds).To(BeZero(), name)
		}

		By("a cluster without an updater")
		w2 := newWorld(nil)
		m := setDesiredVersion(w2.workers[0], toVersion)
		resp := call(updateMachineRequest(m, nil))
		Expect(resp.Status).To(Equal(runtimehooksv1.ResponseStatusFailure))
		Expect(resp.Message).To(HavePrefix(fmt.Sprintf("capi-inplace declines to update Machine %s/workers-1 in place (NoUpdater): no updater configured for Cluster %s/harvester", w2.ns, w2.ns)))
		Expect(w2.tasks()).To(BeEmpty())
		Expect(snapshot(w.ns)).To(Equal(before))
		Expect(strings.Count(fmt.Sprint(before), "UpgradeTaskList")).To(BeZero())
	})
})

// runningNodeUpdate creates, as the task controller would, the NodeUpdate of task for
// machine, in progress.
func (w *world) runningNodeUpdate(task, machine string) *inplacev1.NodeUpdate {
	GinkgoHelper()
	nu := &inplacev1.NodeUpdate{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: w.ns, Name: upgraderequest.NodeUpdateName(task, machine),
			Labels: map[string]string{inplacev1.UpgradeTaskLabel: upgraderequest.LabelValue(task), inplacev1.ClusterNameLabel: "harvester"},
		},
		Spec: inplacev1.NodeUpdateSpec{
			ClusterName: "harvester", MachineName: machine, NodeName: fixtures.NodeName(w.ns, machine), Version: toVersion,
			UpdaterRef: inplacev1.UpdaterReference{Kind: "ConfigMap", Name: "upgrader"}, Phase: inplacev1.TaskActionOngoing,
		},
	}
	Expect(k8s.Create(ctx, nu)).To(Succeed())
	w.setNodeUpdateStatus(machine, running("KubernetesUpgrade"))
	return nu
}

// The guards of UpdateMachine, without the task controller: what the hook itself decides.
var _ = Describe("UpdateMachine guards", func() {
	var (
		w     *world
		hooks *extension.InPlaceHooks
	)
	BeforeEach(func() {
		w = newWorld(map[string]string{inplacev1.UpdaterAnnotation: updaterAnnotation})
		hooks = newInPlaceHooks("")
	})

	call := func(req *runtimehooksv1.UpdateMachineRequest) *runtimehooksv1.UpdateMachineResponse {
		resp := &runtimehooksv1.UpdateMachineResponse{}
		hooks.UpdateMachine(ctx, req, resp)
		return viaWire(resp)
	}

	It("answers Failure and changes nothing for a machine Cluster API has not marked for an in-place update", func() {
		w.controlPlaneRuns(toVersion)
		want := fmt.Sprintf("Machine %s/workers-1 is not marked for an in-place update by Cluster API: it needs the annotation in-place-updates.internal.cluster.x-k8s.io/update-in-progress and UpdateMachine in its runtime.cluster.x-k8s.io/pending-hooks annotation, which Cluster API sets before it calls this hook; capi-inplace changed nothing", w.ns)
		for name, marks := range map[string]map[string]string{
			"no marks":                     {},
			"update-in-progress only":      {clusterv1.UpdateInProgressAnnotation: ""},
			"UpdateMachine not pending":    {clusterv1.UpdateInProgressAnnotation: "", runtimev1.PendingHooksAnnotation: "AfterClusterUpgrade"},
			"pending without the progress": {runtimev1.PendingHooksAnnotation: "UpdateMachine"},
		} {
			m := editMachine(w.workers[0], func(m *clusterv1.Machine) {
				delete(m.Annotations, clusterv1.UpdateInProgressAnnotation)
				delete(m.Annotations, runtimev1.PendingHooksAnnotation)
				for k, v := range marks {
					m.Annotations[k] = v
				}
				m.Spec.Version = toVersion
			})
			before := snapshot(w.ns)
			resp := call(updateMachineRequest(m, nil))
			Expect(resp.Status).To(Equal(runtimehooksv1.ResponseStatusFailure), name)
			Expect(resp.Message).To(Equal(want), name)
			Expect(snapshot(w.ns)).To(Equal(before), name)
		}
		Expect(w.tasks()).To(BeEmpty())

		By("a pending-hooks list that names UpdateMachine among others is a mark")
		m := setDesiredVersion(w.workers[0], toVersion)
		editMachine(m, func(m *clusterv1.Machine) {
			m.Annotations[runtimev1.PendingHooksAnnotation] = "AfterClusterUpgrade,UpdateMachine"
		})
		resp := call(updateMachineRequest(m, nil))
		Expect(resp.Status).To(Equal(runtimehooksv1.ResponseStatusSuccess), resp.Message)
	})

	// Cluster API marks a Machine and calls UpdateMachine at once: the manager's cache
	// may not have seen the mark yet (test/e2e saw "not marked" under load).
	It("reads a Machine its cache shows unmarked again from the API server before refusing it", func() {
		w.controlPlaneRuns(toVersion)
		stale := &clusterv1.Machine{}
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(w.workers[0]), stale)).To(Succeed())
		m := setDesiredVersion(w.workers[0], toVersion)
		lagging := &staleMachines{Client: k8s, machines: map[client.ObjectKey]*clusterv1.Machine{client.ObjectKeyFromObject(stale): stale}}

		By("with only the lagging cache, the call is refused")
		cacheOnly := newInPlaceHooks("")
		cacheOnly.Client = lagging
		resp := &runtimehooksv1.UpdateMachineResponse{}
		cacheOnly.UpdateMachine(ctx, updateMachineRequest(m, nil), resp)
		Expect(resp.Status).To(Equal(runtimehooksv1.ResponseStatusFailure))
		Expect(resp.Message).To(ContainSubstring("is not marked for an in-place update"))
		Expect(w.tasks()).To(BeEmpty())

		By("with the API server behind it, the mark is seen and the machine handed over")
		withReader := newInPlaceHooks("")
		withReader.Client, withReader.Reader = lagging, k8s
		resp = &runtimehooksv1.UpdateMachineResponse{}
		withReader.UpdateMachine(ctx, updateMachineRequest(m, nil), resp)
		Expect(resp.Status).To(Equal(runtimehooksv1.ResponseStatusSuccess), resp.Message)
		Expect(w.tasks()).To(HaveLen(1))
	})

	It("answers done, and creates no task, for a machine already at the target", func() {
		By("its release annotation says so")
		m := setDesiredVersion(w.workers[0], toVersion)
		m = editMachine(m, func(m *clusterv1.Machine) { m.Annotations[inplacev1.UpgradeReleaseAnnotation] = toVersion })
		before := snapshot(w.ns)
		for range 3 {
			resp := call(updateMachineRequest(m, nil))
			Expect(resp.Status).To(Equal(runtimehooksv1.ResponseStatusSuccess), resp.Message)
			Expect(resp.RetryAfterSeconds).To(BeZero(), resp.Message)
			Expect(resp.Message).To(Equal(fmt.Sprintf("Machine %s/workers-1 already runs %s: nothing to update in place", w.ns, toVersion)))
		}
		Expect(snapshot(w.ns)).To(Equal(before))

		By("its kubelet says so, and the updater does not judge otherwise")
		m2 := setDesiredVersion(w.workers[1], toVersion)
		m2.Status.NodeInfo = &corev1.NodeSystemInfo{KubeletVersion: toVersion}
		Expect(k8s.Status().Update(ctx, m2)).To(Succeed())
		Eventually(func() *corev1.NodeSystemInfo {
			got := &clusterv1.Machine{}
			Expect(k8s.Get(ctx, client.ObjectKeyFromObject(m2), got)).To(Succeed())
			return got.Status.NodeInfo
		}).ShouldNot(BeNil())
		resp := call(updateMachineRequest(m2, nil))
		Expect(resp.Status).To(Equal(runtimehooksv1.ResponseStatusSuccess), resp.Message)
		Expect(resp.RetryAfterSeconds).To(BeZero(), resp.Message)
		Expect(w.tasks()).To(BeEmpty())
	})

	It("declines workers newer than the control plane (VersionSkew) and creates nothing", func() {
		m := setDesiredVersion(w.workers[0], toVersion)
		before := snapshot(w.ns)
		resp := call(updateMachineRequest(m, nil))
		Expect(resp.Status).To(Equal(runtimehooksv1.ResponseStatusFailure))
		Expect(resp.Message).To(HavePrefix(fmt.Sprintf("capi-inplace declines to update Machine %s/workers-1 in place (VersionSkew): version %s is newer than %s, which control plane machine cp-1", w.ns, toVersion, fromVersion)))
		Expect(snapshot(w.ns)).To(Equal(before))
	})

	It("hands a machine to one task per version: a live task it was handed to answers, a completed one is not replaced", func() {
		w.controlPlaneRuns(toVersion)
		m := setDesiredVersion(w.workers[0], toVersion)
		resp := call(updateMachineRequest(m, nil))
		Expect(resp.Status).To(Equal(runtimehooksv1.ResponseStatusSuccess), resp.Message)
		tasks := w.tasks()
		Expect(tasks).To(HaveLen(1))
		first := tasks[0]
		Expect(first.Spec.Machines).To(Equal([]string{"workers-1"}))

		By("the ExtensionConfig's settings change while the machine waits in its task")
		resp = call(updateMachineRequest(m, map[string]string{extension.DefaultUpdaterSetting: "ConfigMap/upgrader"}))
		Expect(resp.Status).To(Equal(runtimehooksv1.ResponseStatusSuccess), resp.Message)
		Expect(resp.RetryAfterSeconds).To(BeNumerically(">", 0))
		Expect(resp.Message).To(ContainSubstring("UpgradeTask " + first.Name))
		Expect(w.tasks()).To(HaveLen(1), "the machine is not handed to a second task")

		By("its task completed without upgrading it")
		first.Status.Phase = inplacev1.TaskPhaseCompleted
		Expect(k8s.Status().Update(ctx, &first)).To(Succeed())
		Eventually(func() inplacev1.TaskPhase {
			got := &inplacev1.UpgradeTask{}
			Expect(k8s.Get(ctx, client.ObjectKeyFromObject(&first), got)).To(Succeed())
			return got.Status.Phase
		}).Should(Equal(inplacev1.TaskPhaseCompleted))
		before := snapshot(w.ns)
		for range 3 {
			resp = call(updateMachineRequest(m, nil))
			Expect(resp.Status).To(Equal(runtimehooksv1.ResponseStatusFailure), resp.Message)
			Expect(resp.Message).To(Equal(fmt.Sprintf("UpgradeTask %s/%s completed without upgrading Machine workers-1, whose node does not run %s yet: capi-inplace does not hand a machine to a second task for the same version. See the task's status; delete the task to hand the machine over again", w.ns, first.Name, toVersion)))
		}
		Expect(snapshot(w.ns)).To(Equal(before))
	})

	It("waits, without aborting it, for a running node of an annotation's or ExternalUpgradeRequest's task, and hands the machine over once none runs", func() {
		w.controlPlaneRuns(toVersion)
		req := w.mdRequest(toVersion)
		req.MachinesRequiringUpgrade = []string{"workers-1"}
		accepted := w.call(req)
		Expect(accepted.Decision).To(Equal(hooksv1.DecisionAccept), accepted.Message)
		other := accepted.UpgradeTaskName
		nu := w.runningNodeUpdate(other, "workers-1")

		m := setDesiredVersion(w.workers[1], toVersion)
		before := snapshot(w.ns)
		for range 3 {
			resp := call(updateMachineRequest(m, nil))
			Expect(resp.Status).To(Equal(runtimehooksv1.ResponseStatusSuccess), resp.Message)
			Expect(resp.RetryAfterSeconds).To(BeNumerically(">", 0))
			Expect(resp.Message).To(Equal(fmt.Sprintf("waiting for UpgradeTask %s/%s (paced by capi-inplace: an in-place-upgrade-to annotation or an ExternalUpgradeRequest) to finish node %s (NodeUpdate %s): capi-inplace never aborts a node upgrade in progress; Machine workers-2 is handed over once none of that task's NodeUpdates runs",
				w.ns, other, fixtures.NodeName(w.ns, "workers-1"), nu.Name)))
		}
		Expect(snapshot(w.ns)).To(Equal(before), "nothing aborted, nothing created")

		By("the node finishes")
		w.setNodeUpdateStatus("workers-1", func(s *inplacev1.NodeUpdateStatus) { s.Phase = inplacev1.NodeUpdatePhaseSucceeded })
		resp := call(updateMachineRequest(m, nil))
		Expect(resp.Status).To(Equal(runtimehooksv1.ResponseStatusSuccess), resp.Message)
		Expect(resp.RetryAfterSeconds).To(BeNumerically(">", 0))
		phases := w.phases()
		Expect(phases).To(HaveLen(2))
		Expect(phases).To(HaveKeyWithValue(other, inplacev1.TaskActionAbort))
		for _, t := range w.tasks() {
			if t.Name != other {
				Expect(t.Spec.Pacing).To(Equal(inplacev1.PacingExternal))
				Expect(t.Spec.Machines).To(Equal([]string{"workers-2"}))
			}
		}
	})
})

// staleMachines is a cache that has not seen the latest writes of some Machines: Get
// returns the copies it holds for them; everything else goes to the API server.
type staleMachines struct {
	client.Client
	machines map[client.ObjectKey]*clusterv1.Machine
}

func (c *staleMachines) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if m, ok := obj.(*clusterv1.Machine); ok {
		if stale := c.machines[key]; stale != nil {
			stale.DeepCopyInto(m)
			return nil
		}
	}
	return c.Client.Get(ctx, key, obj, opts...)
}
