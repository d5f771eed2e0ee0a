package e2e

import (
	"crypto/tls"
	"fmt"
	"os"
	"path/filepath"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	runtimehooksv1 "sigs.k8s.io/cluster-api/api/runtime/hooks/v1alpha1"

	"github.com/capi-inplace/capi-inplace/test/hookclient"
	"github.com/capi-inplace/capi-inplace/test/manager"
)

var _ = Describe("The hook servers' TLS", Ordered, func() {
	var proc *manager.Process

	BeforeAll(func() {
		logFile := filepath.Join(workDir, "manager-tls.log")
		var err error
		proc, err = manager.Start(manager.Options{Binary: managerBin, Kubeconfig: kubeconfig, CertDir: certs.Dir, LogFile: logFile,
			ExtraArgs: []string{"--webhook-client-ca=" + filepath.Join(certs.Dir, "ca.crt")}})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { Expect(proc.Stop()).To(Succeed()) })
		if err := proc.WaitReady(time.Minute); err != nil {
			log, _ := os.ReadFile(logFile)
			Fail(fmt.Sprintf("%v\nmanager log:\n%s", err, log))
		}
	})

	It("requires a client certificate of --webhook-client-ca on the ExternalUpgradeRequest server, and none on the server of Cluster API's hooks", func() {
		plain := must(manager.TLSConfig(certs.CAPEM))
		external := fmt.Sprintf("https://127.0.0.1:%d", proc.ExternalHookPort)
		_, err := hookclient.New(external, plain, externalCatalog()).Discover(ctx)
		Expect(err).To(HaveOccurred(), "a client without a certificate was served")
		Expect(err.Error()).To(Or(ContainSubstring("certificate required"), ContainSubstring("bad certificate")))

		withCert := plain.Clone()
		pair, err := tls.LoadX509KeyPair(filepath.Join(certs.Dir, "client.crt"), filepath.Join(certs.Dir, "client.key"))
		Expect(err).NotTo(HaveOccurred())
		withCert.Certificates = []tls.Certificate{pair}
		resp, err := hookclient.New(external, withCert, externalCatalog()).Discover(ctx)
		Expect(err).NotTo(HaveOccurred())
		Expect(resp.Status).To(Equal(runtimehooksv1.ResponseStatusSuccess))

		resp, err = hookclient.New(fmt.Sprintf("https://127.0.0.1:%d", proc.WebhookPort), plain, capiCatalog()).Discover(ctx)
		Expect(err).NotTo(HaveOccurred(), "Cluster API's runtime client presents no certificate and must be served")
		Expect(resp.Status).To(Equal(runtimehooksv1.ResponseStatusSuccess))
	})

	It("refuses TLS 1.2 cipher suites without forward secrecy or authenticated encryption", func() {
		weak := must(manager.TLSConfig(certs.CAPEM))
		weak.MaxVersion = tls.VersionTLS12
		weak.CipherSuites = []uint16{tls.TLS_RSA_WITH_AES_128_CBC_SHA, tls.TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA, tls.TLS_RSA_WITH_AES_128_GCM_SHA256}
		_, err := hookclient.New(fmt.Sprintf("https://127.0.0.1:%d", proc.WebhookPort), weak, capiCatalog()).Discover(ctx)
		Expect(err).To(HaveOccurred())
		Expect(err.Error()).To(ContainSubstring("handshake failure"))

		modern := must(manager.TLSConfig(certs.CAPEM))
		modern.MaxVersion = tls.VersionTLS12
		modern.CipherSuites = []uint16{tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256}
		_, err = hookclient.New(fmt.Sprintf("https://127.0.0.1:%d", proc.WebhookPort), modern, capiCatalog()).Discover(ctx)
		Expect(err).NotTo(HaveOccurred())
	})
})
