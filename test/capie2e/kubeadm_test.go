package capie2e

import (
	"slices"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/nodeprogram"
	"github.com/capi-inplace/capi-inplace/nodeupdater/kubeadmupdater"
	"github.com/capi-inplace/capi-inplace/test/capienv"
	"github.com/capi-inplace/capi-inplace/test/fixtures"
	"github.com/capi-inplace/capi-inplace/test/sim"
)

// kubeadmTarget is the version the KubeadmUpdater's cluster is bumped to; its fake
// binaries' checksums are in the KubeadmUpdater.
const kubeadmTarget = "v1.36.3"

// kubeadmCluster is a ClusterClass Cluster whose updater is a KubeadmUpdater (named on
// the Cluster, as docs/kubeadm.md says), its nodes played by sim.KubeadmNodes, which runs
// the node program's kubeadm subcommands on a fake root per node.
type kubeadmCluster struct {
	*workloadCluster
	hosts *sim.KubeadmNodes
}

// newKubeadmCluster creates the namespace, the ClusterClasses, the KubeadmUpdater
// (binaries from the simulator's URL, with their checksums) and the Cluster annotated
// with it; Cluster API provisions it while the spec goes on.
func newKubeadmCluster(prefix string, shape capienv.ClusterShape) *kubeadmCluster {
	GinkgoHelper()
	ns, err := fixtures.Namespace(ctx, env.Client, prefix)
	Expect(err).NotTo(HaveOccurred())
	Expect(capienv.CreateClasses(ctx, env.Client, ns)).To(Succeed())
	c := &kubeadmCluster{workloadCluster: &workloadCluster{ns: ns, name: prefix, shape: shape}}
	c.hosts, err = sim.RunKubeadmNodes(ctx, sim.KubeadmNodesOptions{
		// The Jobs are served by the test API server (capienv.JobsProxy says why).
		Jobs: env.Client, Namespace: "kube-system", NodeUpdateNamespace: ns,
		Management: env.Client, Scheme: env.Scheme, Nodes: nodes, Hold: hold, Logf: GinkgoWriter.Printf,
	})
	Expect(err).NotTo(HaveOccurred())
	Expect(env.Client.Create(ctx, &inplacev1.KubeadmUpdater{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "kubeadm"},
		Spec: inplacev1.KubeadmUpdaterSpec{Source: inplacev1.KubeadmBinarySource{URL: &inplacev1.KubeadmURLSource{
			Template: c.hosts.URLTemplate(), SHA256: sim.Checksums(kubeadmTarget),
		}}},
	})).To(Succeed())
	c.nus, err = sim.WatchNodeUpdates(ctx, watcher, ns)
	Expect(err).NotTo(HaveOccurred())
	c.machines, err = capienv.WatchMachines(ctx, watcher, ns)
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(func() {
		c.hosts.Stop()
		c.nus.Stop()
		c.machines.Stop()
	})
	_, err = capienv.CreateCluster(ctx, env.Client, ns, c.name, shape,
		map[string]string{inplacev1.UpdaterAnnotation: inplacev1.KubeadmUpdaterKind + "/kubeadm"})
	Expect(err).NotTo(HaveOccurred())
	return c
}

