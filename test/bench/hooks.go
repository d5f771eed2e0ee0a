package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlconfig "sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	runtimecatalog "sigs.k8s.io/cluster-api/api/runtime/catalog"
	runtimehooksv1 "sigs.k8s.io/cluster-api/api/runtime/hooks/v1alpha1"
	runtimeserver "sigs.k8s.io/cluster-api/exp/runtime/server"
	"sigs.k8s.io/cluster-api/test/extension/handlers/inplaceupdate"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/controllers/upgraderequest"
	"github.com/capi-inplace/capi-inplace/extension"
	"github.com/capi-inplace/capi-inplace/harvesteradapter"
	harvesterv1 "github.com/capi-inplace/capi-inplace/harvesteradapter/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/repository"
	"github.com/capi-inplace/capi-inplace/nodeupdater"
	"github.com/capi-inplace/capi-inplace/nodeupdater/jobupdater"
	"github.com/capi-inplace/capi-inplace/test/capisim"
	"github.com/capi-inplace/capi-inplace/test/fixtures"
	"github.com/capi-inplace/capi-inplace/test/manager"
	"github.com/capi-inplace/capi-inplace/workloadcluster"
)

// Implementations compared by the hook benchmark.
const (
	implOurs      = "capi-inplace"
	implReference = "CAPI reference"
)

// hookNames are the hooks measured, in the order of the report.
var hookNames = []string{"CanUpdateMachineSet", "CanUpdateMachine", "UpdateMachine"}

// hookResult is one cell of the hook benchmark: one implementation, one hook, one number
// of concurrent clients.
type hookResult struct {
	hook, impl string
	clients    int
	requests   int
	failures   int
	firstFail  string
	measured   time.Duration
	lat        latencies
	// cpuPerRequest is the process's CPU time (client and server, both in this process)
	// per request.
	cpuPerRequest time.Duration
}

func (r hookResult) rps() float64 {
	if r.measured <= 0 {
		return 0
	}
	return float64(r.requests) / r.measured.Seconds()
}

// hookCase is one hook's requests and where each implementation serves it.
type hookCase struct {
	hook   string
	bodies [][]byte
	paths  map[string]string
	// answers describes each implementation's answer to the first body, for the report.
	answers map[string]string
}

// hookBenchResult is the whole hook benchmark.
type hookBenchResult struct {
	cases        []hookCase
	results      []hookResult
	machines     int
	requestBytes map[string]int
}

