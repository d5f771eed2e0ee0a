package etcdhealth_test

import (
	"context"
	"net"
	"path/filepath"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	"github.com/capi-inplace/capi-inplace/controllers/preflight"
	"github.com/capi-inplace/capi-inplace/test/fixtures"
	"github.com/capi-inplace/capi-inplace/test/procguard"
	"github.com/capi-inplace/capi-inplace/test/testenv"
	"github.com/capi-inplace/capi-inplace/test/testsuite"
	"github.com/capi-inplace/capi-inplace/workloadcluster/etcdhealth"
)

var env *testenv.Environment

func TestEtcdHealth(t *testing.T) {
	RegisterFailHandler(Fail)
	testsuite.Run(t, "etcd's view of a control plane, against real etcd processes and a real API server")
}

var _ = BeforeSuite(func() {
	var err error
	env, err = testenv.Start()
	Expect(err).NotTo(HaveOccurred())
})

var _ = AfterSuite(func() {
	if env != nil {
		Expect(env.Stop()).To(Succeed())
	}
})

// sameCluster is the workload cluster of every Cluster: the suite's API server.
type sameCluster struct{ cfg *rest.Config }

func (s sameCluster) RESTConfig(context.Context, types.NamespacedName) (*rest.Config, error) {
	return rest.CopyConfig(s.cfg), nil
}

// controlPlaneInput is a preflight Input of a control plane whose machines have the nodes named.
func controlPlaneInput(ns string, nodes ...string) *preflight.Input {
	in := &preflight.Input{Cluster: &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "c"}}, ControlPlane: true, MaxUnavailable: 1}
	for _, n := range nodes {
		m := &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "m-" + n}}
		m.Status.NodeRef = clusterv1.MachineNodeReference{Name: n}
		in.ControlPlaneMachines = append(in.ControlPlaneMachines, preflight.MachineNode{Machine: m, Node: &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}}})
	}
	return in
}

func check(v preflight.EtcdView, in *preflight.Input) preflight.Result {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return preflight.EtcdHealthy{View: v}.Check(ctx, in, in.ControlPlaneMachines[0])
}

func read(v etcdhealth.MemberView, ca testCA, nodes ...string) (etcdhealth.Report, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return v.Read(ctx, ca.ca, nodes)
}

