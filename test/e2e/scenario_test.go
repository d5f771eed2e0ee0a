package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	bootstrapv1 "sigs.k8s.io/cluster-api/api/bootstrap/kubeadm/v1beta2"
	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	runtimecatalog "sigs.k8s.io/cluster-api/api/runtime/catalog"
	runtimehooksv1 "sigs.k8s.io/cluster-api/api/runtime/hooks/v1alpha1"
	runtimev1 "sigs.k8s.io/cluster-api/api/runtime/v1beta2"

	hooksv1 "github.com/capi-inplace/capi-inplace/api/hooks/v1alpha1"
	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/test/capisim"
	"github.com/capi-inplace/capi-inplace/test/hookclient"
	"github.com/capi-inplace/capi-inplace/test/manager"
	"github.com/capi-inplace/capi-inplace/test/scenario"
)

// The scenarios run the whole product as `make demo` does: a management and a workload
// API server, a Cluster of simulated Harvester nodes, the simulators, and the manager
// binary of the suite as a separate process over HTTPS. Steps are short so that a whole
// upgrade takes seconds; the safety invariants are checked from the simulators' records.
const (
	// scenarioStepDelay is how long each simulated step (a Plan's Job) takes.
	scenarioStepDelay = 200 * time.Millisecond
	// scenarioPoll is the manager's --poll-interval, and how often the specs look.
	scenarioPoll = 200 * time.Millisecond
	// upgradeTimeout bounds one whole upgrade.
	upgradeTimeout = 3 * time.Minute
)

// startScenario starts a scenario with the suite's manager binary; it is stopped when the
// spec ends, and the manager's log is shown when the spec failed.
func startScenario(name string, opts scenario.Options) *scenario.Scenario {
	dir := filepath.Join(workDir, name)
	Expect(os.MkdirAll(dir, 0o755)).To(Succeed())
	opts.WorkDir = dir
	opts.ManagerBinary = managerBin
	if opts.StepDelay == 0 {
		opts.StepDelay = scenarioStepDelay
	}
	opts.ManagerArgs = append([]string{"--poll-interval=" + scenarioPoll.String()}, opts.ManagerArgs...)
	began := time.Now()
	opts.Progress = func(stage string) { GinkgoWriter.Printf("%5.1fs %s\n", time.Since(began).Seconds(), stage) }
	setLoggerOnce.Do(func() { ctrllog.SetLogger(GinkgoLogr) })
	s, err := scenario.Start(ctx, opts)
	Expect(err).NotTo(HaveOccurred())
	GinkgoWriter.Printf("%5.1fs scenario ready\n", time.Since(began).Seconds())
	DeferCleanup(func() {
		if CurrentSpecReport().Failed() {
			showLogs(dir)
		}
		if s.Workload != nil {
			expectNoKubeconfigInLogs(s, dir)
		}
		Expect(s.Stop()).To(Succeed())
	})
	return s
}

var setLoggerOnce sync.Once

// expectNoKubeconfigInLogs checks that no manager log of the scenario carries the
// workload cluster's kubeconfig, which the manager reads from the kubeconfig Secret.
func expectNoKubeconfigInLogs(s *scenario.Scenario, dir string) {
	GinkgoHelper()
	kubeconfig, err := s.Workload.Kubeconfig()
	Expect(err).NotTo(HaveOccurred())
	needles := secretNeedles(kubeconfig)
	logs, _ := filepath.Glob(filepath.Join(dir, "manager*.log"))
	Expect(logs).NotTo(BeEmpty())
	for _, l := range logs {
		data, err := os.ReadFile(l)
		Expect(err).NotTo(HaveOccurred())
		Expect(string(data)).NotTo(ContainSubstring("PRIVATE KEY"), l)
		for _, n := range needles {
			Expect(strings.Contains(string(data), n)).To(BeFalse(), "%s carries the workload kubeconfig's secret material (%.12s...)", l, n)
		}
	}
}