// runHookBench serves capi-inplace's hooks exactly as the manager does (its handlers on
// Cluster API's runtime SDK server, reading through a manager's cache) and Cluster API's
// reference handlers on a second runtime SDK server of the same manager, then calls both
// over HTTPS with the same bodies the way Cluster API's runtime client does.
func runHookBench(ctx context.Context, b *bench) (*hookBenchResult, error) {
	cfg := b.cfg
	c := b.client
	ns, err := fixtures.Namespace(ctx, c, "bench-hooks")
	if err != nil {
		return nil, err
	}
	const clusterName = "bench"
	upgrader := &harvesterv1.HarvesterUpgrader{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "default"},
		Spec:       harvesterv1.HarvesterUpgraderSpec{Release: harvesterv1.Release{Version: "v1.8.1", RepositoryURL: "http://harvester-repo.example.internal/harvester"}},
	}
	if err := c.Create(ctx, upgrader); err != nil {
		return nil, fmt.Errorf("create HarvesterUpgrader: %w", err)
	}
	// The machines are being updated: Cluster API wrote the desired version into them
	// before it called UpdateMachine, and each has its running NodeUpdate.
	if err := createCluster(ctx, c, clusterShape{
		namespace: ns, name: clusterName, machines: cfg.hookMachines, version: hookToVersion,
		annotations: map[string]string{inplacev1.UpdaterAnnotation: "HarvesterUpgrader/default"}, updating: true,
	}); err != nil {
		return nil, err
	}
	defer func() { _ = deleteNodes(ctx, c, ns) }()
	if err := createRunningNodeUpdates(ctx, c, ns, clusterName, cfg.hookMachines); err != nil {
		return nil, err
	}

	certs, err := manager.NewServingCerts(b.tempDir("hook-certs"))
	if err != nil {
		return nil, err
	}
	ports, err := manager.FreePorts(2)
	if err != nil {
		return nil, err
	}
	mgr, err := ctrl.NewManager(managerRESTConfig(b.env.Config), ctrl.Options{
		Scheme:                 b.env.Scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Controller:             ctrlconfig.Controller{SkipNameValidation: ptr.To(true)},
	})
	if err != nil {
		return nil, fmt.Errorf("create manager: %w", err)
	}
	// As main.go wires them.
	tlsOpts := []func(*tls.Config){func(c *tls.Config) { c.MinVersion = tls.VersionTLS12 }}
	workloads := &workloadcluster.Clients{Reader: mgr.GetAPIReader(), Scheme: mgr.GetScheme()}
	registry := nodeupdater.NewRegistry()
	for _, reg := range []nodeupdater.Registration{
		(&jobupdater.Updater{Client: mgr.GetClient(), Clusters: workloads}).Registration(),
		(&harvesteradapter.Updater{Client: mgr.GetClient(), Workloads: workloads, Releases: repository.ClusterReleaseReader{Configs: workloads}}).Registration(),
	} {
		if err := registry.Register(reg); err != nil {
			return nil, err
		}
	}
	requester := &upgraderequest.Requester{Client: mgr.GetClient(), TaskReader: mgr.GetAPIReader(), Registry: registry, Recorder: mgr.GetEventRecorder("capi-inplace-requests")}
	if err := extension.IndexNodeUpdates(ctx, mgr.GetFieldIndexer()); err != nil {
		return nil, err
	}
	ours, err := extension.NewCAPIHookServer(extension.ServerOptions{Port: ports[0], CertDir: certs.Dir, TLSOpts: tlsOpts},
		&extension.InPlaceHooks{Client: mgr.GetClient(), Requester: requester, Registry: registry})
	if err != nil {
		return nil, err
	}
	ref, err := newReferenceServer(runtimeserver.Options{Port: ports[1], CertDir: certs.Dir, TLSOpts: tlsOpts}, inplaceupdate.NewExtensionHandlers(mgr.GetClient()))
	if err != nil {
		return nil, err
	}
	for _, srv := range []*runtimeserver.Server{ours, ref} {
		if err := mgr.Add(srv); err != nil {
			return nil, err
		}
	}
	stop, err := startManager(ctx, mgr)
	if err != nil {
		return nil, err
	}
	defer stop()
	for _, srv := range []*runtimeserver.Server{ours, ref} {
		if err := waitStarted(ctx, srv); err != nil {
			return nil, err
		}
	}

	tlsConfig, err := manager.TLSConfig(certs.CAPEM)
	if err != nil {
		return nil, err
	}
	clients := map[string]*http.Client{implOurs: capiHTTPClient(tlsConfig), implReference: capiHTTPClient(tlsConfig)}
	bases := map[string]string{implOurs: fmt.Sprintf("https://127.0.0.1:%d", ports[0]), implReference: fmt.Sprintf("https://127.0.0.1:%d", ports[1])}

	cases, err := buildHookCases(ctx, c, ns, clusterName, cfg.hookMachines)
	if err != nil {
		return nil, err
	}
	out := &hookBenchResult{machines: cfg.hookMachines, requestBytes: map[string]int{}}
	for i := range cases {
		hc := &cases[i]
		out.requestBytes[hc.hook] = len(hc.bodies[0])
		if err := checkAnswers(ctx, hc, clients, bases); err != nil {
			return nil, err
		}
	}
	out.cases = cases

	for _, hc := range cases {
		for _, n := range cfg.hookClients {
			res := map[string]*hookResult{}
			for _, impl := range []string{implOurs, implReference} {
				res[impl] = &hookResult{hook: hc.hook, impl: impl, clients: n}
			}
			// ABBA: each implementation runs twice, in mirrored order, so that a drift of
			// the machine's load over the cell weighs on both alike.
			var samples = map[string][]time.Duration{}
			for _, impl := range []string{implOurs, implReference, implReference, implOurs} {
				runtime.GC()
				r := res[impl]
				cpu0 := processCPU()
				s, fails, firstFail, err := hammer(ctx, clients[impl], bases[impl]+hc.paths[impl], hc.bodies, n, cfg.hookWarmup, cfg.hookDuration/2)
				if err != nil {
					return nil, err
				}
				cpu := processCPU() - cpu0
				samples[impl] = append(samples[impl], s...)
				r.requests += len(s)
				r.failures += fails
				if r.firstFail == "" {
					r.firstFail = firstFail
				}
				r.measured += cfg.hookDuration / 2
				r.cpuPerRequest += cpu
			}
			for _, impl := range []string{implOurs, implReference} {
				r := res[impl]
				r.lat = summarize(samples[impl])
				if r.requests > 0 {
					r.cpuPerRequest /= time.Duration(r.requests)
				}
				out.results = append(out.results, *r)
			}
			b.printf("  %-20s %2d clients  %s %7.0f req/s p50 %6s ms p99 %6s ms | %s %7.0f req/s p50 %6s ms p99 %6s ms\n",
				hc.hook, n, implOurs, res[implOurs].rps(), ms(res[implOurs].lat.p50), ms(res[implOurs].lat.p99),
				implReference, res[implReference].rps(), ms(res[implReference].lat.p50), ms(res[implReference].lat.p99))
		}
	}
	return out, nil
}

