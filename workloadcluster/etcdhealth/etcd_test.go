package etcdhealth_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/capi-inplace/capi-inplace/test/procguard"
	"github.com/capi-inplace/capi-inplace/test/testenv"
	"github.com/capi-inplace/capi-inplace/workloadcluster/etcdhealth"
)

// testCA is an etcd CA made for one test etcd, as Cluster API makes <cluster>-etcd.
type testCA struct {
	ca              etcdhealth.CA
	certPEM, keyPEM []byte
}

func newTestCA() testCA {
	GinkgoHelper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	Expect(err).NotTo(HaveOccurred())
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "etcd-ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	Expect(err).NotTo(HaveOccurred())
	keyDER, err := x509.MarshalECPrivateKey(key)
	Expect(err).NotTo(HaveOccurred())
	c := testCA{
		certPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		keyPEM:  pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}),
	}
	c.ca, err = etcdhealth.ParseCA(c.certPEM, c.keyPEM)
	Expect(err).NotTo(HaveOccurred())
	return c
}

// serving signs a serving (and peer) certificate for 127.0.0.1 and writes it with its key
// into dir.
func (c testCA) serving(dir string) (certFile, keyFile string) {
	GinkgoHelper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	Expect(err).NotTo(HaveOccurred())
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: "etcd-server"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.ca.Cert, key.Public(), c.ca.Key)
	Expect(err).NotTo(HaveOccurred())
	keyDER, err := x509.MarshalECPrivateKey(key)
	Expect(err).NotTo(HaveOccurred())
	certFile, keyFile = filepath.Join(dir, "server.crt"), filepath.Join(dir, "server.key")
	Expect(os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600)).To(Succeed())
	Expect(os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600)).To(Succeed())
	return certFile, keyFile
}

// etcdProcess is a real etcd (bin/k8s/etcd, built from its Go module) of one member named
// after a node, serving TLS on 127.0.0.1 with client certificate authentication, as a
// kubeadm control plane's etcd does.
type etcdProcess struct {
	member            string
	addr              string
	certFile, keyFile string
	ca                testCA
	cmd               *exec.Cmd
}

func freePort() int {
	GinkgoHelper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	Expect(err).NotTo(HaveOccurred())
	defer func() { _ = l.Close() }()
	return l.Addr().(*net.TCPAddr).Port
}

// startEtcd starts an etcd whose one member is named member, with certificates of ca; it
// is stopped when the spec ends.
func startEtcd(ca testCA, member string) *etcdProcess {
	GinkgoHelper()
	bin := filepath.Join(assetsDir(), "etcd")
	if _, err := os.Stat(bin); err != nil {
		Fail(fmt.Sprintf("etcd not found at %s: run `make test-binaries` (it builds etcd from its Go module)", bin))
	}
	dir := GinkgoT().TempDir()
	certFile, keyFile := ca.serving(dir)
	caFile := filepath.Join(dir, "ca.crt")
	Expect(os.WriteFile(caFile, ca.certPEM, 0o600)).To(Succeed())
	client, peer := freePort(), freePort()
	e := &etcdProcess{member: member, addr: fmt.Sprintf("127.0.0.1:%d", client), certFile: certFile, keyFile: keyFile, ca: ca}
	e.cmd = exec.Command(bin,
		"--name", member, "--data-dir", filepath.Join(dir, "data"),
		"--listen-client-urls", "https://"+e.addr, "--advertise-client-urls", "https://"+e.addr,
		"--listen-peer-urls", fmt.Sprintf("http://127.0.0.1:%d", peer),
		"--initial-advertise-peer-urls", fmt.Sprintf("http://127.0.0.1:%d", peer),
		"--initial-cluster", fmt.Sprintf("%s=http://127.0.0.1:%d", member, peer),
		"--cert-file", certFile, "--key-file", keyFile, "--trusted-ca-file", caFile, "--client-cert-auth",
		"--unsafe-no-fsync", "--log-level", "error")
	e.cmd.Stdout, e.cmd.Stderr = GinkgoWriter, GinkgoWriter
	procguard.Guard(e.cmd)
	Expect(e.cmd.Start()).To(Succeed())
	DeferCleanup(e.stop)
	return e
}

func (e *etcdProcess) stop() {
	if e.cmd.Process == nil || e.cmd.ProcessState != nil {
		return
	}
	_ = e.cmd.Process.Kill()
	_ = e.cmd.Wait()
}

// dialer reaches the etcd processes by the member's name, as the port-forward to
// kube-system/etcd-<node> does in a real cluster. A node without one is refused.
func dialer(etcds ...*etcdProcess) etcdhealth.DialFunc {
	return func(ctx context.Context, node string) (net.Conn, error) {
		for _, e := range etcds {
			if e.member == node {
				var d net.Dialer
				return d.DialContext(ctx, "tcp", e.addr)
			}
		}
		return nil, fmt.Errorf("pods %q not found", etcdhealth.StaticPodName(node))
	}
}

// raiseAlarm raises an alarm on the etcd's member through the raw Maintenance Alarm RPC
// (ACTIVATE), as etcd itself does when its backend is full (NOSPACE).
func (e *etcdProcess) raiseAlarm(alarm pb.AlarmType) {
	GinkgoHelper()
	pair, err := tls.LoadX509KeyPair(e.certFile, e.keyFile)
	Expect(err).NotTo(HaveOccurred())
	roots := x509.NewCertPool()
	roots.AddCert(e.ca.ca.Cert)
	cli, err := clientv3.New(clientv3.Config{
		Endpoints: []string{"https://" + e.addr}, DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		TLS: &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{pair}, RootCAs: roots},
	})
	Expect(err).NotTo(HaveOccurred())
	defer func() { _ = cli.Close() }()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	members, err := cli.MemberList(ctx)
	Expect(err).NotTo(HaveOccurred())
	_, err = pb.NewMaintenanceClient(cli.ActiveConnection()).Alarm(ctx, &pb.AlarmRequest{
		Action: pb.AlarmRequest_ACTIVATE, MemberID: members.Members[0].ID, Alarm: alarm})
	Expect(err).NotTo(HaveOccurred())
	alarms, err := cli.AlarmList(ctx)
	Expect(err).NotTo(HaveOccurred())
	Expect(alarms.Alarms).To(ContainElement(HaveField("Alarm", alarm)), "etcd keeps the alarm")
}

// assetsDir holds the test control plane's binaries: KUBEBUILDER_ASSETS, else bin/k8s.
func assetsDir() string {
	GinkgoHelper()
	if assets := os.Getenv("KUBEBUILDER_ASSETS"); assets != "" {
		return assets
	}
	root, err := testenv.RepoRoot()
	Expect(err).NotTo(HaveOccurred())
	return filepath.Join(root, "bin", "k8s")
}
