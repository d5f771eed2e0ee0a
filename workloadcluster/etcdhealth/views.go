package etcdhealth

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// DefaultTimeout bounds one read of a view when Views.Timeout is zero: a preflight waits
// no longer for etcd, and an etcd that does not answer within it holds the node.
const DefaultTimeout = 10 * time.Second

// CASecretName is the Secret Cluster API keeps the etcd CA of a kubeadm Cluster in
// (keys tls.crt and tls.key), in the Cluster's namespace.
func CASecretName(cluster string) string { return cluster + "-etcd" }

// RESTConfigs gives the REST config of a workload cluster (workloadcluster.Clients).
type RESTConfigs interface {
	RESTConfig(ctx context.Context, cluster types.NamespacedName) (*rest.Config, error)
}

// Views reads the best view of etcd a Cluster allows: the MemberView when the management
// cluster holds the Cluster's etcd CA, else the ReadyzView.
type Views struct {
	// Reader reads the <cluster>-etcd Secret on the management cluster; an uncached
	// reader (the manager's API reader) keeps the manager from watching every Secret.
	Reader client.Reader
	// Workload gives the REST config of a workload cluster.
	Workload RESTConfigs
	// Timeout bounds one read; zero means DefaultTimeout.
	Timeout time.Duration
	// CallTimeout bounds each call to one etcd member; zero means three seconds.
	CallTimeout time.Duration
	// Dial, when set, replaces the port-forward to the members (PortForward): a test
	// points it straight at an etcd process.
	Dial func(cfg *rest.Config) DialFunc
}

// +kubebuilder:rbac:groups="",resources=secrets,verbs=get

// Read reads etcd's view of the control plane of a Cluster whose control plane nodes are
// named. An error says what could not be read.
func (v *Views) Read(ctx context.Context, cluster types.NamespacedName, nodes []string) (Report, error) {
	timeout := v.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()

	cfg, err := v.Workload.RESTConfig(ctx, cluster)
	if err != nil {
		return Report{}, fmt.Errorf("reach the workload cluster: %w", err)
	}
	key := types.NamespacedName{Namespace: cluster.Namespace, Name: CASecretName(cluster.Name)}
	secret := &corev1.Secret{}
	err = v.Reader.Get(ctx, key, secret)
	switch {
	case apierrors.IsNotFound(err):
		return ReadyzView{}.Read(ctx, cfg, nodes)
	case err != nil:
		return Report{Source: MemberSource}, fmt.Errorf("read the etcd CA Secret %s: %w", key, err)
	}
	if len(secret.Data[corev1.TLSPrivateKeyKey]) == 0 {
		// Cluster API keeps only the certificate of an external etcd's CA: its members are
		// not the control plane's to judge here.
		r, err := ReadyzView{}.Read(ctx, cfg, nodes)
		r.Source += fmt.Sprintf(" (Secret %s has no %s: an external etcd)", key, corev1.TLSPrivateKeyKey)
		return r, err
	}
	ca, err := ParseCA(secret.Data[corev1.TLSCertKey], secret.Data[corev1.TLSPrivateKeyKey])
	if err != nil {
		return Report{Source: MemberSource}, fmt.Errorf("the etcd CA Secret %s: %w", key, err)
	}
	dial := PortForward(cfg)
	if v.Dial != nil {
		dial = v.Dial(cfg)
	}
	return MemberView{Dial: dial, CallTimeout: v.CallTimeout}.Read(ctx, ca, nodes)
}

// ReadyzSource is the Source of a ReadyzView's report.
const ReadyzSource = "the API server's /readyz/etcd and the etcd static pods (no member list: weaker than etcd's own)"

// ReadyzView is the view of etcd a Cluster without Cluster API's etcd CA allows (RKE2,
// Harvester: etcd's certificates never leave the nodes): the API server's /readyz/etcd,
// and the readiness of the static pods kube-system/etcd-<node>. It cannot see a member
// missing from the list, a learner or an alarm.
type ReadyzView struct{}

// Read reads /readyz/etcd and the etcd static pods of the workload cluster of cfg. A
// control plane node without its pod is a problem when other control plane nodes have
// one; when none has, etcd does not run as static pods (an external etcd, or k3s's
// embedded one) and /readyz/etcd is the view.
func (ReadyzView) Read(ctx context.Context, cfg *rest.Config, nodes []string) (Report, error) {
	report := Report{Source: ReadyzSource}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return report, fmt.Errorf("client of the workload cluster: %w", err)
	}
	var code int
	body, err := cs.Discovery().RESTClient().Get().AbsPath("/readyz/etcd").Param("verbose", "true").Do(ctx).StatusCode(&code).Raw()
	switch code {
	case 200:
	case 500, 503:
		report.Problems = append(report.Problems, fmt.Sprintf("the API server's /readyz/etcd answers %d: %s", code, excerpt(body, 300)))
	default:
		return report, fmt.Errorf("read the API server's /readyz/etcd: %w", err)
	}

	var missing, with []string
	for _, node := range nodes {
		pod, err := cs.CoreV1().Pods(metav1.NamespaceSystem).Get(ctx, StaticPodName(node), metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			missing = append(missing, node)
			continue
		}
		if err != nil {
			return report, fmt.Errorf("read the etcd pod %s/%s: %w", metav1.NamespaceSystem, StaticPodName(node), err)
		}
		with = append(with, node)
		if problem := podProblem(pod); problem != "" {
			report.Problems = append(report.Problems, problem)
		}
	}
	switch {
	case len(with) == 0 && len(missing) > 0:
		report.Source = "the API server's /readyz/etcd alone (no etcd static pod in kube-system: an external or embedded etcd; weaker than etcd's own member list)"
	case len(missing) > 0:
		slices.Sort(with)
		for _, node := range missing {
			report.Problems = append(report.Problems, fmt.Sprintf("control plane node %s has no etcd pod %s/%s, while %s have one",
				node, metav1.NamespaceSystem, StaticPodName(node), strings.Join(with, ", ")))
		}
	}
	return report, nil
}

// podProblem says why an etcd pod is not ready, in its containers' words; empty when it is.
func podProblem(pod *corev1.Pod) string {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
			return ""
		}
	}
	why := []string{"phase " + string(pod.Status.Phase)}
	for _, cs := range pod.Status.ContainerStatuses {
		switch {
		case cs.State.Waiting != nil:
			why = append(why, fmt.Sprintf("container %s waiting: %s %s", cs.Name, cs.State.Waiting.Reason, excerpt([]byte(cs.State.Waiting.Message), 200)))
		case cs.State.Terminated != nil:
			why = append(why, fmt.Sprintf("container %s terminated: %s (exit code %d)", cs.Name, cs.State.Terminated.Reason, cs.State.Terminated.ExitCode))
		case !cs.Ready:
			why = append(why, fmt.Sprintf("container %s running, not ready (%d restarts)", cs.Name, cs.RestartCount))
		}
	}
	return fmt.Sprintf("etcd pod %s/%s is not Ready: %s", pod.Namespace, pod.Name, strings.TrimSpace(strings.Join(why, "; ")))
}

// excerpt is a short, one-line excerpt of text from the workload cluster, without control
// characters.
func excerpt(b []byte, limit int) string {
	s := strings.Join(strings.Fields(strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return ' '
		}
		return r
	}, string(b))), " ")
	if len(s) > limit {
		s = s[:limit] + "..."
	}
	return s
}