// newReferenceServer serves Cluster API's reference in-place handlers
// (sigs.k8s.io/cluster-api/test, extension/handlers/inplaceupdate) on the runtime SDK
// server, under the same handler names as capi-inplace's, so the URLs are alike.
func newReferenceServer(opts runtimeserver.Options, h *inplaceupdate.ExtensionHandlers) (*runtimeserver.Server, error) {
	catalog := runtimecatalog.New()
	if err := runtimehooksv1.AddToCatalog(catalog); err != nil {
		return nil, err
	}
	opts.Catalog = catalog
	srv, err := runtimeserver.New(opts)
	if err != nil {
		return nil, err
	}
	for _, handler := range []runtimeserver.ExtensionHandler{
		{Hook: runtimehooksv1.CanUpdateMachineSet, Name: extension.CanUpdateMachineSetHandlerName, HandlerFunc: h.DoCanUpdateMachineSet},
		{Hook: runtimehooksv1.CanUpdateMachine, Name: extension.CanUpdateMachineHandlerName, HandlerFunc: h.DoCanUpdateMachine},
		{Hook: runtimehooksv1.UpdateMachine, Name: extension.UpdateMachineHandlerName, HandlerFunc: h.DoUpdateMachine},
	} {
		if err := srv.AddExtensionHandler(handler); err != nil {
			return nil, err
		}
	}
	return srv, nil
}

