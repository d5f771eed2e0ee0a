package harvesteradapter_test

import (
	"context"
	"fmt"
	"maps"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	sucv1 "github.com/rancher/system-upgrade-controller/pkg/apis/upgrade.cattle.io/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter"
	harvesterv1 "github.com/capi-inplace/capi-inplace/harvesteradapter/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/longhorn"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/repository"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/suc"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/upgradeplan"
	"github.com/capi-inplace/capi-inplace/nodeupdater"
	"github.com/capi-inplace/capi-inplace/test/sim"
	"github.com/capi-inplace/capi-inplace/test/testenv"
	"github.com/capi-inplace/capi-inplace/workloadcluster"
)

// release181 is the release metadata of Harvester v1.8.1, the release the specs install
// over v1.7.1 (fact 5; its upgrade matrix's minimum, fact 3).
var release181 = `harvester: v1.8.1
harvesterChart: 1.8.1
os: Harvester v1.8.1
kubernetes: v1.35.6+rke2r1
rancher: v2.14.2
# the KubeVirt the simulators take chart 1.8.1 to carry (sim.KubeVirtVersionOfChart)
kubevirt: v-harvester-1.8.1
# test values: the facts do not name the release's monitoring and logging charts
monitoringChart: 106.1.0+up66.0.0
loggingChart: 106.0.1+up4.10.1
` + sim.RancherDependenciesYAML("v2.14.2") + `minUpgradableVersion: v1.7.0
`

// harvesterCluster is a Harvester cluster on the workload API server, managed from the
// management API server through its kubeconfig Secret. Every test gets its own namespace
// and node names.
type harvesterCluster struct {
	ns, name   string
	nodes      []string
	rec        *sim.Record
	kubelet    *sim.Kubelet
	suc        *sim.SUC
	repository *sim.Repository
	longhorn   *sim.Longhorn
	updater    *harvesteradapter.Updater
	config     *harvesterv1.HarvesterUpgrader
	// plans is the UpgradePlan controller, running on the cluster's namespace, and plan
	// the cluster's UpgradePlan, created ahead of the nodes as an operator may.
	plans *upgradeplan.PlanReconciler
	plan  *harvesterv1.UpgradePlan
}

var clusterSeq int

func newHarvesterCluster(nodes int, osImage string, mutate func(*harvesterv1.HarvesterUpgrader), simOptions ...func(*sim.SUC)) *harvesterCluster {
	GinkgoHelper()
	return newHarvesterClusterOn(workload, nodes, osImage, mutate, simOptions...)
}

// newHarvesterClusterOn is newHarvesterCluster on the workload API server wl.
func newHarvesterClusterOn(wl *testenv.Environment, nodes int, osImage string, mutate func(*harvesterv1.HarvesterUpgrader), simOptions ...func(*sim.SUC)) *harvesterCluster {
	GinkgoHelper()
	return newClusterWith(wl, true, nodes, osImage, mutate, simOptions...)
}

