// Package manager builds the capi-inplace manager binary and runs it as a separate
// process against a test API server, the way it runs in a cluster: flags, serving
// certificates, probes. Its output goes to a log file the tests can read.
package manager

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/capi-inplace/capi-inplace/test/procguard"
)

// BinaryEnv names a manager binary built from this checkout before the tests started
// (make test and make test-e2e build it once and set it): Build returns it instead of
// linking the manager again in every suite and demo run.
const BinaryEnv = "CAPI_INPLACE_MANAGER_BINARY"

// Build compiles the manager from the checkout at root into dir and returns its path, or
// returns the binary BinaryEnv names when it is set and there.
func Build(ctx context.Context, root, dir string) (string, error) {
	if prebuilt := os.Getenv(BinaryEnv); prebuilt != "" {
		if st, err := os.Stat(prebuilt); err == nil && st.Mode().IsRegular() {
			return prebuilt, nil
		}
		return "", fmt.Errorf("%s=%s: no manager binary there; unset it, or build it with make manager-test-binary", BinaryEnv, prebuilt)
	}
	out := filepath.Join(dir, "capi-inplace")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", out, ".")
	cmd.Dir = root
	procguard.Guard(cmd)
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build manager: %w: %s", err, b)
	}
	return out, nil
}

// Options say how to run the manager.
type Options struct {
	// Binary is the manager binary (see Build).
	Binary string
	// Kubeconfig reaches the management cluster.
	Kubeconfig string
	// CertDir holds the serving certificate (see NewServingCerts).
	CertDir string
	// LogFile receives the manager's standard output and error.
	LogFile string
	// ExtraArgs are appended to the flags (for example --default-updater=...); a flag
	// given here again overrides the one Start sets.
	ExtraArgs []string
	// LeaderElect turns on leader election.
	LeaderElect bool
	// LeaderElectionNamespace is where the Lease lives; default "default".
	LeaderElectionNamespace string
}

// Process is a running manager.
type Process struct {
	cmd  *exec.Cmd
	done chan error
	log  *os.File

	// WebhookPort serves Cluster API's hooks.
	WebhookPort int
	// ExternalHookPort serves capi-inplace's own hooks.
	ExternalHookPort int
	// HealthPort serves /healthz and /readyz.
	HealthPort int
	// MetricsPort serves /metrics over plain HTTP.
	MetricsPort int
}