// createRunningNodeUpdates gives each machine of the cluster the NodeUpdate of its
// running in-place upgrade to hookToVersion, at step KubernetesUpgrade, as the task
// controller and the Harvester updater leave it: the steady state of UpdateMachine.
func createRunningNodeUpdates(ctx context.Context, c client.Client, ns, cluster string, machines int) error {
	const task = "workers-v1.36.0-b3nch000"
	start := metav1.NewTime(time.Now().Add(-2 * time.Minute).Truncate(time.Second))
	return parallel(ctx, machines, func(i int) error {
		machine := machineName(i + 1)
		nu := &inplacev1.NodeUpdate{
			ObjectMeta: metav1.ObjectMeta{
				Namespace: ns, Name: upgraderequest.NodeUpdateName(task, machine),
				Labels: map[string]string{inplacev1.UpgradeTaskLabel: upgraderequest.LabelValue(task), inplacev1.ClusterNameLabel: cluster},
			},
			Spec: inplacev1.NodeUpdateSpec{
				ClusterName: cluster, MachineName: machine, NodeName: fixtures.NodeName(ns, machine), Version: hookToVersion,
				UpdaterRef: inplacev1.UpdaterReference{Kind: "HarvesterUpgrader", Name: "default"}, Phase: inplacev1.TaskActionOngoing,
			},
		}
		if err := c.Create(ctx, nu); err != nil {
			return fmt.Errorf("create NodeUpdate %s: %w", nu.Name, err)
		}
		nu.Status = inplacev1.NodeUpdateStatus{
			Phase: inplacev1.NodeUpdatePhaseInProgress, StartTime: &start, CurrentStep: harvesteradapter.StepKubernetesUpgrade, Attempts: 1,
			Steps: []inplacev1.NodeUpdateStep{
				{Name: harvesteradapter.StepRepository, State: inplacev1.StepStateSucceeded, StartTime: &start, CompletionTime: &start, Message: "repository ready at http://upgrade-repo-hvst-upgrade.harvester-system/harvester-iso"},
				{Name: harvesteradapter.StepImagePreload, State: inplacev1.StepStateSucceeded, StartTime: &start, CompletionTime: &start},
				{Name: harvesteradapter.StepLonghornDataEngine, State: inplacev1.StepStateSucceeded, StartTime: &start, CompletionTime: &start},
				{Name: harvesteradapter.StepKubernetesUpgrade, State: inplacev1.StepStateRunning, StartTime: &start, Message: "SUC Plan capi-inplace-rke2 running on the node"},
				{Name: harvesteradapter.StepOSUpgrade, State: inplacev1.StepStatePending},
				{Name: harvesteradapter.StepFinish, State: inplacev1.StepStatePending},
			},
		}
		if err := c.Status().Update(ctx, nu); err != nil {
			return fmt.Errorf("set status of NodeUpdate %s: %w", nu.Name, err)
		}
		return nil
	})
}

// buildHookCases builds the request bodies of each hook and the paths each server serves
// them at (with the timeout query Cluster API adds).
func buildHookCases(ctx context.Context, c client.Client, ns, cluster string, machines int) ([]hookCase, error) {
	catalog := runtimecatalog.New()
	if err := runtimehooksv1.AddToCatalog(catalog); err != nil {
		return nil, err
	}
	path := func(hook runtimecatalog.Hook, name string) (string, error) {
		gvh, err := catalog.GroupVersionHook(hook)
		if err != nil {
			return "", err
		}
		return runtimecatalog.GVHToPath(gvh, name) + "?timeout=10s", nil
	}
	paths := func(hook runtimecatalog.Hook, name string) (map[string]string, error) {
		p, err := path(hook, name)
		return map[string]string{implOurs: p, implReference: p}, err
	}

	ms := &clusterv1.MachineSet{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: mdName + "-5d8f7c9b4"}, ms); err != nil {
		return nil, err
	}
	msReq, err := canUpdateMachineSetBody(ms)
	if err != nil {
		return nil, err
	}
	msBody, err := marshalBody(msReq)
	if err != nil {
		return nil, err
	}
	mReq, err := canUpdateMachineBody(ns, cluster)
	if err != nil {
		return nil, err
	}
	mBody, err := marshalBody(mReq)
	if err != nil {
		return nil, err
	}
	var umBodies [][]byte
	for i := 1; i <= machines; i++ {
		m := &clusterv1.Machine{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: machineName(i)}, m); err != nil {
			return nil, err
		}
		req, err := updateMachineBody(m)
		if err != nil {
			return nil, err
		}
		body, err := marshalBody(req)
		if err != nil {
			return nil, err
		}
		umBodies = append(umBodies, body)
	}

	var cases []hookCase
	for _, hc := range []struct {
		name   string
		hook   runtimecatalog.Hook
		handle string
		bodies [][]byte
	}{
		{"CanUpdateMachineSet", runtimehooksv1.CanUpdateMachineSet, extension.CanUpdateMachineSetHandlerName, [][]byte{msBody}},
		{"CanUpdateMachine", runtimehooksv1.CanUpdateMachine, extension.CanUpdateMachineHandlerName, [][]byte{mBody}},
		{"UpdateMachine", runtimehooksv1.UpdateMachine, extension.UpdateMachineHandlerName, umBodies},
	} {
		p, err := paths(hc.hook, hc.handle)
		if err != nil {
			return nil, err
		}
		cases = append(cases, hookCase{hook: hc.name, bodies: hc.bodies, paths: p, answers: map[string]string{}})
	}
	return cases, nil
}

