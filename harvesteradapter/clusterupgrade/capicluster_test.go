package clusterupgrade_test

import (
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capi-inplace/capi-inplace/harvesteradapter/clusterupgrade"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher"
	"github.com/capi-inplace/capi-inplace/test/sim"
)

// wait_capi_cluster (harvester-release-steps.md facts 16.3, 16.14 and 40).
var _ = Describe("Run and the Cluster API Cluster fleet-local/local", func() {
	capiCluster := func() *clusterv1.Cluster {
		GinkgoHelper()
		cl := &clusterv1.Cluster{}
		Expect(env.Client.Get(ctx, client.ObjectKey{Namespace: rancher.FleetLocal, Name: rancher.LocalCluster}, cl)).To(Succeed())
		return cl
	}
	phase := func() string { return capiCluster().Status.Phase }
	rancherImage := func() string { return deployment(rancher.RancherDeployment).Spec.Template.Spec.Containers[0].Image }
	// upgradedAt watches the rancher Deployment in the background and sends when its
	// image first names the target Rancher: when the helm upgrade changed it.
	upgradedAt := func(stop <-chan struct{}) <-chan time.Time {
		at := make(chan time.Time, 1)
		go func() {
			defer GinkgoRecover()
			for {
				dep := deployment(rancher.RancherDeployment)
				if strings.HasSuffix(dep.Spec.Template.Spec.Containers[0].Image, ":"+newRelease.Rancher) {
					at <- time.Now()
					return
				}
				select {
				case <-stop:
					return
				case <-time.After(10 * time.Millisecond):
				}
			}
		}()
		return at
	}
	provisioning := func(r *sim.Rancher) {
		GinkgoHelper()
		r.SetCAPIInfrastructureProvisioned(false)
		Eventually(phase).Should(Equal(string(clusterv1.ClusterPhaseProvisioning)))
	}

	It("does not upgrade Rancher while the Cluster API Cluster is not Provisioned, and goes on once it is (16.3)", func() {
		r := seed(oldRelease)
		settle()
		provisioning(r)
		in, p := input("capi-before"), newProgress()
		stop := make(chan struct{})
		defer close(stop)
		changed := upgradedAt(stop)
		done := make(chan error, 1)
		go func() { done <- clusterupgrade.Run(ctx, env.Client, in, p) }()
		Eventually(func() clusterupgrade.StepState {
			steps, err := clusterupgrade.ReadProgress(ctx, env.Client, p.ConfigMap)
			Expect(err).NotTo(HaveOccurred())
			return stepNamed(steps, clusterupgrade.StepUpgradeRancher).State
		}).Should(Equal(clusterupgrade.StateRunning))
		// Time enough for a helm upgrade that did not wait.
		time.Sleep(3 * time.Second)
		Expect(serverVersion()).To(Equal(oldRelease.Rancher))
		provisionedAt := time.Now()
		r.SetCAPIInfrastructureProvisioned(true)
		var at time.Time
		Eventually(changed).Should(Receive(&at))
		Expect(at).To(BeTemporally(">", provisionedAt), "Rancher is upgraded only once the Cluster API Cluster is Provisioned")
		var runErr error
		Eventually(done).WithTimeout(30 * time.Second).Should(Receive(&runErr))
		Expect(runErr).NotTo(HaveOccurred())
		Expect(serverVersion()).To(Equal(newRelease.Rancher))
	})

	It("waits, for a target before v1.8.1, after the fleet-agent's rollout until the Cluster API Cluster is Provisioned past the generation it had before Rancher's upgrade (16.14)", func() {
		r := seed(oldRelease)
		settle()
		before := capiCluster().Status.ObservedGeneration
		in, p := input("capi-after-old"), newProgress()
		steps := runStates(in, p)
		// Rancher v2.11 (embedded Cluster API) to v2.12 wrote the Cluster again.
		Expect(r.CAPIGenerations()).NotTo(BeEmpty())
		after := capiCluster()
		Expect(after.Generation).To(BeNumerically(">", before))
		msg := stepNamed(steps, clusterupgrade.StepSettleFleetAgent).Message
		Expect(msg).To(ContainSubstring("Cluster API Cluster fleet-local/local (read at v1beta2) Provisioned at observedGeneration %d (%d before Rancher's upgrade)", after.Generation, before))
	})

	It("for a target from v1.8.1 on, upgrades Rancher only once the Cluster API Cluster has stayed Provisioned at its generation for the whole window, starting it again when it changes (16.3, fact 40)", func() {
		r := seed(oldRelease)
		settle()
		provisioning(r)
		in, p := input("capi-stable"), newProgress()
		in.HarvesterVersion = "v1.8.1"
		in.RancherFeatures = mustFeatures(in.HarvesterVersion)
		in.CAPIStableFor = 2 * time.Second
		stop := make(chan struct{})
		defer close(stop)
		changed := upgradedAt(stop)
		done := make(chan error, 1)
		go func() { done <- clusterupgrade.Run(ctx, env.Client, in, p) }()

		time.Sleep(300 * time.Millisecond)
		r.SetCAPIInfrastructureProvisioned(true)
		Eventually(phase).Should(Equal(string(clusterv1.ClusterPhaseProvisioned)))
		// Within the window, the Cluster is Provisioning again for a moment.
		time.Sleep(time.Second)
		Expect(changed).NotTo(Receive(), "Rancher is upgraded only after the window")
		provisioning(r)
		time.Sleep(200 * time.Millisecond)
		restarted := time.Now()
		r.SetCAPIInfrastructureProvisioned(true)

		var at time.Time
		Eventually(changed).Should(Receive(&at))
		Expect(at.Sub(restarted)).To(BeNumerically(">=", in.CAPIStableFor), "the window started again when the Cluster was Provisioning")
		var runErr error
		Eventually(done).WithTimeout(40 * time.Second).Should(Receive(&runErr))
		Expect(runErr).NotTo(HaveOccurred())
		steps, err := clusterupgrade.ReadProgress(ctx, env.Client, p.ConfigMap)
		Expect(err).NotTo(HaveOccurred())
		// And again after the fleet-agent's rollout (16.14), at the generation the new
		// Rancher gave it.
		Expect(stepNamed(steps, clusterupgrade.StepSettleFleetAgent).Message).To(ContainSubstring(
			"Cluster API Cluster fleet-local/local (read at v1beta2) Provisioned at generation %d for 2s", capiCluster().Generation))
	})

	It("for a target from v1.8.1 on, does not go on after Rancher's upgrade before Cluster API has observed the Cluster's new generation (16.14)", func() {
		r := seed(oldRelease, func(r *sim.Rancher) { r.CAPIReconcileDelay = 2 * time.Second })
		settle()
		in, p := input("capi-observed"), newProgress()
		in.HarvesterVersion = "v1.8.1"
		in.RancherFeatures = mustFeatures(in.HarvesterVersion)
		steps := runStates(in, p)
		gens := r.CAPIGenerations()
		Expect(gens).To(HaveLen(1), "Rancher v2.12 wrote the Cluster API Cluster again")
		observedAt := r.CAPIObservedAt(gens[0])
		Expect(observedAt).NotTo(BeZero())
		// The fleet-agent is redeployed (16.15) only once Cluster API observed it.
		var asked []sim.FleetAgentRedeploy
		for _, d := range r.FleetAgentRedeploys() {
			if strings.HasPrefix(d.Reason, "spec.redeployAgentGeneration") {
				asked = append(asked, d)
			}
		}
		Expect(asked).NotTo(BeEmpty())
		Expect(asked[0].At).To(BeTemporally(">", observedAt))
		Expect(stepNamed(steps, clusterupgrade.StepSettleFleetAgent).State).To(Equal(clusterupgrade.StateDone))
	})

	It("fails with the Cluster, what it waited for and what to look at when the Cluster API Cluster never settles, without upgrading Rancher", func() {
		r := seed(oldRelease)
		settle()
		provisioning(r)
		in, p := input("capi-timeout"), newProgress()
		in.HarvesterVersion = "v1.8.1"
		in.RancherFeatures = mustFeatures(in.HarvesterVersion)
		in.Timeout = 30 * time.Second // the Cluster never settles: the run ends at this bound, past the sub-steps before (5 s to reach them under CI's load)
		err := clusterupgrade.Run(ctx, env.Client, in, p)
		Expect(err).To(MatchError(And(
			ContainSubstring("UpgradeRancher"),
			ContainSubstring("Cluster API Cluster fleet-local/local to be Provisioned at its generation"),
			ContainSubstring(`phase "Provisioning"`),
			ContainSubstring("kubectl -n fleet-local get clusters.cluster.x-k8s.io local -o yaml"),
		)))
		Expect(serverVersion()).To(Equal(oldRelease.Rancher))
		Expect(rancherImage()).To(HaveSuffix(":" + oldRelease.Rancher))
	})
})
