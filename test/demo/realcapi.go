package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	runtimev1 "sigs.k8s.io/cluster-api/api/runtime/v1beta2"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/extension"
	"github.com/capi-inplace/capi-inplace/test/capienv"
	"github.com/capi-inplace/capi-inplace/test/fixtures"
	"github.com/capi-inplace/capi-inplace/test/manager"
	"github.com/capi-inplace/capi-inplace/test/scenario"
	"github.com/capi-inplace/capi-inplace/test/sim"
	"github.com/capi-inplace/capi-inplace/test/testenv"
)

// The versions of the rollout on Cluster API's own controllers: a minor crossed, where
// KCP also changes the KubeadmConfig, as in test/capie2e.
const (
	capiFromVersion = "v1.35.2"
	capiToVersion   = "v1.36.3"
)

const (
	// capiClusterName is the demo's ClusterClass Cluster, in demoNamespace.
	capiClusterName = "demo"
	// capiUpdater is the updater the ExtensionConfig's settings name: the external
	// updater simulator's kind.
	capiUpdater = "ExternalUpgrader/default"
	// capiLockWait is how long the demo waits for another set of Cluster API's
	// controllers on this machine (a test run of test/capie2e) to end.
	capiLockWait = 20 * time.Minute
	// capiProvisionTimeout is how long Cluster API may take to provision the Cluster.
	capiProvisionTimeout = 6 * time.Minute
	// failureShownAfter is how long the demo waits, once a node failed, for Cluster API
	// to show the failure on the Machine, before it ends.
	failureShownAfter = 45 * time.Second
)

// realCAPI is one run of --via=capi on Cluster API's own controllers.
type realCAPI struct {
	cfg  config
	view *view
	root string

	workDir     string
	env         *testenv.Environment
	watcher     client.WithWatch
	controllers *capienv.Controllers
	mgr         *manager.Process
	recorder    *capienv.HookRecorder
	managerLog  string
	updaterLog  string
	kubeconfig  string
	nodes       *capienv.WorkloadNodes
	updater     *sim.ExternalUpdater
	// kubeadm runs the KubeadmUpdater's node Jobs (--updater=kubeadm), jobs is the
	// proxy that gives the in-memory workload API server the Jobs API, cordons the
	// witness of the drain's cordons.
	kubeadm  *sim.KubeadmNodes
	jobs     *capienv.JobsProxy
	cordons  *capienv.CordonWitness
	nus      *sim.NodeUpdateWitness
	witness  *capienv.MachineWitness
	handlers []string

	// before are the Cluster's machines as provisioned, control plane first.
	before []clusterv1.Machine
	// failMachine is the machine --fail names, resolved once provisioned.
	failMachine string
}

// capiResult is what the run on Cluster API's controllers did, for the test.
type capiResult struct {
	// before and after are the machine names, sorted, before the bump and at the end.
	before, after []string
	// deleted are the machines Cluster API deleted (or began to).
	deleted []string
	// nodeUpdates counts the NodeUpdates created, by machine.
	nodeUpdates map[string]int
	// kubelets are the workload Nodes' kubelet versions at the end, by machine.
	kubelets map[string]string
	// failedMachine is the machine --fail made fail, and failure what Cluster API and
	// capi-inplace showed on it.
	failedMachine string
	failure       string
	// hookCalls counts the in-place hook calls Cluster API made in the rollout, by hook
	// ("canupdatemachineset", "canupdatemachine", "updatemachine").
	hookCalls map[string]int
}