var _ = Describe("MemberView, against a real etcd reached through its dialer", func() {
	var ca testCA
	var etcd *etcdProcess
	BeforeEach(func() {
		ca = newTestCA()
		etcd = startEtcd(ca, "cp-a")
		Eventually(func() error { _, err := read(etcdhealth.MemberView{Dial: dialer(etcd)}, ca, "cp-a"); return err }, 30*time.Second, 200*time.Millisecond).Should(Succeed())
	})

	It("passes a healthy etcd whose members are the control plane nodes", func() {
		r, err := read(etcdhealth.MemberView{Dial: dialer(etcd)}, ca, "cp-a")
		Expect(err).NotTo(HaveOccurred())
		Expect(r.Problems).To(BeEmpty())
		Expect(r.Source).To(Equal(etcdhealth.MemberSource))
	})

	It("reports an active alarm in etcd's words", func() {
		etcd.raiseAlarm(pb.AlarmType_NOSPACE)
		r, err := read(etcdhealth.MemberView{Dial: dialer(etcd)}, ca, "cp-a")
		Expect(err).NotTo(HaveOccurred())
		Expect(r.Problems).To(ConsistOf("etcd member cp-a raises alarm NOSPACE"))
	})

	It("reports a control plane node that has no member", func() {
		r, err := read(etcdhealth.MemberView{Dial: dialer(etcd)}, ca, "cp-a", "cp-b")
		Expect(err).NotTo(HaveOccurred())
		Expect(r.Problems).To(ConsistOf("etcd reports the members cp-a, none for control plane node cp-b"))
	})

	It("reports a member that belongs to no control plane node", func() {
		r, err := read(etcdhealth.MemberView{Dial: func(ctx context.Context, _ string) (net.Conn, error) { return dialer(etcd)(ctx, "cp-a") }}, ca, "cp-z")
		Expect(err).NotTo(HaveOccurred())
		Expect(r.Problems).To(ConsistOf(
			"etcd reports the members cp-a, none for control plane node cp-z",
			MatchRegexp(`^etcd member cp-a \(id [0-9a-f]+\) belongs to no control plane node; it counts for quorum$`)))
	})

	It("cannot read an etcd that does not answer, and says why", func() {
		etcd.stop()
		_, err := read(etcdhealth.MemberView{Dial: dialer(etcd), CallTimeout: 2 * time.Second}, ca, "cp-a")
		Expect(err).To(MatchError(ContainSubstring("no etcd member answered: etcd on node cp-a: ")))
	})

	It("refuses an etcd whose certificate another CA signed", func() {
		other := newTestCA()
		_, err := read(etcdhealth.MemberView{Dial: dialer(etcd), CallTimeout: 2 * time.Second}, other, "cp-a")
		Expect(err).To(MatchError(ContainSubstring("no etcd member answered")))
	})

	Context("as the preflight of a control plane node (Views with the <cluster>-etcd Secret)", func() {
		var ns string
		var views *etcdhealth.Views
		BeforeEach(func() {
			var err error
			ns, err = fixtures.Namespace(ctx(), env.Client, "etcd")
			Expect(err).NotTo(HaveOccurred())
			Expect(env.Client.Create(ctx(), &corev1.Secret{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: etcdhealth.CASecretName("c")},
				Data:       map[string][]byte{corev1.TLSCertKey: ca.certPEM, corev1.TLSPrivateKeyKey: ca.keyPEM},
			})).To(Succeed())
			views = &etcdhealth.Views{Reader: env.Client, Workload: sameCluster{env.Config}, CallTimeout: 2 * time.Second,
				Dial: func(*rest.Config) etcdhealth.DialFunc { return dialer(etcd) }}
		})

		It("passes a healthy etcd", func() {
			Expect(check(views, controlPlaneInput(ns, "cp-a"))).To(Equal(preflight.Result{Name: preflight.EtcdHealthyName, Passed: true}))
		})

		It("holds the node on an alarm, with etcd's words", func() {
			etcd.raiseAlarm(pb.AlarmType_NOSPACE)
			r := check(views, controlPlaneInput(ns, "cp-a"))
			Expect(r.Passed).To(BeFalse())
			Expect(r.Message).To(Equal("etcd is not healthy according to " + etcdhealth.MemberSource + ": etcd member cp-a raises alarm NOSPACE"))
		})

		It("holds a control plane node whose node has no member", func() {
			r := check(views, controlPlaneInput(ns, "cp-a", "cp-b"))
			Expect(r.Passed).To(BeFalse())
			Expect(r.Message).To(ContainSubstring("etcd reports the members cp-a, none for control plane node cp-b"))
		})

		It("holds the node when etcd cannot be reached, naming what could not be read", func() {
			etcd.stop()
			r := check(views, controlPlaneInput(ns, "cp-a"))
			Expect(r.Passed).To(BeFalse())
			Expect(r.Message).To(HavePrefix("etcd's view could not be read (" + etcdhealth.MemberSource + "): no etcd member answered: etcd on node cp-a"))
			Expect(r.Message).To(HaveSuffix("; the node is held until it can"))
		})

		It("holds the node when the CA Secret is not a usable CA", func() {
			Expect(env.Client.Update(ctx(), &corev1.Secret{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: etcdhealth.CASecretName("c"), ResourceVersion: secretVersion(ns)},
				Data:       map[string][]byte{corev1.TLSCertKey: []byte("not a certificate"), corev1.TLSPrivateKeyKey: ca.keyPEM},
			})).To(Succeed())
			r := check(views, controlPlaneInput(ns, "cp-a"))
			Expect(r.Passed).To(BeFalse())
			Expect(r.Message).To(ContainSubstring("the etcd CA Secret " + ns + "/c-etcd: parse the etcd CA"))
		})

		It("holds the node when the port-forward to the member's static pod fails (the manager's dialer, against an API server without that pod)", func() {
			views.Dial = nil
			r := check(views, controlPlaneInput(ns, "cp-a"))
			Expect(r.Passed).To(BeFalse())
			Expect(r.Message).To(ContainSubstring("no etcd member answered: etcd on node cp-a: "))
			Expect(r.Message).To(ContainSubstring("port-forward to pod kube-system/etcd-cp-a"))
		})

		It("passes a worker without reading etcd", func() {
			in := controlPlaneInput(ns, "cp-a")
			in.ControlPlane = false
			etcd.stop()
			Expect(check(views, in).Passed).To(BeTrue())
		})
	})
})

func ctx() context.Context { return context.Background() }

func secretVersion(ns string) string {
	GinkgoHelper()
	s := &corev1.Secret{}
	Expect(env.Client.Get(ctx(), client.ObjectKey{Namespace: ns, Name: etcdhealth.CASecretName("c")}, s)).To(Succeed())
	return s.ResourceVersion
}

// etcdPod creates the static pod kube-system/etcd-<node> as the kubelet mirrors it, Ready or not.
func etcdPod(node string, ready bool) {
	GinkgoHelper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: metav1.NamespaceSystem, Name: etcdhealth.StaticPodName(node)},
		Spec:       corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "etcd", Image: "registry.k8s.io/etcd:3.6.4-0"}}},
	}
	Expect(env.Client.Create(ctx(), pod)).To(Succeed())
	DeferCleanup(func() { _ = env.Client.Delete(ctx(), pod) })
	status := corev1.ConditionTrue
	state := corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}
	if !ready {
		status = corev1.ConditionFalse
		state = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff", Message: "back-off 5m0s restarting failed container=etcd"}}
	}
	pod.Status = corev1.PodStatus{Phase: corev1.PodRunning,
		Conditions:        []corev1.PodCondition{{Type: corev1.PodReady, Status: status}},
		ContainerStatuses: []corev1.ContainerStatus{{Name: "etcd", Ready: ready, State: state, Image: pod.Spec.Containers[0].Image}}}
	Expect(env.Client.Status().Update(ctx(), pod)).To(Succeed())
}

