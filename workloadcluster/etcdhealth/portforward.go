package etcdhealth

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/transport/spdy"
	streamhttp "k8s.io/streaming/pkg/httpstream"
)

// ClientPort is etcd's client port on a control plane node.
const ClientPort = 2379

// StaticPodName is the name of the etcd static pod of a node, in kube-system, as kubeadm
// and RKE2 name their mirror pods.
func StaticPodName(node string) string { return "etcd-" + node }

// PortForward returns a DialFunc that reaches the etcd member of a node through the
// workload API server's port-forward to its static pod kube-system/etcd-<node> (what
// kubectl port-forward does; KubeadmControlPlane reaches etcd the same way). It needs
// pods/portforward on the workload cluster, which the admin kubeconfig Cluster API
// issues has. Each connection forwards one local port on 127.0.0.1, closed with it.
func PortForward(cfg *rest.Config) DialFunc {
	return func(ctx context.Context, node string) (net.Conn, error) {
		pod := StaticPodName(node)
		clientset, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			return nil, fmt.Errorf("port-forward to pod %s/%s: %w", metav1.NamespaceSystem, pod, err)
		}
		url := clientset.CoreV1().RESTClient().Post().Resource("pods").Namespace(metav1.NamespaceSystem).Name(pod).SubResource("portforward").URL()
		transport, upgrader, err := spdy.RoundTripperFor(cfg)
		if err != nil {
			return nil, fmt.Errorf("port-forward to pod %s/%s: %w", metav1.NamespaceSystem, pod, err)
		}
		dialer := spdy.NewDialerForStreaming(upgrader, &http.Client{Transport: transport}, http.MethodPost, url)
		tunnel, err := portforward.NewSPDYOverWebsocketDialerForStreaming(url, cfg)
		if err != nil {
			return nil, fmt.Errorf("port-forward to pod %s/%s: %w", metav1.NamespaceSystem, pod, err)
		}
		// WebSockets first, SPDY where the API server or a proxy in between refuses them.
		dialer = portforward.NewFallbackDialerForStreaming(tunnel, dialer, func(err error) bool {
			return streamhttp.IsUpgradeFailure(err) || streamhttp.IsHTTPSProxyError(err)
		})
		stop, ready := make(chan struct{}), make(chan struct{})
		fw, err := portforward.NewOnAddressesForStreaming(dialer, []string{"127.0.0.1"}, []string{fmt.Sprintf("0:%d", ClientPort)}, stop, ready, io.Discard, io.Discard)
		if err != nil {
			return nil, fmt.Errorf("port-forward to pod %s/%s: %w", metav1.NamespaceSystem, pod, err)
		}
		ended := make(chan error, 1)
		go func() { ended <- fw.ForwardPorts() }()
		var once sync.Once
		closeForward := func() { once.Do(func() { close(stop) }) }
		select {
		case <-ready:
		case err := <-ended:
			if err == nil {
				err = errors.New("ended before it was ready")
			}
			return nil, fmt.Errorf("port-forward to pod %s/%s: %w", metav1.NamespaceSystem, pod, err)
		case <-ctx.Done():
			closeForward()
			return nil, fmt.Errorf("port-forward to pod %s/%s: %w", metav1.NamespaceSystem, pod, ctx.Err())
		}
		ports, err := fw.GetPorts()
		if err == nil && len(ports) == 0 {
			err = errors.New("no local port")
		}
		if err != nil {
			closeForward()
			return nil, fmt.Errorf("port-forward to pod %s/%s: %w", metav1.NamespaceSystem, pod, err)
		}
		var d net.Dialer
		conn, err := d.DialContext(ctx, "tcp", fmt.Sprintf("127.0.0.1:%d", ports[0].Local))
		if err != nil {
			closeForward()
			return nil, fmt.Errorf("port-forward to pod %s/%s: %w", metav1.NamespaceSystem, pod, err)
		}
		return &forwardedConn{Conn: conn, closeForward: closeForward}, nil
	}
}

// forwardedConn ends its port-forward when it is closed.
type forwardedConn struct {
	net.Conn
	closeForward func()
}

func (c *forwardedConn) Close() error {
	err := c.Conn.Close()
	c.closeForward()
	return err
}
