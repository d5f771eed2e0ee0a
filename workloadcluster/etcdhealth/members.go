// Package etcdhealth reads etcd's own view of a workload cluster's control plane, for the
// preflight of a control plane node: Node Ready and a MachineHealthCheck say that a
// kubelet answers, not that etcd has every member, a leader and no alarm.
//
// Two views, by what the management cluster holds:
//   - MemberView, for a Cluster with Cluster API's <cluster>-etcd CA Secret (kubeadm):
//     each member is dialed through the workload API server's port-forward to its static
//     pod kube-system/etcd-<node>, as KubeadmControlPlane does, with a client certificate
//     signed by that CA, made in memory for minutes; it reads the member list, each
//     member's status and the alarms.
//   - ReadyzView, for a Cluster without it (RKE2, Harvester: etcd's certificates never
//     leave the nodes): the API server's /readyz/etcd and the readiness of the etcd static
//     pods. It is weaker: it says that the API server reaches etcd and that the pods run,
//     not which members etcd counts or whether one raises an alarm.
//
// A view that cannot be read is an error: the caller holds the node, it never passes it.
package etcdhealth

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"math/big"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
)

// Report is etcd's view of a control plane, as read once.
type Report struct {
	// Source says where the view comes from, for messages.
	Source string
	// Problems are what is wrong, in etcd's (or the API server's) own words; empty when
	// the control plane is healthy as far as the view can tell.
	Problems []string
}

// Healthy reports whether the view found nothing wrong.
func (r Report) Healthy() bool { return len(r.Problems) == 0 }

// DialFunc opens a connection to the client port of the etcd member of a control plane
// node (kubeadm names the member after its node, and its static pod etcd-<node>).
type DialFunc func(ctx context.Context, node string) (net.Conn, error)

// ClientCertificateLifetime is how long the client certificate made for one read is
// valid: it lives in memory only, for this read.
const ClientCertificateLifetime = 10 * time.Minute

// defaultCallTimeout bounds each call to a member when CallTimeout is zero.
const defaultCallTimeout = 3 * time.Second

// MemberSource is the Source of a MemberView's report.
const MemberSource = "etcd's member list, member status and alarms"

// CA is the certificate authority of a cluster's etcd, as Cluster API keeps it in the
// <cluster>-etcd Secret.
type CA struct {
	Cert *x509.Certificate
	Key  crypto.Signer
}

// ParseCA parses the PEM certificate and key of an etcd CA (tls.crt and tls.key).
func ParseCA(certPEM, keyPEM []byte) (CA, error) {
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return CA{}, fmt.Errorf("parse the etcd CA: %w", err)
	}
	cert, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return CA{}, fmt.Errorf("parse the etcd CA certificate: %w", err)
	}
	key, ok := pair.PrivateKey.(crypto.Signer)
	if !ok || !cert.IsCA {
		return CA{}, errors.New("the etcd CA is not a CA certificate with a signing key")
	}
	return CA{Cert: cert, Key: key}, nil
}

// MemberView reads etcd's members, their status and the alarms, as KubeadmControlPlane
// judges etcd (EtcdClusterHealthy, EtcdMemberHealthy): every control plane node has a
// started, voting member; every member answers, knows a leader and reports no error; no
// member raises an alarm; no member belongs to no control plane node.
type MemberView struct {
	// Dial reaches a member; in the manager, the workload API server's port-forward.
	Dial DialFunc
	// CallTimeout bounds the dial and each call to a member; zero means three seconds.
	CallTimeout time.Duration
}

