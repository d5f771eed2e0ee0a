package capie2e

import (
	"fmt"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	runtimecatalog "sigs.k8s.io/cluster-api/api/runtime/catalog"
	runtimehooksv1 "sigs.k8s.io/cluster-api/api/runtime/hooks/v1alpha1"

	"github.com/capi-inplace/capi-inplace/test/hookclient"
	"github.com/capi-inplace/capi-inplace/test/manager"
)

var _ = Describe("The hooks' client authentication, with Cluster API's own controllers presenting client certificates", func() {
	catalog := func() *runtimecatalog.Catalog {
		c := runtimecatalog.New()
		Expect(runtimehooksv1.AddToCatalog(c)).To(Succeed())
		return c
	}

	It("refuses a direct call without a client certificate of Cluster API's CA, discovery included", func() {
		url := fmt.Sprintf("https://127.0.0.1:%d", mgr.WebhookPort)
		plain, err := manager.TLSConfig(certs.CAPEM)
		Expect(err).NotTo(HaveOccurred())
		_, err = hookclient.New(url, plain, catalog()).Discover(ctx)
		Expect(err).To(MatchError(And(ContainSubstring("HTTP 401"), ContainSubstring("no client certificate was presented"), ContainSubstring("--hook-client-ca"))))

		resp := &runtimehooksv1.CanUpdateMachineSetResponse{}
		err = hookclient.New(url, plain, catalog()).Call(ctx, runtimehooksv1.CanUpdateMachineSet, "can-update-machineset", &runtimehooksv1.CanUpdateMachineSetRequest{}, resp)
		Expect(err).To(MatchError(ContainSubstring("HTTP 401")))

		By("a client certificate of another CA (the manager's serving CA) is refused too")
		otherCA, err := manager.ClientTLSConfig(certs.Dir)
		Expect(err).NotTo(HaveOccurred())
		_, err = hookclient.New(url, otherCA, catalog()).Discover(ctx)
		Expect(err).To(MatchError(And(ContainSubstring("HTTP 401"), ContainSubstring("is not accepted"))))
	})

	It("was discovered by Cluster API's core controller presenting its client certificate", func() {
		var callers []string
		for _, e := range recorder.Exchanges("discovery") {
			callers = append(callers, e.ClientCommonName)
		}
		Expect(callers).NotTo(BeEmpty())
		Expect(callers).To(HaveEach(capi.ClientCerts["capi-core"].CommonName))
	})
})