// newClusterWith is newHarvesterClusterOn; with planByHand false no UpgradePlan is created
// ahead of the nodes (the first node's updater creates it, covering every node of wl).
func newClusterWith(wl *testenv.Environment, planByHand bool, nodes int, osImage string, mutate func(*harvesterv1.HarvesterUpgrader), simOptions ...func(*sim.SUC)) *harvesterCluster {
	GinkgoHelper()
	clusterSeq++
	c := &harvesterCluster{ns: fmt.Sprintf("hv-%d", clusterSeq), name: fmt.Sprintf("hv%d", clusterSeq), rec: sim.NewRecord()}
	Expect(env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: c.ns}})).To(Succeed())
	for _, ns := range []string{"cattle-system", repository.Namespace, longhorn.Namespace} {
		_ = wl.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	}
	_ = wl.Client.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "system-upgrade-controller", Namespace: "cattle-system"}})

	kubeconfig, err := wl.Kubeconfig()
	Expect(err).NotTo(HaveOccurred())
	Expect(env.Client.Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: workloadcluster.KubeconfigSecretName(c.name), Namespace: c.ns},
		Data:       map[string][]byte{workloadcluster.KubeconfigSecretKey: kubeconfig},
	})).To(Succeed())

	// The specs' clusters share one workload API server: each labels its nodes, and its
	// UpgradePlan, created ahead of the nodes as an operator may, covers those only
	// (spec.nodeSelector).
	c.kubelet = &sim.Kubelet{Client: wl.Client, Record: c.rec, OSImage: osImage, Labels: sim.HarvesterNodeLabels(map[string]string{labelTestCluster: c.name})}
	// The spec's nodes leave with it (after its simulators stop: cleanups run last
	// first): a node of an ended spec, down or up, would count in every later spec's
	// cluster-wide waits (the managed nodes Longhorn's upgrade waits for).
	DeferCleanup(func() {
		Expect(wl.Client.DeleteAllOf(ctx, &corev1.Node{}, client.MatchingLabels{labelTestCluster: c.name})).To(Succeed())
	})
	for i := 1; i <= nodes; i++ {
		name := fmt.Sprintf("%s-node-%d", c.name, i)
		_, err := c.kubelet.CreateNode(ctx, name, "v1.34.3+rke2r3", nil)
		Expect(err).NotTo(HaveOccurred())
		c.nodes = append(c.nodes, name)
	}

	runCtx, cancel := context.WithCancel(ctx)
	DeferCleanup(cancel)
	wlCache := simCache(wl)
	c.suc = &sim.SUC{Client: wl.Client, Cache: wlCache, Namespace: "cattle-system", Kubelet: c.kubelet, Record: c.rec, JobDuration: 100 * time.Millisecond}
	for _, o := range simOptions {
		o(c.suc) // before the simulator runs: it reads its settings without a lock
	}
	// The repository simulator: one an option gave the SUC simulator (which then asks it
	// whether the repository serves), completed here, or a plain one.
	c.repository, _ = c.suc.Repository.(*sim.Repository)
	if c.repository == nil {
		c.repository = &sim.Repository{}
	}
	c.repository.Client, c.repository.Cache, c.repository.Namespace, c.repository.Release = wl.Client, wlCache, repository.Namespace, release181
	if c.repository.NodeSelector == nil {
		c.repository.NodeSelector = map[string]string{labelTestCluster: c.name}
	}
	c.repository.Start(runCtx)
	go func() { _ = c.suc.Run(runCtx) }()
	c.longhorn = &sim.Longhorn{Client: wl.Client, Cache: wlCache, Namespace: longhorn.Namespace, StateDuration: 300 * time.Millisecond}
	go c.longhorn.Run(runCtx)

	c.config = &harvesterv1.HarvesterUpgrader{
		ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: c.ns},
		Spec:       harvesterv1.HarvesterUpgraderSpec{Release: harvesterv1.Release{Version: "v1.8.1", RepositoryURL: c.repository.URL()}},
	}
	if mutate != nil {
		mutate(c.config)
	}
	Expect(env.Client.Create(ctx, c.config)).To(Succeed(), "defaults and validation come from the real API server")

	c.updater = &harvesteradapter.Updater{
		Client:           env.Client,
		Workloads:        &workloadcluster.Clients{Reader: env.Client, Scheme: env.Scheme},
		Releases:         repository.HTTPReleaseReader{},
		RepositoryURL:    func(string) string { return c.repository.URL() },
		PollInterval:     20 * time.Millisecond,
		PlannerSettle:    500 * time.Millisecond,
		AgentSilentAfter: 2 * time.Second,
		NodeImage:        managerNodeImage,
		Version:          managerVersion,
	}
	c.plans = startPlans(c.ns, c.updater)
	if !planByHand {
		return c
	}
	c.createPlan(nil)
	return c
}

// createPlan creates the cluster's UpgradePlan for its HarvesterUpgrader's release,
// covering the cluster's nodes only, as an operator may ahead of the nodes; mutate, when
// set, changes its spec first.
func (c *harvesterCluster) createPlan(mutate func(*harvesterv1.UpgradePlanSpec)) {
	GinkgoHelper()
	c.plan = &harvesterv1.UpgradePlan{
		ObjectMeta: metav1.ObjectMeta{Name: upgradeplan.Name(c.name, c.config.Spec.Release.Version), Namespace: c.ns},
		Spec: harvesterv1.UpgradePlanSpec{
			ClusterName: c.name, UpgraderName: c.config.Name, Version: c.config.Spec.Release.Version,
			ImagePreload: c.config.Spec.ImagePreload,
			NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{labelTestCluster: c.name}},
		},
	}
	if mutate != nil {
		mutate(&c.plan.Spec)
	}
	Expect(env.Client.Create(ctx, c.plan)).To(Succeed())
}