// upgradeWithKubeadm bumps the Cluster's version and asserts, over the whole run, that
// the KubeadmUpdater upgraded every machine in place with kubeadm's sequence, safely, and
// that Cluster API's view is true at the end.
func (c *kubeadmCluster) upgradeWithKubeadm() {
	GinkgoHelper()
	c.waitProvisioned()
	c.countRunning()
	proxy, err := capienv.ServeJobs(ctx, env.Client, env.Config, c.ns, c.name)
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(func() { Expect(proxy.Close(ctx)).To(Succeed()) })
	cordons, err := capienv.WatchCordons(ctx, env.Client, env.Scheme, c.ns, c.name)
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(cordons.Stop)

	// The download mirror refuses the first binary asked for: that node's fetch says "not
	// done yet" (exit 3) and its Job's next pod, after the Job controller's back-off,
	// fetches again on the same root.
	c.hosts.FailDownloads(1)
	start := time.Now()
	c.bump(kubeadmTarget)
	after := c.waitAt(kubeadmTarget, 8*time.Minute)
	GinkgoWriter.Printf("6 machines upgraded in place with the KubeadmUpdater in %s\n", time.Since(start))

	By("every machine kept, one NodeUpdate each, never more than one node of a kind down at once, every kubelet at the target")
	c.expectAllInPlace(after, kubeadmTarget)
	_, _, cpNodes, workerNodes := names(c.before)

	By("never more than one control plane node, or one worker (the MachineDeployment's maxUnavailable), cordoned at once; none at the end")
	Expect(cordons.MaxCordoned(cpNodes...)).To(BeNumerically("<=", 1), "control plane nodes cordoned at once")
	Expect(cordons.MaxCordoned(workerNodes...)).To(BeNumerically("<=", 1), "workers cordoned at once")
	Expect(cordons.MaxCordoned(append(slices.Clone(cpNodes), workerNodes...)...)).To(Equal(1),
		"the drain cordoned nodes, one at a time (else the figures above prove nothing)")
	Eventually(cordons.Cordoned).Should(BeEmpty(), "every node uncordoned")

	By("each NodeUpdate ran Fetch, Upgrade, Drain, Kubelet, Uncordon in this order, each succeeded")
	list := &inplacev1.NodeUpdateList{}
	Expect(env.Client.List(ctx, list, client.InNamespace(c.ns))).To(Succeed())
	Expect(list.Items).To(HaveLen(6))
	wantSteps := []string{kubeadmupdater.StepFetch, kubeadmupdater.StepUpgrade, kubeadmupdater.StepDrain, kubeadmupdater.StepKubelet, kubeadmupdater.StepUncordon}
	for _, nu := range list.Items {
		var steps []string
		var last time.Time
		for _, s := range nu.Status.Steps {
			steps = append(steps, s.Name)
			Expect(s.State).To(Equal(inplacev1.StepStateSucceeded), "%s step %s: %s", nu.Spec.NodeName, s.Name, s.Message)
			Expect(s.StartTime).NotTo(BeNil())
			Expect(s.StartTime.Time.Before(last)).To(BeFalse(), "%s step %s started before the step before it", nu.Spec.NodeName, s.Name)
			last = s.StartTime.Time
		}
		Expect(steps).To(Equal(wantSteps), nu.Spec.NodeName)
	}

	By("on each node the node program ran fetch, upgrade, kubelet once each to success, in order; the one fetch the mirror refused was run again by its Job")
	runs := c.hosts.Runs()
	byNode := map[string][]string{}
	var refused []sim.KubeadmRun
	for _, r := range runs {
		if r.Exit != 0 {
			refused = append(refused, r)
			continue
		}
		byNode[r.Node] = append(byNode[r.Node], r.Args[1])
	}
	for _, n := range append(slices.Clone(cpNodes), workerNodes...) {
		Expect(byNode).To(HaveKeyWithValue(n, []string{"fetch", "upgrade", "kubelet"}), n)
	}
	Expect(refused).To(HaveLen(1), "runs that did not succeed: %+v", refused)
	first := refused[0]
	Expect(first.Exit).To(Equal(nodeprogram.ExitRetry), first.Message)
	Expect(first.Args[1]).To(Equal("fetch"))
	Expect(first.Attempt).To(Equal(1))
	Expect(first.Message).To(And(ContainSubstring("not done yet: download kubeadm from"), ContainSubstring("503 Service Unavailable")))
	again := slices.IndexFunc(runs, func(r sim.KubeadmRun) bool { return r.Job == first.Job && r.Attempt == 2 })
	Expect(again).NotTo(Equal(-1), "the Job of %s's refused fetch ran a second pod", first.Node)
	Expect(runs[again].Exit).To(Equal(0), runs[again].Message)
	Expect(runs[again].Start.After(first.End)).To(BeTrue(), "the second pod started after the first ended")

	By("control plane before workers: every worker's first Job started after the last control plane node's last Job ended")
	var cpEnd, workerStart time.Time
	for _, r := range runs {
		if slices.Contains(cpNodes, r.Node) && r.End.After(cpEnd) {
			cpEnd = r.End
		}
		if slices.Contains(workerNodes, r.Node) && (workerStart.IsZero() || r.Start.Before(workerStart)) {
			workerStart = r.Start
		}
	}
	Expect(workerStart.After(cpEnd)).To(BeTrue(), "first worker Job at %s, last control plane Job ended at %s", workerStart, cpEnd)

	By("kubeadm's own upgrade ran once per node: " + kubeadmUpgradeRule)
	upgrades := c.hosts.KubeadmUpgrades(c.ns, c.name)
	GinkgoWriter.Printf("kubeadm upgrade per node: %v\n", upgrades)
	expectKubeadmUpgrades(upgrades, cpNodes, workerNodes)

	By("Cluster API's view: every Machine UpToDate, KubeadmControlPlane and MachineDeployment at the version and rolling out nothing")
	Eventually(func(g Gomega) {
		machines, err := capienv.Machines(ctx, env.Client, c.ns, c.name)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(machines).To(HaveLen(6))
		for _, m := range machines {
			g.Expect(m.Spec.Version).To(Equal(kubeadmTarget), m.Name)
			up := condition(m.Status.Conditions, clusterv1.MachineUpToDateCondition)
			g.Expect(up).NotTo(BeNil(), m.Name)
			g.Expect(up.Status).To(Equal(metav1.ConditionTrue), "%s: %s", m.Name, up.Message)
		}
		kcps := &controlplanev1.KubeadmControlPlaneList{}
		g.Expect(env.Client.List(ctx, kcps, client.InNamespace(c.ns))).To(Succeed())
		g.Expect(kcps.Items).To(HaveLen(1))
		kcp := kcps.Items[0]
		g.Expect(kcp.Spec.Version).To(Equal(kubeadmTarget))
		var versions []string
		for _, v := range kcp.Status.Versions {
			versions = append(versions, v.Version)
		}
		g.Expect(versions).To(Equal([]string{kubeadmTarget}), "the versions KubeadmControlPlane's machines run")
		g.Expect(kcp.Status.UpToDateReplicas).To(HaveValue(Equal(int32(3))))
		rolling := condition(kcp.Status.Conditions, clusterv1.RollingOutCondition)
		g.Expect(rolling).NotTo(BeNil())
		g.Expect(rolling.Status).To(Equal(metav1.ConditionFalse), rolling.Message)
		mds := &clusterv1.MachineDeploymentList{}
		g.Expect(env.Client.List(ctx, mds, client.InNamespace(c.ns))).To(Succeed())
		g.Expect(mds.Items).To(HaveLen(1))
		md := mds.Items[0]
		g.Expect(md.Spec.Template.Spec.Version).To(Equal(kubeadmTarget))
		g.Expect(md.Status.UpToDateReplicas).To(HaveValue(Equal(int32(3))))
		rolling = condition(md.Status.Conditions, clusterv1.RollingOutCondition)
		g.Expect(rolling).NotTo(BeNil())
		g.Expect(rolling.Status).To(Equal(metav1.ConditionFalse), rolling.Message)
	}, 2*time.Minute, time.Second).Should(Succeed())
	Expect(c.machines.Deleted()).To(BeEmpty(), "no machine deleted, after the rollout either")
}