// showLogs writes the end of every manager log of dir to the spec's output.
func showLogs(dir string) {
	logs, _ := filepath.Glob(filepath.Join(dir, "manager*.log"))
	for _, l := range logs {
		data, _ := os.ReadFile(l)
		if len(data) > 30000 {
			data = data[len(data)-30000:]
		}
		GinkgoWriter.Printf("\n===== %s (end) =====\n%s\n", l, data)
	}
}

// upgradedNodes are the nodes that run the target Kubernetes version and OS.
func upgradedNodes(s *scenario.Scenario) []string {
	nodes := &corev1.NodeList{}
	Expect(s.Workload.Client.List(ctx, nodes)).To(Succeed())
	var out []string
	for _, n := range nodes.Items {
		if n.Status.NodeInfo.KubeletVersion == scenario.ToVersion && n.Status.NodeInfo.OSImage == scenario.ToOSImage {
			out = append(out, n.Name)
		}
	}
	sort.Strings(out)
	return out
}

// expectInvariants fails the spec on any broken safety invariant, upgraded being the
// nodes that reached the target.
func expectInvariants(s *scenario.Scenario, upgraded []string) {
	GinkgoHelper()
	for _, c := range s.Invariants(ctx, upgraded) {
		GinkgoWriter.Printf("invariant: %s: %v %s\n", c.Name, c.OK, c.Detail)
		Expect(c.OK).To(BeTrue(), "safety invariant broken: %s: %s", c.Name, c.Detail)
	}
}

// expectAllUpgraded checks that every node reached the target, each exactly once and
// within the invariants, and that each machine had exactly one NodeUpdate.
func expectAllUpgraded(s *scenario.Scenario, nu *nodeUpdateWatch) {
	GinkgoHelper()
	all := s.NodeNames()
	sort.Strings(all)
	Eventually(func() []string { return upgradedNodes(s) }).WithPolling(scenarioPoll).Should(Equal(all))
	// The updater deletes its Plans as the node's NodeUpdate ends; give the last one time.
	Eventually(func() []scenario.Check {
		var broken []scenario.Check
		for _, c := range s.Invariants(ctx, all) {
			if !c.OK {
				broken = append(broken, c)
			}
		}
		return broken
	}).WithPolling(scenarioPoll).Should(BeEmpty())
	expectInvariants(s, all)

	machines := &clusterv1.MachineList{}
	Expect(s.Management.Client.List(ctx, machines, client.InNamespace(s.Cluster.Namespace))).To(Succeed())
	Expect(machines.Items).To(HaveLen(len(s.Nodes)))
	for _, m := range machines.Items {
		// The task writes the release once the node's NodeUpdate succeeded and it saw it.
		Eventually(func() map[string]string {
			got := &clusterv1.Machine{}
			Expect(s.Management.Client.Get(ctx, client.ObjectKeyFromObject(&m), got)).To(Succeed())
			return got.Annotations
		}).WithPolling(scenarioPoll).Should(HaveKeyWithValue(inplacev1.UpgradeReleaseAnnotation, scenario.ToVersion), "Machine %s", m.Name)
	}
	nus := &inplacev1.NodeUpdateList{}
	Expect(s.Management.Client.List(ctx, nus, client.InNamespace(s.Cluster.Namespace))).To(Succeed())
	perMachine := map[string]int{}
	for _, n := range nus.Items {
		perMachine[n.Spec.MachineName]++
		Expect(n.Status.Phase).To(Equal(inplacev1.NodeUpdatePhaseSucceeded), "NodeUpdate %s", n.Name)
	}
	want := map[string]int{}
	for _, n := range s.Nodes {
		want[n.Machine] = 1
	}
	Expect(perMachine).To(Equal(want), "NodeUpdates per machine at the end")
	if nu != nil {
		Expect(nu.created()).To(Equal(want), "NodeUpdates ever created per machine (from a watch)")
	}
}