// labelTestCluster names, on a node of the shared workload API server, the spec's
// cluster it belongs to.
const labelTestCluster = "test.capi-inplace.io/cluster"

// The manager these specs play: its version and its own node image (main.go's
// --harvester-node-image default).
const (
	managerVersion   = "v0.4.0"
	managerNodeImage = "ghcr.io/capi-inplace/capi-inplace:" + managerVersion
)

func (c *harvesterCluster) nodeUpdate(node string) *inplacev1.NodeUpdate {
	GinkgoHelper()
	return c.nodeUpdateTo(node, "v1.35.6+rke2r1")
}

// nodeUpdateTo creates the NodeUpdate of node to the RKE2 version.
func (c *harvesterCluster) nodeUpdateTo(node, version string) *inplacev1.NodeUpdate {
	GinkgoHelper()
	nu := &inplacev1.NodeUpdate{
		ObjectMeta: metav1.ObjectMeta{Name: "nu-" + node, Namespace: c.ns},
		Spec: inplacev1.NodeUpdateSpec{
			ClusterName: c.name, MachineName: "m-" + node, NodeName: node, Version: version,
			UpdaterRef: inplacev1.UpdaterReference{Kind: "HarvesterUpgrader", Name: c.config.Name},
		},
	}
	Expect(env.Client.Create(ctx, nu)).To(Succeed())
	return nu
}

// succeededAsReconciled sets a NodeUpdate that drive brought to its end Succeeded, as the
// NodeUpdate reconciler does once its updater says done: a spec that drives a next
// control plane node by hand needs it, since the Cluster's disruption ledger counts a
// NodeUpdate until it has ended.
func succeededAsReconciled(nu *inplacev1.NodeUpdate) {
	GinkgoHelper()
	Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(nu), nu)).To(Succeed())
	nu.Status.Phase = inplacev1.NodeUpdatePhaseSucceeded
	Expect(env.Client.Status().Update(ctx, nu)).To(Succeed())
}

// repositoryServices records, on the shared workload API server, every upgrade repository
// Service that exists now or is created until the spec ends, and returns how to read
// their names by UID (a Service deleted and created again counts twice).
func repositoryServices() func() map[types.UID]string {
	GinkgoHelper()
	wc, err := client.NewWithWatch(workload.Config, client.Options{Scheme: workload.Scheme})
	Expect(err).NotTo(HaveOccurred())
	var mu sync.Mutex
	seen := map[types.UID]string{}
	opts := []client.ListOption{client.InNamespace(repository.Namespace), client.HasLabels{repository.LabelRepository}}
	list := &corev1.ServiceList{}
	Expect(wc.List(ctx, list, opts...)).To(Succeed())
	for _, svc := range list.Items {
		seen[svc.UID] = svc.Name
	}
	// From the list's resource version: the watch sends what changes after it.
	w, err := wc.Watch(ctx, &corev1.ServiceList{}, append(opts, &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: list.ResourceVersion}})...)
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(w.Stop)
	go func() {
		for ev := range w.ResultChan() {
			if svc, ok := ev.Object.(*corev1.Service); ok && ev.Type == watch.Added {
				mu.Lock()
				seen[svc.UID] = svc.Name
				mu.Unlock()
			}
		}
	}()
	return func() map[types.UID]string {
		mu.Lock()
		defer mu.Unlock()
		return maps.Clone(seen)
	}
}

// drive calls the updater the way the NodeUpdate reconciler does (Reconcile, persist the
// status, again after RequeueAfter) until it is done or fails, and returns the error.
func drive(u *harvesteradapter.Updater, nu *inplacev1.NodeUpdate, limit time.Duration) error {
	GinkgoHelper()
	return driveUntil(u, nu, limit, nil)
}

// driveUntil is drive that also stops, with no error, as soon as until (when set) says
// so after a reconcile.
func driveUntil(u *harvesteradapter.Updater, nu *inplacev1.NodeUpdate, limit time.Duration, until func(*inplacev1.NodeUpdate) bool) error {
	GinkgoHelper()
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		res, err := u.Reconcile(ctx, nu)
		Expect(env.Client.Status().Update(ctx, nu)).To(Succeed())
		if err != nil {
			if _, permanent := nodeupdater.AsPermanent(err); permanent {
				return err
			}
			GinkgoWriter.Printf("retryable error: %v\n", err)
			time.Sleep(50 * time.Millisecond)
			continue
		}
		if res.Done || (until != nil && until(nu)) {
			return nil
		}
		time.Sleep(res.RequeueAfter)
	}
	return fmt.Errorf("not done within %s; steps %+v", limit, nu.Status.Steps)
}

