package e2e

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/controllers/upgraderequest"
	"github.com/capi-inplace/capi-inplace/test/manager"
	"github.com/capi-inplace/capi-inplace/test/scenario"
)

// The manager's leader election timing: controller-runtime's defaults, which main.go
// keeps. The leader renews its Lease every retryPeriod; a renewal that does not succeed
// within renewDeadline loses the Lease, and controller-runtime's manager then stops with
// "leader election lost" (main.go exits 1, and a Deployment's kubelet starts it again).
// A new process takes a Lease over only leaseDuration after it first saw it unchanged.
const (
	leaseDuration = 15 * time.Second
	renewDeadline = 10 * time.Second
	retryPeriod   = 2 * time.Second
)

// The management API server's outages, as the manager sees them: from the first request
// refused while kube-apiserver stops (ending the open watches) to the first answered
// while it starts again, measured by outageProbe. The leader's renewal of its Lease (a
// try every retryPeriod, for renewDeadline) outlasts every outage shorter than
// renewDeadline-retryPeriod, and none longer than renewDeadline+retryPeriod.
const (
	// shortAPIServerDown makes an outage of about 5-7s (more on a loaded machine): longer
	// than the leader election client's timeout (renewDeadline/2 = 5s), shorter than any
	// renewal.
	shortAPIServerDown = 3 * time.Second
	// survivable is the longest outage every renewal outlasts.
	survivable = renewDeadline - retryPeriod
	// hopeless is the shortest outage no renewal outlasts.
	hopeless = renewDeadline + retryPeriod
)

// nodesStarted counts the nodes whose own upgrade started (a drain, RKE2 or OS Plan: the
// UpgradePlan preloads every node before any starts).
func nodesStarted(s *scenario.Scenario) int {
	return len(scenario.NodesUpgraded(s.Record.Runs()))
}

// managerLogSize is the size of the scenario's manager log (every manager process of the
// scenario appends to it), to read what was logged after.
func managerLogSize(s *scenario.Scenario) int64 {
	fi, err := os.Stat(s.ManagerLog)
	Expect(err).NotTo(HaveOccurred())
	return fi.Size()
}

// managerLogSince is what the managers logged after offset.
func managerLogSince(s *scenario.Scenario, offset int64) string {
	data, err := os.ReadFile(s.ManagerLog)
	Expect(err).NotTo(HaveOccurred())
	return string(data[offset:])
}

// managerExited reports whether the scenario's manager process ended on its own.
func managerExited(s *scenario.Scenario) bool {
	exited, _ := s.Manager.Exited()
	return exited
}

// outageProbe measures an outage of the management API server as the manager's leader
// election sees it: it reads the manager's Lease every 50ms, and the outage is from the
// first read that failed to the first that succeeded after it.
type outageProbe struct {
	stop          chan struct{}
	stopOnce      sync.Once
	done          chan struct{}
	failed, whole time.Time
}

