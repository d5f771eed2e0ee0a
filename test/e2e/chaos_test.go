package e2e

import (
	"bufio"
	"fmt"
	"math/rand"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/test/manager"
	"github.com/capi-inplace/capi-inplace/test/scenario"
)

// leaseName is the manager's leader election ID (main.go), the name of its Lease.
const leaseName = "capi-inplace-manager.inplace.cluster.x-k8s.io"

// chaosSeed is the seed of the random kill points: E2E_CHAOS_SEED reproduces a run.
func chaosSeed() int64 {
	if v := os.Getenv("E2E_CHAOS_SEED"); v != "" {
		seed, err := strconv.ParseInt(v, 10, 64)
		Expect(err).NotTo(HaveOccurred(), "E2E_CHAOS_SEED")
		return seed
	}
	return time.Now().UnixNano()
}

// restartManager starts the scenario's manager again as it was started, on new ports.
func restartManager(s *scenario.Scenario) {
	GinkgoHelper()
	proc, err := manager.StartReady(manager.Options{
		Binary: s.Options.ManagerBinary, Kubeconfig: s.ManagementKubeconfig, CertDir: s.Certs.Dir,
		LogFile: s.ManagerLog, ExtraArgs: s.Options.ManagerArgs,
	}, time.Minute)
	if proc != nil {
		s.Manager = proc
	}
	Expect(err).NotTo(HaveOccurred())
}

// isLeader reads the manager's leader_election_master_status gauge from its metrics.
func isLeader(p *manager.Process) bool {
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/metrics", p.MetricsPort))
	if err != nil {
		return false
	}
	defer func() { _ = resp.Body.Close() }()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, `leader_election_master_status{name="`+leaseName+`"}`) {
			return strings.HasSuffix(line, " 1")
		}
	}
	return false
}

// leaseHolder is the holderIdentity of the manager's Lease.
func leaseHolder(s *scenario.Scenario) string {
	lease := &coordinationv1.Lease{}
	if err := s.Management.Client.Get(ctx, client.ObjectKey{Namespace: "default", Name: leaseName}, lease); err != nil || lease.Spec.HolderIdentity == nil {
		return ""
	}
	return *lease.Spec.HolderIdentity
}

// jobEvents counts the simulated SUC's Job starts and ends so far.
func jobEvents(s *scenario.Scenario) int {
	n := 0
	for _, r := range s.Record.Runs() {
		n++
		if !r.End.IsZero() {
			n++
		}
	}
	return n
}

func nodeUpdatesCreated(s *scenario.Scenario) int {
	nus := &inplacev1.NodeUpdateList{}
	if err := s.Management.Client.List(ctx, nus, client.InNamespace(s.Cluster.Namespace)); err != nil {
		return 0
	}
	return len(nus.Items)
}

var _ = Describe("The manager killed mid-upgrade", func() {
	It("completes a 10-node upgrade, each node upgraded exactly once, through 5 SIGKILLs and restarts at random points", func() {
		seed := chaosSeed()
		By(fmt.Sprintf("random kill points from seed %d (E2E_CHAOS_SEED=%d reproduces them)", seed, seed))
		AddReportEntry("chaos seed", seed)
		rng := rand.New(rand.NewSource(seed))
		s := startScenario("sigkill", scenario.Options{Namespace: "sigkill", ControlPlaneMachines: 3, Workers: 7, WorkerMaxUnavailable: 2})
		nu := watchNodeUpdates(s)
		annotateCluster(s)

		// The kill points are spread over the whole upgrade: each is a random number of the
		// simulated SUC's Job starts and ends (4 Plans per node, so 80 in all), then a random
		// moment up to 400ms later; the manager stays down up to 500ms.
		const events = 4 * 2 * 10
		targets := rng.Perm(events - 6)[:5]
		sort.Ints(targets)
		for i, target := range targets {
			target += 2
			Eventually(func() int { return jobEvents(s) }, upgradeTimeout, 20*time.Millisecond).Should(BeNumerically(">=", target))
			jitter := time.Duration(rng.Intn(400)) * time.Millisecond
			time.Sleep(jitter)
			status, message := clusterStatus(s)
			Expect(status).NotTo(BeElementOf(inplacev1.UpgradeStatusDone, inplacev1.UpgradeStatusFailed),
				"the upgrade ended (%s: %s) before kill %d: the kills must land mid-upgrade", status, message, i+1)
			By(fmt.Sprintf("kill %d: SIGKILL the manager %s after Job event %d of %d; %d NodeUpdates so far, %d nodes upgraded",
				i+1, jitter, target, events, nodeUpdatesCreated(s), len(upgradedNodes(s))))
			Expect(s.Manager.Kill()).To(Succeed())
			time.Sleep(time.Duration(rng.Intn(500)) * time.Millisecond)
			restartManager(s)
		}

		status, message := waitClusterStatus(s, upgradeTimeout)
		Expect(status).To(Equal(inplacev1.UpgradeStatusDone), message)
		expectAllUpgraded(s, nu)
	})
})

var _ = Describe("Two replicas with leader election", func() {
	It("hand over when the leader is killed mid-upgrade, and the upgrade completes", func() {
		s := startScenario("leader", scenario.Options{Namespace: "leader",
			ManagerArgs: []string{"--leader-elect=true", "--leader-election-namespace=default"}})
		nu := watchNodeUpdates(s)
		a := s.Manager
		b, err := manager.Start(manager.Options{
			Binary: managerBin, Kubeconfig: s.ManagementKubeconfig, CertDir: s.Certs.Dir,
			LogFile: filepath.Join(s.Options.WorkDir, "manager-b.log"), LeaderElect: true, LeaderElectionNamespace: "default",
			ExtraArgs: []string{"--poll-interval=" + scenarioPoll.String()},
		})
		Expect(err).NotTo(HaveOccurred())
		bAlive := true
		DeferCleanup(func() {
			if bAlive {
				Expect(b.Stop()).To(Succeed())
			}
		})
		Expect(b.WaitReady(time.Minute)).To(Succeed())

		By("one of the two leads: the Lease's holder, and its leader_election_master_status gauge")
		Eventually(func() bool { return isLeader(a) != isLeader(b) }, time.Minute, scenarioPoll).Should(BeTrue())
		leader, follower := a, b
		if isLeader(b) {
			leader, follower = b, a
		}
		holder := leaseHolder(s)
		host, _ := os.Hostname()
		Expect(holder).To(HavePrefix(host+"_"), "controller-runtime's identity: hostname_uuid")

		annotateCluster(s)
		By("SIGKILL the leader once the upgrade is under way")
		Eventually(func() int { return nodeUpdatesCreated(s) }, time.Minute, 50*time.Millisecond).Should(BeNumerically(">=", 2))
		status, _ := clusterStatus(s)
		Expect(status).NotTo(Equal(inplacev1.UpgradeStatusDone))
		Expect(leader.Kill()).To(Succeed())
		if leader == b {
			bAlive = false
		} else {
			s.Manager = b // the scenario stops the survivor
			bAlive = false
		}

		By("the other replica takes the Lease over")
		Eventually(func() bool { return isLeader(follower) }, time.Minute, scenarioPoll).Should(BeTrue())
		Expect(leaseHolder(s)).NotTo(BeElementOf(holder, ""))

		status, message := waitClusterStatus(s, upgradeTimeout)
		Expect(status).To(Equal(inplacev1.UpgradeStatusDone), message)
		expectAllUpgraded(s, nu)
	})
})