func stepStates(nu *inplacev1.NodeUpdate) map[string]inplacev1.StepState {
	out := map[string]inplacev1.StepState{}
	for _, s := range nu.Status.Steps {
		out[s.Name] = s.State
	}
	return out
}

func ourPlans(c *harvesterCluster) []sucv1.Plan {
	plans := &sucv1.PlanList{}
	Expect(workload.Client.List(ctx, plans, client.InNamespace("cattle-system"), client.HasLabels{suc.LabelNodeUpdate})).To(Succeed())
	var out []sucv1.Plan
	for _, p := range plans.Items {
		for _, n := range c.nodes {
			if p.Annotations[suc.AnnotationNode] == n {
				out = append(out, p)
			}
		}
	}
	return out
}

var _ = Describe("The Harvester updater", func() {
	It("upgrades three nodes one after another through every step, and leaves no Plan behind", func() {
		c := newHarvesterCluster(3, "Harvester v1.7.1", nil)
		var results []*inplacev1.NodeUpdate
		for _, node := range c.nodes {
			nu := c.nodeUpdate(node)
			Expect(drive(c.updater, nu, 90*time.Second)).To(Succeed())
			results = append(results, nu)
		}
		for i, nu := range results {
			Expect(stepStates(nu)).To(Equal(map[string]inplacev1.StepState{
				harvesteradapter.StepClusterUpgrade: inplacev1.StepStateSucceeded,
				harvesteradapter.StepRepository:     inplacev1.StepStateSucceeded,
				harvesteradapter.StepImagePreload:   inplacev1.StepStateSkipped, // the UpgradePlan preloaded every node
				harvesteradapter.StepCordon:         inplacev1.StepStateSucceeded,
				harvesteradapter.StepEvacuateVMs:    inplacev1.StepStateSucceeded,
				harvesteradapter.StepDrain:          inplacev1.StepStateSucceeded,
				// No machine-plan Secret: Rancher does not provision these nodes, SUC
				// upgrades RKE2, no drain hook to wait for or answer, no guard.
				harvesteradapter.StepRancherPreDrain:    inplacev1.StepStateSkipped,
				harvesteradapter.StepRemoveRestartGuard: inplacev1.StepStateSkipped,
				harvesteradapter.StepRancherPostDrain:   inplacev1.StepStateSkipped,
				harvesteradapter.StepKubernetesUpgrade:  inplacev1.StepStateSucceeded,
				harvesteradapter.StepOSUpgrade:          inplacev1.StepStateSucceeded,
				harvesteradapter.StepLonghornDataEngine: inplacev1.StepStateSkipped,
				harvesteradapter.StepLonghornPause:      inplacev1.StepStateSkipped,
				harvesteradapter.StepRestoreVMs:         inplacev1.StepStateSucceeded,
				harvesteradapter.StepFinish:             inplacev1.StepStateSucceeded,
			}), "node %d", i+1)
			node := &corev1.Node{}
			Expect(workload.Client.Get(ctx, client.ObjectKey{Name: nu.Spec.NodeName}, node)).To(Succeed())
			Expect(node.Status.NodeInfo.KubeletVersion).To(Equal("v1.35.6+rke2r1"))
			Expect(node.Status.NodeInfo.OSImage).To(Equal("Harvester v1.8.1"))
			Expect(node.Spec.Unschedulable).To(BeFalse())
		}
		for _, kind := range []string{"drain", "rke2", "os"} {
			for _, nu := range results {
				node := nu.Spec.NodeName
				Expect(c.rec.RunsOf(harvesteradapter.PlanName(kind, nu))).To(Equal(map[string]int{node: 1}), "plan %s ran once, on its node only", kind)
			}
		}
		Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(c.plan), c.plan)).To(Succeed())
		preload := upgradeplan.ObjectName("preload", c.plan)
		Expect(c.rec.RunsOf(preload)).To(Equal(map[string]int{c.nodes[0]: 1, c.nodes[1]: 1, c.nodes[2]: 1}), "one preload of every node, by the UpgradePlan")
		Expect(c.rec.MaxDown()).To(Equal(1), "one node down at a time")
		Expect(ourPlans(c)).To(BeEmpty(), "every node's Plans are deleted at the end")
	})

	It("fails the Kubernetes step with the SUC Job's reason when the RKE2 upgrade fails on a node", func() {
		c := newHarvesterCluster(2, "Harvester v1.7.1", nil)
		node := c.nodes[0]
		nu := c.nodeUpdate(node)
		c.suc.FailNode(harvesteradapter.PlanName("rke2", nu), node, "rke2 failed to start: etcd member not healthy")
		err := drive(c.updater, nu, 90*time.Second)
		Expect(err).To(HaveOccurred())
		perm, ok := nodeupdater.AsPermanent(err)
		Expect(ok).To(BeTrue())
		Expect(perm.Reason).To(Equal("PlanJobFailed"))
		step := nodeupdater.Step(nu, harvesteradapter.StepKubernetesUpgrade)
		Expect(step.State).To(Equal(inplacev1.StepStateFailed))
		Expect(step.Message).To(ContainSubstring("BackoffLimitExceeded: Job has reached the specified backoff limit"), "the Job controller's words")
		Expect(step.Message).To(MatchRegexp(`^rke2 failed to start: etcd member not healthy \(container upgrade of pod \S+ exited with code 1\); SUC job `), "the node's own words, from the failed pod, first")
		Expect(nodeupdater.StepState(nu, harvesteradapter.StepOSUpgrade)).To(Equal(inplacev1.StepStatePending), "nothing after the failed step runs")
		Expect(c.rec.RunsOf(harvesteradapter.PlanName("os", nu))).To(BeEmpty())
	})

	It("fails the Drain step with kubectl's own error, which only the failed pod's log holds", func() {
		addr, err := sim.NonLoopbackIPv4()
		Expect(err).NotTo(HaveOccurred())
		c := newHarvesterCluster(2, "Harvester v1.7.1", func(h *harvesterv1.HarvesterUpgrader) {
			h.Spec.PreloadImages = ptr.To(false)
			h.Spec.UpgradeOS = ptr.To(false)
			h.Spec.Drain.Timeout = ptr.To(intstr.FromInt32(30))
		}, func(s *sim.SUC) {
			s.DrainDuration = 5 * time.Minute // longer than kubectl's --timeout: the drain fails
			s.Kubelet.ServeAddress, s.Kubelet.Logs = addr, s.PodLog
		})
		DeferCleanup(c.kubelet.Close)
		node := c.nodes[0]
		Expect(c.kubelet.StartServing(ctx, node)).To(Succeed())
		nu := c.nodeUpdate(node)
		err = drive(c.updater, nu, 90*time.Second)
		perm, ok := nodeupdater.AsPermanent(err)
		Expect(ok).To(BeTrue(), "%v", err)
		Expect(perm.Reason).To(Equal("PlanJobFailed"))
		step := nodeupdater.Step(nu, harvesteradapter.StepDrain)
		Expect(step.State).To(Equal(inplacev1.StepStateFailed))
		Expect(step.Message).To(ContainSubstring("BackoffLimitExceeded: Job has reached the specified backoff limit"))
		Expect(step.Message).To(MatchRegexp(`^no termination message; its log ends: container upgrade: error: unable to drain node "%s" due to error: global timeout reached: 30s \(container upgrade of pod \S+ exited with code 1\); SUC job `, node))
	})

	It("holds a release the cluster's Harvester version cannot be upgraded to, before touching a node, until the plan is forced", func() {
		// A release whose upgrade matrix starts above the hop's first patch, as v1.5.x
		// started at v1.4.2 (fact 3): v1.7.0 -> v1.8.1 is a supported hop, but this release
		// installs only over v1.7.1.
		c := newClusterWith(workload, false, 2, "Harvester v1.7.0", func(h *harvesterv1.HarvesterUpgrader) { h.Spec.UpgradeOS = ptr.To(false) })
		c.repository.Release = strings.Replace(release181, "minUpgradableVersion: v1.7.0", "minUpgradableVersion: v1.7.1", 1)
		c.createPlan(nil)
		nu := c.nodeUpdate(c.nodes[0])
		Expect(driveUntil(c.updater, nu, 90*time.Second, heldWith("installs only over v1.7.1 or newer"))).To(Succeed())
		err := drive(c.updater, nu, 2*time.Second)
		Expect(err).To(MatchError(ContainSubstring("not done within")), "held, not failed")
		step := nodeupdater.Step(nu, harvesteradapter.StepClusterUpgrade)
		Expect(step.State).To(Equal(inplacev1.StepStateRunning))
		Expect(step.Message).To(ContainSubstring("the node runs Harvester v1.7.0, but Harvester v1.8.1 installs only over v1.7.1 or newer: upgrade to v1.7.1 first"))
		Expect(runsOn(c.rec, c.nodes[0])).To(BeEmpty(), "no Plan ran on the node")
		Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(c.plan), c.plan)).To(Succeed())
		Expect(c.plan.Status.Phase).To(Equal(harvesterv1.UpgradePlanMetadataPopulating))
		Expect(meta.IsStatusConditionTrue(c.plan.Status.Conditions, harvesterv1.UpgradePlanDegraded)).To(BeTrue())

		// spec.force skips the eligibility check, as the toolkit's force skips its version guard.
		c.plan.Spec.Force = true
		Expect(env.Client.Update(ctx, c.plan)).To(Succeed())
		Expect(drive(c.updater, nu, 90*time.Second)).To(Succeed())
	})

	It("deploys one repository for many nodes", func() {
		c := newHarvesterCluster(2, "Harvester v1.7.1", func(h *harvesterv1.HarvesterUpgrader) {
			h.Spec.Release = harvesterv1.Release{Version: "v1.8.1", ISOURL: "https://releases.example/harvester-v1.8.1-amd64.iso", ISOChecksum: fmt.Sprintf("%0128x", 1)}
			h.Spec.PreloadImages = ptr.To(false)
			h.Spec.UpgradeOS = ptr.To(false)
		})
		// Every repository Service that exists from now on, by UID: once both nodes ended,
		// the plan's clean-up may already have removed the one they shared (CI saw an
		// empty list after the second node), so what is asserted is what existed, not
		// what is left.
		services := repositoryServices()
		for _, node := range c.nodes {
			Expect(drive(c.updater, c.nodeUpdate(node), 90*time.Second)).To(Succeed())
		}
		seen := services()
		Expect(seen).To(HaveLen(1), "one repository Service for the release, shared by both nodes")
		Expect(c.repository.MetadataRequests()).To(BeNumerically(">=", 2), "each node checks the release's eligibility")
		for _, name := range seen {
			Expect(c.repository.Problem(name)).To(BeEmpty(), "the repository's pods run the node program as a real node would")
		}
	})

	It("keeps serving the release through a drain of the node its first pod ran on: each pod keeps its own copy, the others copy it from a peer (harvester#9597, longhorn#12226)", func() {
		// Repositories earlier specs left on the shared workload API server: this spec's
		// simulator plays every Deployment of the namespace, with its pods.
		for _, obj := range []client.Object{&appsv1.Deployment{}, &corev1.Pod{}} {
			Expect(workload.Client.DeleteAllOf(ctx, obj, client.InNamespace(repository.Namespace), client.HasLabels{repository.LabelRepository}, client.GracePeriodSeconds(0))).To(Succeed())
		}
		// A shared ReadWriteMany volume hangs attaching for good once its share-manager
		// is evicted (longhorn#12226, reproduced often in harvester#9597); the Jobs of the
		// nodes read the repository (SUC.Repository).
		repo := &sim.Repository{PlayPods: true, RWXAttachHangs: true, Delay: 300 * time.Millisecond}
		c := newHarvesterCluster(3, "Harvester v1.7.1", func(h *harvesterv1.HarvesterUpgrader) {
			h.Spec.Release = harvesterv1.Release{Version: "v1.8.1", ISOURL: "https://releases.example/harvester-v1.8.1-amd64.iso", ISOChecksum: fmt.Sprintf("%0128x", 1)}
			h.Spec.PreloadImages = ptr.To(false)
		}, func(s *sim.SUC) { s.Repository = repo; s.RepositoryPatience = 2 * time.Second })
		DeferCleanup(func() {
			for _, obj := range []client.Object{&appsv1.Deployment{}, &corev1.Pod{}} {
				Expect(workload.Client.DeleteAllOf(ctx, obj, client.InNamespace(repository.Namespace), client.HasLabels{repository.LabelRepository}, client.GracePeriodSeconds(0))).To(Succeed())
			}
			Expect(workload.Client.DeleteAllOf(ctx, &corev1.Pod{}, client.InNamespace(sim.ShareManagerNamespace), client.HasLabels{"longhorn.io/share-manager"}, client.GracePeriodSeconds(0))).To(Succeed())
		})

		// The first node's repository pod downloads; the node is the one the first pod
		// runs on (the simulated scheduler's first pick), so its drain takes that pod.
		first := c.nodeUpdate(c.nodes[0])
		Expect(drive(c.updater, first, 90*time.Second)).To(Succeed(), "the drained node's own OS Job reads the repository after the drain (harvester#9597: post-drain waited for it for good)")
		dep := &appsv1.Deployment{}
		Expect(workload.Client.Get(ctx, client.ObjectKey{Namespace: repository.Namespace, Name: repository.Name("v1.8.1")}, dep)).To(Succeed())
		Expect(dep.Spec.Replicas).To(HaveValue(BeEquivalentTo(repository.Replicas)), "scaled to one pod per node of the control plane once the first serves")
		Expect(workload.Client.Get(ctx, client.ObjectKey{Namespace: repository.Namespace, Name: repository.Name("v1.8.1")}, &corev1.PersistentVolumeClaim{})).
			To(Satisfy(apierrors.IsNotFound), "no volume shared by the pods")
		Expect(repo.PodsCreated()).To(BeNumerically(">", repository.Replicas), "the drain evicted a repository pod, which the Deployment replaced")

		// The other nodes' OS Jobs read the repository while it has lost a pod and got it
		// back, and while each of them is drained in turn.
		for _, node := range c.nodes[1:] {
			Expect(drive(c.updater, c.nodeUpdate(node), 90*time.Second)).To(Succeed(), "node %s", node)
		}
		for _, r := range c.rec.Runs() {
			Expect(r.Failed).To(BeFalse(), "run %s on %s failed: %s", r.Plan, r.Node, r.Message)
		}
		Expect(repo.Downloads()).To(Equal(1), "one download left the cluster: every other pod copied the ISO from a ready peer")
		Expect(repo.Problem(dep.Name)).To(BeEmpty(), "the repository's pods run the node program as a real node would")
	})

	It("waits for a downloader that is not done yet (exit code 3) instead of failing the node", func() {
		c := newHarvesterCluster(1, "Harvester v1.7.1", func(h *harvesterv1.HarvesterUpgrader) {
			h.Spec.Release = harvesterv1.Release{Version: "v1.8.3", ISOURL: "https://releases.example/harvester-v1.8.3-amd64.iso", ISOChecksum: fmt.Sprintf("%0128x", 3)}
		})
		c.repository.FailMessage = "capi-inplace node repository download: not done yet: the leader (repo-0) has not written /repository/harvester.iso.ready after 30m0s"
		c.repository.FailExitCode = 3
		nu := c.nodeUpdate(c.nodes[0])
		Expect(driveUntil(c.updater, nu, 90*time.Second, heldWith("RepoCreating"))).To(Succeed())
		err := drive(c.updater, nu, 2*time.Second)
		Expect(err).To(MatchError(ContainSubstring("not done within")), "held, not failed")
		Expect(nodeupdater.StepState(nu, harvesteradapter.StepClusterUpgrade)).To(Equal(inplacev1.StepStateRunning), "the UpgradePlan waits for its repository")
		Expect(nodeupdater.Step(nu, harvesteradapter.StepClusterUpgrade).Message).To(ContainSubstring("RepoCreating"))
	})

	It("fails clearly when the repository cannot verify the ISO's checksum", func() {
		bad := newHarvesterCluster(1, "Harvester v1.7.1", func(h *harvesterv1.HarvesterUpgrader) {
			h.Spec.Release = harvesterv1.Release{Version: "v1.8.2", ISOURL: "https://releases.example/harvester-v1.8.2-amd64.iso", ISOChecksum: fmt.Sprintf("%0128x", 2)}
		})
		bad.repository.FailMessage = "sha512 checksum mismatch: got 9f2c..., want 0000...0002"
		nu := bad.nodeUpdate(bad.nodes[0])
		err := drive(bad.updater, nu, 10*time.Second)
		Expect(err).To(MatchError(ContainSubstring("the upgrade repository capi-inplace-repo-v1-8-2 could not provide Harvester v1.8.2")))
		Expect(err).To(MatchError(ContainSubstring("sha512 checksum mismatch")))
	})
})