// kubeadmUpgradeRule is what kubeadm's upgrade is on a KubeadmControlPlane cluster.
// KubeadmControlPlane writes the target into the workload's ClusterConfiguration
// (kube-system/kubeadm-config, kubernetesVersion) before it updates or replaces any
// machine (sigs.k8s.io/cluster-api v1.14.2
// controlplane/kubeadm/reconcilers/kubeadmcontrolplane/update.go, updateControlPlane calls
// Workload.UpdateClusterConfiguration before rollingUpdate), and does the cluster-wide part
// of an upgrade itself (EnsureKubeadmPermissions there; CoreDNS and kube-proxy in its
// workload cluster code), as it does for a rolling replacement, where new machines join at
// the target. So when the first control plane node's Upgrade Job runs, the cluster is
// already at the target by the node program's rule (docs/kubeadm-node-program.md: apply
// only while the ClusterConfiguration is below it), and every node, the first included,
// runs `kubeadm upgrade node`, never `kubeadm upgrade apply`. The apply path is the one of
// clusters whose ClusterConfiguration nobody else moves; the node program's fake-host
// specs prove it.
const kubeadmUpgradeRule = "`kubeadm upgrade node` on every node, the first control plane node included; never `kubeadm upgrade apply` (KubeadmControlPlane moved the ClusterConfiguration to the target first)"

// expectKubeadmUpgrades asserts which `kubeadm upgrade` each node ran: once each, and
// `kubeadm upgrade node` everywhere (kubeadmUpgradeRule).
func expectKubeadmUpgrades(upgrades map[string][]string, cpNodes, workerNodes []string) {
	GinkgoHelper()
	for _, n := range append(slices.Clone(cpNodes), workerNodes...) {
		Expect(upgrades[n]).To(Equal([]string{"kubeadm upgrade node"}), "%s ran kubeadm upgrade node, once", n)
	}
	Expect(upgrades).To(HaveLen(len(cpNodes)+len(workerNodes)), "no other node ran kubeadm upgrade")
}
