// Package capienv runs Cluster API's own controllers (core, KubeadmControlPlane, kubeadm
// bootstrap and CAPD with its in-memory backend, built into bin/capi by
// `make capi-binaries`) as processes against a test API server, with their CRDs'
// conversion webhooks and their admission webhooks served by those processes, as a
// clusterctl install wires them. Each process logs to a file of its own in the work
// directory, kept for a failing spec.
package capienv

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/capi-inplace/capi-inplace/test/manager"
	"github.com/capi-inplace/capi-inplace/test/procguard"
	"github.com/capi-inplace/capi-inplace/test/testenv"
)

// FeatureGates are the gates every controller runs with: the topology (ClusterClass
// clusters), the Runtime SDK (extensions) and in-place updates, as docs/capi-hooks.md
// asks of an operator.
const FeatureGates = "ClusterTopology=true,RuntimeSDK=true,InPlaceUpdates=true"

// provider is one of Cluster API's controllers: its binary in bin/capi and where its
// config (CRDs, webhooks) lives in its Go module.
type provider struct {
	name   string
	module string
	dir    string
}

var providers = []provider{
	{name: "capi-core", module: "sigs.k8s.io/cluster-api", dir: "core"},
	{name: "capi-kubeadm-bootstrap", module: "sigs.k8s.io/cluster-api", dir: "bootstrap/kubeadm"},
	{name: "capi-kubeadm-control-plane", module: "sigs.k8s.io/cluster-api", dir: "controlplane/kubeadm"},
	{name: "capd", module: "sigs.k8s.io/cluster-api/test", dir: "infrastructure/docker"},
}

// BinDir is where `make capi-binaries` puts the controllers.
func BinDir(root string) string { return filepath.Join(root, "bin", "capi") }

// Built returns nil when every controller is in BinDir, else an error that says how to
// build them.
func Built(root string) error {
	for _, p := range providers {
		if _, err := os.Stat(filepath.Join(BinDir(root), p.name)); err != nil {
			return fmt.Errorf("cluster API controller %s not found in %s: run `make capi-binaries` (or `make test-binaries`), which builds CAPI's controllers from their Go modules", p.name, BinDir(root))
		}
	}
	return nil
}

// ClientCert is a client certificate and its key, as files, and the certificate's
// common name.
type ClientCert struct {
	CertFile, KeyFile, CommonName string
}

// The controllers that call runtime extensions, with the common name of the client
// certificate each presents (the names of their Deployments in a clusterctl install).
var extensionCallers = map[string]string{
	"capi-core":                  "capi-controller-manager",
	"capi-kubeadm-control-plane": "capi-kubeadm-control-plane-controller-manager",
}

// Controllers are Cluster API's controllers running against one test API server.
type Controllers struct {
	// WorkDir holds each process's log (<name>.log), the kubeconfig and the certificates.
	WorkDir string
	// CAPEM is the authority of the serving certificate of every webhook, the
	// controllers' and the one the extension is given.
	CAPEM []byte
	// CertDir holds tls.crt and tls.key for 127.0.0.1, signed by CAPEM.
	CertDir string
	// ClientCerts are the client certificates (signed by CAPEM, for client
	// authentication) the controllers that call runtime extensions present to them, by
	// controller: core (discovery, CanUpdateMachineSet, UpdateMachine) and
	// KubeadmControlPlane (CanUpdateMachine), through Cluster API's
	// --runtime-extension-client-cert-file and --runtime-extension-client-key-file.
	ClientCerts map[string]ClientCert

	env    *testenv.Environment
	procs  map[string]*process
	ports  map[string]int
	unlock func()
}

// Start installs the controllers' CRDs (with their contract labels and conversion
// webhooks), starts the four controllers, waits until each is ready, then installs their
// admission webhooks. CAPD's in-memory backend listens on fixed ports (its debug server on
// 19000, workload clusters from 20000), so one set of controllers runs at a time on a
// machine: Start waits for the others (a file lock) for up to lockWait.
func Start(ctx context.Context, env *testenv.Environment, workDir string, lockWait time.Duration) (*Controllers, error) {
	if err := Built(env.RepoRoot); err != nil {
		return nil, err
	}
	unlock, err := lockMachine(ctx, lockWait)
	if err != nil {
		return nil, err
	}
	c := &Controllers{WorkDir: workDir, env: env, procs: map[string]*process{}, ports: map[string]int{}, unlock: unlock}
	if err := c.start(ctx); err != nil {
		return nil, errors.Join(err, c.Stop())
	}
	return c, nil
}