func readyz(cfg *rest.Config, nodes ...string) (etcdhealth.Report, error) {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return etcdhealth.ReadyzView{}.Read(c, cfg, nodes)
}

var _ = Describe("ReadyzView, against the real API server", func() {
	var n string
	BeforeEach(func() {
		ns, err := fixtures.Namespace(ctx(), env.Client, "readyz")
		Expect(err).NotTo(HaveOccurred())
		n = ns // a prefix of node names no other spec uses
	})

	It("passes on /readyz/etcd alone where etcd runs in no static pod, and says so", func() {
		r, err := readyz(env.Config, n+"-1", n+"-2")
		Expect(err).NotTo(HaveOccurred())
		Expect(r.Problems).To(BeEmpty())
		Expect(r.Source).To(HavePrefix("the API server's /readyz/etcd alone"))
	})

	It("passes when every control plane node's etcd pod is Ready", func() {
		etcdPod(n+"-1", true)
		etcdPod(n+"-2", true)
		r, err := readyz(env.Config, n+"-1", n+"-2")
		Expect(err).NotTo(HaveOccurred())
		Expect(r.Problems).To(BeEmpty())
		Expect(r.Source).To(Equal(etcdhealth.ReadyzSource))
	})

	It("reports an etcd pod that is not Ready, in its container's words, and a node without one", func() {
		etcdPod(n+"-1", true)
		etcdPod(n+"-2", false)
		r, err := readyz(env.Config, n+"-1", n+"-2", n+"-3")
		Expect(err).NotTo(HaveOccurred())
		Expect(r.Problems).To(ConsistOf(
			"etcd pod kube-system/etcd-"+n+"-2 is not Ready: phase Running; container etcd waiting: CrashLoopBackOff back-off 5m0s restarting failed container=etcd",
			"control plane node "+n+"-3 has no etcd pod kube-system/etcd-"+n+"-3, while "+n+"-1, "+n+"-2 have one"))
	})

	It("cannot read an API server that does not answer", func() {
		cfg := rest.CopyConfig(env.Config)
		cfg.Host = "https://127.0.0.1:1"
		_, err := readyz(cfg, n+"-1")
		Expect(err).To(MatchError(ContainSubstring("read the API server's /readyz/etcd")))
	})

	It("is the view of a Cluster without the <cluster>-etcd Secret, and holds its control plane node on a pod not Ready", func() {
		etcdPod(n+"-1", false)
		views := &etcdhealth.Views{Reader: env.Client, Workload: sameCluster{env.Config}}
		r := check(views, controlPlaneInput(n, n+"-1"))
		Expect(r.Passed).To(BeFalse())
		Expect(r.Message).To(HavePrefix("etcd is not healthy according to " + etcdhealth.ReadyzSource + ": etcd pod kube-system/etcd-" + n + "-1 is not Ready"))
	})

	It("reports the API server's answer when its etcd is gone", func() {
		cp, cfg := startControlPlane()
		Expect(readyz(cfg)).To(HaveField("Problems", BeEmpty()))
		Expect(cp.Etcd.Stop()).To(Succeed())
		Eventually(func() []string { r, _ := readyz(cfg); return r.Problems }, time.Minute, time.Second).
			Should(ConsistOf(MatchRegexp(`^the API server's /readyz/etcd answers 500: .*etcd`)))
	})
})

// startControlPlane starts a kube-apiserver with an etcd of its own, stopped when the spec ends.
func startControlPlane() (*envtest.ControlPlane, *rest.Config) {
	GinkgoHelper()
	var paths []string
	for _, bin := range []string{"kube-apiserver", "etcd"} {
		// Killed with the test binary, as testenv's are.
		p, err := procguard.WrapperScript(GinkgoT().TempDir(), filepath.Join(assetsDir(), bin))
		Expect(err).NotTo(HaveOccurred())
		paths = append(paths, p)
	}
	cp := &envtest.ControlPlane{APIServer: &envtest.APIServer{Path: paths[0]}, Etcd: &envtest.Etcd{Path: paths[1]}}
	Expect(cp.Start()).To(Succeed())
	DeferCleanup(func() { _ = cp.Stop() })
	user, err := cp.AddUser(envtest.User{Name: "admin", Groups: []string{"system:masters"}}, nil)
	Expect(err).NotTo(HaveOccurred())
	return cp, user.Config()
}