// Read reads etcd's view of the control plane made of nodes, with a client certificate
// signed by ca. It returns an error when no member could be reached or read: then
// nothing is known.
func (v MemberView) Read(ctx context.Context, ca CA, nodes []string) (Report, error) {
	report := Report{Source: MemberSource}
	if len(nodes) == 0 {
		return report, errors.New("no control plane node to reach etcd through")
	}
	tlsConfig, err := clientTLS(ca)
	if err != nil {
		return report, err
	}

	// The first member that answers gives the member list and the alarms, as KCP reads them.
	var reached []string
	var first *memberClient
	for _, node := range nodes {
		c, err := v.client(node, tlsConfig)
		if err == nil {
			if _, err = v.status(ctx, c, node); err == nil {
				first = c
				break
			}
			_ = c.Close()
		}
		reached = append(reached, fmt.Sprintf("etcd on node %s: %v", node, err))
	}
	if first == nil {
		return report, fmt.Errorf("no etcd member answered: %s", strings.Join(reached, "; "))
	}
	defer func() { _ = first.Close() }()

	members, err := v.members(ctx, first)
	if err != nil {
		return report, err
	}
	alarms, err := v.alarms(ctx, first)
	if err != nil {
		return report, err
	}

	names := make([]string, 0, len(members))
	byID := map[uint64]string{}
	for _, m := range members {
		names = append(names, memberName(m))
		byID[m.ID] = memberName(m)
	}
	slices.Sort(names)
	for _, node := range nodes {
		i := slices.IndexFunc(members, func(m *pb.Member) bool { return m.Name == node })
		switch {
		case i < 0:
			report.Problems = append(report.Problems, fmt.Sprintf("etcd reports the members %s, none for control plane node %s", strings.Join(names, ", "), node))
		case members[i].IsLearner:
			report.Problems = append(report.Problems, fmt.Sprintf("etcd member %s is a learner, not yet promoted to a voting member", node))
		}
	}
	for _, m := range members {
		if !slices.Contains(nodes, m.Name) {
			report.Problems = append(report.Problems, fmt.Sprintf("etcd member %s (id %x) belongs to no control plane node; it counts for quorum", memberName(m), m.ID))
		}
	}
	for _, a := range alarms {
		if a.Alarm == pb.AlarmType_NONE {
			continue
		}
		who := byID[a.MemberID]
		if who == "" {
			who = fmt.Sprintf("%x", a.MemberID)
		}
		report.Problems = append(report.Problems, fmt.Sprintf("etcd member %s raises alarm %s", who, a.Alarm))
	}
	// Each member's own status: one that does not answer, knows no leader or reports an
	// error is a member the next disruption would count on.
	for _, m := range members {
		if m.Name == "" || !slices.Contains(nodes, m.Name) {
			continue
		}
		if problem := v.memberStatus(ctx, m.Name, tlsConfig); problem != "" {
			report.Problems = append(report.Problems, problem)
		}
	}
	return report, nil
}

// memberStatus reads one member's status; it returns what is wrong, empty when nothing.
func (v MemberView) memberStatus(ctx context.Context, node string, tlsConfig *tls.Config) string {
	c, err := v.client(node, tlsConfig)
	if err != nil {
		return fmt.Sprintf("etcd member %s cannot be reached: %v", node, err)
	}
	defer func() { _ = c.Close() }()
	st, err := v.status(ctx, c, node)
	switch {
	case err != nil:
		return fmt.Sprintf("etcd member %s does not answer: %v", node, err)
	case st.Leader == 0:
		return fmt.Sprintf("etcd member %s knows no leader", node)
	}
	if errs := statusErrors(st.Errors); len(errs) > 0 {
		return fmt.Sprintf("etcd member %s reports: %s", node, strings.Join(errs, "; "))
	}
	return ""
}

// statusErrors are the errors a member's status reports, less the active alarms, which
// etcd lists there too ("memberID:... alarm:NOSPACE") and which the alarm list names.
func statusErrors(errs []string) []string {
	var out []string
	for _, e := range errs {
		if strings.HasPrefix(e, "memberID:") && strings.Contains(e, " alarm:") {
			continue
		}
		out = append(out, strings.TrimSpace(e))
	}
	return out
}

func (v MemberView) callTimeout() time.Duration {
	if v.CallTimeout > 0 {
		return v.CallTimeout
	}
	return defaultCallTimeout
}

// memberClient is a client of one member, with the last error of its dial: gRPC reports
// a failed dial as a deadline, and the dial's own error says why.
type memberClient struct {
	*clientv3.Client
	mu      sync.Mutex
	dialErr error
}