func (c *Controllers) start(ctx context.Context) error {
	certs, err := manager.NewServingCerts(filepath.Join(c.WorkDir, "capi-certs"))
	if err != nil {
		return err
	}
	c.CAPEM, c.CertDir = certs.CAPEM, certs.Dir
	c.ClientCerts = map[string]ClientCert{}
	for name, commonName := range extensionCallers {
		certFile, keyFile, err := certs.NewClientCertificate(name+"-extension-client", commonName)
		if err != nil {
			return err
		}
		c.ClientCerts[name] = ClientCert{CertFile: certFile, KeyFile: keyFile, CommonName: commonName}
	}
	kubeconfig := filepath.Join(c.WorkDir, "capi-kubeconfig")
	if err := c.env.WriteKubeconfig(kubeconfig); err != nil {
		return err
	}
	ports, err := manager.FreePorts(3 * len(providers))
	if err != nil {
		return err
	}
	for i, p := range providers {
		c.ports[p.name] = ports[3*i]
		dir, err := testenv.ModuleDir(c.env.RepoRoot, p.module)
		if err != nil {
			return err
		}
		if err := c.installCRDs(ctx, filepath.Join(dir, p.dir, "config", "crd"), c.ports[p.name]); err != nil {
			return fmt.Errorf("%s: %w", p.name, err)
		}
	}
	for i, p := range providers {
		args := []string{
			"--webhook-port=" + strconv.Itoa(ports[3*i]),
			"--webhook-cert-dir=" + c.CertDir,
			"--health-addr=127.0.0.1:" + strconv.Itoa(ports[3*i+1]),
			"--diagnostics-address=127.0.0.1:" + strconv.Itoa(ports[3*i+2]),
			"--insecure-diagnostics=true",
			"--leader-elect=false",
			"--feature-gates=" + FeatureGates,
		}
		if cert, ok := c.ClientCerts[p.name]; ok {
			// As config/capi-client-auth patches their Deployments: the hooks require it.
			args = append(args, "--runtime-extension-client-cert-file="+cert.CertFile, "--runtime-extension-client-key-file="+cert.KeyFile)
		}
		proc, err := startProcess(p.name, filepath.Join(BinDir(c.env.RepoRoot), p.name), kubeconfig, filepath.Join(c.WorkDir, p.name+".log"), args, ports[3*i+1])
		if err != nil {
			return err
		}
		c.procs[p.name] = proc
	}
	for _, p := range providers {
		if err := c.procs[p.name].waitReady(ctx, 2*time.Minute); err != nil {
			return fmt.Errorf("%w\n%s", err, c.procs[p.name].tail(40))
		}
	}
	for _, p := range providers {
		dir, err := testenv.ModuleDir(c.env.RepoRoot, p.module)
		if err != nil {
			return err
		}
		if err := c.installWebhooks(ctx, p.name, filepath.Join(dir, p.dir, "config", "webhook", "manifests.yaml"), c.ports[p.name]); err != nil {
			return fmt.Errorf("%s: %w", p.name, err)
		}
	}
	return nil
}

// Stop ends every controller (SIGTERM, then SIGKILL after 20 s) and releases the machine
// lock. The logs stay in WorkDir.
func (c *Controllers) Stop() error {
	var errs []error
	for _, p := range c.procs {
		errs = append(errs, p.stop())
	}
	c.procs = map[string]*process{}
	if c.unlock != nil {
		c.unlock()
		c.unlock = nil
	}
	return errors.Join(errs...)
}

// Logs returns the last lines of every controller's log, for a failing spec's report.
func (c *Controllers) Logs(lines int) string {
	var b strings.Builder
	for _, p := range providers {
		if proc, ok := c.procs[p.name]; ok {
			fmt.Fprintf(&b, "---- %s (%s)\n%s\n", p.name, proc.logPath, proc.tail(lines))
		}
	}
	return b.String()
}

// LogPaths returns each controller's log file, by name.
func (c *Controllers) LogPaths() map[string]string {
	out := map[string]string{}
	for _, p := range providers {
		out[p.name] = filepath.Join(c.WorkDir, p.name+".log")
	}
	return out
}

