package extension_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	runtimecatalog "sigs.k8s.io/cluster-api/api/runtime/catalog"
	runtimehooksv1 "sigs.k8s.io/cluster-api/api/runtime/hooks/v1alpha1"
	runtimeserver "sigs.k8s.io/cluster-api/exp/runtime/server"

	hooksv1 "github.com/capi-inplace/capi-inplace/api/hooks/v1alpha1"
	"github.com/capi-inplace/capi-inplace/extension"
	"github.com/capi-inplace/capi-inplace/test/hookclient"
	"github.com/capi-inplace/capi-inplace/test/manager"
)

// acceptAll answers every hook with Success, so a spec sees only what the caller gate did.
type acceptAll struct{}

func (acceptAll) CanUpdateMachineSet(_ context.Context, _ *runtimehooksv1.CanUpdateMachineSetRequest, resp *runtimehooksv1.CanUpdateMachineSetResponse) {
	resp.SetStatus(runtimehooksv1.ResponseStatusSuccess)
}

func (acceptAll) CanUpdateMachine(_ context.Context, _ *runtimehooksv1.CanUpdateMachineRequest, resp *runtimehooksv1.CanUpdateMachineResponse) {
	resp.SetStatus(runtimehooksv1.ResponseStatusSuccess)
}

func (acceptAll) UpdateMachine(_ context.Context, _ *runtimehooksv1.UpdateMachineRequest, resp *runtimehooksv1.UpdateMachineResponse) {
	resp.SetStatus(runtimehooksv1.ResponseStatusSuccess)
}

func (acceptAll) ExternalUpgradeRequest(_ context.Context, _ *hooksv1.ExternalUpgradeRequestRequest, resp *hooksv1.ExternalUpgradeRequestResponse) {
	resp.SetStatus(runtimehooksv1.ResponseStatusSuccess)
	resp.Decision = hooksv1.DecisionAccept
}

