package harvesteradapter_test

import (
	"os"
	"path/filepath"
	"strings"
	"time"

	longhornv1 "github.com/longhorn/longhorn-manager/k8s/pkg/apis/longhorn/v1beta2"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter"
	harvesterv1 "github.com/capi-inplace/capi-inplace/harvesteradapter/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/longhorn"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/longhornlive"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/suc"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/upgradeplan"
	"github.com/capi-inplace/capi-inplace/nodeupdater"
	"github.com/capi-inplace/capi-inplace/test/sim"
	"github.com/capi-inplace/capi-inplace/test/testenv"
)

const (
	imOld = "longhornio/longhorn-instance-manager:v1.12.2"
	imNew = "longhornio/longhorn-instance-manager:v1.13.0"
)

// These specs run on a workload API server of their own: they install Longhorn's
// live-upgrade kinds part-way and keep Longhorn's singletons (the Setting, the
// InstanceManagerUpgradeControl) in longhorn-system, which the other specs must not see.
// Each spec leaves Longhorn's namespace empty for the next (resetLonghorn).
var _ = Describe("Longhorn v2 and Longhorn's live upgrade of v2 instance managers", Ordered, ContinueOnFailure, func() {
	var lh *testenv.Environment

	BeforeAll(func() {
		var err error
		lh, err = testenv.Start()
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { Expect(lh.Stop()).To(Succeed()) })
		startRancher(lh)
	})

	// newCluster is a cluster on lh with Longhorn's objects removed after the spec, once
	// its simulators have stopped (cleanups run last-registered first).
	// Each node's Longhorn runs its v1 instance manager of the image the longhorn-manager
	// DaemonSet renders now, as a settled Longhorn does (the cluster step waits for one
	// per Longhorn node, fact 25).
	newCluster := func(nodes int) *harvesterCluster {
		GinkgoHelper()
		DeferCleanup(resetLonghorn, lh)
		c := newHarvesterClusterOn(lh, nodes, "Harvester v1.7.1", func(h *harvesterv1.HarvesterUpgrader) {
			h.Spec.PreloadImages = ptr.To(false)
			h.Spec.UpgradeOS = ptr.To(false)
		})
		image, err := sim.DeployedInstanceManagerImage(ctx, lh.Client)
		Expect(err).NotTo(HaveOccurred())
		for _, n := range c.nodes {
			Expect(sim.CreateLonghornInstanceManager(ctx, lh.Client, longhorn.Namespace, n, image, longhornv1.DataEngineTypeV1)).To(Succeed())
		}
		return c
	}
	// longhornStep is the Longhorn step the node is at: LonghornPause (before the cordon)
	// until it is done, then LonghornDataEngine (after the evacuation and the drain).
	longhornStep := func(nu *inplacev1.NodeUpdate) *inplacev1.NodeUpdateStep {
		if !nodeupdater.StepDone(nu, harvesteradapter.StepLonghornPause) {
			return nodeupdater.Step(nu, harvesteradapter.StepLonghornPause)
		}
		return nodeupdater.Step(nu, harvesteradapter.StepLonghornDataEngine)
	}
	stepMessages := func(messages *[]string) func(*inplacev1.NodeUpdate) bool {
		return func(nu *inplacev1.NodeUpdate) bool {
			if m := longhornStep(nu).Message; m != "" && (len(*messages) == 0 || (*messages)[len(*messages)-1] != m) {
				*messages = append(*messages, m)
			}
			return false
		}
	}
	setting := func() *longhornv1.Setting {
		GinkgoHelper()
		s := &longhornv1.Setting{}
		Expect(lh.Client.Get(ctx, client.ObjectKey{Namespace: longhorn.Namespace, Name: longhorn.SettingV2AutomaticUpgrade}, s)).To(Succeed())
		return s
	}
	pausers := func() string { return setting().Annotations[longhorn.AnnotationV2UpgradePausedBy] }
	untilStepDone := func(nu *inplacev1.NodeUpdate) bool {
		return nodeupdater.StepDone(nu, harvesteradapter.StepLonghornDataEngine)
	}

	Context("when Longhorn does not serve the live upgrade (v1.10 to v1.12.1)", func() {
		It("holds a node where an attached v2 volume has its engine, naming it, and lets a node without one go", func() {
			// Three nodes, a replica on each: the second node goes while the first is
			// held cordoned, and its Cordon judges the storage again (freshstorage_test.go):
			// with replicas on those two nodes only it would be held there, rightly.
			c := newCluster(3)
			for _, n := range c.nodes {
				Expect(sim.CreateLonghornV2InstanceManager(ctx, lh.Client, longhorn.Namespace, n, imOld)).To(Succeed())
			}
			// A v2 volume attached before the cluster step holds the whole upgrade there
			// (released_longhorn_test.go); this one is attached after it.
			clusterUpgraded(c)
			Expect(sim.CreateLonghornV2Volume(ctx, lh.Client, longhorn.Namespace,
				sim.LonghornV2Volume{Name: "pvc-" + c.name, ReplicaNodes: c.nodes, EngineNode: c.nodes[0]})).To(Succeed())

			Expect(preflightFailures(c, c.nodes[0])).To(HaveKeyWithValue(longhorn.CheckLonghornV2SwapAvailable,
				ContainSubstring("would interrupt the attached v2 volumes whose engine runs on it and that neither its VMs' evacuation nor its drain frees: pvc-"+c.name+" (attached with no pod using it);")))
			Expect(preflightFailures(c, c.nodes[1])).To(BeEmpty(), "a v2 replica alone does not hold a node")

			held := c.nodeUpdate(c.nodes[0])
			Expect(driveUntil(c.updater, held, 90*time.Second, func(nu *inplacev1.NodeUpdate) bool {
				return nodeupdater.StepState(nu, harvesteradapter.StepLonghornDataEngine) == inplacev1.StepStateRunning
			})).To(Succeed())
			Expect(drive(c.updater, held, 2*time.Second)).To(MatchError(ContainSubstring("not done within")), "the node is held, not failed")
			step := nodeupdater.Step(held, harvesteradapter.StepLonghornDataEngine)
			Expect(step.State).To(Equal(inplacev1.StepStateRunning))
			Expect(step.Message).To(ContainSubstring("holding: the cluster's Longhorn does not serve the live upgrade of v2 instance managers"))
			Expect(step.Message).To(ContainSubstring("have their engine on node " + c.nodes[0] + ": pvc-" + c.name))
			// Cordoned as ours and drained (a volume attached by a VM would have moved with
			// its VM's migration in EvacuateVMs, a pod's detached with the drain's
			// eviction), but neither RKE2 nor the OS is touched while held.
			Expect(nodeupdater.StepState(held, harvesteradapter.StepDrain)).To(Equal(inplacev1.StepStateSucceeded), "held after the drain")
			Expect(nodeupdater.StepState(held, harvesteradapter.StepKubernetesUpgrade)).To(Equal(inplacev1.StepStatePending), "RKE2 is not restarted while held")
			Expect(nodeupdater.StepState(held, harvesteradapter.StepOSUpgrade)).To(Equal(inplacev1.StepStatePending), "the OS is not touched while held")
			Expect(unschedulableOn(lh, c.nodes[0])).To(BeTrue(), "the node was cordoned before the evacuation")

			free := c.nodeUpdate(c.nodes[1])
			Expect(drive(c.updater, free, 90*time.Second)).To(Succeed())
			Expect(nodeupdater.Step(free, harvesteradapter.StepLonghornDataEngine).State).To(Equal(inplacev1.StepStateSkipped))
		})
	})

	Context("when Longhorn serves the live upgrade", func() {
		BeforeAll(func() { installCRDs(lh, "longhorn-liveupgrade") })

		// rolling is a cluster whose Longhorn rolls its v2 instance managers from imOld to
		// imNew, allowed by the setting, with a v2 volume attached on the first node.
		rolling := func(nodes int) *harvesterCluster {
			GinkgoHelper()
			c := newCluster(nodes)
			for _, n := range c.nodes {
				Expect(sim.CreateLonghornV2InstanceManager(ctx, lh.Client, longhorn.Namespace, n, imOld)).To(Succeed())
			}
			Expect(sim.CreateLonghornV2Volume(ctx, lh.Client, longhorn.Namespace,
				sim.LonghornV2Volume{Name: "pvc-" + c.name, ReplicaNodes: c.nodes, EngineNode: c.nodes[0]})).To(Succeed())
			Expect(sim.SetLonghornSetting(ctx, lh.Client, longhorn.Namespace, longhorn.SettingV2AutomaticUpgrade, "true")).To(Succeed())
			c.longhorn.SetTargetImage(imNew)
			return c
		}

		It("pauses Longhorn's roll, holds while it upgrades another node, goes on when that ends, and gives the setting back at Finish", func() {
			c := rolling(3)
			c.longhorn.HoldNode(c.nodes[0]) // until the NodeUpdate has been seen holding
			Eventually(c.longhorn.Upgrades).WithPolling(20 * time.Millisecond).ShouldNot(BeEmpty())
			first := c.longhorn.Upgrades()[0]
			Expect(first.Node).To(Equal(c.nodes[0]), "Longhorn starts the smallest node name")
			Expect(first.IMU).To(HavePrefix("upgrade-" + c.nodes[0] + "-"))

			Expect(preflightFailures(c, c.nodes[2])).To(HaveKeyWithValue(longhorn.CheckLonghornLiveUpgradeIdle,
				ContainSubstring("InstanceManagerUpgrade "+first.IMU+" on node "+c.nodes[0])), "no node is picked while Longhorn's roll runs")

			nu := c.nodeUpdate(c.nodes[2])
			var messages []string
			Expect(driveUntil(c.updater, nu, 90*time.Second, func(nu *inplacev1.NodeUpdate) bool {
				stepMessages(&messages)(nu)
				if step := longhornStep(nu); step.State == inplacev1.StepStateRunning && !strings.HasPrefix(step.Message, "turned") {
					Expect(setting().Value).To(Equal("false"), "Longhorn's roll is paused while the node waits")
					Expect(pausers()).To(Equal(string(nu.UID)))
				}
				if strings.HasPrefix(longhornStep(nu).Message, "holding: Longhorn's live upgrade") {
					Expect(nodeupdater.StepState(nu, harvesteradapter.StepCordon)).To(Equal(inplacev1.StepStatePending), "the node is not cordoned while Longhorn's roll runs")
					c.longhorn.ReleaseNode(c.nodes[0])
				}
				return false
			})).To(Succeed())
			Expect(strings.Join(messages, "\n")).To(ContainSubstring("holding: Longhorn's live upgrade of v2 instance managers is running (InstanceManagerUpgrade " + first.IMU + " on node " + c.nodes[0]))
			Expect(nodeupdater.StepState(nu, harvesteradapter.StepLonghornPause)).To(Equal(inplacev1.StepStateSucceeded))
			Expect(nodeupdater.StepState(nu, harvesteradapter.StepLonghornDataEngine)).To(Equal(inplacev1.StepStateSucceeded))

			upgrades := c.longhorn.Upgrades()
			Expect(upgrades[0].End).NotTo(BeZero())
			drains := c.rec.Drains(c.nodes[2])
			Expect(drains).NotTo(BeEmpty())
			Expect(drains[0].At).To(BeTemporally(">", upgrades[0].End), "the node is drained only after Longhorn's upgrade of the other node ended")
			if len(upgrades) > 1 {
				Expect(upgrades[1].Start).To(BeTemporally(">", nodeupdater.Step(nu, harvesteradapter.StepFinish).CompletionTime.Add(-time.Second)),
					"no further node starts while the setting is paused")
			}

			s := setting()
			Expect(s.Value).To(Equal("true"), "Finish gives the setting back")
			Expect(s.Annotations).NotTo(HaveKey(longhorn.AnnotationV2UpgradePausedBy))
			Expect(s.Annotations).NotTo(HaveKey(longhorn.AnnotationV2UpgradePausedValue))
			Eventually(c.longhorn.Upgraded).WithPolling(50*time.Millisecond).Should(ConsistOf(c.nodes), "Longhorn's roll goes on once released")
			Expect(c.longhorn.Violations()).To(BeEmpty(), "no node was cordoned or NotReady while an upgrade was active")
		})

		It("lets two NodeUpdates pause together and gives the value back only when both have released it", func() {
			c := rolling(3)
			c.longhorn.SetTargetImage("") // no roll: only the pause is looked at
			a, b := c.nodeUpdate(c.nodes[1]), c.nodeUpdate(c.nodes[2])
			Expect(driveUntil(c.updater, a, 90*time.Second, untilStepDone)).To(Succeed())
			Expect(driveUntil(c.updater, b, 90*time.Second, untilStepDone)).To(Succeed())
			Expect(setting().Value).To(Equal("false"))
			Expect(strings.Split(pausers(), ",")).To(ConsistOf(string(a.UID), string(b.UID)))
			Expect(setting().Annotations).To(HaveKeyWithValue(longhorn.AnnotationV2UpgradePausedValue, "true"))

			Expect(drive(c.updater, a, 90*time.Second)).To(Succeed())
			Expect(setting().Value).To(Equal("false"), "b still pauses it")
			Expect(pausers()).To(Equal(string(b.UID)))

			Expect(drive(c.updater, b, 90*time.Second)).To(Succeed())
			Expect(setting().Value).To(Equal("true"))
			Expect(setting().Annotations).NotTo(HaveKey(longhorn.AnnotationV2UpgradePausedBy))
		})

		It("gives the setting back when a node's update is aborted", func() {
			c := rolling(3)
			c.longhorn.SetTargetImage("")
			aborted := c.nodeUpdate(c.nodes[1])
			Expect(driveUntil(c.updater, aborted, 90*time.Second, untilStepDone)).To(Succeed())
			Expect(pausers()).To(Equal(string(aborted.UID)))
			Eventually(func() bool {
				done, err := c.updater.Abort(ctx, aborted)
				Expect(err).NotTo(HaveOccurred())
				return done
			}).WithPolling(100 * time.Millisecond).Should(BeTrue())
			Expect(setting().Value).To(Equal("true"), "an aborted node does not leave Longhorn paused")
			Expect(pausers()).To(BeEmpty())
		})

		It("gives the setting back when a node's update fails", func() {
			c := rolling(3)
			c.longhorn.SetTargetImage("")
			startLifecycle(c)
			failed := c.nodeUpdate(c.nodes[2])
			c.suc.FailNodeLabelled(map[string]string{suc.LabelPlanKind: "rke2"}, c.nodes[2], "rke2 failed to start")
			Eventually(func(g Gomega) bool {
				g.Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(failed), failed)).To(Succeed())
				if nodeupdater.StepState(failed, harvesteradapter.StepLonghornDataEngine) == inplacev1.StepStateSucceeded && failed.Status.Phase == inplacev1.NodeUpdatePhaseInProgress {
					g.Expect(pausers()).To(Equal(string(failed.UID)), "the failing node paused it")
				}
				return failed.Status.Phase == inplacev1.NodeUpdatePhaseFailed
			}, 60*time.Second, 50*time.Millisecond).Should(BeTrue())
			Expect(failed.Status.FailureMessage).To(ContainSubstring("rke2 failed to start"))
			Expect(setting().Value).To(Equal("true"), "a failed node does not leave Longhorn paused")
			Expect(pausers()).To(BeEmpty())
		})

		It("holds a node where an attached v2 volume has its engine, naming it, until the engine moves away", func() {
			c := rolling(2)
			c.longhorn.SetTargetImage("")
			vol := "pvc-" + c.name
			clusterUpgraded(c)
			nu := c.nodeUpdate(c.nodes[0])
			// Until the node reaches the hold (its earlier steps take longer on a slow
			// machine), then a while longer: it stays held.
			held := "holding: Longhorn's live upgrade is idle, but attached v2 volumes have their engine on node " + c.nodes[0]
			Expect(driveUntil(c.updater, nu, 90*time.Second, heldWith(held))).To(Succeed())
			Expect(drive(c.updater, nu, 2*time.Second)).To(MatchError(ContainSubstring("not done within")), "the node is held, not failed")
			step := nodeupdater.Step(nu, harvesteradapter.StepLonghornDataEngine)
			Expect(step.State).To(Equal(inplacev1.StepStateRunning))
			Expect(step.Message).To(ContainSubstring("holding: Longhorn's live upgrade is idle, but attached v2 volumes have their engine on node " + c.nodes[0] + ": " + vol + ";"))
			Expect(step.Message).To(ContainSubstring("live-migrate their VMs to another node or detach them"))
			Expect(pausers()).To(Equal(string(nu.UID)), "the node pauses Longhorn's roll while it waits")
			Expect(nodeupdater.StepState(nu, harvesteradapter.StepKubernetesUpgrade)).To(Equal(inplacev1.StepStatePending), "RKE2 is not restarted while held")
			Expect(nodeupdater.StepState(nu, harvesteradapter.StepLonghornPause)).To(Equal(inplacev1.StepStateSucceeded), "the pause came before the cordon")

			// A VM's live migration moves its volume's engine to the VM's new node.
			Expect(sim.MoveLonghornEngine(ctx, lh.Client, longhorn.Namespace, vol, c.nodes[1])).To(Succeed())
			Expect(drive(c.updater, nu, 90*time.Second)).To(Succeed())
			Expect(nodeupdater.StepState(nu, harvesteradapter.StepLonghornDataEngine)).To(Equal(inplacev1.StepStateSucceeded))
			Expect(setting().Value).To(Equal("true"))
		})
	})
})