// kustomization is the part of a provider's config/crd/kustomization.yaml read here: the
// CRD files, the labels every CRD gets (the contract versions Cluster API looks up) and
// the patches that turn on the conversion webhook.
type kustomization struct {
	Resources []string `json:"resources"`
	Labels    []struct {
		Pairs map[string]string `json:"pairs"`
	} `json:"labels"`
	Patches []struct {
		Path string `json:"path"`
	} `json:"patches"`
}

// installCRDs installs (or updates) the CRDs of a provider's config/crd directory as its
// kustomization renders them, the conversion webhook served by the provider on port.
func (c *Controllers) installCRDs(ctx context.Context, dir string, port int) error {
	data, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
	if err != nil {
		return fmt.Errorf("read the CRD kustomization: %w", err)
	}
	var k kustomization
	if err := sigsyaml.Unmarshal(data, &k); err != nil {
		return fmt.Errorf("parse %s: %w", filepath.Join(dir, "kustomization.yaml"), err)
	}
	converted := map[string]bool{}
	for _, patch := range k.Patches {
		crd, err := readCRD(filepath.Join(dir, patch.Path))
		if err != nil {
			return err
		}
		if crd.Spec.Conversion != nil && crd.Spec.Conversion.Strategy == apiextensionsv1.WebhookConverter {
			converted[crd.Name] = true
		}
	}
	var names []string
	for _, res := range k.Resources {
		crd, err := readCRD(filepath.Join(dir, res))
		if err != nil {
			return err
		}
		if crd.Labels == nil {
			crd.Labels = map[string]string{}
		}
		for _, l := range k.Labels {
			for key, value := range l.Pairs {
				crd.Labels[key] = value
			}
		}
		if converted[crd.Name] {
			crd.Spec.Conversion = &apiextensionsv1.CustomResourceConversion{
				Strategy: apiextensionsv1.WebhookConverter,
				Webhook: &apiextensionsv1.WebhookConversion{
					ConversionReviewVersions: []string{"v1", "v1beta1"},
					ClientConfig: &apiextensionsv1.WebhookClientConfig{
						URL:      ptrTo(fmt.Sprintf("https://127.0.0.1:%d/convert", port)),
						CABundle: c.CAPEM,
					},
				},
			}
		}
		if err := createOrUpdate(ctx, c.env.Client, crd, &apiextensionsv1.CustomResourceDefinition{}); err != nil {
			return err
		}
		names = append(names, crd.Name)
	}
	return waitEstablished(ctx, c.env.Client, names)
}

// installWebhooks installs a provider's admission webhooks (config/webhook/manifests.yaml:
// a MutatingWebhookConfiguration and a ValidatingWebhookConfiguration) under names of
// their own, each webhook served by the provider on port at the path its Service
// reference gives.
func (c *Controllers) installWebhooks(ctx context.Context, name, path string, port int) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("read the webhook manifests: %w", err)
	}
	reader := yaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for {
		doc, err := reader.Read()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read %s: %w", path, err)
		}
		obj := &unstructured.Unstructured{}
		if err := sigsyaml.Unmarshal(doc, &obj.Object); err != nil {
			return fmt.Errorf("parse %s: %w", path, err)
		}
		if len(obj.Object) == 0 {
			continue
		}
		if kind := obj.GetKind(); kind != "MutatingWebhookConfiguration" && kind != "ValidatingWebhookConfiguration" {
			return fmt.Errorf("%s: unexpected kind %q", path, kind)
		}
		obj.SetName(name + "-" + obj.GetName())
		webhooks, _, err := unstructured.NestedSlice(obj.Object, "webhooks")
		if err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		for i := range webhooks {
			webhook, ok := webhooks[i].(map[string]any)
			if !ok {
				return fmt.Errorf("%s: webhook %d is not an object", path, i)
			}
			servicePath, _, _ := unstructured.NestedString(webhook, "clientConfig", "service", "path")
			webhook["clientConfig"] = map[string]any{
				"url":      fmt.Sprintf("https://127.0.0.1:%d%s", port, servicePath),
				"caBundle": base64.StdEncoding.EncodeToString(c.CAPEM),
			}
		}
		if err := unstructured.SetNestedSlice(obj.Object, webhooks, "webhooks"); err != nil {
			return err
		}
		existing := &unstructured.Unstructured{}
		existing.SetGroupVersionKind(obj.GroupVersionKind())
		if err := createOrUpdate(ctx, c.env.Client, obj, existing); err != nil {
			return err
		}
	}
}