// runRealCAPI is --via=capi with Cluster API's controllers built in bin/capi: an API
// server, Cluster API's core, KCP, CABPK and CAPD (in-memory) controllers as processes,
// the manager registered through an ExtensionConfig, a ClusterClass Cluster, and the
// updater simulator on the in-memory workload Nodes. The user's only action is the
// version bump; everything after it is Cluster API's doing and capi-inplace's.
func runRealCAPI(ctx context.Context, cfg config, root string, view *view) (*outcome, error) {
	began := time.Now()
	d := &realCAPI{cfg: cfg, view: view, root: root}
	var err error
	d.workDir, err = os.MkdirTemp("", "capi-inplace-demo-")
	if err != nil {
		return &outcome{}, err
	}
	keepWorkDir := false // kept when something failed: the logs tell why
	defer func() {
		if !keepWorkDir {
			_ = os.RemoveAll(d.workDir)
		}
	}()
	// On Ctrl-C the processes got the signal too: how they ended is no news then.
	defer func() { d.stop(ctx.Err() == nil) }()

	if err := d.start(ctx); err != nil {
		if ctx.Err() != nil {
			return &outcome{interrupted: true}, errors.New("interrupted while starting")
		}
		keepWorkDir = true
		return &outcome{}, fmt.Errorf("start the demo on Cluster API's controllers: %w (logs in %s)", err, d.workDir)
	}
	d.ready(time.Since(began))
	if cfg.preview {
		showPreview(ctx, d.env.Client, view, demoNamespace, capiClusterName, capiToVersion, cfg.previewWait)
	}

	res := d.follow(ctx)
	keepWorkDir = !res.ok() && !res.interrupted
	d.summary(ctx, res)
	if cfg.keep && !res.interrupted {
		d.keep()
		<-ctx.Done()
		_, _ = fmt.Fprintln(view.out, "\nstopping the manager, Cluster API's controllers and the API server...")
	}
	return res, nil
}