// Start runs the manager on free loopback ports and returns once the process started;
// use WaitReady to wait for its probes.
func Start(opts Options) (*Process, error) {
	ports, err := FreePorts(4)
	if err != nil {
		return nil, err
	}
	p := &Process{WebhookPort: ports[0], ExternalHookPort: ports[1], HealthPort: ports[2], MetricsPort: ports[3], done: make(chan error, 1)}
	args := []string{
		"--kubeconfig=" + opts.Kubeconfig,
		"--webhook-port=" + strconv.Itoa(p.WebhookPort),
		"--external-hook-port=" + strconv.Itoa(p.ExternalHookPort),
		"--webhook-cert-dir=" + opts.CertDir,
		"--health-probe-bind-address=127.0.0.1:" + strconv.Itoa(p.HealthPort),
		"--metrics-bind-address=127.0.0.1:" + strconv.Itoa(p.MetricsPort),
		"--metrics-secure=false",
		"--leader-elect=" + strconv.FormatBool(opts.LeaderElect),
		// Both hook servers authenticate their callers, as the shipped config/ does: a
		// client certificate of CertDir's CA (ClientTLSConfig presents one).
		"--hook-client-ca=" + filepath.Join(opts.CertDir, "ca.crt"),
		"--external-hook-client-ca=" + filepath.Join(opts.CertDir, "ca.crt"),
	}
	leNamespace := opts.LeaderElectionNamespace
	if leNamespace == "" {
		leNamespace = "default"
	}
	args = append(args, "--leader-election-namespace="+leNamespace)
	args = append(args, opts.ExtraArgs...)
	log, err := os.OpenFile(opts.LogFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	p.log = log
	p.cmd = exec.Command(opts.Binary, args...)
	p.cmd.Stdout, p.cmd.Stderr = log, log
	// The manager ends with the test binary (or the demo) that started it, even when that
	// one is killed or times out before it stops the manager.
	procguard.Guard(p.cmd)
	if err := p.cmd.Start(); err != nil {
		_ = log.Close()
		return nil, fmt.Errorf("start manager: %w", err)
	}
	go func() { p.done <- p.cmd.Wait() }()
	return p, nil
}

// StartReady is Start then WaitReady. A manager that exits because one of its ports was
// taken between FreePorts and its listen (a port that was free a moment ago can be any
// new connection's source port) is started again on other ports, up to three times. On
// an error the process, if one was started, is returned too, to be stopped.
func StartReady(opts Options, timeout time.Duration) (*Process, error) {
	for attempt := 1; ; attempt++ {
		var logged int64
		if st, err := os.Stat(opts.LogFile); err == nil {
			logged = st.Size()
		}
		p, err := Start(opts)
		if err != nil {
			return nil, err
		}
		err = p.WaitReady(timeout)
		if err == nil {
			return p, nil
		}
		if exited, _ := p.Exited(); !exited || attempt == 3 || !loggedSince(opts.LogFile, logged, "address already in use") {
			return p, err
		}
	}
}

// loggedSince says whether the file has text after its first offset bytes.
func loggedSince(file string, offset int64, text string) bool {
	data, err := os.ReadFile(file)
	if err != nil || int64(len(data)) < offset {
		return false
	}
	return strings.Contains(string(data[offset:]), text)
}

// WaitReady waits until /readyz answers 200, or the process exits, or the timeout passes.
func (p *Process) WaitReady(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	url := fmt.Sprintf("http://127.0.0.1:%d/readyz", p.HealthPort)
	for time.Now().Before(deadline) {
		select {
		case err := <-p.done:
			p.done <- err
			return fmt.Errorf("manager exited before it was ready: %w", err)
		default:
		}
		resp, err := http.Get(url) //nolint:gosec,noctx // loopback test probe
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("manager not ready after %s", timeout)
}

// Exited reports whether the manager process has ended on its own (a manager that loses
// its leader election Lease exits, as controller-runtime's managers do), and the error
// of its end (its exit status).
func (p *Process) Exited() (bool, error) {
	select {
	case err := <-p.done:
		p.done <- err
		return true, err
	default:
		return false, nil
	}
}

// Stop asks the manager to stop (SIGTERM) and waits for it.
func (p *Process) Stop() error {
	return p.signalAndWait(syscall.SIGTERM)
}

// Kill stops the manager at once (SIGKILL), as a crash would.
func (p *Process) Kill() error {
	return p.signalAndWait(syscall.SIGKILL)
}

func (p *Process) signalAndWait(sig syscall.Signal) error {
	defer func() { _ = p.log.Close() }()
	_ = p.cmd.Process.Signal(sig)
	select {
	case err := <-p.done:
		p.done <- err
		if sig == syscall.SIGTERM {
			return err
		}
		return nil
	case <-time.After(30 * time.Second):
		_ = p.cmd.Process.Kill()
		return fmt.Errorf("manager did not stop within 30s of %s", sig)
	}
}

// ClientTLSConfig returns a client TLS configuration that trusts only the CA of certDir
// (see NewServingCerts) and presents its client certificate: what the manager Start ran
// lets in on both hook servers.
func ClientTLSConfig(certDir string) (*tls.Config, error) {
	caPEM, err := os.ReadFile(filepath.Join(certDir, "ca.crt"))
	if err != nil {
		return nil, err
	}
	c, err := TLSConfig(caPEM)
	if err != nil {
		return nil, err
	}
	pair, err := tls.LoadX509KeyPair(filepath.Join(certDir, "client.crt"), filepath.Join(certDir, "client.key"))
	if err != nil {
		return nil, fmt.Errorf("load the test client certificate: %w", err)
	}
	c.Certificates = []tls.Certificate{pair}
	return c, nil
}

// TLSConfig returns a client TLS configuration that trusts only caPEM and presents no
// client certificate.
func TLSConfig(caPEM []byte) (*tls.Config, error) {
	pool, err := certPool(caPEM)
	if err != nil {
		return nil, err
	}
	return &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}, nil
}

// FreePorts returns n loopback ports that were free a moment ago.
func FreePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	listeners := make([]net.Listener, 0, n)
	defer func() {
		for _, l := range listeners {
			_ = l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("find a free port: %w", err)
		}
		listeners = append(listeners, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}
