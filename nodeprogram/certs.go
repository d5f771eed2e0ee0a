package nodeprogram

import (
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// rke2CertificateGlobs are the host files holding the certificates RKE2's components
// serve and present: the server's (API server, supervisor, controller, the clients of
// each component), etcd's, the kube-controller-manager's and kube-scheduler's serving
// certificates (each in its own directory, which RKE2 generates once and, before v1.27,
// never renews), and the agent's (kubelet, kube-proxy, the RKE2 controller). A node that
// is not a server has only the agent's.
var rke2CertificateGlobs = []string{
	"/var/lib/rancher/rke2/server/tls/*.crt",
	"/var/lib/rancher/rke2/server/tls/etcd/*.crt",
	"/var/lib/rancher/rke2/server/tls/kube-controller-manager/*.crt",
	"/var/lib/rancher/rke2/server/tls/kube-scheduler/*.crt",
	"/var/lib/rancher/rke2/agent/*.crt",
}

// ExpiringCertificate is one certificate of RKE2's on the node that expires before a
// deadline.
type ExpiringCertificate struct {
	// Path is the file on the host.
	Path string
	// Subject is the certificate's subject.
	Subject string
	// NotAfter is when it expires.
	NotAfter time.Time
}

// ExpiringRKE2Certificates lists the certificates in RKE2's files on the host (every one
// of a file's chain) that expire before deadline, the first to expire first. A file that
// does not parse is no certificate of RKE2's to judge and is left out.
func ExpiringRKE2Certificates(host Host, deadline time.Time) ([]ExpiringCertificate, error) {
	var out []ExpiringCertificate
	for _, glob := range rke2CertificateGlobs {
		files, err := filepath.Glob(host.Path(glob))
		if err != nil {
			return nil, fmt.Errorf("list %s: %w", glob, err)
		}
		for _, f := range files {
			data, err := os.ReadFile(f)
			if err != nil {
				return nil, fmt.Errorf("read %s: %w", f, err)
			}
			onHost := filepath.Join(filepath.Dir(glob), filepath.Base(f))
			for block, rest := pem.Decode(data); block != nil; block, rest = pem.Decode(rest) {
				if block.Type != "CERTIFICATE" {
					continue
				}
				c, err := x509.ParseCertificate(block.Bytes)
				if err != nil || !c.NotAfter.Before(deadline) {
					continue
				}
				out = append(out, ExpiringCertificate{Path: onHost, Subject: c.Subject.String(), NotAfter: c.NotAfter})
			}
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].NotAfter.Before(out[j].NotAfter) })
	return out, nil
}

// checkRKE2Certificates fails when a certificate of RKE2's on the node expires within
// days of now: an RKE2 component restarted by the upgrade with it stops answering, and
// the upgrade stalls there (Rancher waits for the probes of kube-controller-manager and
// kube-scheduler for good: harvester/harvester#3863, #5828, #9130; rancher/rancher#41125).
// Harvester's own preflight checks only the API server's certificate. days 0 checks
// nothing.
func checkRKE2Certificates(env *Env, days int) error {
	if days <= 0 {
		return nil
	}
	now := env.Now()
	expiring, err := ExpiringRKE2Certificates(env.host(), now.AddDate(0, 0, days))
	if err != nil {
		return err
	}
	if len(expiring) == 0 {
		env.say("RKE2's certificates on this node are valid for more than %d days\n", days)
		return nil
	}
	return RKE2CertificatesError(expiring, now, days)
}

// RKE2CertificatesError is the failure of a node whose RKE2 certificates expire within
// days of now: each named (the first few), and what to run.
func RKE2CertificatesError(expiring []ExpiringCertificate, now time.Time, days int) error {
	var named []string
	component := false
	for _, c := range expiring {
		component = component || strings.Contains(c.Path, "/kube-controller-manager/") || strings.Contains(c.Path, "/kube-scheduler/")
	}
	for i, c := range expiring {
		if i == 3 {
			named = append(named, fmt.Sprintf("and %d more", len(expiring)-i))
			break
		}
		when := "expires"
		if c.NotAfter.Before(now) {
			when = "expired"
		}
		named = append(named, fmt.Sprintf("%s (%s) %s at %s", c.Path, c.Subject, when, c.NotAfter.UTC().Format(time.RFC3339)))
	}
	own := ""
	if component {
		own = "RKE2 before v1.27 does not renew kube-controller-manager's and kube-scheduler's own serving certificates: remove their .crt and .key and restart the component (rancher/rancher#41125). "
	}
	return fmt.Errorf("RKE2's certificates on this node expire within %d days: %s. An RKE2 component that the upgrade restarts with them stops answering and the upgrade stalls there (harvester/harvester#3863, #5828, #9130). "+
		"Rotate them first: on a server node systemctl stop rke2-server; rke2 certificate rotate; systemctl start rke2-server; on an agent node systemctl restart rke2-agent. %s"+
		"Then upgrade again (the UpgradePlan's annotation harvester.inplace.cluster.x-k8s.io/min-certs-expiration-in-day changes the minimum)",
		days, strings.Join(named, "; "), own)
}