// start brings up everything the rollout needs and waits until Cluster API provisioned
// the Cluster.
func (d *realCAPI) start(ctx context.Context) error {
	v := d.view
	v.stage("starting the management API server (kube-apiserver and etcd from bin/k8s) and installing the CRDs")
	managerBin := d.cfg.managerBinary
	var wg sync.WaitGroup
	var envErr, buildErr error
	wg.Add(1)
	go func() { defer wg.Done(); d.env, envErr = testenv.Start() }()
	if managerBin == "" {
		v.stage("building the manager binary from this checkout")
		managerBin, buildErr = manager.Build(ctx, d.root, d.workDir)
	}
	wg.Wait()
	if err := errors.Join(envErr, buildErr); err != nil {
		return err
	}
	var err error
	d.watcher, err = client.NewWithWatch(d.env.Config, client.Options{Scheme: d.env.Scheme})
	if err != nil {
		return err
	}
	d.kubeconfig = filepath.Join(d.workDir, "kubeconfig")
	if err := d.env.WriteKubeconfig(d.kubeconfig); err != nil {
		return err
	}

	v.stage(fmt.Sprintf("starting Cluster API's own controllers as processes: core, KubeadmControlPlane, kubeadm bootstrap, CAPD in-memory (one set per machine: if another runs, such as test/capie2e's, this waits for it, up to %s)",
		formatDuration(capiLockWait)))
	d.controllers, err = capienv.Start(ctx, d.env, d.workDir, capiLockWait)
	if err != nil {
		return err
	}

	v.stage("starting the manager as a process and registering it with Cluster API (ExtensionConfig capi-inplace)")
	certs, err := manager.NewServingCerts(filepath.Join(d.workDir, "manager-certs"))
	if err != nil {
		return err
	}
	d.managerLog = filepath.Join(d.workDir, "manager.log")
	d.mgr, err = manager.StartReady(manager.Options{Binary: managerBin, Kubeconfig: d.kubeconfig, CertDir: certs.Dir, LogFile: d.managerLog,
		ExtraArgs: []string{"--poll-interval=" + d.cfg.pollInterval.String(),
			// Cluster API's core and KCP present their client certificates to the hooks.
			"--hook-client-ca=" + d.controllers.ExtensionClientCA()}}, time.Minute)
	if err != nil {
		return err
	}
	// Cluster API reaches the manager through a recording proxy, so the demo can show
	// the hook calls Cluster API makes.
	d.recorder, err = capienv.NewHookRecorder(certs.Dir, certs.CAPEM, fmt.Sprintf("https://127.0.0.1:%d", d.mgr.WebhookPort),
		d.controllers.ExtensionClientAuth())
	if err != nil {
		return err
	}
	if err := capienv.RegisterExtension(ctx, d.env.Client, "capi-inplace", d.recorder.URL, certs.CAPEM,
		map[string]string{extension.DefaultUpdaterSetting: capiUpdater}); err != nil {
		return err
	}
	ext := &runtimev1.ExtensionConfig{}
	if err := d.env.Client.Get(ctx, client.ObjectKey{Name: "capi-inplace"}, ext); err != nil {
		return err
	}
	for _, h := range ext.Status.Handlers {
		d.handlers = append(d.handlers, h.Name)
	}
	sort.Strings(d.handlers)

	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: demoNamespace}}
	if err := d.env.Client.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create namespace %s: %w", demoNamespace, err)
	}
	if err := capienv.CreateClasses(ctx, d.env.Client, demoNamespace); err != nil {
		return err
	}
	if err := fixtures.ExternalUpdater(ctx, d.env.Client, demoNamespace); err != nil {
		return err
	}
	d.nus, err = sim.WatchNodeUpdates(ctx, d.watcher, demoNamespace)
	if err != nil {
		return err
	}
	d.witness, err = capienv.WatchMachines(ctx, d.watcher, demoNamespace)
	if err != nil {
		return err
	}
	d.updaterLog = filepath.Join(d.workDir, "updater.log")
	logf := d.fileLogger(d.updaterLog)
	d.nodes = capienv.NewWorkloadNodes(d.env.Client, d.env.Scheme)
	var annotations map[string]string
	if d.cfg.updater == updaterKubeadm {
		// The KubeadmUpdater's Jobs are served by the management API server (through
		// capienv.JobsProxy) and run by sim.KubeadmNodes on a fake root per node.
		d.kubeadm, err = sim.RunKubeadmNodes(ctx, sim.KubeadmNodesOptions{Jobs: d.env.Client, Namespace: metav1.NamespaceSystem,
			Management: d.env.Client, Scheme: d.env.Scheme, Nodes: d.nodes, Hold: d.cfg.stepDelay, Logf: logf})
		if err != nil {
			return err
		}
		if err := d.env.Client.Create(ctx, &inplacev1.KubeadmUpdater{
			ObjectMeta: metav1.ObjectMeta{Namespace: demoNamespace, Name: kubeadmUpdaterName},
			Spec: inplacev1.KubeadmUpdaterSpec{Source: inplacev1.KubeadmBinarySource{URL: &inplacev1.KubeadmURLSource{
				Template: d.kubeadm.URLTemplate(), SHA256: sim.Checksums(capiToVersion)}}},
		}); err != nil {
			return fmt.Errorf("create KubeadmUpdater: %w", err)
		}
		annotations = map[string]string{inplacev1.UpdaterAnnotation: d.updaterRef()}
	} else {
		d.updater = sim.RunExternalUpdater(ctx, d.env.Client, demoNamespace, d.cfg.stepDelay, logf)
		d.updater.UseNodes(d.nodes)
	}

	shape := capienv.ClusterShape{Version: capiFromVersion, ControlPlane: int32(d.cfg.controlPlane), Workers: int32(d.cfg.workers)}
	v.stage(fmt.Sprintf("creating Cluster %s/%s of ClusterClass %s at %s: %d control plane machines and MachineDeployment md-0 of %d workers; Cluster API provisions them (about a minute)",
		demoNamespace, capiClusterName, capienv.InPlaceClass, capiFromVersion, d.cfg.controlPlane, d.cfg.workers))
	if _, err := capienv.CreateCluster(ctx, d.env.Client, demoNamespace, capiClusterName, shape, annotations); err != nil {
		return err
	}
	if err := d.waitProvisioned(ctx); err != nil {
		return err
	}
	if d.kubeadm != nil {
		if d.jobs, err = capienv.ServeJobs(ctx, d.env.Client, d.env.Config, demoNamespace, capiClusterName); err != nil {
			return err
		}
		if d.cordons, err = capienv.WatchCordons(ctx, d.env.Client, d.env.Scheme, demoNamespace, capiClusterName); err != nil {
			return err
		}
	}
	if d.cfg.fail != "" {
		d.failMachine, err = d.resolveFail(d.cfg.fail)
		if err != nil {
			return err
		}
		if d.kubeadm != nil {
			d.kubeadm.FailCommand(d.nodeOf(d.failMachine), "kubeadm upgrade",
				"[preflight] Some fatal errors occurred: [ERROR CoreDNSUnsupportedPlugins]: there are unsupported plugins in the CoreDNS Corefile (failure injected by --fail)")
		} else {
			d.updater.FailMachine(d.failMachine, "rke2-server did not start: kubelet exited with status 1 (failure injected by --fail)")
		}
	}
	return nil
}

