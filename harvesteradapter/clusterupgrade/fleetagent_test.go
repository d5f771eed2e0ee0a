package clusterupgrade_test

import (
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capi-inplace/capi-inplace/harvesteradapter/clusterupgrade"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher/fleetv1alpha1"
	"github.com/capi-inplace/capi-inplace/test/sim"
)

// The end of upgrade_rancher: fleet-controller's API server saved and put back, the local
// fleet-agent redeployed and waited for (harvester-release-steps.md fact 16.5 and 16.14 to
// 16.16; the simulator's Fleet, test/sim/fleet.go).
var _ = Describe("Run and Fleet's local agent", func() {
	fleetAPIServer := func() rancher.FleetAPIServer {
		GinkgoHelper()
		cm := &corev1.ConfigMap{}
		Expect(env.Client.Get(ctx, client.ObjectKey{Namespace: rancher.FleetNamespace, Name: rancher.FleetControllerConfigMap}, cm)).To(Succeed())
		cfg, err := rancher.ParseFleetConfig(cm.Data[rancher.FleetControllerConfigKey])
		Expect(err).NotTo(HaveOccurred())
		return cfg.APIServer()
	}
	fleetLocal := func() *fleetv1alpha1.Cluster {
		GinkgoHelper()
		cl := &fleetv1alpha1.Cluster{}
		Expect(env.Client.Get(ctx, client.ObjectKey{Namespace: rancher.FleetLocal, Name: rancher.FleetLocalCluster}, cl)).To(Succeed())
		return cl
	}

	It("puts fleet-controller's API server back and has the agent redeployed before any ManagedChart is deployed, never while one is", func() {
		r := seed(oldRelease)
		settle()
		Expect(fleetAPIServer()).To(Equal(rancher.FleetAPIServer{URL: sim.FleetAPIServerURL, CA: sim.FleetAPIServerCA}))
		in := input("up-fleet")
		p := newProgress()
		steps := runStates(in, p)

		redeploys := r.FleetAgentRedeploys()
		Expect(redeploys).NotTo(BeEmpty(), "Fleet deployed the local agent after Rancher's upgrade")
		for _, d := range redeploys {
			Expect(d.ChartsInFlight).To(BeEmpty(), "the agent deployed at %s (%s) while ManagedCharts were being deployed", d.At, d.Reason)
		}
		crdChanged := r.ChartVersionSeenAt(rancher.HarvesterCRDChart, in.HarvesterChartVersion)
		Expect(crdChanged).NotTo(BeZero())
		Expect(crdChanged).To(BeTemporally(">", redeploys[len(redeploys)-1].At), "Harvester's charts change only after the agent's last redeploy")
		Expect(fleetAPIServer()).To(Equal(rancher.FleetAPIServer{URL: sim.FleetAPIServerURL, CA: sim.FleetAPIServerCA}))
		cl := fleetLocal()
		Expect(cl.Spec.RedeployAgentGeneration).To(Equal(int64(1)))
		Expect(cl.Status.AgentDeployedGeneration).To(Equal(ptr.To(int64(1))))
		Expect(cl.Annotations).To(HaveKeyWithValue(clusterupgrade.FleetAgentRedeployedAnnotation, "up-fleet"))
		step := stepNamed(steps, clusterupgrade.StepSettleFleetAgent)
		Expect(step.State).To(Equal(clusterupgrade.StateDone))
		Expect(step.Message).To(ContainSubstring(`put back apiServerURL from "" to "` + sim.FleetAPIServerURL + `", apiServerCA to the saved one`))
		Expect(step.Message).To(ContainSubstring("redeployAgentGeneration 1"))
		Expect(step.Message).To(ContainSubstring("cluster.fleet local is Ready"))

		By("a resumed run asks for no second redeploy")
		steps = runStates(in, p)
		Expect(stepNamed(steps, clusterupgrade.StepSettleFleetAgent).Message).To(ContainSubstring("done by an earlier run"))
		Expect(r.FleetAgentRedeploys()).To(HaveLen(len(redeploys)))
		Expect(fleetLocal().Spec.RedeployAgentGeneration).To(Equal(int64(1)))
	})

	It("leaves Fleet alone when Rancher was already at the release", func() {
		r := seed(sim.HarvesterRelease{Version: oldRelease.Version, Rancher: newRelease.Rancher})
		settle()
		steps := runStates(input("up-fleet-skip"), newProgress())
		Expect(stepNamed(steps, clusterupgrade.StepSettleFleetAgent).State).To(Equal(clusterupgrade.StateSkipped))
		Expect(r.FleetAgentRedeploys()).To(BeEmpty())
		Expect(fleetLocal().Spec.RedeployAgentGeneration).To(BeZero())
	})

	It("puts the saved API server back when a failed upgrade is restored", func() {
		seed(oldRelease)
		settle()
		p := newProgress()
		Expect(env.Client.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: p.ConfigMap.Namespace, Name: p.ConfigMap.Name}})).To(Succeed())
		Expect(clusterupgrade.Record(ctx, env.Client, p.ConfigMap, client.ObjectKey{Namespace: rancher.FleetNamespace, Name: rancher.FleetControllerConfigMap},
			clusterupgrade.FieldFleetAPIServer, []byte(`{"apiServerURL":"`+sim.FleetAPIServerURL+`"}`))).To(Succeed())
		cm := &corev1.ConfigMap{}
		Expect(env.Client.Get(ctx, client.ObjectKey{Namespace: rancher.FleetNamespace, Name: rancher.FleetControllerConfigMap}, cm)).To(Succeed())
		cm.Data[rancher.FleetControllerConfigKey] = "agentTLSMode: strict\napiServerURL: \"\"\napiServerCA: \"\"\n"
		Expect(env.Client.Update(ctx, cm)).To(Succeed())
		Expect(clusterupgrade.Restore(ctx, env.Client, p.ConfigMap)).To(Succeed())
		Expect(fleetAPIServer()).To(Equal(rancher.FleetAPIServer{URL: sim.FleetAPIServerURL}), "the URL recorded, the CA recorded empty and left as it is")
		Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(cm), cm)).To(Succeed())
		Expect(cm.Data[rancher.FleetControllerConfigKey]).To(ContainSubstring("agentTLSMode: strict"), "the rest of the configuration kept")
	})
})
