package harvesteradapter_test

import (
	"crypto/tls"
	"net/url"
	"strings"
	"time"

	longhornv1 "github.com/longhorn/longhorn-manager/k8s/pkg/apis/longhorn/v1beta2"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capi-inplace/capi-inplace/harvesteradapter/clusterchecks"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/harvesterapi"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/longhorn"
	"github.com/capi-inplace/capi-inplace/test/sim"
	"github.com/capi-inplace/capi-inplace/test/testenv"
)

// The cluster preflight checks run against a workload API server of their own (they look
// at every node and volume of the cluster, so the suite's shared workload cluster, where
// other specs leave nodes cordoned or down, would not do), whose kubelets the simulator
// serves over HTTPS and the checks reach through the API server's node proxy, as in
// production.
var _ = Describe("Cluster preflight checks", Ordered, func() {
	const gi = uint64(1) << 30
	var (
		cw        *testenv.Environment
		kubelet   *sim.Kubelet
		kubelets  clusterchecks.KubeletReader
		notAfter  time.Time // the API server's serving certificate's expiry
		nodeNames = []string{"cc-node-1", "cc-node-2", "cc-node-3"}
	)
	input := func(annotations map[string]string) clusterchecks.Input {
		return clusterchecks.Input{
			Workload: cw.Client, Kubelets: kubelets, APIServer: cw.Config,
			Annotations: annotations, Now: notAfter.AddDate(0, 0, -30),
		}
	}
	resultOf := func(in clusterchecks.Input, name string) clusterchecks.Result {
		GinkgoHelper()
		for _, r := range clusterchecks.Run(ctx, in) {
			if r.Name == name {
				return r
			}
		}
		Fail("no result named " + name)
		return clusterchecks.Result{}
	}
	skip := func(name string) map[string]string {
		return map[string]string{clusterchecks.SkipCheckAnnotationPrefix + name: "true"}
	}
	expectPassed := func(r clusterchecks.Result) {
		GinkgoHelper()
		Expect(r.Passed).To(BeTrue(), r.Message)
		Expect(r.Skipped).To(BeFalse())
	}
	expectFailed := func(r clusterchecks.Result, parts ...string) {
		GinkgoHelper()
		Expect(r.Passed).To(BeFalse(), r.Message)
		Expect(r.Skipped).To(BeFalse())
		for _, p := range parts {
			Expect(r.Message).To(ContainSubstring(p))
		}
	}
	expectSkipped := func(r clusterchecks.Result, name string) {
		GinkgoHelper()
		Expect(r.Skipped).To(BeTrue(), r.Message)
		Expect(r.Passed).To(BeFalse())
		Expect(r.Message).To(ContainSubstring(clusterchecks.SkipCheckAnnotationPrefix + name))
	}

	BeforeAll(func() {
		var err error
		cw, err = testenv.Start()
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { Expect(cw.Stop()).To(Succeed()) })
		addr, err := sim.NonLoopbackIPv4()
		Expect(err).NotTo(HaveOccurred())
		kubelet = &sim.Kubelet{Client: cw.Client, Record: sim.NewRecord(), ServeAddress: addr}
		DeferCleanup(kubelet.Close)
		for _, n := range nodeNames {
			_, err := kubelet.CreateNode(ctx, n, "v1.34.3+rke2r3", nil)
			Expect(err).NotTo(HaveOccurred())
		}
		kubelets, err = clusterchecks.NewProxyKubeletReader(cw.Config)
		Expect(err).NotTo(HaveOccurred())
		for _, ns := range []string{longhorn.Namespace, "vms"} {
			Expect(cw.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})).To(Succeed())
		}

		u, err := url.Parse(cw.Config.Host)
		Expect(err).NotTo(HaveOccurred())
		conn, err := tls.Dial("tcp", u.Host, &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // reads the served certificate
		Expect(err).NotTo(HaveOccurred())
		notAfter = conn.ConnectionState().PeerCertificates[0].NotAfter
		Expect(conn.Close()).To(Succeed())
	})

	It("pass on a healthy cluster, every one, in a fixed order", func() {
		results := clusterchecks.Run(ctx, input(nil))
		var names []string
		for _, r := range results {
			names = append(names, r.Name)
			expectPassed(r)
		}
		Expect(names).To(Equal([]string{"ImageGCDiskSpace", "APIServerCertificates", "SingleReplicaVolumes", "VMBackupsIdle", "NodesSchedulable"}))
		Expect(clusterchecks.Names()).To(Equal(names))
	})

	It("keep their order when some fail and some are skipped", func() {
		Expect(kubelet.SetUnschedulable(ctx, "cc-node-1", true)).To(Succeed())
		DeferCleanup(func() { Expect(kubelet.SetUnschedulable(ctx, "cc-node-1", false)).To(Succeed()) })
		in := input(skip("ImageGCDiskSpace"))
		in.APIServer = nil
		results := clusterchecks.Run(ctx, in)
		Expect(results).To(HaveLen(5))
		Expect(results[0].Name).To(Equal("ImageGCDiskSpace"))
		expectSkipped(results[0], "ImageGCDiskSpace")
		Expect(results[1].Name).To(Equal("APIServerCertificates"))
		expectFailed(results[1])
		Expect(results[2].Name).To(Equal("SingleReplicaVolumes"))
		expectPassed(results[2])
		Expect(results[3].Name).To(Equal("VMBackupsIdle"))
		expectPassed(results[3])
		Expect(results[4].Name).To(Equal("NodesSchedulable"))
		expectFailed(results[4])
	})

	It("fail a check whose skip annotation is not a boolean, naming it", func() {
		key := clusterchecks.SkipCheckAnnotationPrefix + "NodesSchedulable"
		expectFailed(resultOf(input(map[string]string{key: "yes please"}), "NodesSchedulable"), key, `"yes please"`)
		expectPassed(resultOf(input(map[string]string{key: "false"}), "NodesSchedulable"))
	})

	Context("ImageGCDiskSpace", func() {
		setDisk := func(node string, s sim.DiskStats) {
			kubelet.SetDiskStats(node, s)
			DeferCleanup(func() { kubelet.SetDiskStats(node, sim.DefaultDiskStats) })
		}
		oneFs := func(used uint64) sim.DiskStats {
			return sim.DiskStats{RootCapacity: 100 * gi, RootUsed: used, ImageCapacity: 100 * gi, ImageUsed: used}
		}

		It("passes while used + 13 GiB stays at the kubelet's default threshold of 85%", func() {
			setDisk("cc-node-2", oneFs(72*gi)) // 85.0% after the images
			r := resultOf(input(nil), "ImageGCDiskSpace")
			expectPassed(r)
			Expect(r.Message).To(ContainSubstring("3 nodes"))
		})

		It("fails a node that would pass the threshold, naming it, the figures and what to do", func() {
			setDisk("cc-node-2", oneFs(73*gi)) // 86.0%
			r := resultOf(input(nil), "ImageGCDiskSpace")
			expectFailed(r, "node cc-node-2", "86.0%", "73.0 GiB used", "13.0 GiB of images", "100.0 GiB", "threshold of 85%", "free at least 1.0 GiB")
			Expect(r.Message).NotTo(ContainSubstring("cc-node-1"))
			Expect(r.Message).NotTo(ContainSubstring("cc-node-3"))
		})

		It("uses the kubelet's own imageGCHighThresholdPercent from /configz", func() {
			s := oneFs(73 * gi)
			s.ImageGCHighThresholdPercent = ptr.To[int32](90)
			setDisk("cc-node-2", s)
			expectPassed(resultOf(input(nil), "ImageGCDiskSpace"))
			s3 := oneFs(60 * gi) // 73%: above only node-3's own threshold
			s3.ImageGCHighThresholdPercent = ptr.To[int32](70)
			setDisk("cc-node-3", s3)
			expectFailed(resultOf(input(nil), "ImageGCDiskSpace"), "node cc-node-3", "73.0%", "threshold of 70%")
		})

		It("measures the image filesystem, and the root filesystem only when there is none", func() {
			setDisk("cc-node-2", sim.DiskStats{RootCapacity: 100 * gi, RootUsed: 90 * gi, ImageCapacity: 200 * gi, ImageUsed: 20 * gi})
			expectPassed(resultOf(input(nil), "ImageGCDiskSpace"))
			setDisk("cc-node-2", sim.DiskStats{RootCapacity: 100 * gi, RootUsed: 10 * gi, ImageCapacity: 100 * gi, ImageUsed: 80 * gi})
			expectFailed(resultOf(input(nil), "ImageGCDiskSpace"), "node cc-node-2", "its image filesystem would be 93.0% full")
			setDisk("cc-node-2", sim.DiskStats{RootCapacity: 100 * gi, RootUsed: 80 * gi})
			expectFailed(resultOf(input(nil), "ImageGCDiskSpace"), "node cc-node-2", "root filesystem", "93.0%")
		})

		It("is skipped by its annotation even while a node would pass the threshold", func() {
			setDisk("cc-node-2", oneFs(90*gi))
			expectFailed(resultOf(input(nil), "ImageGCDiskSpace"), "node cc-node-2")
			expectSkipped(resultOf(input(skip("ImageGCDiskSpace")), "ImageGCDiskSpace"), "ImageGCDiskSpace")
		})

		It("fails with the reason when a kubelet cannot be read", func() {
			setDisk("cc-node-3", sim.DiskStats{Fail: "summary provider is down"})
			expectFailed(resultOf(input(nil), "ImageGCDiskSpace"), "node cc-node-3", "cannot tell", "summary provider is down")
		})

		It("fails with the reason when a node's kubelet is not reachable at all", func() {
			Expect(cw.Client.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "cc-node-0-no-kubelet"}})).To(Succeed())
			DeferCleanup(func() {
				Expect(cw.Client.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "cc-node-0-no-kubelet"}})).To(Succeed())
			})
			expectFailed(resultOf(input(nil), "ImageGCDiskSpace"), "node cc-node-0-no-kubelet", "cannot tell")
		})

		It("fails without a kubelet reader", func() {
			in := input(nil)
			in.Kubelets = nil
			expectFailed(resultOf(in, "ImageGCDiskSpace"), "no kubelet reader")
		})
	})

	Context("APIServerCertificates", func() {
		at := func(now time.Time, annotations map[string]string) clusterchecks.Result {
			in := input(annotations)
			in.Now = now
			return resultOf(in, "APIServerCertificates")
		}

		It("passes when the serving certificate outlives 7 days", func() {
			r := at(notAfter.AddDate(0, 0, -8), nil)
			expectPassed(r)
			Expect(r.Message).To(ContainSubstring(notAfter.UTC().Format(time.RFC3339)))
		})

		It("fails when it expires within 7 days, saying when and what to do", func() {
			expectFailed(at(notAfter.AddDate(0, 0, -6), nil), "expires at "+notAfter.UTC().Format(time.RFC3339), "within 7 days", "rotate", clusterchecks.AnnotationMinCertsExpirationDays)
			expectFailed(at(notAfter.Add(time.Hour), nil), "expired at")
		})

		It("takes the minimum number of days from its annotation", func() {
			days := func(n string) map[string]string {
				return map[string]string{clusterchecks.AnnotationMinCertsExpirationDays: n}
			}
			expectPassed(at(notAfter.AddDate(0, 0, -6), days("5")))
			expectFailed(at(notAfter.AddDate(0, 0, -20), days("30")), "within 30 days")
			for _, bad := range []string{"0", "-1", "a week"} {
				expectFailed(at(notAfter.AddDate(0, 0, -20), days(bad)), clusterchecks.AnnotationMinCertsExpirationDays, `"`+bad+`"`)
			}
		})

		It("is skipped by its annotation even while the certificate is about to expire", func() {
			expectFailed(at(notAfter.AddDate(0, 0, -1), nil))
			expectSkipped(at(notAfter.AddDate(0, 0, -1), skip("APIServerCertificates")), "APIServerCertificates")
		})

		It("fails with the reason when the API server cannot be read", func() {
			in := input(nil)
			in.APIServer = nil
			expectFailed(resultOf(in, "APIServerCertificates"), "cannot tell")
			in.APIServer = &rest.Config{Host: "https://127.0.0.1:1"}
			expectFailed(resultOf(in, "APIServerCertificates"), "cannot tell", "127.0.0.1:1")
			in.APIServer = &rest.Config{Host: "http://" + strings.TrimPrefix(cw.Config.Host, "https://")}
			expectFailed(resultOf(in, "APIServerCertificates"), "not reached over https")
		})
	})

	Context("SingleReplicaVolumes", func() {
		// Longhorn's CRD makes several enums required when present, so the volume carries
		// only the fields Longhorn would set.
		createVolume := func(name string, replicas int64, state longhornv1.VolumeState, node, pvc string) {
			GinkgoHelper()
			v := &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": longhornv1.SchemeGroupVersion.String(), "kind": "Volume",
				"metadata": map[string]any{"name": name, "namespace": longhorn.Namespace},
				"spec":     map[string]any{"numberOfReplicas": replicas, "dataEngine": "v1"},
			}}
			Expect(cw.Client.Create(ctx, v)).To(Succeed())
			DeferCleanup(func() { Expect(cw.Client.Delete(ctx, v)).To(Succeed()) })
			v.Object["status"] = map[string]any{
				"state": string(state), "currentNodeID": node,
				"kubernetesStatus": map[string]any{"namespace": "default", "pvcName": pvc},
			}
			Expect(cw.Client.Status().Update(ctx, v)).To(Succeed())
		}
		skipDetached := map[string]string{clusterchecks.AnnotationSkipDetachedSingleReplicaVolumes: "true"}

		It("passes when every volume has more than one replica", func() {
			createVolume("pvc-three", 3, longhornv1.VolumeStateAttached, "cc-node-1", "three")
			createVolume("pvc-two", 2, longhornv1.VolumeStateDetached, "", "two")
			r := resultOf(input(nil), "SingleReplicaVolumes")
			expectPassed(r)
			Expect(r.Message).To(Equal("no Longhorn volume has a single replica"))
		})

		It("fails on an attached single-replica volume, even with detached ones accepted", func() {
			createVolume("pvc-three", 3, longhornv1.VolumeStateAttached, "cc-node-1", "three")
			createVolume("pvc-one", 1, longhornv1.VolumeStateAttached, "cc-node-2", "data-one")
			for _, ann := range []map[string]string{nil, skipDetached} {
				r := resultOf(input(ann), "SingleReplicaVolumes")
				expectFailed(r, "in use have a single replica: pvc-one (PVC default/data-one, on node cc-node-2, attached)", "at least 2 replicas")
				Expect(r.Message).NotTo(ContainSubstring("pvc-three"))
				Expect(r.Message).NotTo(ContainSubstring("detached"))
			}
		})

		It("fails on a detached single-replica volume unless that is accepted by its own annotation", func() {
			createVolume("pvc-idle", 1, longhornv1.VolumeStateDetached, "", "idle")
			expectFailed(resultOf(input(nil), "SingleReplicaVolumes"), "detached Longhorn volumes have a single replica: pvc-idle (PVC default/idle)", clusterchecks.AnnotationSkipDetachedSingleReplicaVolumes+"=true")
			r := resultOf(input(skipDetached), "SingleReplicaVolumes")
			expectPassed(r)
			Expect(r.Message).To(ContainSubstring("1 detached"))
		})

		It("is skipped by its annotation even with single-replica volumes in use", func() {
			createVolume("pvc-one", 1, longhornv1.VolumeStateAttached, "cc-node-2", "data-one")
			expectFailed(resultOf(input(nil), "SingleReplicaVolumes"), "pvc-one")
			expectSkipped(resultOf(input(skip("SingleReplicaVolumes")), "SingleReplicaVolumes"), "SingleReplicaVolumes")
		})

		It("fails when the detached skip annotation is not a boolean", func() {
			expectFailed(resultOf(input(map[string]string{clusterchecks.AnnotationSkipDetachedSingleReplicaVolumes: "maybe"}), "SingleReplicaVolumes"), clusterchecks.AnnotationSkipDetachedSingleReplicaVolumes)
		})
	})

	Context("VMBackupsIdle", func() {
		createBackup := func(name string, status *harvesterapi.VirtualMachineBackupStatus) {
			GinkgoHelper()
			b := &harvesterapi.VirtualMachineBackup{
				ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "vms"},
				Spec:       harvesterapi.VirtualMachineBackupSpec{Source: corev1.TypedLocalObjectReference{APIGroup: ptr.To("kubevirt.io"), Kind: "VirtualMachine", Name: "vm-1"}},
				Status:     status,
			}
			Expect(cw.Client.Create(ctx, b)).To(Succeed())
			DeferCleanup(func() { Expect(cw.Client.Delete(ctx, b)).To(Succeed()) })
		}
		createSchedule := func(name string, suspend, suspended bool) {
			GinkgoHelper()
			s := &harvesterapi.ScheduleVMBackup{
				ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "vms"},
				Spec: harvesterapi.ScheduleVMBackupSpec{Cron: "0 * * * *", Retain: 8, MaxFailure: 4, Suspend: suspend,
					VMBackupSpec: harvesterapi.VirtualMachineBackupSpec{Source: corev1.TypedLocalObjectReference{APIGroup: ptr.To("kubevirt.io"), Kind: "VirtualMachine", Name: "vm-1"}}},
				Status: harvesterapi.ScheduleVMBackupStatus{Suspended: suspended},
			}
			Expect(cw.Client.Create(ctx, s)).To(Succeed())
			DeferCleanup(func() { Expect(cw.Client.Delete(ctx, s)).To(Succeed()) })
		}

		It("passes with finished or failed backups and suspended schedules", func() {
			createBackup("done", &harvesterapi.VirtualMachineBackupStatus{ReadyToUse: ptr.To(true), Progress: 100})
			createBackup("broken", &harvesterapi.VirtualMachineBackupStatus{ReadyToUse: ptr.To(false), Error: &harvesterapi.Error{Message: ptr.To("target unreachable")}})
			createSchedule("nightly", true, true)
			r := resultOf(input(nil), "VMBackupsIdle")
			expectPassed(r)
			Expect(r.Message).To(ContainSubstring("VM backups or backup schedules"))
		})

		It("fails while a backup runs, naming it and its progress", func() {
			createBackup("done", &harvesterapi.VirtualMachineBackupStatus{ReadyToUse: ptr.To(true), Progress: 100})
			createBackup("halfway", &harvesterapi.VirtualMachineBackupStatus{ReadyToUse: ptr.To(false), Progress: 40})
			createBackup("just-created", nil)
			r := resultOf(input(nil), "VMBackupsIdle")
			expectFailed(r, "VM backups are running: vms/halfway (40%), vms/just-created (0%)", "wait until they finish")
			Expect(r.Message).NotTo(ContainSubstring("vms/done"))
		})

		It("fails while a schedule is not suspended, or not yet", func() {
			createSchedule("hourly", false, false)
			createSchedule("daily", true, false)
			createSchedule("weekly", true, true)
			r := resultOf(input(nil), "VMBackupsIdle")
			expectFailed(r, "not suspended: vms/hourly;", "spec.suspend: true", "has not suspended them yet (status.suspended): vms/daily;")
			Expect(r.Message).NotTo(ContainSubstring("weekly"))
		})

		It("is skipped by its annotation even while a backup runs", func() {
			createBackup("halfway", &harvesterapi.VirtualMachineBackupStatus{Progress: 40})
			expectFailed(resultOf(input(nil), "VMBackupsIdle"), "vms/halfway")
			expectSkipped(resultOf(input(skip("VMBackupsIdle")), "VMBackupsIdle"), "VMBackupsIdle")
		})
	})

	Context("NodesSchedulable", func() {
		It("passes when every node is Ready and schedulable", func() {
			r := resultOf(input(nil), "NodesSchedulable")
			expectPassed(r)
			Expect(r.Message).To(ContainSubstring("all 3 nodes"))
		})

		It("fails on a node not Ready and on a cordoned one, naming them", func() {
			Expect(kubelet.SetReady(ctx, "cc-node-2", false, "KubeletDown")).To(Succeed())
			DeferCleanup(func() { Expect(kubelet.SetReady(ctx, "cc-node-2", true, "KubeletReady")).To(Succeed()) })
			r := resultOf(input(nil), "NodesSchedulable")
			expectFailed(r, "not Ready: cc-node-2;")
			Expect(r.Message).NotTo(ContainSubstring("cordoned"))

			Expect(kubelet.SetUnschedulable(ctx, "cc-node-3", true)).To(Succeed())
			DeferCleanup(func() { Expect(kubelet.SetUnschedulable(ctx, "cc-node-3", false)).To(Succeed()) })
			expectFailed(resultOf(input(nil), "NodesSchedulable"), "not Ready: cc-node-2;", "cordoned (spec.unschedulable): cc-node-3;", "kubectl uncordon")
		})

		It("is skipped by its annotation even while a node is cordoned", func() {
			Expect(kubelet.SetUnschedulable(ctx, "cc-node-1", true)).To(Succeed())
			DeferCleanup(func() { Expect(kubelet.SetUnschedulable(ctx, "cc-node-1", false)).To(Succeed()) })
			expectFailed(resultOf(input(nil), "NodesSchedulable"), "cc-node-1")
			expectSkipped(resultOf(input(skip("NodesSchedulable")), "NodesSchedulable"), "NodesSchedulable")
		})
	})

	// Last: it removes Longhorn's Volume and Harvester's backup kinds from the cluster.
	It("pass the Longhorn and backup checks, saying so, on a cluster that serves neither", func() {
		for _, name := range []string{"volumes.longhorn.io", "virtualmachinebackups.harvesterhci.io", "schedulevmbackups.harvesterhci.io"} {
			Expect(cw.Client.Delete(ctx, &apiextensionsv1.CustomResourceDefinition{ObjectMeta: metav1.ObjectMeta{Name: name}})).To(Succeed())
		}
		Eventually(func(g Gomega) {
			// a new client: a client's REST mapper remembers the kinds it has seen served
			c, err := client.New(cw.Config, client.Options{Scheme: cw.Scheme})
			g.Expect(err).NotTo(HaveOccurred())
			in := input(nil)
			in.Workload = c
			results := clusterchecks.Run(ctx, in)
			g.Expect(results[2].Name).To(Equal("SingleReplicaVolumes"))
			g.Expect(results[2].Passed).To(BeTrue())
			g.Expect(results[2].Message).To(ContainSubstring("Longhorn is not installed"))
			g.Expect(results[3].Name).To(Equal("VMBackupsIdle"))
			g.Expect(results[3].Passed).To(BeTrue())
			g.Expect(results[3].Message).To(ContainSubstring("serves no Harvester VM backup kinds"))
		}).WithTimeout(30 * time.Second).Should(Succeed())
	})
})
