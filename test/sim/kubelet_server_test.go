package sim_test

import (
	"encoding/json"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/capi-inplace/capi-inplace/test/sim"
)

var _ = Describe("The kubelet simulator's servers", func() {
	It("serve a node's /stats/summary and /configz through the API server's node proxy, only when asked to", func() {
		addr, err := sim.NonLoopbackIPv4()
		Expect(err).NotTo(HaveOccurred())
		served := &sim.Kubelet{Client: env.Client, Record: sim.NewRecord(), ServeAddress: addr}
		DeferCleanup(served.Close)
		node, err := served.CreateNode(ctx, "kubelet-served", "v1.32.5+rke2r1", nil)
		Expect(err).NotTo(HaveOccurred())
		Expect(node.Status.Addresses).To(Equal([]corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: addr}}))
		Expect(node.Status.DaemonEndpoints.KubeletEndpoint.Port).NotTo(BeZero())

		plain := &sim.Kubelet{Client: env.Client, Record: sim.NewRecord()}
		other, err := plain.CreateNode(ctx, "kubelet-not-served", "v1.32.5+rke2r1", nil)
		Expect(err).NotTo(HaveOccurred())
		Expect(other.Status.Addresses).To(BeEmpty())
		Expect(other.Status.DaemonEndpoints.KubeletEndpoint.Port).To(BeZero())

		cs, err := kubernetes.NewForConfig(env.Config)
		Expect(err).NotTo(HaveOccurred())
		get := func(node string, path ...string) ([]byte, error) {
			return cs.CoreV1().RESTClient().Get().Resource("nodes").Name(node).SubResource("proxy").Suffix(path...).DoRaw(ctx)
		}

		served.SetDiskStats("kubelet-served", sim.DiskStats{RootCapacity: 100, RootUsed: 30, ImageCapacity: 50, ImageUsed: 40, ImageGCHighThresholdPercent: ptr.To[int32](77)})
		data, err := get("kubelet-served", "stats", "summary")
		Expect(err).NotTo(HaveOccurred())
		var summary struct {
			Node struct {
				NodeName string                       `json:"nodeName"`
				Fs       map[string]uint64            `json:"fs"`
				Runtime  map[string]map[string]uint64 `json:"runtime"`
			} `json:"node"`
		}
		Expect(json.Unmarshal(data, &summary)).To(Succeed())
		Expect(summary.Node.NodeName).To(Equal("kubelet-served"))
		Expect(summary.Node.Fs).To(Equal(map[string]uint64{"capacityBytes": 100, "usedBytes": 30, "availableBytes": 70}))
		Expect(summary.Node.Runtime["imageFs"]).To(Equal(map[string]uint64{"capacityBytes": 50, "usedBytes": 40, "availableBytes": 10}))

		data, err = get("kubelet-served", "configz")
		Expect(err).NotTo(HaveOccurred())
		var configz struct {
			KubeletConfig map[string]any `json:"kubeletconfig"`
		}
		Expect(json.Unmarshal(data, &configz)).To(Succeed())
		Expect(configz.KubeletConfig).To(HaveKeyWithValue("imageGCHighThresholdPercent", BeNumerically("==", 77)))

		served.SetDiskStats("kubelet-served", sim.DiskStats{Fail: "disk stats unavailable"})
		_, err = get("kubelet-served", "stats", "summary")
		Expect(err).To(MatchError(ContainSubstring("disk stats unavailable")))

		_, err = get("kubelet-not-served", "stats", "summary")
		Expect(err).To(HaveOccurred())
	})
})