func probeOutage(s *scenario.Scenario) *outageProbe {
	p := &outageProbe{stop: make(chan struct{}), done: make(chan struct{})}
	DeferCleanup(p.halt)
	go func() {
		defer close(p.done)
		for {
			rctx, cancel := context.WithTimeout(ctx, time.Second)
			at := time.Now()
			err := s.Management.Client.Get(rctx, client.ObjectKey{Namespace: "default", Name: leaseName}, &coordinationv1.Lease{})
			cancel()
			switch {
			case err != nil && p.failed.IsZero():
				p.failed = at
			case err == nil && !p.failed.IsZero():
				p.whole = at
				return
			}
			select {
			case <-p.stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
	return p
}

// halt stops the probe and waits for it.
func (p *outageProbe) halt() {
	p.stopOnce.Do(func() { close(p.stop) })
	<-p.done
}

// outage waits until the API server answered again and returns how long it did not.
func (p *outageProbe) outage() time.Duration {
	GinkgoHelper()
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		p.halt()
	}
	Expect(p.failed.IsZero()).To(BeFalse(), "no read of the Lease failed: the API server never went away")
	Expect(p.whole.IsZero()).To(BeFalse(), "the API server does not answer again")
	return p.whole.Sub(p.failed)
}

// leaseRenewed is when holder last renewed the manager's Lease; zero when it does not
// hold it.
func leaseRenewed(s *scenario.Scenario, holder string) time.Time {
	lease := &coordinationv1.Lease{}
	err := s.Management.Client.Get(ctx, client.ObjectKey{Namespace: "default", Name: leaseName}, lease)
	if err != nil || lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity != holder || lease.Spec.RenewTime == nil {
		return time.Time{}
	}
	return lease.Spec.RenewTime.Time
}

// waitMidUpgrade waits until upgrade Plans started on nodes nodes, and checks that the
// upgrade is under way and not about to end.
func waitMidUpgrade(s *scenario.Scenario, nodes int) {
	GinkgoHelper()
	Eventually(func() int { return nodesStarted(s) }, upgradeTimeout, 20*time.Millisecond).Should(BeNumerically(">=", nodes))
	status, message := clusterStatus(s)
	Expect(status).To(Equal(inplacev1.UpgradeStatusInProgress), "the outage must come mid-upgrade (%s)", message)
	upgraded := len(upgradedNodes(s))
	Expect(upgraded).To(BeNumerically("<", len(s.Nodes)-1), "the outage must come mid-upgrade")
	nus := &inplacev1.NodeUpdateList{}
	Expect(s.Management.Client.List(ctx, nus, client.InNamespace(s.Cluster.Namespace))).To(Succeed())
	var running []string
	for _, n := range nus.Items {
		if !n.Status.Phase.IsFinal() {
			running = append(running, n.Spec.MachineName)
		}
	}
	By(fmt.Sprintf("%d nodes started, %d upgraded; %d NodeUpdates, running: %v", nodesStarted(s), upgraded, len(nus.Items), running))
}

var _ = Describe("The management API server restarted mid-upgrade", func() {
	It("loses nothing: the upgrade resumes and completes, each node once, within maxUnavailable, through a short and a long outage", func() {
		// Leader election is on, as the manager is deployed (the flag's default). What
		// happens, and what the spec asserts:
		// - an outage the Lease renewal outlasts: the manager keeps running and leading;
		//   its watches fail and are made again, its requests fail and are retried, and
		//   the upgrade goes on where it was once the API server answers;
		// - a longer outage: the renewal runs out of time and controller-runtime's manager
		//   stops with "leader election lost" (main.go exits 1) while the API server is
		//   still down. Started again at once, as a Deployment's kubelet does, the new
		//   process waits for the API server, takes the Lease over once it has seen it
		//   unrenewed for leaseDuration, and finishes the upgrade from the API objects.
		s := startScenario("apiserver-restart", scenario.Options{
			Namespace: "apiserver-restart", ControlPlaneMachines: 3, Workers: 3,
			StepDelay:   300 * time.Millisecond,
			ManagerArgs: []string{"--leader-elect=true", "--leader-election-namespace=default"},
		})
		nu := watchNodeUpdates(s)
		Eventually(func() bool { return isLeader(s.Manager) }, time.Minute, scenarioPoll).Should(BeTrue())
		holder := leaseHolder(s)
		Expect(holder).NotTo(BeEmpty())
		annotateCluster(s)

		By("outage 1, short: while the second control plane node is being upgraded, kube-apiserver restarted")
		waitMidUpgrade(s, 2)
		logFrom := managerLogSize(s)
		probe := probeOutage(s)
		began := time.Now()
		Expect(s.Management.StopAPIServer()).To(Succeed())
		stopping := time.Since(began)
		time.Sleep(shortAPIServerDown)
		Expect(s.Management.StartAPIServer()).To(Succeed())
		starting := time.Since(began) - stopping - shortAPIServerDown
		outage := probe.outage()
		By(fmt.Sprintf("kube-apiserver answered again after an outage of %s (stopping took %s, down %s, starting %s)",
			outage.Round(100*time.Millisecond), stopping.Round(100*time.Millisecond), shortAPIServerDown, starting.Round(100*time.Millisecond)))
		AddReportEntry("short outage", outage.String())
		Expect(managerLogSince(s, logFrom)).To(ContainSubstring("connection refused"), "the manager did not see the outage")
		// Either the manager renews its Lease now that the API server answers, or the
		// renewal ran out of time during the outage and the manager stopped.
		Eventually(func() bool { return managerExited(s) || leaseRenewed(s, holder).After(probe.whole) }, renewDeadline, scenarioPoll).
			Should(BeTrue(), "the manager neither renewed its Lease nor stopped after an outage of %s", outage)
		if outage < survivable {
			// Whatever the moment the outage began, a try of the renewal came after it.
			Expect(managerExited(s)).To(BeFalse(), "the manager exited after an outage of %s, shorter than any renewal", outage)
		}
		if managerExited(s) {
			// Only on a loaded machine, where kube-apiserver is slow to start: whether an
			// outage between survivable and hopeless outlasts the renewal depends on where
			// in its retry period it began.
			By(fmt.Sprintf("an outage of %s cost the manager its Lease: start it again", outage))
			Expect(managerLogSince(s, logFrom)).To(ContainSubstring("leader election lost"))
			Expect(s.Manager.Kill()).To(Succeed()) // releases its log
			restartManager(s)
			Eventually(func() bool { return isLeader(s.Manager) }, leaseDuration+renewDeadline, scenarioPoll).Should(BeTrue())
			holder = leaseHolder(s)
		} else {
			By("the manager rode it out: the same process renewed its Lease once the API server answered")
			Expect(isLeader(s.Manager)).To(BeTrue())
		}

		By("outage 2, long: while the first worker is being upgraded, kube-apiserver down until the manager gives up")
		waitMidUpgrade(s, s.Options.ControlPlaneMachines+1)
		logFrom = managerLogSize(s)
		probe = probeOutage(s)
		began = time.Now()
		Expect(s.Management.StopAPIServer()).To(Succeed())
		Eventually(func() bool { return managerExited(s) }, hopeless+5*time.Second, 100*time.Millisecond).Should(BeTrue(),
			"the manager still runs %s into the outage, longer than any Lease renewal", time.Since(began))
		gaveUp := time.Since(began)
		By(fmt.Sprintf("the manager stopped %s into the outage: it could not renew its Lease", gaveUp.Round(100*time.Millisecond)))
		Expect(gaveUp).To(BeNumerically(">=", survivable), "the manager stopped sooner than a Lease renewal can fail")
		_, exitErr := s.Manager.Exited()
		Expect(exitErr).To(HaveOccurred(), "a manager that lost its Lease exits non-zero")
		Expect(managerLogSince(s, logFrom)).To(ContainSubstring("leader election lost"))
		Expect(s.Manager.Kill()).To(Succeed()) // releases its log

		By("started again at once, as a Deployment's kubelet does, while kube-apiserver is still down")
		proc, err := manager.Start(manager.Options{
			Binary: s.Options.ManagerBinary, Kubeconfig: s.ManagementKubeconfig, CertDir: s.Certs.Dir,
			LogFile: s.ManagerLog, ExtraArgs: s.Options.ManagerArgs,
		})
		Expect(err).NotTo(HaveOccurred())
		s.Manager = proc
		Expect(s.Management.StartAPIServer()).To(Succeed())
		outage = probe.outage()
		By(fmt.Sprintf("kube-apiserver answered again after an outage of %s", outage.Round(100*time.Millisecond)))
		AddReportEntry("long outage", outage.String())
		Expect(managerExited(s)).To(BeFalse(), "the manager started while the API server was down exited")
		Expect(s.Manager.WaitReady(time.Minute)).To(Succeed())

		By(fmt.Sprintf("the new process takes the Lease over once it saw it unrenewed for %s", leaseDuration))
		Eventually(func() bool { return isLeader(s.Manager) }, leaseDuration+renewDeadline, scenarioPoll).Should(BeTrue())
		Expect(leaseHolder(s)).NotTo(BeElementOf(holder, ""))

		By("the upgrade resumes and completes")
		status, message := waitClusterStatus(s, upgradeTimeout)
		Expect(status).To(Equal(inplacev1.UpgradeStatusDone), message)

		By("every node upgraded exactly once, control plane first, within maxUnavailable, one NodeUpdate ever per machine")
		expectAllUpgraded(s, nu)

		By("both UpgradeTasks Completed, every machine Upgraded through its deterministically named NodeUpdate, never more than maxUnavailable down")
		tasks := &inplacev1.UpgradeTaskList{}
		Expect(s.Management.Client.List(ctx, tasks, client.InNamespace(s.Cluster.Namespace))).To(Succeed())
		Expect(tasks.Items).To(HaveLen(2), "one UpgradeTask for the control plane, one for the MachineDeployment")
		inTask := map[string]string{}
		for _, task := range tasks.Items {
			Expect(task.Status.Phase).To(Equal(inplacev1.TaskPhaseCompleted), "UpgradeTask %s: %s", task.Name, taskConditions(&task))
			n := int32(len(task.Status.Machines))
			Expect([]int32{task.Status.Total, task.Status.Upgraded, task.Status.InProgress, task.Status.Failed, task.Status.Waiting}).
				To(Equal([]int32{n, n, 0, 0, 0}), "UpgradeTask %s: total, upgraded, in progress, failed, waiting", task.Name)
			var nodes []string
			for _, m := range task.Status.Machines {
				Expect(m.State).To(Equal(inplacev1.MachineStateUpgraded), "machine %s of UpgradeTask %s: %s", m.Name, task.Name, m.Message)
				Expect(m.NodeUpdate).To(Equal(upgraderequest.NodeUpdateName(task.Name, m.Name)), "machine %s", m.Name)
				Expect(inTask).NotTo(HaveKey(m.Name), "machine %s is in two UpgradeTasks", m.Name)
				inTask[m.Name] = task.Name
				nodes = append(nodes, m.NodeName)
			}
			limit := 1 // the default
			if task.Spec.MaxUnavailable != nil {
				limit, err = intstr.GetScaledValueFromIntOrPercent(task.Spec.MaxUnavailable, len(task.Status.Machines), false)
				Expect(err).NotTo(HaveOccurred())
			}
			Expect(scenario.MaxDownAtOnce(s.Record.DownLog(), nodes)).To(BeNumerically("<=", limit),
				"nodes of UpgradeTask %s down at once; its maxUnavailable is %d", task.Name, limit)
		}
		Expect(inTask).To(HaveLen(len(s.Nodes)))
		nus := &inplacev1.NodeUpdateList{}
		Expect(s.Management.Client.List(ctx, nus, client.InNamespace(s.Cluster.Namespace))).To(Succeed())
		for _, n := range nus.Items {
			Expect(n.Name).To(Equal(upgraderequest.NodeUpdateName(inTask[n.Spec.MachineName], n.Spec.MachineName)))
		}

		By("no machine lost its state: released, marked upgraded, spec untouched, its Node Ready and schedulable")
		machines := &clusterv1.MachineList{}
		Expect(s.Management.Client.List(ctx, machines, client.InNamespace(s.Cluster.Namespace))).To(Succeed())
		names := make([]string, 0, len(machines.Items))
		for _, m := range machines.Items {
			names = append(names, m.Name)
			Expect(m.Labels).NotTo(HaveKey(inplacev1.UpgradeTaskLabel), "Machine %s is still claimed", m.Name)
			Expect(m.Annotations).To(HaveKeyWithValue(inplacev1.UpgradeReleaseAnnotation, scenario.ToVersion), "Machine %s", m.Name)
			Expect(m.Spec.Version).To(Equal(scenario.FromVersion), "Machine %s: spec.version is never written on this path", m.Name)
			cond := meta.FindStatusCondition(m.Status.Conditions, inplacev1.InPlaceUpgradeUpToDateCondition)
			Expect(cond).NotTo(BeNil(), "Machine %s", m.Name)
			Expect(cond.Status).To(Equal(metav1.ConditionTrue), "Machine %s: %s %s", m.Name, cond.Reason, cond.Message)
			Expect(cond.Reason).To(Equal(inplacev1.DoneReason), "Machine %s", m.Name)
		}
		sort.Strings(names)
		Expect(strings.Join(names, ",")).To(Equal(machineNames(s)))
		nodes := &corev1.NodeList{}
		Expect(s.Workload.Client.List(ctx, nodes)).To(Succeed())
		Expect(nodes.Items).To(HaveLen(len(s.Nodes)))
		for _, n := range nodes.Items {
			Expect(n.Spec.Unschedulable).To(BeFalse(), "Node %s is still cordoned", n.Name)
			ready := false
			for _, c := range n.Status.Conditions {
				if c.Type == corev1.NodeReady {
					ready = c.Status == corev1.ConditionTrue
				}
			}
			Expect(ready).To(BeTrue(), "Node %s is not Ready", n.Name)
		}
	})
})

// machineNames is the scenario's Machine names, sorted and comma-separated.
func machineNames(s *scenario.Scenario) string {
	out := make([]string, 0, len(s.Nodes))
	for _, n := range s.Nodes {
		out = append(out, n.Machine)
	}
	sort.Strings(out)
	return strings.Join(out, ",")
}
