package e2e

import (
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	runtimecatalog "sigs.k8s.io/cluster-api/api/runtime/catalog"
	runtimehooksv1 "sigs.k8s.io/cluster-api/api/runtime/hooks/v1alpha1"

	hooksv1 "github.com/capi-inplace/capi-inplace/api/hooks/v1alpha1"
	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/test/hookclient"
	"github.com/capi-inplace/capi-inplace/test/manager"
)

func capiCatalog() *runtimecatalog.Catalog {
	c := runtimecatalog.New()
	Expect(runtimehooksv1.AddToCatalog(c)).To(Succeed())
	return c
}

func externalCatalog() *runtimecatalog.Catalog {
	c := capiCatalog()
	Expect(hooksv1.AddToCatalog(c)).To(Succeed())
	return c
}

func handlerNames(resp *runtimehooksv1.DiscoveryResponse) []string {
	var names []string
	for _, h := range resp.Handlers {
		names = append(names, h.Name)
	}
	sort.Strings(names)
	return names
}

var _ = Describe("The manager", Ordered, func() {
	var (
		proc    *manager.Process
		logFile string
		tlsConf *tls.Config
	)

	BeforeAll(func() {
		logFile = filepath.Join(workDir, "manager.log")
		var err error
		proc, err = manager.Start(manager.Options{Binary: managerBin, Kubeconfig: kubeconfig, CertDir: certs.Dir, LogFile: logFile})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() {
			Expect(proc.Stop()).To(Succeed())
		})
		if err := proc.WaitReady(time.Minute); err != nil {
			log, _ := os.ReadFile(logFile)
			Fail(fmt.Sprintf("%v\nmanager log:\n%s", err, log))
		}
		tlsConf, err = manager.ClientTLSConfig(certs.Dir)
		Expect(err).NotTo(HaveOccurred())
	})

	It("answers its health and readiness probes", func() {
		for _, path := range []string{"/healthz", "/readyz"} {
			resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d%s", proc.HealthPort, path))
			Expect(err).NotTo(HaveOccurred())
			_ = resp.Body.Close()
			Expect(resp.StatusCode).To(Equal(http.StatusOK), path)
		}
	})

	It("serves Prometheus metrics", func() {
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/metrics", proc.MetricsPort))
		Expect(err).NotTo(HaveOccurred())
		defer func() { _ = resp.Body.Close() }()
		body, err := io.ReadAll(resp.Body)
		Expect(err).NotTo(HaveOccurred())
		Expect(resp.StatusCode).To(Equal(http.StatusOK))
		Expect(string(body)).To(ContainSubstring("go_goroutines"))
	})

	It("lists exactly Cluster API's in-place update hooks in discovery on the webhook port, all from Cluster API's catalog", func() {
		cat := capiCatalog()
		c := hookclient.New(fmt.Sprintf("https://127.0.0.1:%d", proc.WebhookPort), tlsConf, cat)
		resp, err := c.Discover(ctx)
		Expect(err).NotTo(HaveOccurred())
		Expect(resp.Status).To(Equal(runtimehooksv1.ResponseStatusSuccess))
		Expect(handlerNames(resp)).To(Equal([]string{"can-update-machine", "can-update-machineset", "update-machine"}))
		hooks := map[string]string{}
		for _, h := range resp.Handlers {
			hooks[h.Name] = h.RequestHook.Hook
			Expect(h.RequestHook.APIVersion).To(Equal(runtimehooksv1.GroupVersion.String()), h.Name)
			// Cluster API's discovery rejects a handler whose hook is not in its catalog.
			gvh := runtimecatalog.GroupVersionHook{Group: runtimehooksv1.GroupVersion.Group, Version: runtimehooksv1.GroupVersion.Version, Hook: h.RequestHook.Hook}
			_, err := cat.Request(gvh)
			Expect(err).NotTo(HaveOccurred(), "hook %s of handler %s is not in Cluster API's catalog", h.RequestHook.Hook, h.Name)
		}
		Expect(hooks).To(Equal(map[string]string{
			"can-update-machineset": "CanUpdateMachineSet",
			"can-update-machine":    "CanUpdateMachine",
			"update-machine":        "UpdateMachine",
		}))
	})

	It("lists exactly the ExternalUpgradeRequest hook of its own catalog on the external hook port", func() {
		c := hookclient.New(fmt.Sprintf("https://127.0.0.1:%d", proc.ExternalHookPort), tlsConf, externalCatalog())
		resp, err := c.Discover(ctx)
		Expect(err).NotTo(HaveOccurred())
		Expect(resp.Status).To(Equal(runtimehooksv1.ResponseStatusSuccess))
		Expect(resp.Handlers).To(HaveLen(1))
		Expect(resp.Handlers[0].Name).To(Equal("external-upgrade-request"))
		Expect(resp.Handlers[0].RequestHook).To(Equal(runtimehooksv1.GroupVersionHook{
			APIVersion: "hooks.inplace.cluster.x-k8s.io/v1alpha1", Hook: "ExternalUpgradeRequest",
		}))
	})

	It("answers an ExternalUpgradeRequest over HTTPS: a request for a Cluster that does not exist is declined with the reason", func() {
		c := hookclient.New(fmt.Sprintf("https://127.0.0.1:%d", proc.ExternalHookPort), tlsConf, externalCatalog())
		req := &hooksv1.ExternalUpgradeRequestRequest{
			MachineDeploymentRef: &inplacev1.MachineDeploymentReference{Name: "workers"},
			NewMachineSpec:       hooksv1.NewMachineSpec{Version: "v1.33.3+rke2r1"},
		}
		req.Cluster.Name, req.Cluster.Namespace = "nope", "default"
		resp := &hooksv1.ExternalUpgradeRequestResponse{}
		Expect(c.Call(ctx, hooksv1.ExternalUpgradeRequest, "external-upgrade-request", req, resp)).To(Succeed())
		Expect(resp.Status).To(Equal(runtimehooksv1.ResponseStatusSuccess))
		Expect(resp.Decision).To(Equal(hooksv1.DecisionDecline))
		Expect(resp.Message).To(ContainSubstring("Cluster default/nope not found"))
	})

	It("serves TLS that a client verifies against the serving CA, and refuses TLS older than 1.2", func() {
		url := fmt.Sprintf("https://127.0.0.1:%d", proc.WebhookPort)

		untrusting := hookclient.New(url, &tls.Config{MinVersion: tls.VersionTLS12}, capiCatalog())
		_, err := untrusting.Discover(ctx)
		Expect(err).To(MatchError(ContainSubstring("certificate signed by unknown authority")))

		old := tlsConf.Clone()
		old.MinVersion, old.MaxVersion = tls.VersionTLS10, tls.VersionTLS11
		_, err = hookclient.New(url, old, capiCatalog()).Discover(ctx)
		Expect(err).To(HaveOccurred())
		Expect(err.Error()).To(Or(ContainSubstring("protocol version"), ContainSubstring("no supported versions")))
	})
})

var _ = Describe("The manager's flags", func() {
	It("refuses a malformed --default-updater with a message that says the expected form", func() {
		cmd := exec.Command(managerBin, "--kubeconfig="+kubeconfig, "--default-updater=HarvesterUpgrader",
			"--leader-elect=false", "--metrics-bind-address=0", "--health-probe-bind-address=0")
		out, err := cmd.CombinedOutput()
		Expect(err).To(HaveOccurred(), "the manager started with a malformed --default-updater")
		Expect(string(out)).To(ContainSubstring(`capi-inplace: --default-updater: updater reference "HarvesterUpgrader" is not of the form Kind/name (for example HarvesterUpgrader/default)`))
	})
})