// nodeUpdateWatch records every NodeUpdate ever created in a namespace, by machine, from
// a watch, so that a NodeUpdate deleted and created again for a machine is seen.
type nodeUpdateWatch struct {
	mu   sync.Mutex
	uids map[string]map[types.UID]bool
	// first names the machines in the order their first NodeUpdate was seen: creation
	// order, as a watch delivers in the order of the store's revisions.
	first []string
}

func (w *nodeUpdateWatch) record(n *inplacev1.NodeUpdate) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.uids[n.Spec.MachineName] == nil {
		w.uids[n.Spec.MachineName] = map[types.UID]bool{}
		w.first = append(w.first, n.Spec.MachineName)
	}
	w.uids[n.Spec.MachineName][n.UID] = true
}

func watchNodeUpdates(s *scenario.Scenario) *nodeUpdateWatch {
	wc, err := client.NewWithWatch(s.Management.Config, client.Options{Scheme: s.Management.Scheme})
	Expect(err).NotTo(HaveOccurred())
	w := &nodeUpdateWatch{uids: map[string]map[types.UID]bool{}}
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	DeferCleanup(func() { cancel(); <-done })
	// start watches from rv; expired says the server no longer has rv (410 Gone).
	start := func(rv string) (wi watch.Interface, expired bool) {
		list := &inplacev1.NodeUpdateList{}
		var opts []client.ListOption
		opts = append(opts, client.InNamespace(s.Cluster.Namespace))
		if rv != "" {
			opts = append(opts, &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: rv}})
		}
		wi, err := wc.Watch(wctx, list, opts...)
		if err != nil {
			return nil, apierrors.IsResourceExpired(err) || apierrors.IsGone(err)
		}
		return wi, false
	}
	// relist records every NodeUpdate there is and returns the list's resourceVersion.
	relist := func() (string, bool) {
		list := &inplacev1.NodeUpdateList{}
		if err := wc.List(wctx, list, client.InNamespace(s.Cluster.Namespace)); err != nil {
			return "", false
		}
		for i := range list.Items {
			w.record(&list.Items[i])
		}
		return list.ResourceVersion, true
	}
	wi, _ := start("")
	Expect(wi).NotTo(BeNil())
	go func() {
		defer close(done)
		rv := ""
		for {
			expired := false
			for ev := range wi.ResultChan() {
				switch o := ev.Object.(type) {
				case *inplacev1.NodeUpdate:
					rv = o.ResourceVersion
					if ev.Type == watch.Added {
						w.record(o)
					}
				case *metav1.Status:
					expired = o.Code == http.StatusGone
				}
			}
			if wctx.Err() != nil {
				return
			}
			// The server closed the watch: watch again from where it stopped. A restarted
			// API server no longer has that version (its watch cache starts afresh and
			// answers 410 Gone): then record what a new list holds and watch from there.
			for {
				if expired {
					if listRV, ok := relist(); ok {
						rv, expired = listRV, false
					}
				}
				if !expired {
					if wi, expired = start(rv); wi != nil {
						break
					}
				}
				if wctx.Err() != nil {
					return
				}
				time.Sleep(scenarioPoll)
			}
		}
	}()
	return w
}

// firstOrder names the machines in the order their first NodeUpdate was created.
func (w *nodeUpdateWatch) firstOrder() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.first)
}

// created counts the NodeUpdates ever created per machine.
func (w *nodeUpdateWatch) created() map[string]int {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := map[string]int{}
	for m, uids := range w.uids {
		out[m] = len(uids)
	}
	return out
}

// annotateCluster asks for the upgrade as a user does: the in-place-upgrade-to annotation.
func annotateCluster(s *scenario.Scenario) {
	GinkgoHelper()
	cluster := &clusterv1.Cluster{}
	Expect(s.Management.Client.Get(ctx, client.ObjectKeyFromObject(s.Cluster), cluster)).To(Succeed())
	patch := client.MergeFrom(cluster.DeepCopy())
	if cluster.Annotations == nil {
		cluster.Annotations = map[string]string{}
	}
	cluster.Annotations[inplacev1.UpgradeToAnnotation] = scenario.ToVersion
	Expect(s.Management.Client.Patch(ctx, cluster, patch)).To(Succeed())
}