// explain adds the last dial error to an error of a call.
func (c *memberClient) explain(err error) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err == nil || c.dialErr == nil {
		return err
	}
	return fmt.Errorf("%w (dial: %w)", err, c.dialErr)
}

// client makes a client of the member of one node. The endpoint only names the member:
// the connection is Dial's.
func (v MemberView) client(node string, tlsConfig *tls.Config) (*memberClient, error) {
	if v.Dial == nil {
		return nil, errors.New("no way to reach etcd is configured")
	}
	mc := &memberClient{}
	c, err := clientv3.New(clientv3.Config{
		Endpoints:   []string{"etcd-" + node},
		DialTimeout: v.callTimeout(),
		DialOptions: []grpc.DialOption{grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			conn, err := v.Dial(ctx, node)
			mc.mu.Lock()
			mc.dialErr = err
			mc.mu.Unlock()
			return conn, err
		})},
		TLS:    tlsConfig,
		Logger: zap.NewNop(),
		// One try per call: the preflight asks again at its next round.
		MaxUnaryRetries: 1,
	})
	if err != nil {
		return nil, mc.explain(err)
	}
	mc.Client = c
	return mc, nil
}

func (v MemberView) status(ctx context.Context, c *memberClient, node string) (*clientv3.StatusResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, v.callTimeout())
	defer cancel()
	st, err := c.Status(ctx, "etcd-"+node)
	if err != nil {
		return nil, fmt.Errorf("status: %w", c.explain(err))
	}
	return st, nil
}

func (v MemberView) members(ctx context.Context, c *memberClient) ([]*pb.Member, error) {
	ctx, cancel := context.WithTimeout(ctx, v.callTimeout())
	defer cancel()
	resp, err := c.MemberList(ctx)
	if err != nil {
		return nil, fmt.Errorf("read etcd's member list: %w", c.explain(err))
	}
	return resp.Members, nil
}

func (v MemberView) alarms(ctx context.Context, c *memberClient) ([]*pb.AlarmMember, error) {
	ctx, cancel := context.WithTimeout(ctx, v.callTimeout())
	defer cancel()
	resp, err := c.AlarmList(ctx)
	if err != nil {
		return nil, fmt.Errorf("read etcd's alarms: %w", c.explain(err))
	}
	return resp.Alarms, nil
}

// memberName names a member; a member that has not started yet has no name.
func memberName(m *pb.Member) string {
	if m.Name == "" {
		return fmt.Sprintf("(unstarted, id %x)", m.ID)
	}
	return m.Name
}

// clientTLS makes a client certificate signed by the etcd CA, valid for
// ClientCertificateLifetime, and trusts the CA for the members' serving certificates.
// The members are reached through a tunnel under a name their certificates do not carry,
// so the chain is verified without the host name, as KubeadmControlPlane does.
func clientTLS(ca CA) (*tls.Config, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate a key for the etcd client certificate: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return nil, fmt.Errorf("generate a serial number for the etcd client certificate: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: "capi-inplace-etcd-view"},
		NotBefore:    now.Add(-time.Minute),
		NotAfter:     now.Add(ClientCertificateLifetime),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, key.Public(), ca.Key)
	if err != nil {
		return nil, fmt.Errorf("sign the etcd client certificate with the etcd CA: %w", err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	return &tls.Config{
		MinVersion:   tls.VersionTLS12,
		Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}},
		// The host name is not checked (see above); VerifyConnection checks the chain.
		InsecureSkipVerify: true, //nolint:gosec // the chain is verified in VerifyConnection
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("the etcd member presented no certificate")
			}
			inter := x509.NewCertPool()
			for _, c := range cs.PeerCertificates[1:] {
				inter.AddCert(c)
			}
			_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
			if err != nil {
				return fmt.Errorf("the etcd member's certificate is not signed by the cluster's etcd CA: %w", err)
			}
			return nil
		},
	}, nil
}