// kubeadmUpdaterName is the demo's KubeadmUpdater (--updater=kubeadm).
const kubeadmUpdaterName = "kubeadm"

// updaterRef is the updater of the demo's Cluster: the ExtensionConfig's default, or the
// KubeadmUpdater its annotation names.
func (d *realCAPI) updaterRef() string {
	if d.cfg.updater == updaterKubeadm {
		return inplacev1.KubeadmUpdaterKind + "/" + kubeadmUpdaterName
	}
	return capiUpdater
}

// nodeOf is the Node of a machine as provisioned.
func (d *realCAPI) nodeOf(machine string) string {
	for i := range d.before {
		if d.before[i].Name == machine {
			return d.before[i].Status.NodeRef.Name
		}
	}
	return ""
}

// fileLogger appends what the updater simulator could not write to path.
func (d *realCAPI) fileLogger(path string) func(format string, args ...any) {
	var mu sync.Mutex
	return func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
		if err != nil {
			return
		}
		_, _ = fmt.Fprintf(f, time.Now().Format(time.RFC3339Nano)+" "+format+"\n", args...)
		_ = f.Close()
	}
}

// waitProvisioned waits until Cluster API provisioned every machine, telling how many
// have their Node as it goes.
func (d *realCAPI) waitProvisioned(ctx context.Context) error {
	want := d.cfg.controlPlane + d.cfg.workers
	deadline := time.Now().Add(capiProvisionTimeout)
	last := -1
	for {
		machines, err := capienv.Machines(ctx, d.env.Client, demoNamespace, capiClusterName)
		if err == nil {
			ready := 0
			for i := range machines {
				m := &machines[i]
				// A control plane member counts once KubeadmControlPlane sees it healthy:
				// bumped before that, KCP replaces the member that looks unhealthy.
				if m.DeletionTimestamp.IsZero() && m.Status.NodeRef.IsDefined() && m.Status.NodeInfo != nil &&
					m.Status.NodeInfo.KubeletVersion == capiFromVersion && m.Spec.Version == capiFromVersion &&
					capienv.UnhealthyControlPlaneComponent(m) == "" {
					ready++
				}
			}
			if ready != last {
				last = ready
				d.view.stage(fmt.Sprintf("Cluster API provisioning: %d machines, %d of %d with their Node running kubelet %s", len(machines), ready, want, capiFromVersion))
			}
			if ready == want && len(machines) == want {
				sortMachines(machines)
				d.before = machines
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cluster API did not provision %d machines within %s (%d ready)", want, capiProvisionTimeout, max(last, 0))
		}
		if err := sleep(ctx, 500*time.Millisecond); err != nil {
			return err
		}
	}
}

// sortMachines puts the control plane first, then the workers, each by name.
func sortMachines(machines []clusterv1.Machine) {
	sort.SliceStable(machines, func(i, j int) bool {
		ci, cj := capienv.IsControlPlane(&machines[i]), capienv.IsControlPlane(&machines[j])
		if ci != cj {
			return ci
		}
		return machines[i].Name < machines[j].Name
	})
}

// resolveFail maps --fail to a machine: its name, its Node's name, or as the simulated
// scenario names them, cp-N or workers-N (demo- in front or not): the Nth control plane
// or worker machine by name.
func (d *realCAPI) resolveFail(name string) (string, error) {
	var cp, workers []string
	for i := range d.before {
		m := &d.before[i]
		if m.Name == name || m.Status.NodeRef.Name == name {
			return m.Name, nil
		}
		if capienv.IsControlPlane(m) {
			cp = append(cp, m.Name)
		} else {
			workers = append(workers, m.Name)
		}
	}
	short := strings.TrimPrefix(name, demoNamespace+"-")
	for prefix, list := range map[string][]string{scenario.ControlPlaneName + "-": cp, scenario.MachineDeploymentName + "-": workers} {
		if n, err := strconv.Atoi(strings.TrimPrefix(short, prefix)); strings.HasPrefix(short, prefix) && err == nil && n >= 1 && n <= len(list) {
			return list[n-1], nil
		}
	}
	return "", fmt.Errorf("--fail=%s: no such machine; the machines are %s (or cp-N, workers-N)", name, strings.Join(append(cp, workers...), ", "))
}

// versionsFromGoMod reads the versions of Cluster API's modules the controllers in
// bin/capi were built from (make capi-binaries builds the versions go.mod requires).
func versionsFromGoMod(root string) map[string]string {
	out := map[string]string{}
	f, err := os.Open(filepath.Join(root, "go.mod"))
	if err != nil {
		return out
	}
	defer func() { _ = f.Close() }()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(strings.TrimPrefix(strings.TrimSpace(sc.Text()), "require "))
		if len(fields) >= 2 && strings.HasPrefix(fields[0], "sigs.k8s.io/cluster-api") {
			out[fields[0]] = fields[1]
		}
	}
	return out
}