var _ = Describe("Who may call the hook servers", func() {
	var (
		certs, otherCerts *manager.ServingCerts
		caFile            string
	)

	BeforeEach(func() {
		dir := GinkgoT().TempDir()
		var err error
		certs, err = manager.NewServingCerts(filepath.Join(dir, "ours"))
		Expect(err).NotTo(HaveOccurred())
		otherCerts, err = manager.NewServingCerts(filepath.Join(dir, "other"))
		Expect(err).NotTo(HaveOccurred())
		caFile = filepath.Join(certs.Dir, "ca.crt")
	})

	// serve starts srv and returns its address once it listens.
	serve := func(newServer func(extension.ServerOptions) (*runtimeserver.Server, error), opts extension.ServerOptions) string {
		ports, err := manager.FreePorts(1)
		Expect(err).NotTo(HaveOccurred())
		opts.Port, opts.CertDir = ports[0], certs.Dir
		opts.TLSOpts = []func(*tls.Config){extension.ServingTLS}
		srv, err := newServer(opts)
		Expect(err).NotTo(HaveOccurred())
		srvCtx, cancel := context.WithCancel(ctx)
		DeferCleanup(cancel)
		go func() { _ = srv.Start(srvCtx) }()
		Eventually(func() error { return srv.StartedChecker()(&http.Request{}) }).WithTimeout(10 * time.Second).Should(Succeed())
		return fmt.Sprintf("https://127.0.0.1:%d", ports[0])
	}
	capiServer := func(opts extension.ServerOptions) string {
		return serve(func(o extension.ServerOptions) (*runtimeserver.Server, error) {
			return extension.NewCAPIHookServer(o, acceptAll{})
		}, opts)
	}
	externalServer := func(opts extension.ServerOptions) string {
		return serve(func(o extension.ServerOptions) (*runtimeserver.Server, error) {
			return extension.NewExternalHookServer(o, acceptAll{})
		}, opts)
	}
	noCert := func() *tls.Config { return must(manager.TLSConfig(certs.CAPEM)) }
	withCert := func() *tls.Config { return must(manager.ClientTLSConfig(certs.Dir)) }
	// withOtherCert presents a client certificate another CA signed.
	withOtherCert := func() *tls.Config {
		c := noCert()
		c.Certificates = must(manager.ClientTLSConfig(otherCerts.Dir)).Certificates
		return c
	}
	capiCall := func(url string, c *tls.Config) error {
		resp := &runtimehooksv1.CanUpdateMachineResponse{}
		err := hookclient.New(url, c, capiHookCatalog()).Call(ctx, runtimehooksv1.CanUpdateMachine, extension.CanUpdateMachineHandlerName,
			&runtimehooksv1.CanUpdateMachineRequest{}, resp)
		if err == nil && resp.Status != runtimehooksv1.ResponseStatusSuccess {
			return fmt.Errorf("answered %s: %s", resp.Status, resp.Message)
		}
		return err
	}
	eurCall := func(client *hookclient.Client) error {
		resp := &hooksv1.ExternalUpgradeRequestResponse{}
		err := client.Call(ctx, hooksv1.ExternalUpgradeRequest, extension.ExternalUpgradeRequestHandlerName, &hooksv1.ExternalUpgradeRequestRequest{}, resp)
		if err == nil && resp.Decision != hooksv1.DecisionAccept {
			return fmt.Errorf("answered %s %s: %s", resp.Status, resp.Decision, resp.Message)
		}
		return err
	}
	eur := func(url string, c *tls.Config) *hookclient.Client {
		return hookclient.New(url, c, externalHookCatalog())
	}

	It("serves Cluster API's hooks only to a client certificate of --hook-client-ca when it is set, discovery included", func() {
		url := capiServer(extension.ServerOptions{Callers: extension.Callers{ClientCAFile: caFile}})

		err := capiCall(url, noCert())
		Expect(err).To(MatchError(And(ContainSubstring("HTTP 401"), ContainSubstring("no client certificate was presented"),
			ContainSubstring("--hook-client-ca"))))
		_, err = hookclient.New(url, noCert(), capiHookCatalog()).Discover(ctx)
		Expect(err).To(MatchError(ContainSubstring("HTTP 401")), "discovery without a certificate was served")
		Expect(capiCall(url, withOtherCert())).To(MatchError(And(ContainSubstring("HTTP 401"), ContainSubstring("is not accepted"))))

		Expect(capiCall(url, withCert())).To(Succeed())
		resp, err := hookclient.New(url, withCert(), capiHookCatalog()).Discover(ctx)
		Expect(err).NotTo(HaveOccurred())
		Expect(resp.Handlers).To(HaveLen(3))
	})

	It("serves Cluster API's hooks to every caller without --hook-client-ca (Cluster API's default presents no certificate)", func() {
		url := capiServer(extension.ServerOptions{})
		Expect(capiCall(url, noCert())).To(Succeed())
	})

	It("refuses every ExternalUpgradeRequest by default, saying what the operator sets", func() {
		url := externalServer(extension.ServerOptions{})
		err := eurCall(eur(url, noCert()))
		Expect(err).To(MatchError(And(ContainSubstring("HTTP 403"), ContainSubstring("accepts no caller"),
			ContainSubstring("--external-hook-client-ca"), ContainSubstring("--external-hook-token-file"),
			ContainSubstring("--external-hook-insecure-allow-anonymous"))))
		Expect(eurCall(eur(url, withCert()))).To(MatchError(ContainSubstring("HTTP 403")), "a certificate no CA was configured for was let in")
		Expect(eurCall(eur(url, noCert()).WithBearerToken("anything"))).To(MatchError(ContainSubstring("HTTP 403")))
	})

	It("serves every ExternalUpgradeRequest caller only with the lab flag", func() {
		url := externalServer(extension.ServerOptions{AllowAnonymous: true})
		Expect(eurCall(eur(url, noCert()))).To(Succeed())
	})

	It("serves an ExternalUpgradeRequest with a client certificate of --external-hook-client-ca, and refuses one without", func() {
		url := externalServer(extension.ServerOptions{Callers: extension.Callers{ClientCAFile: caFile}})
		Expect(eurCall(eur(url, withCert()))).To(Succeed())
		Expect(eurCall(eur(url, noCert()))).To(MatchError(And(ContainSubstring("HTTP 401"), ContainSubstring("--external-hook-client-ca"))))
		Expect(eurCall(eur(url, withOtherCert()))).To(MatchError(ContainSubstring("HTTP 401")))
	})

	It("serves an ExternalUpgradeRequest with the bearer token of --external-hook-token-file, refuses a wrong one, and follows a rotation", func() {
		tokenFile := filepath.Join(GinkgoT().TempDir(), "token")
		Expect(os.WriteFile(tokenFile, []byte("first-secret-token\n"), 0o600)).To(Succeed())
		url := externalServer(extension.ServerOptions{Callers: extension.Callers{TokenFile: tokenFile, ClientCAFile: caFile}})

		Expect(eurCall(eur(url, noCert()).WithBearerToken("first-secret-token"))).To(Succeed())
		Expect(eurCall(eur(url, withCert()))).To(Succeed(), "a client certificate is still let in beside the token")
		err := eurCall(eur(url, noCert()).WithBearerToken("first-secret-tokex"))
		Expect(err).To(MatchError(And(ContainSubstring("HTTP 403"), ContainSubstring("the bearer token is wrong"))))
		Expect(err.Error()).NotTo(ContainSubstring("first-secret-token"), "the answer must not reveal the token")
		Expect(eurCall(eur(url, noCert()))).To(MatchError(And(ContainSubstring("HTTP 401"), ContainSubstring("no bearer token was sent"),
			ContainSubstring("no client certificate was presented"))))

		By("rotating the token: the old one is refused, the new one served, without a restart")
		Expect(os.WriteFile(tokenFile, []byte("second-secret-token-longer"), 0o600)).To(Succeed())
		Expect(eurCall(eur(url, noCert()).WithBearerToken("first-secret-token"))).To(MatchError(ContainSubstring("HTTP 403")))
		Expect(eurCall(eur(url, noCert()).WithBearerToken("second-secret-token-longer"))).To(Succeed())
	})

	It("refuses token calls while the token file does not exist yet, and serves them once it does", func() {
		tokenFile := filepath.Join(GinkgoT().TempDir(), "token")
		callers := extension.Callers{TokenFile: tokenFile}
		Expect(callers.Check("ca", "token")).To(Succeed(), "an optional Secret's file appears later")
		url := externalServer(extension.ServerOptions{Callers: callers})
		Expect(eurCall(eur(url, noCert()).WithBearerToken("t0ken"))).To(MatchError(And(ContainSubstring("HTTP 403"), ContainSubstring("no usable --external-hook-token-file token"))))
		Expect(os.WriteFile(tokenFile, []byte("t0ken"), 0o600)).To(Succeed())
		Expect(eurCall(eur(url, noCert()).WithBearerToken("t0ken"))).To(Succeed())
	})

	It("stops the manager at its start on a CA bundle that is missing or holds no certificate, or an empty token file", func() {
		dir := GinkgoT().TempDir()
		Expect(extension.Callers{ClientCAFile: filepath.Join(dir, "missing")}.Check("hook-client-ca", "")).To(MatchError(ContainSubstring("--hook-client-ca")))
		Expect(os.WriteFile(filepath.Join(dir, "junk"), []byte("not a certificate"), 0o600)).To(Succeed())
		Expect(extension.Callers{ClientCAFile: filepath.Join(dir, "junk")}.Check("hook-client-ca", "")).To(MatchError(ContainSubstring("holds no PEM certificate")))
		Expect(os.WriteFile(filepath.Join(dir, "empty"), []byte("\n"), 0o600)).To(Succeed())
		Expect(extension.Callers{TokenFile: filepath.Join(dir, "empty")}.Check("", "external-hook-token-file")).To(MatchError(And(
			ContainSubstring("--external-hook-token-file"), ContainSubstring("is empty"))))
	})
})

func capiHookCatalog() *runtimecatalog.Catalog {
	c := runtimecatalog.New()
	Expect(runtimehooksv1.AddToCatalog(c)).To(Succeed())
	return c
}

func externalHookCatalog() *runtimecatalog.Catalog {
	c := capiHookCatalog()
	Expect(hooksv1.AddToCatalog(c)).To(Succeed())
	return c
}

func must[T any](v T, err error) T {
	GinkgoHelper()
	Expect(err).NotTo(HaveOccurred())
	return v
}
