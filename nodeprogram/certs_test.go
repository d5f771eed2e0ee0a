package nodeprogram

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"strings"
	"testing"
	"time"
)

// runNode's clock.
var certNow = time.Date(2026, 11, 24, 1, 0, 0, 0, time.UTC)

// pemCert is a PEM certificate for cn valid until notAfter, self-signed as
// kube-controller-manager and kube-scheduler sign their own serving certificates in
// RKE2's tls directories.
func pemCert(t *testing.T, cn string, notAfter time.Time) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: cn}, NotBefore: notAfter.AddDate(-1, 0, 0), NotAfter: notAfter}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
}

// withRKE2Certificates writes a server node's certificates, valid for a year, onto host.
func withRKE2Certificates(t *testing.T, host *fakeHost) {
	t.Helper()
	year := certNow.AddDate(1, 0, 0)
	host.write(t, "/var/lib/rancher/rke2/server/tls/serving-kube-apiserver.crt", pemCert(t, "kube-apiserver", year)+pemCert(t, "rke2-server-ca", year.AddDate(9, 0, 0)))
	host.write(t, "/var/lib/rancher/rke2/server/tls/etcd/server-client.crt", pemCert(t, "etcd-server", year))
	host.write(t, "/var/lib/rancher/rke2/server/tls/kube-controller-manager/kube-controller-manager.crt", pemCert(t, "kube-controller-manager", year))
	host.write(t, "/var/lib/rancher/rke2/server/tls/kube-scheduler/kube-scheduler.crt", pemCert(t, "kube-scheduler", year))
	host.write(t, "/var/lib/rancher/rke2/agent/serving-kubelet.crt", pemCert(t, "hv-node-1", year))
	host.write(t, "/var/lib/rancher/rke2/server/tls/client-ca.key", "not a certificate")
}

func TestPreloadFailsFirstWhenRKE2CertificatesExpireSoon(t *testing.T) {
	srv := releaseRepository(t)
	host := newFakeHost(t)
	withCtr(host)
	withRKE2Certificates(t, host)
	// kube-controller-manager's own serving certificate, which RKE2 before v1.27 never
	// renews (rancher/rancher#41125), expires in three days; the kubelet's expired.
	host.write(t, "/var/lib/rancher/rke2/server/tls/kube-controller-manager/kube-controller-manager.crt", pemCert(t, "kube-controller-manager", certNow.AddDate(0, 0, 3)))
	host.write(t, "/var/lib/rancher/rke2/agent/serving-kubelet.crt", pemCert(t, "hv-node-1", certNow.Add(-time.Hour)))

	r := runNode(t, host, nil, "preload", "--repository-url="+srv.URL+"/harvester-iso/", "--version=v1.6.0")
	r.expect(t, ExitFailed,
		"RKE2's certificates on this node expire within 7 days",
		"/var/lib/rancher/rke2/agent/serving-kubelet.crt (CN=hv-node-1) expired at 2026-11-24T00:00:00Z",
		"/var/lib/rancher/rke2/server/tls/kube-controller-manager/kube-controller-manager.crt (CN=kube-controller-manager) expires at 2026-11-27T01:00:00Z",
		"rke2 certificate rotate", "rancher/rancher#41125", "harvester/harvester#3863",
		"harvester.inplace.cluster.x-k8s.io/min-certs-expiration-in-day")
	if strings.Index(r.termination, "serving-kubelet") > strings.Index(r.termination, "kube-controller-manager.crt") {
		t.Errorf("the first to expire is named first: %s", r.termination)
	}
	if len(host.calls) != 0 || srv.count("/harvester-iso/harvester-release.yaml") != 0 {
		t.Errorf("the check comes before anything else; ran %v", host.commandLines())
	}

	// A minimum of 2 days still sees the expired kubelet certificate, not the one in three days.
	r = runNode(t, host, nil, "preload", "--repository-url="+srv.URL+"/harvester-iso/", "--version=v1.6.0", "--min-cert-days=2")
	r.expect(t, ExitFailed, "within 2 days", "serving-kubelet.crt")
	if strings.Contains(r.termination, "kube-controller-manager.crt") || strings.Contains(r.termination, "rancher/rancher#41125") {
		t.Errorf("--min-cert-days=2 names a certificate valid for three more days: %s", r.termination)
	}

	r = runNode(t, host, nil, "preload", "--repository-url="+srv.URL+"/harvester-iso/", "--version=v1.6.0", "--min-cert-days=0")
	r.expect(t, ExitOK, "capi-inplace node preload: done")

	r = runNode(t, host, nil, "preload", "--repository-url="+srv.URL+"/harvester-iso/", "--min-cert-days=-1")
	r.expect(t, ExitUsage, "--min-cert-days must be 0 (no check) or more, not -1")
}

func TestPreloadGoesOnWhenRKE2CertificatesAreValid(t *testing.T) {
	srv := releaseRepository(t)
	host := newFakeHost(t)
	withCtr(host)
	withRKE2Certificates(t, host)
	r := runNode(t, host, nil, "preload", "--repository-url="+srv.URL+"/harvester-iso/", "--version=v1.6.0")
	r.expect(t, ExitOK, "capi-inplace node preload: done")
	if !strings.Contains(r.stdout, "RKE2's certificates on this node are valid for more than 7 days") {
		t.Errorf("stdout %q", r.stdout)
	}
}

func TestExpiringRKE2CertificatesReadsEveryCertificateOfAChain(t *testing.T) {
	host := newFakeHost(t)
	withRKE2Certificates(t, host)
	// A client certificate file carries its CA after it; the CA expires first.
	host.write(t, "/var/lib/rancher/rke2/server/tls/client-admin.crt", pemCert(t, "system:admin", certNow.AddDate(1, 0, 0))+pemCert(t, "rke2-client-ca", certNow.AddDate(0, 0, 1)))
	got, err := ExpiringRKE2Certificates(host, certNow.AddDate(0, 0, 7))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Path != "/var/lib/rancher/rke2/server/tls/client-admin.crt" || got[0].Subject != "CN=rke2-client-ca" {
		t.Fatalf("got %+v, want the chain's expiring CA alone", got)
	}
}