// ready says what runs, and that the user's only action follows.
func (d *realCAPI) ready(took time.Duration) {
	v := d.view
	mods := versionsFromGoMod(d.root)
	core, capd := mods["sigs.k8s.io/cluster-api"], mods["sigs.k8s.io/cluster-api/test"]
	var cpName, mdName string
	for i := range d.before {
		m := &d.before[i]
		if capienv.IsControlPlane(m) && cpName == "" {
			cpName = m.Labels[clusterv1.MachineControlPlaneNameLabel]
		}
		if !capienv.IsControlPlane(m) && mdName == "" {
			mdName = m.Labels[clusterv1.MachineDeploymentNameLabel]
		}
	}
	v.println(fmt.Sprintf("%s  ready in %s:", v.style(dim, v.clock()), formatDuration(took)))
	v.println(fmt.Sprintf("         management API server %s  (kubeconfig %s)", d.env.Config.Host, d.kubeconfig))
	v.println(fmt.Sprintf("         %s, as processes from bin/capi (logs in %s):", v.style(bold, "Cluster API's own controllers"), d.workDir))
	v.println(fmt.Sprintf("           core (Cluster, topology, MachineDeployment, MachineSet, Machine)  sigs.k8s.io/cluster-api %s", core))
	v.println(fmt.Sprintf("           KubeadmControlPlane, kubeadm bootstrap                             sigs.k8s.io/cluster-api %s", core))
	v.println(fmt.Sprintf("           CAPD, in-memory backend (no Docker)                                sigs.k8s.io/cluster-api/test %s", capd))
	v.println(fmt.Sprintf("           feature gates %s", capienv.FeatureGates))
	v.println(fmt.Sprintf("         manager               hooks on https://127.0.0.1:%d (Cluster API calls them through a recording proxy, %s), log %s",
		d.mgr.WebhookPort, d.recorder.URL, d.managerLog))
	v.println(fmt.Sprintf("                               ExtensionConfig capi-inplace, settings defaultUpdater=%s; Cluster API discovered %s",
		capiUpdater, strings.Join(d.handlers, ", ")))
	if d.kubeadm != nil {
		v.println(fmt.Sprintf("         updater               %s, named on the Cluster (annotation %s): each node's kubeadm phases run as Jobs on the workload cluster",
			d.updaterRef(), inplacev1.UpdaterAnnotation))
		v.println(fmt.Sprintf("                               the nodes: a simulator runs each Job's `capi-inplace node kubeadm ...` on a fake root per node (kubeadm, kubelet, systemctl stand-ins); a restarted kubelet is NotReady for %s (--step-delay)",
			formatDuration(d.cfg.stepDelay)))
	} else {
		v.println(fmt.Sprintf("         updater               %s: a simulator that takes each node NotReady for %s (--step-delay), then makes its kubelet report the new version",
			capiUpdater, formatDuration(d.cfg.stepDelay)))
	}
	v.println(fmt.Sprintf("         Cluster %s/%s, ClusterClass %s, %s: KubeadmControlPlane %s (%d, maxSurge 0), MachineDeployment %s (%d, maxSurge 0, maxUnavailable 1)",
		demoNamespace, capiClusterName, capienv.InPlaceClass, capiFromVersion, cpName, d.cfg.controlPlane, mdName, d.cfg.workers))
	if d.failMachine != "" {
		v.println(fmt.Sprintf("         %s the node of machine %s will fail its upgrade (--fail %s)", v.style(yellow, "!"), d.failMachine, d.cfg.fail))
	}
	v.println("")
	v.println(v.style(bold, "Nothing here plays Cluster API: your only action is the version bump below. From there, Cluster API's controllers"))
	v.println(v.style(bold, "decide, call capi-inplace's CanUpdateMachine[Set] and UpdateMachine hooks, and roll the machines out."))
	v.println("")
}

