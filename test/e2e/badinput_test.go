package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	runtimecatalog "sigs.k8s.io/cluster-api/api/runtime/catalog"
	runtimehooksv1 "sigs.k8s.io/cluster-api/api/runtime/hooks/v1alpha1"

	hooksv1 "github.com/capi-inplace/capi-inplace/api/hooks/v1alpha1"
	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	harvesterv1 "github.com/capi-inplace/capi-inplace/harvesteradapter/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/test/capisim"
	"github.com/capi-inplace/capi-inplace/test/fixtures"
	"github.com/capi-inplace/capi-inplace/test/hookclient"
	"github.com/capi-inplace/capi-inplace/test/manager"
	"github.com/capi-inplace/capi-inplace/workloadcluster"
)

// The bad inputs of docs/bad-input.md, each sent to the manager process the way a caller
// would, with the exact answer it gets, and a check that nothing changed.
var _ = Describe("Bad input", Ordered, func() {
	var (
		capi, external *hookclient.Client
		ns             string
	)

	BeforeAll(func() {
		logFile := filepath.Join(workDir, "manager-badinput.log")
		proc, err := manager.Start(manager.Options{Binary: managerBin, Kubeconfig: kubeconfig, CertDir: certs.Dir, LogFile: logFile,
			ExtraArgs: []string{"--poll-interval=200ms"}})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { Expect(proc.Stop()).To(Succeed()) })
		if err := proc.WaitReady(time.Minute); err != nil {
			log, _ := os.ReadFile(logFile)
			Fail(fmt.Sprintf("%v\nmanager log:\n%s", err, log))
		}
		tlsConf := must(manager.ClientTLSConfig(certs.Dir))
		capi = hookclient.New(fmt.Sprintf("https://127.0.0.1:%d", proc.WebhookPort), tlsConf, capiCatalog())
		external = hookclient.New(fmt.Sprintf("https://127.0.0.1:%d", proc.ExternalHookPort), tlsConf, externalCatalog())

		// A cluster "kubeadm" with the JobUpdater annotation, a control plane of one and
		// two workers at v1.35.2; a cluster "plain" without an updater.
		ns, err = fixtures.Namespace(ctx, env.Client, "bad")
		Expect(err).NotTo(HaveOccurred())
		_, err = fixtures.Cluster(ctx, env.Client, ns, "kubeadm", "cp", map[string]string{inplacev1.UpdaterAnnotation: "JobUpdater/nodes"})
		Expect(err).NotTo(HaveOccurred())
		_, _, err = fixtures.ControlPlane(ctx, env.Client, ns, "kubeadm", "cp", "v1.35.2", 1, false)
		Expect(err).NotTo(HaveOccurred())
		_, _, err = fixtures.MachineDeployment(ctx, env.Client, ns, "kubeadm", "workers", "v1.35.2", 2)
		Expect(err).NotTo(HaveOccurred())
		_, err = fixtures.Cluster(ctx, env.Client, ns, "plain", "", nil)
		Expect(err).NotTo(HaveOccurred())
		_, _, err = fixtures.MachineDeployment(ctx, env.Client, ns, "plain", "plain-workers", "v1.35.2", 1)
		Expect(err).NotTo(HaveOccurred())
		Expect(env.Client.Create(ctx, &inplacev1.JobUpdater{
			ObjectMeta: metav1.ObjectMeta{Name: "nodes", Namespace: ns},
			Spec:       inplacev1.JobUpdaterSpec{Image: "registry.example/kubeadm-upgrader:v1", Namespace: "kube-system"},
		})).To(Succeed())
	})

	// state is every object a bad input must not change, by kind/name and resourceVersion.
	state := func() map[string]string {
		out := map[string]string{}
		for _, l := range []client.ObjectList{&clusterv1.ClusterList{}, &clusterv1.MachineList{}, &clusterv1.MachineDeploymentList{}, &inplacev1.UpgradeTaskList{}, &inplacev1.NodeUpdateList{}} {
			Expect(env.Client.List(ctx, l, client.InNamespace(ns))).To(Succeed())
			items, err := meta.ExtractList(l)
			Expect(err).NotTo(HaveOccurred())
			for _, item := range items {
				o := must(meta.Accessor(item))
				out[fmt.Sprintf("%T/%s", item, o.GetName())] = o.GetResourceVersion()
			}
		}
		return out
	}

	externalPath := runtimecatalog.GVHToPath(runtimecatalog.GroupVersionHook{Group: hooksv1.GroupVersion.Group, Version: hooksv1.GroupVersion.Version, Hook: "ExternalUpgradeRequest"}, "external-upgrade-request")
	upgradeRequest := func(cluster string, md, cp string, version string) *hooksv1.ExternalUpgradeRequestRequest {
		req := &hooksv1.ExternalUpgradeRequestRequest{NewMachineSpec: hooksv1.NewMachineSpec{Version: version}}
		if md != "" {
			req.MachineDeploymentRef = &inplacev1.MachineDeploymentReference{Name: md}
		}
		if cp != "" {
			req.ControlPlaneRef = &inplacev1.ControlPlaneReference{APIGroup: "controlplane.cluster.x-k8s.io", Kind: "KubeadmControlPlane", Name: cp}
		}
		req.Cluster.Name, req.Cluster.Namespace = cluster, ns
		return req
	}
	decline := func(req *hooksv1.ExternalUpgradeRequestRequest) (string, string) {
		GinkgoHelper()
		resp := &hooksv1.ExternalUpgradeRequestResponse{}
		Expect(external.Call(ctx, hooksv1.ExternalUpgradeRequest, "external-upgrade-request", req, resp)).To(Succeed())
		Expect(resp.Status).To(Equal(runtimehooksv1.ResponseStatusSuccess), resp.Message)
		Expect(resp.Decision).To(Equal(hooksv1.DecisionDecline), resp.Message)
		return resp.Reason, resp.Message
	}

	It("answers each malformed hook body with a Failure that names the problem", func() {
		before := state()
		var resp hooksv1.ExternalUpgradeRequestResponse
		Expect(external.Post(ctx, externalPath, []byte(`{"cluster": {"name": "kubeadm",`), &resp)).To(Succeed())
		Expect(resp.Status).To(Equal(runtimehooksv1.ResponseStatusFailure))
		Expect(resp.Message).To(Equal("error unmarshalling request: unexpected end of JSON input"))

		resp = hooksv1.ExternalUpgradeRequestResponse{}
		big := append([]byte(`{"cluster":{"name":"`), bytes.Repeat([]byte("a"), 20<<20)...)
		Expect(external.Post(ctx, externalPath, big, &resp)).To(Succeed())
		Expect(resp.Status).To(Equal(runtimehooksv1.ResponseStatusFailure))
		Expect(resp.Message).To(Equal("error reading request: http: request body too large"))

		resp = hooksv1.ExternalUpgradeRequestResponse{}
		Expect(external.Post(ctx, externalPath, []byte(`{"apiVersion":"hooks.runtime.cluster.x-k8s.io/v1alpha1","kind":"UpdateMachineRequest"}`), &resp)).To(Succeed())
		Expect(resp.Status).To(Equal(runtimehooksv1.ResponseStatusFailure))
		Expect(resp.Message).To(Equal("the request body is a hooks.runtime.cluster.x-k8s.io/v1alpha1 UpdateMachineRequest, but this hook takes a hooks.inplace.cluster.x-k8s.io/v1alpha1 ExternalUpgradeRequestRequest"))

		updatePath := runtimecatalog.GVHToPath(runtimecatalog.GroupVersionHook{Group: runtimehooksv1.GroupVersion.Group, Version: runtimehooksv1.GroupVersion.Version, Hook: "UpdateMachine"}, "update-machine")
		var um runtimehooksv1.UpdateMachineResponse
		Expect(capi.Post(ctx, updatePath, []byte(`{"apiVersion":"hooks.runtime.cluster.x-k8s.io/v1alpha1","kind":"CanUpdateMachineRequest","desired":{"machine":{"metadata":{"name":"workers-1","namespace":"`+ns+`"}}}}`), &um)).To(Succeed())
		Expect(um.Status).To(Equal(runtimehooksv1.ResponseStatusFailure))
		Expect(um.Message).To(Equal("the request body is a hooks.runtime.cluster.x-k8s.io/v1alpha1 CanUpdateMachineRequest, but this hook takes a hooks.runtime.cluster.x-k8s.io/v1alpha1 UpdateMachineRequest"))
		Expect(state()).To(Equal(before))
	})

	It("declines each request it must not carry out with the reason and what to do, and changes nothing", func() {
		before := state()
		cases := []struct {
			name, reason, message string
			req                   *hooksv1.ExternalUpgradeRequestRequest
		}{
			{"an unknown cluster", "ClusterNotFound", "Cluster " + ns + "/nope not found", upgradeRequest("nope", "workers", "", "v1.36.3")},
			{"a MachineDeployment of another cluster", "NotPartOfCluster", "MachineDeployment " + ns + "/plain-workers belongs to Cluster plain, not to Cluster kubeadm", upgradeRequest("kubeadm", "plain-workers", "", "v1.36.3")},
			{"a version that is not semver", "InvalidVersion", `version "1.36" is not a valid semantic version: give MAJOR.MINOR.PATCH with an optional v prefix, pre-release and build metadata, for example v1.33.3 or v1.33.3+rke2r1`, upgradeRequest("kubeadm", "workers", "", "1.36")},
			{"a downgrade", "Downgrade", "version v1.34.0 is older than v1.35.2, which machine workers-1 already runs: in-place downgrades are not supported", upgradeRequest("kubeadm", "workers", "", "v1.34.0")},
			{"a control plane skipping a minor version", "MinorVersionSkip", "control plane machine cp-1 runs v1.35.2; v1.37.0 would skip a minor version, which Kubernetes does not support for a control plane: upgrade to v1.36 first", upgradeRequest("kubeadm", "", "cp", "v1.37.0")},
			{"a cluster without an updater", "NoUpdater", "no updater configured for Cluster " + ns + "/plain: set the annotation inplace.cluster.x-k8s.io/updater: <Kind>/<name> on the Cluster (for example HarvesterUpgrader/default), pass updaterRef in the request, or start the manager with --default-updater", upgradeRequest("plain", "plain-workers", "", "v1.36.3")},
		}
		for _, c := range cases {
			reason, message := decline(c.req)
			Expect(reason).To(Equal(c.reason), c.name)
			Expect(message).To(Equal(c.message), c.name)
		}

		By("UpdateMachine for a machine of another cluster")
		call := func(ctx context.Context, req *runtimehooksv1.UpdateMachineRequest, resp *runtimehooksv1.UpdateMachineResponse) error {
			return capi.Call(ctx, runtimehooksv1.UpdateMachine, "update-machine", req, resp)
		}
		m := &clusterv1.Machine{}
		Expect(env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "workers-1"}, m)).To(Succeed())
		req := &runtimehooksv1.UpdateMachineRequest{Desired: runtimehooksv1.UpdateMachineRequestObjects{Machine: capisim.SpecOnly(m)}}
		req.Desired.Machine.Spec.ClusterName = "plain"
		resp := &runtimehooksv1.UpdateMachineResponse{}
		Expect(call(ctx, req, resp)).To(Succeed())
		Expect(resp.Status).To(Equal(runtimehooksv1.ResponseStatusFailure))
		Expect(resp.Message).To(Equal("Machine " + ns + "/workers-1 belongs to Cluster kubeadm, not to Cluster plain named in the request"))
		Expect(state()).To(Equal(before))
	})

	It("refuses a HarvesterUpgrader with a bad ISO URL or checksum at the API server, with the rule's message", func() {
		for _, c := range []struct {
			release harvesterv1.Release
			message string
		}{
			{harvesterv1.Release{Version: "v1.8.1", ISOURL: "ftp://releases.example/harvester.iso", ISOChecksum: strings.Repeat("a", 128)}, "release.isoURL must be an http:// or https:// URL"},
			{harvesterv1.Release{Version: "v1.8.1", ISOURL: "https://releases.example/harvester.iso", ISOChecksum: "abc123"}, "release.isoChecksum must be a SHA-512 checksum: 128 hexadecimal digits"},
			{harvesterv1.Release{Version: "v1.8.1", ISOURL: "https://releases.example/harvester.iso"}, "release.isoChecksum is required with release.isoURL: the repository refuses an ISO it cannot verify"},
		} {
			err := env.Client.Create(ctx, &harvesterv1.HarvesterUpgrader{
				ObjectMeta: metav1.ObjectMeta{Name: "bad", Namespace: ns},
				Spec:       harvesterv1.HarvesterUpgraderSpec{Release: c.release},
			})
			Expect(err).To(HaveOccurred())
			Expect(err.Error()).To(ContainSubstring(c.message))
		}
		Expect(env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "bad"}, &harvesterv1.HarvesterUpgrader{})).NotTo(Succeed())
	})

	It("holds a task, visibly, while the workload cluster's kubeconfig Secret is missing or invalid, and starts no node", func() {
		resp := &hooksv1.ExternalUpgradeRequestResponse{}
		// The control plane: workers are not asked past it (VersionSkew).
		Expect(external.Call(ctx, hooksv1.ExternalUpgradeRequest, "external-upgrade-request", upgradeRequest("kubeadm", "", "cp", "v1.36.3"), resp)).To(Succeed())
		Expect(resp.Decision).To(Equal(hooksv1.DecisionAccept), resp.Message)
		progressing := func() string {
			t := &inplacev1.UpgradeTask{}
			Expect(env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: resp.UpgradeTaskName}, t)).To(Succeed())
			if c := meta.FindStatusCondition(t.Status.Conditions, inplacev1.ProgressingCondition); c != nil {
				return c.Message
			}
			return ""
		}
		Eventually(progressing, 30*time.Second, 200*time.Millisecond).Should(Equal(fmt.Sprintf(
			"cannot reach the workload cluster of Cluster %s/kubeadm: kubeconfig Secret %s/kubeadm-kubeconfig of the workload cluster does not exist; no node is started until it is reachable", ns, ns)))

		Expect(env.Client.Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: workloadcluster.KubeconfigSecretName("kubeadm"), Namespace: ns},
			Data:       map[string][]byte{workloadcluster.KubeconfigSecretKey: []byte("this is not a kubeconfig")},
		})).To(Succeed())
		Eventually(progressing, 30*time.Second, 200*time.Millisecond).Should(HavePrefix(fmt.Sprintf(
			"cannot reach the workload cluster of Cluster %s/kubeadm: parse kubeconfig of Secret %s/kubeadm-kubeconfig: ", ns, ns)))
		Expect(progressing()).NotTo(ContainSubstring("this is not a kubeconfig"), "the Secret's content never appears")

		events := &eventsv1.EventList{}
		Expect(env.Client.List(ctx, events, client.InNamespace(ns))).To(Succeed())
		var notes []string
		for _, e := range events.Items {
			if e.Regarding.Name == resp.UpgradeTaskName && e.Type == corev1.EventTypeWarning {
				notes = append(notes, e.Note)
			}
		}
		Expect(notes).To(ContainElement(ContainSubstring("cannot reach the workload cluster")))
		nus := &inplacev1.NodeUpdateList{}
		Expect(env.Client.List(ctx, nus, client.InNamespace(ns))).To(Succeed())
		Expect(nus.Items).To(BeEmpty())
	})
})