// checkAnswers calls each implementation once per hook and checks that it answers
// Success (so that the benchmark measures the path Cluster API relies on, not an error
// path), and for capi-inplace that Cluster API's verdict is "in place". It records what
// each answered. The first call also starts the informers the handlers read from.
func checkAnswers(ctx context.Context, hc *hookCase, clients map[string]*http.Client, bases map[string]string) error {
	for _, impl := range []string{implOurs, implReference} {
		data, err := post(ctx, clients[impl], bases[impl]+hc.paths[impl], hc.bodies[0])
		if err != nil {
			return fmt.Errorf("%s %s: %w", impl, hc.hook, err)
		}
		var answer string
		switch hc.hook {
		case "CanUpdateMachineSet":
			req, resp := &runtimehooksv1.CanUpdateMachineSetRequest{}, &runtimehooksv1.CanUpdateMachineSetResponse{}
			if err := decodeBoth(hc.bodies[0], req, data, resp); err != nil {
				return err
			}
			if resp.Status != runtimehooksv1.ResponseStatusSuccess {
				return fmt.Errorf("%s %s answered %s: %s", impl, hc.hook, resp.Status, resp.Message)
			}
			inPlace, left, err := capisim.VerdictMachineSet(req, resp)
			if err != nil {
				return err
			}
			answer = verdictText(inPlace, left)
			if impl == implOurs && !inPlace {
				return fmt.Errorf("%s %s: Cluster API would not update in place (left: %v): %s", impl, hc.hook, left, resp.Message)
			}
		case "CanUpdateMachine":
			req, resp := &runtimehooksv1.CanUpdateMachineRequest{}, &runtimehooksv1.CanUpdateMachineResponse{}
			if err := decodeBoth(hc.bodies[0], req, data, resp); err != nil {
				return err
			}
			if resp.Status != runtimehooksv1.ResponseStatusSuccess {
				return fmt.Errorf("%s %s answered %s: %s", impl, hc.hook, resp.Status, resp.Message)
			}
			inPlace, left, err := capisim.VerdictMachine(req, resp)
			if err != nil {
				return err
			}
			answer = verdictText(inPlace, left)
			if impl == implOurs && !inPlace {
				return fmt.Errorf("%s %s: Cluster API would not update in place (left: %v): %s", impl, hc.hook, left, resp.Message)
			}
		case "UpdateMachine":
			resp := &runtimehooksv1.UpdateMachineResponse{}
			if err := json.Unmarshal(data, resp); err != nil {
				return err
			}
			if resp.Status != runtimehooksv1.ResponseStatusSuccess || resp.RetryAfterSeconds == 0 {
				return fmt.Errorf("%s %s answered %s, retry after %ds: %s", impl, hc.hook, resp.Status, resp.RetryAfterSeconds, resp.Message)
			}
			answer = fmt.Sprintf("Success, retry after %d s: %q", resp.RetryAfterSeconds, resp.Message)
		}
		hc.answers[impl] = fmt.Sprintf("%s (%d bytes)", answer, len(data))
	}
	return nil
}

func verdictText(inPlace bool, left []string) string {
	if inPlace {
		return "Success; Cluster API's verdict: in place"
	}
	return fmt.Sprintf("Success; Cluster API's verdict: not in place (%v still differs)", left)
}

