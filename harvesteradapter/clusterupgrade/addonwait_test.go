package clusterupgrade_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capi-inplace/capi-inplace/harvesteradapter/clusterupgrade"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/harvesterapi"
	"github.com/capi-inplace/capi-inplace/test/sim"
)

// The release's wait after it changed an add-on (harvester-release-steps.md fact 29;
// lib.sh at v1.8.2 wait_for_addon_upgrade_deployment, called by
// upgrade_addon_rancher_monitoring_with_patches, upgrade_addon_rancher_logging_with_patch_eventrouter_image
// and upgrade_addon_try_patch_version_only): only for an add-on that is enabled and was
// AddonDeploySuccessful before the change, at most 300 s, never failing. Harvester's add-on
// controller is the simulator's (sim.HarvesterAddons).
var _ = Describe("Run and the add-ons it changed coming back (wait_for_addon_upgrade_deployment)", func() {
	var (
		monitoring  = client.ObjectKey{Namespace: "cattle-monitoring-system", Name: "rancher-monitoring"}
		logging     = client.ObjectKey{Namespace: "cattle-logging-system", Name: "rancher-logging"}
		descheduler = client.ObjectKey{Namespace: "kube-system", Name: "descheduler"}
		addons      *sim.HarvesterAddons
	)
	const (
		oldMonitoring = "105.1.0+up61.3.2"
		oldLogging    = "105.1.0+up4.10.0"
	)
	BeforeEach(func() {
		seed(oldRelease)
		settle()
		for _, ns := range []string{monitoring.Namespace, logging.Namespace} {
			Expect(env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})).To(Or(Succeed(), MatchError(ContainSubstring("already exists"))))
		}
		addons = &sim.HarvesterAddons{Client: env.Client, JobDelay: 50 * time.Millisecond}
		simCtx, cancel := context.WithCancel(ctx)
		DeferCleanup(cancel)
		addons.Start(simCtx)
	})
	// create makes the add-on at key, at version, as its user left it.
	create := func(key client.ObjectKey, version string, enabled bool) {
		GinkgoHelper()
		a := &harvesterapi.Addon{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}, Spec: harvesterapi.AddonSpec{
			Repo: "http://harvester-cluster-repo.cattle-system.svc/charts", Chart: key.Name, Version: version, Enabled: enabled, ValuesContent: "their: own\n"}}
		Expect(env.Client.Create(ctx, a)).To(Succeed())
		DeferCleanup(func() { Expect(client.IgnoreNotFound(env.Client.Delete(ctx, a))).To(Succeed()) })
	}
	state := func(key client.ObjectKey) func() harvesterapi.AddonState {
		return func() harvesterapi.AddonState { return addon(key).Status.Status }
	}
	upgradeAddons := func(p clusterupgrade.Progress) clusterupgrade.StepProgress {
		GinkgoHelper()
		steps, err := clusterupgrade.ReadProgress(ctx, env.Client, p.ConfigMap)
		Expect(err).NotTo(HaveOccurred())
		return stepNamed(steps, clusterupgrade.StepUpgradeAddons)
	}

	It("after changing an enabled add-on that was deployed, goes on only once Harvester has deployed it again", func() {
		create(monitoring, oldMonitoring, true)
		Eventually(state(monitoring)).Should(Equal(harvesterapi.AddonDeployed))
		// Its new version's Helm job runs until the spec lets it end.
		addons.HoldAddon(monitoring)
		in := input("up-addon-wait")
		in.AddonUpgradeWait = time.Hour // not the bound, the add-on ends this wait
		p := newProgress()
		done := make(chan error, 1)
		go func() { done <- clusterupgrade.Run(ctx, env.Client, in, p) }()

		By("the Job waits for rancher-monitoring, and says so in its progress")
		Eventually(func() clusterupgrade.StepProgress {
			s := upgradeAddons(p)
			if s.State == clusterupgrade.StateDone || s.State == clusterupgrade.StateFailed {
				StopTrying(fmt.Sprintf("UpgradeAddons ended %s while rancher-monitoring was %s: %s", s.State, addon(monitoring).Status.Status, s.Message)).Now()
			}
			return s
		}).Should(And(HaveField("State", clusterupgrade.StateRunning),
			HaveField("Message", ContainSubstring("for add-on cattle-monitoring-system/rancher-monitoring to be AddonDeploySuccessful again"))))
		Expect(addon(monitoring).Spec.Version).To(Equal(in.MonitoringChartVersion))
		By("Harvester takes the change up, and the held Helm job keeps it AddonUpdating: the Job still waits")
		Eventually(state(monitoring)).Should(Equal(harvesterapi.AddonUpdating))
		steps, err := clusterupgrade.ReadProgress(ctx, env.Client, p.ConfigMap)
		Expect(err).NotTo(HaveOccurred())
		Expect(stepNamed(steps, clusterupgrade.StepUpgradeAddons).State).To(Equal(clusterupgrade.StateRunning))
		Expect(stepNamed(steps, clusterupgrade.StepWaitFleetBundles).State).To(Equal(clusterupgrade.StatePending))
		Expect(done).NotTo(Receive())

		By("Harvester deploys it: the Job goes on and says it came back")
		addons.UnholdAddon(monitoring)
		var runErr error
		Eventually(done).Should(Receive(&runErr))
		Expect(runErr).NotTo(HaveOccurred())
		Expect(addon(monitoring).Status.Status).To(Equal(harvesterapi.AddonDeployed))
		s := upgradeAddons(p)
		Expect(s.State).To(Equal(clusterupgrade.StateDone))
		Expect(s.Message).To(ContainSubstring("rancher-monitoring " + in.MonitoringChartVersion + " (was " + oldMonitoring + ") with its values edited as the release does (AddonDeploySuccessful again)"))
	})

	It("goes on without failing when a changed add-on is not deployed again within --addon-upgrade-wait, and names it", func() {
		create(monitoring, oldMonitoring, true)
		Eventually(state(monitoring)).Should(Equal(harvesterapi.AddonDeployed))
		in := input("up-addon-failed")
		addons.FailAddon(monitoring, in.MonitoringChartVersion)
		in.AddonUpgradeWait = time.Second
		var log bytes.Buffer
		p := newProgress()
		p.Log = io.MultiWriter(GinkgoWriter, &log)
		steps := runStates(in, p)

		s := stepNamed(steps, clusterupgrade.StepUpgradeAddons)
		Expect(s.State).To(Equal(clusterupgrade.StateDone))
		// What it last saw of the add-on (AddonUpdating and the failed job, unless the
		// simulator was slower than the bound) comes between these two.
		Expect(s.Message).To(And(
			ContainSubstring("rancher-monitoring "+in.MonitoringChartVersion+" (was "+oldMonitoring+") with its values edited as the release does (not AddonDeploySuccessful again after 1s: "),
			ContainSubstring("; gone on as the release's script does, recover it manually after the upgrade)")))
		Expect(stepNamed(steps, clusterupgrade.StepWaitFleetBundles).State).To(Equal(clusterupgrade.StateDone), "the Job went on")
		Expect(log.String()).To(ContainSubstring("add-on cattle-monitoring-system/rancher-monitoring is not AddonDeploySuccessful again after 1s"))
		Eventually(func() bool { return addon(monitoring).Status.IsTrue(harvesterapi.AddonOperationFailed) }).Should(BeTrue(), "the simulated Helm job failed")
		Expect(addon(monitoring).Status.Status).To(Equal(harvesterapi.AddonUpdating))
	})

	It("does not wait for a disabled add-on, one not deployed before the change, or one the release brings with upgrade_addon", func() {
		// rancher-monitoring's first install never ends: AddonEnabling when the Job changes it.
		addons.HoldAddon(monitoring)
		create(monitoring, oldMonitoring, true)
		create(logging, oldLogging, false)
		create(descheduler, "0.33.0", true)
		Eventually(state(monitoring)).Should(Equal(harvesterapi.AddonEnabling))
		Eventually(state(logging)).Should(Equal(harvesterapi.AddonDisabled))
		Eventually(state(descheduler)).Should(Equal(harvesterapi.AddonDeployed))
		// The descheduler's new version never comes back: upgrade_addon does not wait.
		addons.FailAddon(descheduler, "")
		in := input("up-addon-nowait")
		in.AddonUpgradeWait = time.Hour // a wait would last until Run's timeout and fail it
		steps := runStates(in, newProgress())

		s := stepNamed(steps, clusterupgrade.StepUpgradeAddons)
		Expect(s.State).To(Equal(clusterupgrade.StateDone))
		Expect(s.Message).To(And(
			ContainSubstring("rancher-monitoring "+in.MonitoringChartVersion+" (was "+oldMonitoring+") with its values edited as the release does (AddonEnabling before the change, not waited for)"),
			ContainSubstring("rancher-logging "+in.LoggingChartVersion+" (was "+oldLogging+") (disabled, not waited for)"),
			ContainSubstring("descheduler "+releaseAddon(descheduler.Name).Spec.Version+" (was 0.33.0)"),
			Not(ContainSubstring("descheduler "+releaseAddon(descheduler.Name).Spec.Version+" (was 0.33.0) ("))))
		Expect(addon(monitoring).Status.Status).To(Equal(harvesterapi.AddonEnabling))
		Eventually(func() bool { return addon(descheduler).Status.IsTrue(harvesterapi.AddonOperationFailed) }).Should(BeTrue())
	})
})