// clusterStatus is the Cluster's in-place-upgrade-status and -message annotations.
func clusterStatus(s *scenario.Scenario) (string, string) {
	cluster := &clusterv1.Cluster{}
	if err := s.Management.Client.Get(ctx, client.ObjectKeyFromObject(s.Cluster), cluster); err != nil {
		return "", err.Error()
	}
	return cluster.Annotations[inplacev1.UpgradeStatusAnnotation], cluster.Annotations[inplacev1.UpgradeMessageAnnotation]
}

// waitClusterStatus waits until the Cluster's upgrade status is final and returns it.
func waitClusterStatus(s *scenario.Scenario, timeout time.Duration) (string, string) {
	GinkgoHelper()
	var status, message string
	Eventually(func() string {
		status, message = clusterStatus(s)
		return status
	}, timeout, scenarioPoll).Should(BeElementOf(inplacev1.UpgradeStatusDone, inplacev1.UpgradeStatusFailed))
	return status, message
}

func waitTask(s *scenario.Scenario, name string) *inplacev1.UpgradeTask {
	GinkgoHelper()
	task := &inplacev1.UpgradeTask{}
	Eventually(func() bool {
		return s.Management.Client.Get(ctx, client.ObjectKey{Namespace: s.Cluster.Namespace, Name: name}, task) == nil && task.Status.Phase.IsFinal()
	}, upgradeTimeout, scenarioPoll).Should(BeTrue(), "UpgradeTask %s did not end", name)
	return task
}