func decodeBoth(reqBody []byte, req any, respBody []byte, resp any) error {
	if err := json.Unmarshal(reqBody, req); err != nil {
		return err
	}
	return json.Unmarshal(respBody, resp)
}

// capiHTTPClient is the HTTP client Cluster API's runtime client builds for an extension
// (internal/runtime/client createHTTPClient): Kubernetes' transport defaults, HTTP/2,
// shared by every call to the extension.
func capiHTTPClient(tlsConfig *tls.Config) *http.Client {
	return &http.Client{
		Timeout:   10 * time.Second,
		Transport: utilnet.SetTransportDefaults(&http.Transport{TLSClientConfig: tlsConfig}),
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		},
	}
}

func post(ctx context.Context, c *http.Client, url string, body []byte) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("HTTP %d: %s", resp.StatusCode, data)
	}
	return data, nil
}

var successStatus = []byte(`"status":"Success"`)

// hammer runs n closed-loop clients against url for warmup then d, and returns the
// latency of every request started within d, the number of those that failed (not HTTP
// 200 with status Success) and the first failure. Client i sends bodies[(i+k) mod len]
// as its k-th request.
func hammer(ctx context.Context, c *http.Client, url string, bodies [][]byte, n int, warmup, d time.Duration) ([]time.Duration, int, string, error) {
	var (
		measuring atomic.Bool
		stopping  atomic.Bool
		wg        sync.WaitGroup
		mu        sync.Mutex
		all       []time.Duration
		fails     int
		firstFail string
	)
	for i := range n {
		wg.Go(func() {
			var mine []time.Duration
			myFails, myFirst := 0, ""
			for k := i; !stopping.Load() && ctx.Err() == nil; k++ {
				counted := measuring.Load()
				start := time.Now()
				data, err := post(ctx, c, url, bodies[k%len(bodies)])
				elapsed := time.Since(start)
				if !counted {
					continue
				}
				mine = append(mine, elapsed)
				if err == nil && !bytes.Contains(data, successStatus) {
					err = fmt.Errorf("answer is not a Success: %.300s", data)
				}
				if err != nil {
					myFails++
					if myFirst == "" {
						myFirst = err.Error()
					}
				}
			}
			mu.Lock()
			all = append(all, mine...)
			fails += myFails
			if firstFail == "" {
				firstFail = myFirst
			}
			mu.Unlock()
		})
	}
	sleep(ctx, warmup)
	measuring.Store(true)
	sleep(ctx, d)
	// Requests started after this point are not counted; those in flight finish.
	measuring.Store(false)
	stopping.Store(true)
	wg.Wait()
	if ctx.Err() != nil {
		return nil, 0, "", ctx.Err()
	}
	return all, fails, firstFail, nil
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// processCPU is the CPU time (user and system) this process used so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// startManager starts mgr and returns once its caches synced; stop ends it and waits.
func startManager(ctx context.Context, mgr ctrl.Manager) (stop func(), err error) {
	mctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- mgr.Start(mctx) }()
	stop = func() {
		cancel()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_, _ = fmt.Fprintln(os.Stderr, "bench: a manager did not stop within 30s")
		}
	}
	select {
	case <-mgr.Elected():
	case err := <-done:
		cancel()
		return nil, fmt.Errorf("manager ended before it started: %w", err)
	case <-time.After(time.Minute):
		stop()
		return nil, errors.New("manager did not start within a minute")
	}
	syncCtx, syncCancel := context.WithTimeout(ctx, time.Minute)
	defer syncCancel()
	if !mgr.GetCache().WaitForCacheSync(syncCtx) {
		stop()
		return nil, errors.New("the manager's caches did not sync within a minute")
	}
	return stop, nil
}

func waitStarted(ctx context.Context, srv *runtimeserver.Server) error {
	check := srv.StartedChecker()
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := check(nil)
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("hook server not started: %w", err)
		}
		sleep(ctx, 50*time.Millisecond)
	}
}