var _ = Describe("Aborting a node's upgrade", func() {
	It("stops a running drain (its Plan deleted at once), waits until its Job and pod are gone, then lifts its own cordon", func() {
		// Long enough that the Job still runs when Abort is first asked, on a loaded machine
		// too (1.5 s was not: the Job had ended and Abort rightly said done).
		c := newHarvesterCluster(2, "Harvester v1.7.1", func(h *harvesterv1.HarvesterUpgrader) { h.Spec.PreloadImages = ptr.To(false) },
			func(s *sim.SUC) { s.JobDuration = 5 * time.Second })
		node := c.nodes[0]
		nu := c.nodeUpdate(node)
		// Advance until the drain Plan's Job runs on this node (the updater cordoned the
		// node just before). Runs on other nodes do not count: Plans that earlier specs
		// left in the shared SUC namespace can run under this cluster's simulator too.
		Eventually(func() []sim.PlanRun {
			_, err := c.updater.Reconcile(ctx, nu)
			Expect(err).NotTo(HaveOccurred())
			return nodeRunsOn(c.rec, node)
		}, 60*time.Second, 50*time.Millisecond).Should(HaveLen(1), "the node's first Plan runs once the cluster step is done")

		done, err := c.updater.Abort(ctx, nu)
		Expect(err).NotTo(HaveOccurred())
		if !done {
			// The simulated garbage collector may delete the Job and its pod within the
			// call (it acts on the Plan's deletion event): then the abort is done at once.
			Expect(unschedulable(node)).To(BeTrue(), "not uncordoned while the drain's Job may still evict or cordon")
		} else {
			Expect(nodeRunsOn(c.rec, node)[0].End).NotTo(BeZero(), "done only once the drain's run has ended")
		}
		// kubectl drain is evictions one at a time: stopping it leaves nothing half-done,
		// and a drain a PodDisruptionBudget blocks would never end by itself.
		Expect(ourPlans(c)).To(BeEmpty(), "the drain's Plan is deleted at once, not waited for")

		Eventually(func() bool {
			done, err := c.updater.Abort(ctx, nu)
			Expect(err).NotTo(HaveOccurred())
			return done
		}).WithPolling(100 * time.Millisecond).Should(BeTrue())
		Expect(ourPlans(c)).To(BeEmpty())
		n := &corev1.Node{}
		Expect(workload.Client.Get(ctx, client.ObjectKey{Name: node}, n)).To(Succeed())
		Expect(n.Spec.Unschedulable).To(BeFalse())
		runs := nodeRunsOn(c.rec, node)
		Expect(runs).To(HaveLen(1))
		Expect(runs[0].Deleted).To(ContainSubstring("its Plan is gone"), "the drain's Job was deleted while it ran, by the garbage collector")
		Expect(runs[0].End).NotTo(BeZero(), "the drain's run ended before the abort was done")
		Consistently(func() int { return len(nodeRunsOn(c.rec, node)) }, 500*time.Millisecond, 50*time.Millisecond).Should(Equal(1), "nothing runs on the node after the abort")
	})
})

// runsOn returns the runs a simulator recorded on one node: of every Plan, the cluster
// phase's Plans for every node (restart guard, rke2-multus skip, image cleanup) included.
func runsOn(rec *sim.Record, node string) []sim.PlanRun {
	var out []sim.PlanRun
	for _, r := range rec.Runs() {
		if r.Node == node {
			out = append(out, r)
		}
	}
	return out
}

// clusterPlanKinds are the kinds of the Plans an UpgradePlan runs on every node, outside
// any NodeUpdate.
var clusterPlanKinds = []suc.PlanKind{suc.PlanImageCleanup, suc.PlanRestartGuard, suc.PlanManifestSkip, suc.PlanManifestUnskip}

// nodeRunsOn returns the runs of a NodeUpdate's own Plans on one node (preload, drain,
// rke2, os, unguard, reguard), leaving out the cluster phase's Plans for every node.
func nodeRunsOn(rec *sim.Record, node string) []sim.PlanRun {
	var out []sim.PlanRun
runs:
	for _, r := range runsOn(rec, node) {
		for _, kind := range clusterPlanKinds {
			if strings.HasPrefix(r.Plan, "capi-inplace-"+string(kind)+"-") {
				continue runs
			}
		}
		out = append(out, r)
	}
	return out
}