// follow bumps the version and shows the rollout live until every machine is at the new
// version, a node failed and Cluster API showed it, or --timeout.
func (d *realCAPI) follow(ctx context.Context) *outcome {
	runCtx, cancel := context.WithTimeout(ctx, d.cfg.timeout)
	defer cancel()
	t := newCAPITracker(d)
	_ = t.sample(runCtx)
	stopLive := d.view.live(runCtx, t)

	err := d.bump(runCtx)
	if err == nil {
		err = d.waitRollout(runCtx, t)
	}
	sampleCtx, cancelSample := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancelSample()
	_ = t.sample(sampleCtx)
	stopLive()

	res := &outcome{interrupted: ctx.Err() != nil, capi: &capiResult{failedMachine: d.failMachine}}
	switch {
	case res.interrupted:
		d.view.problem("interrupted")
	case runCtx.Err() != nil:
		d.view.problem(fmt.Sprintf("the rollout did not end within --timeout=%s", d.cfg.timeout))
	case err != nil:
		d.view.problem(err.Error())
	}
	d.check(sampleCtx, t, res)
	return res
}

// bump is the user's action: the Cluster's spec.topology.version.
func (d *realCAPI) bump(ctx context.Context) error {
	cluster := &clusterv1.Cluster{}
	if err := d.env.Client.Get(ctx, client.ObjectKey{Namespace: demoNamespace, Name: capiClusterName}, cluster); err != nil {
		return err
	}
	patch := client.MergeFrom(cluster.DeepCopy())
	cluster.Spec.Topology.Version = capiToVersion
	if err := d.env.Client.Patch(ctx, cluster, patch); err != nil {
		return fmt.Errorf("bump the Cluster's spec.topology.version: %w", err)
	}
	d.view.step(fmt.Sprintf(`kubectl patch cluster -n %s %s --type merge -p '{"spec":{"topology":{"version":"%s"}}}'   %s`,
		demoNamespace, capiClusterName, capiToVersion, d.view.style(bold, "<- the only action; from here on, Cluster API drives")))
	return nil
}

// waitRollout waits until the tracker sees every machine done, or a failure shown.
func (d *realCAPI) waitRollout(ctx context.Context, t *capiTracker) error {
	var failedAt time.Time
	for {
		if err := sleep(ctx, 500*time.Millisecond); err != nil {
			return err
		}
		if t.allDone() {
			return nil
		}
		if m, ok := t.failed(); ok {
			if failedAt.IsZero() {
				failedAt = time.Now()
			}
			if m.capiFailed() || time.Since(failedAt) > failureShownAfter {
				return fmt.Errorf("the node of machine %s failed its upgrade; Cluster API holds the rollout there", m.name)
			}
		}
	}
}

