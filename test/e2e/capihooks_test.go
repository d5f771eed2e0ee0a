package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	runtimehooksv1 "sigs.k8s.io/cluster-api/api/runtime/hooks/v1alpha1"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/extension"
	"github.com/capi-inplace/capi-inplace/test/capisim"
	"github.com/capi-inplace/capi-inplace/test/fixtures"
	"github.com/capi-inplace/capi-inplace/test/hookclient"
	"github.com/capi-inplace/capi-inplace/test/manager"
)

// handlerFor returns the name discovery gives the handler of hook, as Cluster API's
// registry keeps it, so that the calls below use what the extension announced.
func handlerFor(resp *runtimehooksv1.DiscoveryResponse, hook string) string {
	for _, h := range resp.Handlers {
		if h.RequestHook.Hook == hook {
			return h.Name
		}
	}
	return ""
}

var _ = Describe("Cluster API's in-place update hooks over HTTPS", Ordered, func() {
	It("answers CanUpdateMachineSet with a patch Cluster API accepts, then carries every worker through UpdateMachine to done", func() {
		logFile := filepath.Join(workDir, "manager-capi.log")
		proc, err := manager.Start(manager.Options{Binary: managerBin, Kubeconfig: kubeconfig, CertDir: certs.Dir, LogFile: logFile,
			ExtraArgs: []string{"--poll-interval=200ms"}})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { Expect(proc.Stop()).To(Succeed()) })
		if err := proc.WaitReady(time.Minute); err != nil {
			log, _ := os.ReadFile(logFile)
			Fail(fmt.Sprintf("%v\nmanager log:\n%s", err, log))
		}

		// A cluster without the updater annotation: the ExtensionConfig's settings name the
		// updater, a JobUpdater whose Jobs the test completes.
		ns, err := fixtures.Namespace(ctx, env.Client, "capi")
		Expect(err).NotTo(HaveOccurred())
		_, err = fixtures.Cluster(ctx, env.Client, ns, "kubeadm", "", nil)
		Expect(err).NotTo(HaveOccurred())
		_, machines, err := fixtures.MachineDeployment(ctx, env.Client, ns, "kubeadm", "workers", "v1.35.2", 3)
		Expect(err).NotTo(HaveOccurred())
		jobUpdaterWorkload(ns, "kubeadm")
		settings := map[string]string{extension.DefaultUpdaterSetting: "JobUpdater/nodes"}

		By("discovery first, as Cluster API registers an extension")
		hooks := hookclient.New(fmt.Sprintf("https://127.0.0.1:%d", proc.WebhookPort), must(manager.ClientTLSConfig(certs.Dir)), capiCatalog())
		discovery, err := hooks.Discover(ctx)
		Expect(err).NotTo(HaveOccurred())
		canUpdateSet, update := handlerFor(discovery, "CanUpdateMachineSet"), handlerFor(discovery, "UpdateMachine")
		Expect(canUpdateSet).NotTo(BeEmpty())
		Expect(update).NotTo(BeEmpty())

		By("CanUpdateMachineSet for the version bump v1.35.2 to v1.36.3")
		ms := &clusterv1.MachineSet{}
		Expect(env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "workers-ms"}, ms)).To(Succeed())
		current := capisim.SpecOnlySet(ms)
		desired := *current.DeepCopy()
		desired.Name = "workers-ms-v1-36-3"
		desired.Spec.Template.Spec.Version = "v1.36.3"
		infraTemplate := runtime.RawExtension{Raw: []byte(fmt.Sprintf(`{"apiVersion":"infrastructure.cluster.x-k8s.io/v1beta2","kind":"DockerMachineTemplate","metadata":{"name":"workers","namespace":%q},"spec":{"template":{"spec":{"extraMounts":[]}}}}`, ns))}
		canReq := &runtimehooksv1.CanUpdateMachineSetRequest{
			CommonRequest: runtimehooksv1.CommonRequest{Settings: settings},
			Current:       runtimehooksv1.CanUpdateMachineSetRequestObjects{MachineSet: current, InfrastructureMachineTemplate: infraTemplate},
			Desired:       runtimehooksv1.CanUpdateMachineSetRequestObjects{MachineSet: desired, InfrastructureMachineTemplate: infraTemplate},
		}
		canResp := &runtimehooksv1.CanUpdateMachineSetResponse{}
		Expect(hooks.Call(ctx, runtimehooksv1.CanUpdateMachineSet, canUpdateSet, canReq, canResp)).To(Succeed())
		Expect(canResp.Status).To(Equal(runtimehooksv1.ResponseStatusSuccess), canResp.Message)
		inPlace, left, err := capisim.VerdictMachineSet(canReq, canResp)
		Expect(err).NotTo(HaveOccurred())
		Expect(inPlace).To(BeTrue(), "left: %v, message: %s", left, canResp.Message)

		By("UpdateMachine for one machine at a time (MachineDeployment maxUnavailable 1), each until done")
		call := func(ctx context.Context, req *runtimehooksv1.UpdateMachineRequest, resp *runtimehooksv1.UpdateMachineResponse) error {
			return hooks.Call(ctx, runtimehooksv1.UpdateMachine, update, req, resp)
		}
		for _, m := range machines {
			answers := 0
			mctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
			err := capisim.UpdateMachine(mctx, env.Client, call, client.ObjectKeyFromObject(m), "v1.36.3", settings, 200*time.Millisecond,
				func(*runtimehooksv1.UpdateMachineResponse) { answers++ })
			cancel()
			Expect(err).NotTo(HaveOccurred())
			Expect(answers).To(BeNumerically(">", 1), "machine %s was answered done on the first call", m.Name)
		}

		By("every machine upgraded exactly once, by one externally paced task")
		nus := &inplacev1.NodeUpdateList{}
		Expect(env.Client.List(ctx, nus, client.InNamespace(ns))).To(Succeed())
		perMachine := map[string]int{}
		for _, nu := range nus.Items {
			perMachine[nu.Spec.MachineName]++
			Expect(nu.Status.Phase).To(Equal(inplacev1.NodeUpdatePhaseSucceeded), nu.Name)
		}
		Expect(perMachine).To(Equal(map[string]int{"workers-1": 1, "workers-2": 1, "workers-3": 1}))
		tasks := &inplacev1.UpgradeTaskList{}
		Expect(env.Client.List(ctx, tasks, client.InNamespace(ns))).To(Succeed())
		Expect(tasks.Items).To(HaveLen(1))
		Expect(tasks.Items[0].Spec.Pacing).To(Equal(inplacev1.PacingExternal))
		Expect(tasks.Items[0].Spec.UpdaterRef).To(Equal(inplacev1.UpdaterReference{Kind: "JobUpdater", Name: "nodes"}))
		Eventually(func() inplacev1.TaskPhase {
			t := &inplacev1.UpgradeTask{}
			Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(&tasks.Items[0]), t)).To(Succeed())
			return t.Status.Phase
		}, 30*time.Second, 200*time.Millisecond).Should(Equal(inplacev1.TaskPhaseCompleted))
		for _, m := range machines {
			got := &clusterv1.Machine{}
			Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(m), got)).To(Succeed())
			Expect(got.Annotations).To(HaveKeyWithValue(inplacev1.UpgradeReleaseAnnotation, "v1.36.3"))
		}
	})
})