var _ = Describe("The three ways of asking for an upgrade, on a management and a workload cluster", func() {
	It("upgrades every node by the in-place-upgrade-to annotation on the Cluster", func() {
		s := startScenario("annotation", scenario.Options{Namespace: "annotation"})
		nu := watchNodeUpdates(s)

		By("kubectl annotate cluster ... in-place-upgrade-to=" + scenario.ToVersion)
		annotateCluster(s)
		status, message := waitClusterStatus(s, upgradeTimeout)
		Expect(status).To(Equal(inplacev1.UpgradeStatusDone), message)

		By("every node upgraded exactly once, control plane first, within maxUnavailable, no Plan left")
		expectAllUpgraded(s, nu)
		for _, obj := range []client.Object{&controlplanev1.KubeadmControlPlane{}, &clusterv1.MachineDeployment{}} {
			key := client.ObjectKeyFromObject(s.ControlPlane)
			if _, ok := obj.(*clusterv1.MachineDeployment); ok {
				key = client.ObjectKeyFromObject(s.MachineDeployment)
			}
			Expect(s.Management.Client.Get(ctx, key, obj)).To(Succeed())
			Expect(obj.GetAnnotations()).To(HaveKeyWithValue(inplacev1.UpgradeStatusAnnotation, inplacev1.UpgradeStatusDone), "%T %s", obj, key)
		}
	})

	It("upgrades the control plane then the MachineDeployment by ExternalUpgradeRequests over HTTPS", func() {
		s := startScenario("hook", scenario.Options{Namespace: "hook", WorkerMaxUnavailable: 2})
		nu := watchNodeUpdates(s)
		hooks := hookclient.New(fmt.Sprintf("https://127.0.0.1:%d", s.Manager.ExternalHookPort), must(manager.ClientTLSConfig(s.Certs.Dir)), externalCatalog())
		discovery, err := hooks.Discover(ctx)
		Expect(err).NotTo(HaveOccurred())
		handler := handlerFor(discovery, "ExternalUpgradeRequest")
		Expect(handler).NotTo(BeEmpty())

		request := func(req *hooksv1.ExternalUpgradeRequestRequest) *inplacev1.UpgradeTask {
			req.Cluster.Namespace, req.Cluster.Name = s.Cluster.Namespace, s.Cluster.Name
			req.NewMachineSpec = hooksv1.NewMachineSpec{Version: scenario.ToVersion}
			resp := &hooksv1.ExternalUpgradeRequestResponse{}
			Expect(hooks.Call(ctx, hooksv1.ExternalUpgradeRequest, handler, req, resp)).To(Succeed())
			Expect(resp.Status).To(Equal(runtimehooksv1.ResponseStatusSuccess), resp.Message)
			Expect(resp.Decision).To(Equal(hooksv1.DecisionAccept), resp.Message)
			return waitTask(s, resp.UpgradeTaskName)
		}

		By("ExternalUpgradeRequest for the KubeadmControlPlane, to its end")
		task := request(&hooksv1.ExternalUpgradeRequestRequest{
			ControlPlaneRef: &inplacev1.ControlPlaneReference{APIGroup: controlplanev1.GroupVersion.Group, Kind: "KubeadmControlPlane", Name: s.ControlPlane.Name},
		})
		Expect(task.Status.Phase).To(Equal(inplacev1.TaskPhaseCompleted), taskConditions(task))

		By("then for the MachineDeployment, with its maxUnavailable of 2")
		task = request(&hooksv1.ExternalUpgradeRequestRequest{
			MachineDeploymentRef: &inplacev1.MachineDeploymentReference{Name: s.MachineDeployment.Name},
			Options:              hooksv1.UpgradeOptions{MaxUnavailable: s.MachineDeployment.Spec.Rollout.Strategy.RollingUpdate.MaxUnavailable},
		})
		Expect(task.Status.Phase).To(Equal(inplacev1.TaskPhaseCompleted), taskConditions(task))
		expectAllUpgraded(s, nu)
	})

	It("upgrades every node through Cluster API's hook sequence: CanUpdateMachine[Set], then UpdateMachine per machine", func() {
		s := startScenario("capi", scenario.Options{Namespace: "capi", WorkerMaxUnavailable: 2})
		nu := watchNodeUpdates(s)
		hooks := hookclient.New(fmt.Sprintf("https://127.0.0.1:%d", s.Manager.WebhookPort), must(manager.ClientTLSConfig(s.Certs.Dir)), capiCatalog())
		discovery, err := hooks.Discover(ctx)
		Expect(err).NotTo(HaveOccurred())
		canUpdateMachine, canUpdateSet, update := handlerFor(discovery, "CanUpdateMachine"), handlerFor(discovery, "CanUpdateMachineSet"), handlerFor(discovery, "UpdateMachine")
		Expect([]string{canUpdateMachine, canUpdateSet, update}).NotTo(ContainElement(BeEmpty()))
		mc := s.Management.Client
		ns := s.Cluster.Namespace
		updateMachine := func(name string, controlPlane bool) error {
			calls := 0
			// A liveness bound: the first machine waits for the whole cluster step, which
			// took over a minute on a loaded 2-core machine.
			mctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
			defer cancel()
			err := capisim.UpdateMachineWith(mctx, mc, func(ctx context.Context, req *runtimehooksv1.UpdateMachineRequest, resp *runtimehooksv1.UpdateMachineResponse) error {
				return hooks.Call(ctx, runtimehooksv1.UpdateMachine, update, req, resp)
			}, client.ObjectKey{Namespace: ns, Name: name}, scenario.ToVersion, capisim.UpdateOptions{
				Poll:        scenarioPoll,
				Progress:    func(*runtimehooksv1.UpdateMachineResponse) { calls++ },
				Annotations: map[string]string{runtimev1.PendingHooksAnnotation: runtimecatalog.HookName(runtimehooksv1.UpdateMachine)},
				Objects: func(m *clusterv1.Machine, desired *runtimehooksv1.UpdateMachineRequestObjects) {
					desired.InfrastructureMachine = harvesterMachine(m, true)
					if controlPlane {
						desired.BootstrapConfig = kubeadmConfig(m, true)
					}
				},
			})
			if err == nil && calls < 2 {
				return fmt.Errorf("machine %s was answered done on the first UpdateMachine call", name)
			}
			return err
		}

		By("KubeadmControlPlane: CanUpdateMachine judged as KCP does, then UpdateMachine to done, one machine at a time")
		for _, n := range s.Nodes {
			if !n.ControlPlane {
				continue
			}
			m := &clusterv1.Machine{}
			Expect(mc.Get(ctx, client.ObjectKey{Namespace: ns, Name: n.Machine}, m)).To(Succeed())
			desired := m.DeepCopy()
			desired.Spec.Version = scenario.ToVersion
			req := &runtimehooksv1.CanUpdateMachineRequest{
				Current: runtimehooksv1.CanUpdateMachineRequestObjects{Machine: capisim.SpecOnly(m), InfrastructureMachine: harvesterMachine(m, false), BootstrapConfig: kubeadmConfig(m, false)},
				Desired: runtimehooksv1.CanUpdateMachineRequestObjects{Machine: capisim.SpecOnly(desired), InfrastructureMachine: harvesterMachine(desired, false), BootstrapConfig: kubeadmConfig(desired, false)},
			}
			resp := &runtimehooksv1.CanUpdateMachineResponse{}
			Expect(hooks.Call(ctx, runtimehooksv1.CanUpdateMachine, canUpdateMachine, req, resp)).To(Succeed())
			Expect(resp.Status).To(Equal(runtimehooksv1.ResponseStatusSuccess), resp.Message)
			inPlace, left, err := capisim.VerdictMachine(req, resp)
			Expect(err).NotTo(HaveOccurred())
			Expect(inPlace).To(BeTrue(), "Machine %s: left %v, message %s", n.Machine, left, resp.Message)
			Expect(updateMachine(n.Machine, true)).To(Succeed())
		}

		By("MachineDeployment: CanUpdateMachineSet judged as CAPI does, then UpdateMachine, at most maxUnavailable (2) at once")
		sets := &clusterv1.MachineSetList{}
		Expect(mc.List(ctx, sets, client.InNamespace(ns), client.MatchingLabels{clusterv1.MachineDeploymentNameLabel: s.MachineDeployment.Name})).To(Succeed())
		Expect(sets.Items).To(HaveLen(1))
		current := capisim.SpecOnlySet(&sets.Items[0])
		desired := *current.DeepCopy()
		desired.Name = current.Name + "-v1-33-3"
		desired.Spec.Template.Spec.Version = scenario.ToVersion
		canReq := &runtimehooksv1.CanUpdateMachineSetRequest{
			Current: runtimehooksv1.CanUpdateMachineSetRequestObjects{MachineSet: current, InfrastructureMachineTemplate: harvesterTemplate(&current)},
			Desired: runtimehooksv1.CanUpdateMachineSetRequestObjects{MachineSet: desired, InfrastructureMachineTemplate: harvesterTemplate(&desired)},
		}
		canResp := &runtimehooksv1.CanUpdateMachineSetResponse{}
		Expect(hooks.Call(ctx, runtimehooksv1.CanUpdateMachineSet, canUpdateSet, canReq, canResp)).To(Succeed())
		Expect(canResp.Status).To(Equal(runtimehooksv1.ResponseStatusSuccess), canResp.Message)
		inPlace, left, err := capisim.VerdictMachineSet(canReq, canResp)
		Expect(err).NotTo(HaveOccurred())
		Expect(inPlace).To(BeTrue(), "left %v, message %s", left, canResp.Message)

		slots := make(chan struct{}, s.Options.WorkerMaxUnavailable)
		errs := make(chan error, len(s.Nodes))
		var wg sync.WaitGroup
		for _, n := range s.Nodes {
			if n.ControlPlane {
				continue
			}
			slots <- struct{}{}
			wg.Add(1)
			go func(name string) {
				defer GinkgoRecover()
				defer wg.Done()
				defer func() { <-slots }()
				errs <- updateMachine(name, false)
			}(n.Machine)
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			Expect(err).NotTo(HaveOccurred())
		}
		expectAllUpgraded(s, nu)
		machines := &clusterv1.MachineList{}
		Expect(mc.List(ctx, machines, client.InNamespace(ns))).To(Succeed())
		for _, m := range machines.Items {
			Expect(m.Annotations).NotTo(HaveKey(clusterv1.UpdateInProgressAnnotation), "Machine %s", m.Name)
		}
	})
})