// check fills the outcome: the summary rows, the safety checks, and what the test reads.
func (d *realCAPI) check(ctx context.Context, t *capiTracker, res *outcome) {
	machines := t.snapshot()
	res.upgraded = true
	var cpNodes, workerNodes []string
	for _, m := range machines {
		res.upgraded = res.upgraded && m.done()
		if m.controlPlane {
			cpNodes = append(cpNodes, m.node)
		} else {
			workerNodes = append(workerNodes, m.node)
		}
	}
	r := res.capi
	for i := range d.before {
		r.before = append(r.before, d.before[i].Name)
	}
	sort.Strings(r.before)
	if after, err := capienv.Machines(ctx, d.env.Client, demoNamespace, capiClusterName); err == nil {
		for _, m := range after {
			r.after = append(r.after, m.Name)
		}
	}
	r.deleted = d.witness.Deleted()
	r.hookCalls = t.hookCalls()
	r.nodeUpdates = d.nus.Creations()
	r.kubelets = map[string]string{}
	for _, m := range machines {
		r.kubelets[m.name] = m.kubelet
		if m.name == d.failMachine {
			r.failure = m.failureText()
		}
	}
	if len(r.before) == 0 || len(machines) != len(r.before) {
		res.upgraded = false
	}

	kept := scenario.Check{Name: fmt.Sprintf("every machine kept: the same %d machines, none deleted or added by Cluster API", len(r.before)),
		OK: strings.Join(r.before, ",") == strings.Join(r.after, ",") && len(r.deleted) == 0}
	if !kept.OK {
		kept.Detail = fmt.Sprintf("before %v, after %v, deleted %v", r.before, r.after, r.deleted)
	}
	once := scenario.Check{Name: "no machine upgraded twice: at most one NodeUpdate per machine, never two at once", OK: len(d.nus.RunTwice()) == 0}
	var extra []string
	for name, n := range r.nodeUpdates {
		if n != 1 {
			extra = append(extra, fmt.Sprintf("%s: %d", name, n))
		}
	}
	sort.Strings(extra)
	if len(extra) > 0 || !once.OK {
		once.OK, once.Detail = false, fmt.Sprintf("NodeUpdates by machine %v, two at once on %v", extra, d.nus.RunTwice())
	}
	cpDown := d.nodes.MaxNotReady(demoNamespace, capiClusterName, cpNodes...)
	workersDown := d.nodes.MaxNotReady(demoNamespace, capiClusterName, workerNodes...)
	anyDown := d.nodes.MaxNotReady(demoNamespace, capiClusterName, append(append([]string{}, cpNodes...), workerNodes...)...)
	res.checks = []scenario.Check{
		kept, once,
		{Name: "at most 1 control plane node down at once", OK: cpDown <= 1, Detail: fmt.Sprintf("%d were", cpDown)},
		{Name: "at most 1 worker node down at once (the MachineDeployment's maxUnavailable)", OK: workersDown <= 1, Detail: fmt.Sprintf("%d were", workersDown)},
		{Name: "the updater took the nodes down while upgrading them (so the two lines above mean something)", OK: anyDown >= 1, Detail: "no node went NotReady"},
	}
	if d.kubeadm != nil {
		res.checks = append(res.checks, d.kubeadmChecks(cpNodes, workerNodes)...)
	}
}

func (d *realCAPI) summary(ctx context.Context, res *outcome) {
	v := d.view
	t, _ := v.t.(*capiTracker)
	v.println("")
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	_, _ = fmt.Fprintln(tw, "MACHINE\tROLE\tNODE\tKUBELET\tNODEUPDATES\tDURATION\tRESULT")
	if t != nil {
		for _, m := range t.snapshot() {
			role := "worker"
			if m.controlPlane {
				role = "control plane"
			}
			dur := "-"
			if !m.started.IsZero() {
				dur = formatDuration(m.elapsed(time.Now()))
			}
			_, _ = fmt.Fprintf(tw, "%s\t%s\t%s\t%s -> %s\t%d\t%s\t%s\n", m.name, role, m.node, capiFromVersion, m.kubelet,
				res.capi.nodeUpdates[m.name], dur, m.result())
		}
	}
	_ = tw.Flush()
	v.printTable(b.String(), "upgraded in place")
	if d.kubeadm != nil {
		d.kubeadmPhases(ctx)
	}
	if t != nil {
		v.println("")
		v.println("Hook calls Cluster API made (recorded by the proxy in front of the manager): " + t.hookCounts())
	}
	if res.capi.failedMachine != "" && res.capi.failure != "" {
		v.println("")
		v.println(v.style(red, fmt.Sprintf("What an operator sees on Machine %s:", res.capi.failedMachine)))
		for _, line := range strings.Split(res.capi.failure, "\n") {
			v.println(v.style(red, "  "+line))
		}
	}
	v.println("")
	v.println("Checks, from the watches of Machines and NodeUpdates and the workload Nodes' readiness:")
	for _, c := range res.checks {
		if c.OK {
			v.println(fmt.Sprintf("  %s %s", v.style(green, "✔"), c.Name))
		} else {
			v.println(fmt.Sprintf("  %s %s: %s", v.style(red, "✘"), c.Name, c.Detail))
		}
	}
	d.kubectlView(ctx)
	v.println("")
	took := "-"
	if t != nil {
		took = formatDuration(time.Since(t.began()))
	}
	if res.ok() {
		v.println(v.style(green+bold, fmt.Sprintf("All %d machines were updated in place to Kubernetes %s by Cluster API's own controllers in %s (rollout) / %s (whole demo).",
			len(res.capi.before), capiToVersion, took, formatDuration(time.Since(v.began)))))
		return
	}
	reached := 0
	if t != nil {
		for _, m := range t.snapshot() {
			if m.done() {
				reached++
			}
		}
	}
	verdict := fmt.Sprintf("%d of %d machines updated in place to Kubernetes %s (%s, on Cluster API's own controllers).", reached, len(res.capi.before), capiToVersion, took)
	if !res.interrupted {
		verdict += " Logs: " + d.workDir
	}
	v.println(v.style(red+bold, verdict))
}