// resetLonghorn empties Longhorn's namespace of what a spec created.
func resetLonghorn(wl *testenv.Environment) {
	GinkgoHelper()
	opts := []client.DeleteAllOfOption{client.InNamespace(longhorn.Namespace)}
	for _, obj := range []client.Object{
		&longhornv1.Volume{}, &longhornv1.Engine{}, &longhornv1.Replica{}, &longhornv1.InstanceManager{}, &longhornv1.Node{}, &longhornv1.Setting{},
	} {
		Expect(wl.Client.DeleteAllOf(ctx, obj, opts...)).To(Succeed())
	}
	for _, obj := range []client.Object{&longhornlive.InstanceManagerUpgrade{}, &longhornlive.InstanceManagerUpgradeControl{}} {
		if err := wl.Client.DeleteAllOf(ctx, obj, opts...); err != nil {
			Expect(err.Error()).To(ContainSubstring("no matches for kind"), "the live-upgrade kinds may not be installed yet")
		}
	}
}

func unschedulableOn(wl *testenv.Environment, node string) bool {
	GinkgoHelper()
	n := &corev1.Node{}
	Expect(wl.Client.Get(ctx, client.ObjectKey{Name: node}, n)).To(Succeed())
	return n.Spec.Unschedulable
}

// installCRDs installs the CRDs of test/crds/<dir> on wl.
func installCRDs(wl *testenv.Environment, dir string) {
	GinkgoHelper()
	path := filepath.Join(wl.RepoRoot, "test", "crds", dir)
	entries, err := os.ReadDir(path)
	Expect(err).NotTo(HaveOccurred())
	var crds []*apiextensionsv1.CustomResourceDefinition
	for _, e := range entries {
		data, err := os.ReadFile(filepath.Join(path, e.Name()))
		Expect(err).NotTo(HaveOccurred())
		crd := &apiextensionsv1.CustomResourceDefinition{}
		Expect(yaml.Unmarshal(data, crd)).To(Succeed())
		crds = append(crds, crd)
	}
	_, err = envtest.InstallCRDs(wl.Config, envtest.CRDInstallOptions{CRDs: crds})
	Expect(err).NotTo(HaveOccurred())
}

// clusterUpgraded waits until the cluster's UpgradePlan has done the cluster step: a
// cluster upgrade on a fresh workload API server takes a few seconds, which a node's own
// wait for it must not eat into.
func clusterUpgraded(c *harvesterCluster) {
	GinkgoHelper()
	Eventually(func(g Gomega) bool {
		plan := &harvesterv1.UpgradePlan{}
		g.Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(c.plan), plan)).To(Succeed())
		return upgradeplan.PhaseReached(plan, harvesterv1.UpgradePlanNodeUpgrading)
	}, 60*time.Second, 50*time.Millisecond).Should(BeTrue())
}

// preflightFailures are the updater's failed preflight checks for node, by name.
func preflightFailures(c *harvesterCluster, node string) map[string]string {
	GinkgoHelper()
	out := map[string]string{}
	for _, r := range c.updater.Preflight(ctx, nodeupdater.PreflightTarget{
		Namespace: c.ns, ClusterName: c.name, NodeName: node, Version: "v1.35.6+rke2r1",
		UpdaterRef: inplacev1.UpdaterReference{Kind: "HarvesterUpgrader", Name: c.config.Name},
	}) {
		if !r.Passed {
			out[r.Name] = r.Message
		}
	}
	return out
}