var _ = Describe("A node that fails its upgrade", func() {
	It("stops the task and shows the node's own message on the NodeUpdate, UpgradeTask, Machine, MachineDeployment and Cluster", func() {
		s := startScenario("failure", scenario.Options{Namespace: "failure"})
		const message = "elemental upgrade failed with return code: 33 (failure injected by the e2e suite)"
		failed, ok := s.Node("workers-2")
		Expect(ok).To(BeTrue())
		Expect(s.FailNode(failed.Machine, message)).To(Succeed())

		annotateCluster(s)
		status, clusterMessage := waitClusterStatus(s, upgradeTimeout)
		Expect(status).To(Equal(inplacev1.UpgradeStatusFailed))
		Expect(clusterMessage).To(ContainSubstring(message), "the Cluster's %s", inplacev1.UpgradeMessageAnnotation)

		By("the task stops: no node starts after the failed one")
		started := func() []string {
			var out []string
			for node := range scenario.NodesUpgraded(s.Record.Runs()) {
				out = append(out, node)
			}
			sort.Strings(out)
			return out
		}
		var want []string
		for _, n := range s.Nodes {
			if n.Machine != "workers-3" {
				want = append(want, n.Name)
			}
		}
		sort.Strings(want)
		Consistently(started, 3*time.Second, scenarioPoll).Should(Equal(want))
		mc := s.Management.Client
		ns := s.Cluster.Namespace
		nus := &inplacev1.NodeUpdateList{}
		Expect(mc.List(ctx, nus, client.InNamespace(ns))).To(Succeed())
		var failedNU *inplacev1.NodeUpdate
		for i := range nus.Items {
			Expect(nus.Items[i].Spec.MachineName).NotTo(Equal("workers-3"), "a NodeUpdate was created after the failure")
			if nus.Items[i].Spec.MachineName == failed.Machine {
				failedNU = &nus.Items[i]
			}
		}
		upgraded := upgradedNodes(s)
		Expect(upgraded).To(ConsistOf(s.Nodes[0].Name, s.Nodes[1].Name, s.Nodes[2].Name, s.Nodes[3].Name))
		expectInvariants(s, upgraded)

		By("the NodeUpdate: phase Failed, status.failureMessage the node's message")
		Expect(failedNU).NotTo(BeNil())
		Expect(failedNU.Status.Phase).To(Equal(inplacev1.NodeUpdatePhaseFailed))
		Expect(failedNU.Status.FailureMessage).To(ContainSubstring(message))

		By("the UpgradeTask: Degraded with the message, the machine Failed with it, the next one never started")
		tasks := &inplacev1.UpgradeTaskList{}
		Expect(mc.List(ctx, tasks, client.InNamespace(ns))).To(Succeed())
		var task *inplacev1.UpgradeTask
		for i := range tasks.Items {
			for _, m := range tasks.Items[i].Status.Machines {
				if m.Name == failed.Machine {
					task = &tasks.Items[i]
				}
			}
		}
		Expect(task).NotTo(BeNil(), "no UpgradeTask lists machine %s", failed.Machine)
		Expect(task.Status.Phase).To(Equal(inplacev1.TaskPhaseFailed))
		degraded := meta.FindStatusCondition(task.Status.Conditions, inplacev1.DegradedCondition)
		Expect(degraded).NotTo(BeNil())
		Expect(degraded.Status).To(Equal(metav1.ConditionTrue))
		Expect(degraded.Message).To(ContainSubstring(message))
		states := map[string]inplacev1.MachineState{}
		for _, m := range task.Status.Machines {
			states[m.Name] = m.State
			if m.Name == failed.Machine {
				Expect(m.Message).To(ContainSubstring(message))
			}
		}
		Expect(states).To(Equal(map[string]inplacev1.MachineState{
			"workers-1": inplacev1.MachineStateUpgraded, "workers-2": inplacev1.MachineStateFailed, "workers-3": inplacev1.MachineStateWaiting,
		}))

		By("the Machine: InPlaceUpgradeUpToDate False, reason Failed, the node's message")
		m := &clusterv1.Machine{}
		Expect(mc.Get(ctx, client.ObjectKey{Namespace: ns, Name: failed.Machine}, m)).To(Succeed())
		cond := meta.FindStatusCondition(m.Status.Conditions, inplacev1.InPlaceUpgradeUpToDateCondition)
		Expect(cond).NotTo(BeNil())
		Expect(cond.Status).To(Equal(metav1.ConditionFalse))
		Expect(cond.Reason).To(Equal(inplacev1.FailedReason))
		Expect(cond.Message).To(ContainSubstring(message))

		By("the MachineDeployment failed with the message; the control plane done")
		md := &clusterv1.MachineDeployment{}
		Expect(mc.Get(ctx, client.ObjectKeyFromObject(s.MachineDeployment), md)).To(Succeed())
		Expect(md.Annotations).To(HaveKeyWithValue(inplacev1.UpgradeStatusAnnotation, inplacev1.UpgradeStatusFailed))
		Expect(md.Annotations[inplacev1.UpgradeMessageAnnotation]).To(ContainSubstring(message))
		kcp := &controlplanev1.KubeadmControlPlane{}
		Expect(mc.Get(ctx, client.ObjectKeyFromObject(s.ControlPlane), kcp)).To(Succeed())
		Expect(kcp.Annotations).To(HaveKeyWithValue(inplacev1.UpgradeStatusAnnotation, inplacev1.UpgradeStatusDone))
	})
})