// kubectlPath is bin/k8s/kubectl, relative to the working directory when it is under it.
func kubectlPath(root string) string {
	kubectl := filepath.Join(root, "bin", "k8s", "kubectl")
	if wd, err := os.Getwd(); err == nil {
		if rel, err := filepath.Rel(wd, kubectl); err == nil && !strings.HasPrefix(rel, "..") {
			return rel
		}
	}
	return kubectl
}

// kubectlView shows the Machines as kubectl does, with Cluster API's own columns.
func (d *realCAPI) kubectlView(ctx context.Context) {
	kubectl := filepath.Join(d.root, "bin", "k8s", "kubectl")
	if _, err := os.Stat(kubectl); err != nil {
		return
	}
	args := []string{"get", "machines", "-n", demoNamespace}
	cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(cctx, kubectl, append([]string{"--kubeconfig", d.kubeconfig}, args...)...) //nolint:gosec // the checkout's own kubectl
	out, err := cmd.CombinedOutput()
	d.view.println("")
	d.view.println(d.view.style(bold, "$ kubectl "+strings.Join(args, " ")))
	for _, line := range strings.Split(strings.TrimRight(string(out), "\n"), "\n") {
		d.view.println("  " + line)
	}
	if err != nil {
		d.view.println(fmt.Sprintf("  (kubectl: %v)", err))
	}
}

// keep tells how to look at what keeps running.
func (d *realCAPI) keep() {
	v := d.view
	kubectl := kubectlPath(d.root)
	workload := filepath.Join(d.workDir, "workload-kubeconfig")
	secret := &corev1.Secret{}
	if err := d.env.Client.Get(context.Background(), client.ObjectKey{Namespace: demoNamespace, Name: capiClusterName + "-kubeconfig"}, secret); err == nil {
		_ = os.WriteFile(workload, secret.Data["value"], 0o600)
	}
	v.println("")
	v.println(v.style(bold, "Everything keeps running (--keep). In another terminal:"))
	v.println("  export KUBECONFIG=" + d.kubeconfig + "   # the management cluster")
	v.println("  " + kubectl + " get cluster,kubeadmcontrolplanes,machinedeployments,machines -n " + demoNamespace)
	v.println("  " + kubectl + " get nodeupdates,upgradetasks -n " + demoNamespace)
	v.println("  " + kubectl + " get extensionconfig capi-inplace -o yaml")
	v.println("  " + kubectl + " --kubeconfig " + workload + " get nodes   # the workload cluster (CAPD's in-memory API server)")
	v.println("  tail -f " + d.managerLog + "   # and the controllers' logs next to it")
	v.println("Press Ctrl-C to stop everything.")
}

// stop ends the updater, the watches, the manager, Cluster API's controllers and the API
// server, in that order, and says what did not stop cleanly when report is set.
func (d *realCAPI) stop(report bool) {
	if d.updater != nil {
		d.updater.Stop()
	}
	if d.kubeadm != nil {
		d.kubeadm.Stop()
	}
	if d.cordons != nil {
		d.cordons.Stop()
	}
	if d.jobs != nil {
		_ = d.jobs.Close(context.Background())
	}
	if d.nus != nil {
		d.nus.Stop()
	}
	if d.witness != nil {
		d.witness.Stop()
	}
	var errs []error
	if d.recorder != nil {
		errs = append(errs, d.recorder.Close())
	}
	if d.mgr != nil {
		errs = append(errs, d.mgr.Stop())
	}
	if d.controllers != nil {
		errs = append(errs, d.controllers.Stop())
	}
	if d.env != nil {
		errs = append(errs, d.env.Stop())
	}
	if err := errors.Join(errs...); err != nil && report {
		d.view.println(fmt.Sprintf("stopping: %v", err))
	}
}
