package e2e

import (
	"crypto/tls"
	"fmt"
	"os"
	"path/filepath"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	runtimecatalog "sigs.k8s.io/cluster-api/api/runtime/catalog"
	runtimehooksv1 "sigs.k8s.io/cluster-api/api/runtime/hooks/v1alpha1"

	hooksv1 "github.com/capi-inplace/capi-inplace/api/hooks/v1alpha1"

	"github.com/capi-inplace/capi-inplace/test/hookclient"
	"github.com/capi-inplace/capi-inplace/test/manager"
)

var _ = Describe("The hook servers' TLS and callers", Ordered, func() {
	// proc authenticates callers as the shipped config/ does (manager.Start's default:
	// both CAs set); open runs with no credential flag at all, so its defaults show.
	var proc, open *manager.Process
	var tokenFile string

	startManager := func(name string, extraArgs ...string) *manager.Process {
		logFile := filepath.Join(workDir, name+".log")
		p, err := manager.Start(manager.Options{Binary: managerBin, Kubeconfig: kubeconfig, CertDir: certs.Dir, LogFile: logFile, ExtraArgs: extraArgs})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { Expect(p.Stop()).To(Succeed()) })
		if err := p.WaitReady(time.Minute); err != nil {
			log, _ := os.ReadFile(logFile)
			Fail(fmt.Sprintf("%v\nmanager log:\n%s", err, log))
		}
		return p
	}

	BeforeAll(func() {
		proc = startManager("manager-tls")
		tokenFile = filepath.Join(workDir, "external-hook-token")
		Expect(os.WriteFile(tokenFile, []byte("e2e-external-hook-token\n"), 0o600)).To(Succeed())
		open = startManager("manager-tls-defaults", "--hook-client-ca=", "--external-hook-client-ca=")
	})

	It("requires a client certificate of --hook-client-ca on the server of Cluster API's hooks and of --external-hook-client-ca on the ExternalUpgradeRequest server", func() {
		plain := must(manager.TLSConfig(certs.CAPEM))
		withCert := must(manager.ClientTLSConfig(certs.Dir))
		for _, server := range []struct {
			url     string
			catalog *runtimecatalog.Catalog
			flag    string
		}{
			{fmt.Sprintf("https://127.0.0.1:%d", proc.WebhookPort), capiCatalog(), "--hook-client-ca"},
			{fmt.Sprintf("https://127.0.0.1:%d", proc.ExternalHookPort), externalCatalog(), "--external-hook-client-ca"},
		} {
			_, err := hookclient.New(server.url, plain, server.catalog).Discover(ctx)
			Expect(err).To(MatchError(And(ContainSubstring("HTTP 401"), ContainSubstring("no client certificate was presented"),
				ContainSubstring(server.flag))), "a client without a certificate was served by %s", server.url)

			resp, err := hookclient.New(server.url, withCert, server.catalog).Discover(ctx)
			Expect(err).NotTo(HaveOccurred())
			Expect(resp.Status).To(Equal(runtimehooksv1.ResponseStatusSuccess))
		}
	})

	It("refuses every ExternalUpgradeRequest without a credential flag, serves Cluster API's hooks without --hook-client-ca", func() {
		plain := must(manager.TLSConfig(certs.CAPEM))
		req := &hooksv1.ExternalUpgradeRequestRequest{NewMachineSpec: hooksv1.NewMachineSpec{Version: "v1.33.3+rke2r1"}}
		req.Cluster.Name, req.Cluster.Namespace = "nope", "default"
		external := hookclient.New(fmt.Sprintf("https://127.0.0.1:%d", open.ExternalHookPort), plain, externalCatalog())
		err := external.Call(ctx, hooksv1.ExternalUpgradeRequest, "external-upgrade-request", req, &hooksv1.ExternalUpgradeRequestResponse{})
		Expect(err).To(MatchError(And(ContainSubstring("HTTP 403"), ContainSubstring("--external-hook-token-file"),
			ContainSubstring("--external-hook-insecure-allow-anonymous"))), "an unauthenticated ExternalUpgradeRequest was served")
		_, err = hookclient.New(fmt.Sprintf("https://127.0.0.1:%d", open.ExternalHookPort), must(manager.ClientTLSConfig(certs.Dir)), externalCatalog()).Discover(ctx)
		Expect(err).To(MatchError(ContainSubstring("HTTP 403")), "a certificate was let in though no CA was configured")

		resp, err := hookclient.New(fmt.Sprintf("https://127.0.0.1:%d", open.WebhookPort), plain, capiCatalog()).Discover(ctx)
		Expect(err).NotTo(HaveOccurred())
		Expect(resp.Status).To(Equal(runtimehooksv1.ResponseStatusSuccess))
	})

	It("serves an ExternalUpgradeRequest with the bearer token of --external-hook-token-file and refuses a wrong one", func() {
		withToken := startManager("manager-tls-token", "--external-hook-client-ca=", "--external-hook-token-file="+tokenFile)
		url := fmt.Sprintf("https://127.0.0.1:%d", withToken.ExternalHookPort)
		plain := must(manager.TLSConfig(certs.CAPEM))
		resp, err := hookclient.New(url, plain, externalCatalog()).WithBearerToken("e2e-external-hook-token").Discover(ctx)
		Expect(err).NotTo(HaveOccurred())
		Expect(resp.Status).To(Equal(runtimehooksv1.ResponseStatusSuccess))
		_, err = hookclient.New(url, plain, externalCatalog()).WithBearerToken("e2e-external-hook-tokeX").Discover(ctx)
		Expect(err).To(MatchError(And(ContainSubstring("HTTP 403"), ContainSubstring("the bearer token is wrong"))))
		_, err = hookclient.New(url, plain, externalCatalog()).Discover(ctx)
		Expect(err).To(MatchError(And(ContainSubstring("HTTP 401"), ContainSubstring("no bearer token was sent"))))
	})

	It("refuses TLS 1.2 cipher suites without forward secrecy or authenticated encryption", func() {
		weak := must(manager.TLSConfig(certs.CAPEM))
		weak.MaxVersion = tls.VersionTLS12
		weak.CipherSuites = []uint16{tls.TLS_RSA_WITH_AES_128_CBC_SHA, tls.TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA, tls.TLS_RSA_WITH_AES_128_GCM_SHA256}
		_, err := hookclient.New(fmt.Sprintf("https://127.0.0.1:%d", proc.WebhookPort), weak, capiCatalog()).Discover(ctx)
		Expect(err).To(HaveOccurred())
		Expect(err.Error()).To(ContainSubstring("handshake failure"))

		modern := must(manager.ClientTLSConfig(certs.Dir))
		modern.MaxVersion = tls.VersionTLS12
		modern.CipherSuites = []uint16{tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256}
		_, err = hookclient.New(fmt.Sprintf("https://127.0.0.1:%d", proc.WebhookPort), modern, capiCatalog()).Discover(ctx)
		Expect(err).NotTo(HaveOccurred())
	})
})