func taskConditions(task *inplacev1.UpgradeTask) string {
	var out []string
	for _, c := range task.Status.Conditions {
		out = append(out, fmt.Sprintf("%s=%s %s: %s", c.Type, c.Status, c.Reason, c.Message))
	}
	return strings.Join(out, "; ")
}

// rawObject is an object as Cluster API's cleanupUnstructured leaves it in a hook
// request, serialized.
func rawObject(apiVersion, kind, name, namespace string, inProgress bool, spec map[string]any) runtime.RawExtension {
	metadata := map[string]any{"name": name, "namespace": namespace}
	if inProgress {
		metadata["annotations"] = map[string]any{clusterv1.UpdateInProgressAnnotation: ""}
	}
	data, err := json.Marshal(map[string]any{"apiVersion": apiVersion, "kind": kind, "metadata": metadata, "spec": spec})
	Expect(err).NotTo(HaveOccurred())
	return runtime.RawExtension{Raw: data}
}

// harvesterMachine stands for the machine's HarvesterMachine; the upgrade leaves it as it is.
func harvesterMachine(m *clusterv1.Machine, inProgress bool) runtime.RawExtension {
	ref := m.Spec.InfrastructureRef
	return rawObject(ref.APIGroup+"/v1beta1", ref.Kind, m.Name, m.Namespace, inProgress, map[string]any{"providerID": "harvester://" + m.Name})
}

func harvesterTemplate(ms *clusterv1.MachineSet) runtime.RawExtension {
	ref := ms.Spec.Template.Spec.InfrastructureRef
	return rawObject(ref.APIGroup+"/v1beta1", ref.Kind+"Template", ref.Name, ms.Namespace, false, map[string]any{"template": map[string]any{"spec": map[string]any{}}})
}

// kubeadmConfig stands for a control plane machine's KubeadmConfig; the upgrade leaves it
// as it is.
func kubeadmConfig(m *clusterv1.Machine, inProgress bool) runtime.RawExtension {
	return rawObject(bootstrapv1.GroupVersion.String(), "KubeadmConfig", m.Name, m.Namespace, inProgress,
		map[string]any{"joinConfiguration": map[string]any{"nodeRegistration": map[string]any{"name": m.Name}}})
}