func readCRD(path string) (*apiextensionsv1.CustomResourceDefinition, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read CRD: %w", err)
	}
	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := sigsyaml.Unmarshal(data, crd); err != nil {
		return nil, fmt.Errorf("parse CRD %s: %w", path, err)
	}
	return crd, nil
}

// createOrUpdate creates obj, or replaces the object of its name (read into existing).
func createOrUpdate(ctx context.Context, c client.Client, obj, existing client.Object) error {
	err := c.Get(ctx, client.ObjectKeyFromObject(obj), existing)
	switch {
	case apierrors.IsNotFound(err):
		if err := c.Create(ctx, obj); err != nil {
			return fmt.Errorf("create %s %s: %w", obj.GetObjectKind().GroupVersionKind().Kind, obj.GetName(), err)
		}
		return nil
	case err != nil:
		return fmt.Errorf("read %s %s: %w", obj.GetObjectKind().GroupVersionKind().Kind, obj.GetName(), err)
	}
	obj.SetResourceVersion(existing.GetResourceVersion())
	if err := c.Update(ctx, obj); err != nil {
		return fmt.Errorf("update %s %s: %w", obj.GetObjectKind().GroupVersionKind().Kind, obj.GetName(), err)
	}
	return nil
}

func waitEstablished(ctx context.Context, c client.Client, names []string) error {
	deadline := time.Now().Add(time.Minute)
	for _, name := range names {
		for {
			crd := &apiextensionsv1.CustomResourceDefinition{}
			if err := c.Get(ctx, client.ObjectKey{Name: name}, crd); err == nil && established(crd) {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("CRD %s not established after a minute", name)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	return nil
}

func established(crd *apiextensionsv1.CustomResourceDefinition) bool {
	for _, cond := range crd.Status.Conditions {
		if cond.Type == apiextensionsv1.Established && cond.Status == apiextensionsv1.ConditionTrue {
			return true
		}
	}
	return false
}

func ptrTo[T any](v T) *T { return &v }

// lockMachine takes the machine-wide lock of CAPD's fixed ports, waiting up to wait.
func lockMachine(ctx context.Context, wait time.Duration) (func(), error) {
	path := filepath.Join(os.TempDir(), "capi-inplace-capd.lock")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open the CAPD lock %s: %w", path, err)
	}
	deadline := time.Now().Add(wait)
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() { _ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN); _ = f.Close() }, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			_ = f.Close()
			return nil, fmt.Errorf("another set of CAPI controllers holds %s (CAPD's in-memory backend uses fixed ports, so one runs at a time) and did not end within %s", path, wait)
		}
		time.Sleep(time.Second)
	}
}

// process is one controller.
type process struct {
	name       string
	cmd        *exec.Cmd
	done       chan error
	log        *os.File
	logPath    string
	healthPort int
}

func startProcess(name, binary, kubeconfig, logPath string, args []string, healthPort int) (*process, error) {
	log, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(binary, args...) //nolint:gosec // the test's own binaries
	// POD_IP is the address CAPD's in-memory backend serves the workload clusters' API
	// servers on, and writes into each Cluster's control plane endpoint.
	cmd.Env = append(os.Environ(), "KUBECONFIG="+kubeconfig, "POD_IP=127.0.0.1", "POD_NAMESPACE=capi-system")
	cmd.Stdout, cmd.Stderr = log, log
	// The controller ends with the test binary (or the demo) that started it, even when
	// that one is killed or times out before it stops the controller.
	procguard.Guard(cmd)
	if err := cmd.Start(); err != nil {
		_ = log.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &process{name: name, cmd: cmd, done: make(chan error, 1), log: log, logPath: logPath, healthPort: healthPort}
	go func() { p.done <- cmd.Wait() }()
	return p, nil
}

func (p *process) waitReady(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	url := fmt.Sprintf("http://127.0.0.1:%d/readyz", p.healthPort)
	for time.Now().Before(deadline) {
		select {
		case err := <-p.done:
			p.done <- err
			return fmt.Errorf("%s exited before it was ready: %w (log %s)", p.name, err, p.logPath)
		default:
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("%s not ready after %s (log %s)", p.name, timeout, p.logPath)
}

func (p *process) stop() error {
	defer func() { _ = p.log.Close() }()
	select {
	case <-p.done:
		return nil
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return nil
	case <-time.After(20 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
		return fmt.Errorf("%s did not stop within 20s of SIGTERM; killed", p.name)
	}
}

// tail returns the last n lines of the process's log.
func (p *process) tail(n int) string {
	data, err := os.ReadFile(p.logPath)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
