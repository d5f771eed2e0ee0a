// Package testenv starts a real kube-apiserver and etcd (built from their Go modules by
// `make test-binaries` into bin/k8s) through controller-runtime's envtest, with every
// CustomResourceDefinition capi-inplace works with installed: its own, Cluster API's
// (core, kubeadm control plane, kubeadm bootstrap), System Upgrade Controller's Plan,
// Longhorn's v1beta2 kinds, KubeVirt's, Harvester's VM backup kinds, the Rancher kinds
// of the Harvester cluster upgrade, RKE2 helm-controller's HelmChart and HelmChartConfig, and
// Multus's NetworkAttachmentDefinition. Nothing an API server does is mocked.
package testenv

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	longhornv1 "github.com/longhorn/longhorn-manager/k8s/pkg/apis/longhorn/v1beta2"
	sucv1 "github.com/rancher/system-upgrade-controller/pkg/apis/upgrade.cattle.io/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	kubevirtv1 "kubevirt.io/api/core/v1"
	ctrlcache "sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	bootstrapv1 "sigs.k8s.io/cluster-api/api/bootstrap/kubeadm/v1beta2"
	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	runtimev1 "sigs.k8s.io/cluster-api/api/runtime/v1beta2"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	harvesterv1 "github.com/capi-inplace/capi-inplace/harvesteradapter/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/harvesterapi"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/harvesterapi/toolkit"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/longhornlive"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher"
	"github.com/capi-inplace/capi-inplace/test/manifests"
	"github.com/capi-inplace/capi-inplace/test/procguard"
)

// Environment is a running test API server with the project's CRDs installed.
type Environment struct {
	env *envtest.Environment
	// certDir is the API server's certificate directory, owned by the Environment (not by
	// envtest, which would remove it and mint new certificates on every API server stop),
	// so that RestartAPIServer keeps the serving and client CAs every kubeconfig trusts.
	certDir string
	// binDir holds the scripts envtest starts kube-apiserver and etcd through
	// (procguard.WrapperScript), owned by the Environment like certDir.
	binDir string

	// Config reaches the API server as a member of system:masters.
	Config *rest.Config
	// Client is a client of Config with Scheme.
	Client client.Client
	// Scheme knows every kind whose CRD is installed, and the built-in kinds.
	Scheme *runtime.Scheme
	// RepoRoot is the root of the capi-inplace checkout.
	RepoRoot string
}

// NewScheme returns a scheme with the built-in kinds and every kind whose CRD the test
// environment installs.
func NewScheme() (*runtime.Scheme, error) {
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{
		clientgoscheme.AddToScheme,
		apiextensionsv1.AddToScheme,
		clusterv1.AddToScheme,
		controlplanev1.AddToScheme,
		bootstrapv1.AddToScheme,
		runtimev1.AddToScheme,
		inplacev1.AddToScheme,
		sucv1.AddToScheme,
		longhornv1.AddToScheme,
		harvesterv1.AddToScheme,
		longhornlive.AddToScheme,
		kubevirtv1.AddToScheme,
		harvesterapi.AddToScheme,
		toolkit.AddToScheme,
		rancher.AddToScheme,
	} {
		if err := add(scheme); err != nil {
			return nil, err
		}
	}
	return scheme, nil
}

// CertManagerModule is the cert-manager release whose CRDs (shipped in its Go module
// under deploy/crds) a test environment installs when asked to, to check manifests that
// use cert-manager's Issuer and Certificate.
const CertManagerModule = "github.com/cert-manager/cert-manager@v1.19.1"

// Options tune a test environment.
type Options struct {
	// CertManagerCRDs also installs cert-manager's CRDs.
	CertManagerCRDs bool
}

// Start starts etcd and kube-apiserver and installs the CRDs. The binaries come from
// KUBEBUILDER_ASSETS when set, else from bin/k8s of the checkout.
func Start() (*Environment, error) {
	return StartWithOptions(Options{})
}

// StartWithOptions is Start with options.
func StartWithOptions(opts Options) (*Environment, error) {
	root, err := RepoRoot()
	if err != nil {
		return nil, err
	}
	assets := os.Getenv("KUBEBUILDER_ASSETS")
	if assets == "" {
		assets = filepath.Join(root, "bin", "k8s")
	}
	for _, bin := range []string{"kube-apiserver", "etcd"} {
		if _, err := os.Stat(filepath.Join(assets, bin)); err != nil {
			return nil, fmt.Errorf("test control plane binary %s not found in %s: run `make test-binaries` (it builds them from their Go modules)", bin, assets)
		}
	}
	crdDirs, err := CRDDirectories(root)
	if err != nil {
		return nil, err
	}
	if opts.CertManagerCRDs {
		dir, err := downloadedModuleDir(CertManagerModule)
		if err != nil {
			return nil, err
		}
		crdDirs = append(crdDirs, filepath.Join(dir, "deploy", "crds"))
	}
	scheme, err := NewScheme()
	if err != nil {
		return nil, fmt.Errorf("build test scheme: %w", err)
	}

	certDir, err := os.MkdirTemp("", "capi-inplace-apiserver-")
	if err != nil {
		return nil, fmt.Errorf("create the API server's certificate directory: %w", err)
	}
	binDir, err := os.MkdirTemp("", "capi-inplace-controlplane-bin-")
	if err != nil {
		_ = os.RemoveAll(certDir)
		return nil, fmt.Errorf("create the control plane's script directory: %w", err)
	}
	cleanup := func() { _ = os.RemoveAll(certDir); _ = os.RemoveAll(binDir) }
	// kube-apiserver and etcd are started through scripts that give them SIGKILL as their
	// parent-death signal: when the test binary (or the demo) is killed or times out, they
	// end with it instead of running on. envtest starts them in a process group of their
	// own with no such signal, and has no hook on its exec.Cmd, only their paths.
	var paths [2]string
	for i, bin := range []string{"kube-apiserver", "etcd"} {
		if paths[i], err = procguard.WrapperScript(binDir, filepath.Join(assets, bin)); err != nil {
			cleanup()
			return nil, err
		}
	}
	apiServer := &envtest.APIServer{CertDir: certDir, Path: paths[0]}
	// On SIGTERM, end the open watches within this grace period: kube-apiserver's default
	// (0) leaves them open until its HTTP server's shutdown times out, a minute later.
	apiServer.Configure().Set("shutdown-watch-termination-grace-period", "2s")
	env := &envtest.Environment{
		ControlPlane:          envtest.ControlPlane{APIServer: apiServer, Etcd: &envtest.Etcd{Path: paths[1]}},
		BinaryAssetsDirectory: assets,
		CRDInstallOptions: envtest.CRDInstallOptions{
			Paths:              crdDirs,
			ErrorIfPathMissing: true,
			Scheme:             scheme,
		},
		ControlPlaneStartTimeout: time.Minute,
		ControlPlaneStopTimeout:  time.Minute,
	}
	cfg, err := env.Start()
	if err != nil {
		cleanup()
		return nil, fmt.Errorf("start test control plane from %s: %w", assets, err)
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		_ = env.Stop()
		cleanup()
		return nil, fmt.Errorf("create test client: %w", err)
	}
	if err := installPolicies(root, c); err != nil {
		_ = env.Stop()
		cleanup()
		return nil, err
	}
	return &Environment{env: env, certDir: certDir, binDir: binDir, Config: cfg, Client: c, Scheme: scheme, RepoRoot: root}, nil
}

// installPolicies creates the admission policies capi-inplace ships (config/policy), so
// that the API server enforces them in every test as it does on a management cluster.
func installPolicies(root string, c client.Client) error {
	files, err := filepath.Glob(filepath.Join(root, "config", "policy", "*.yaml"))
	if err != nil {
		return err
	}
	for _, f := range files {
		if filepath.Base(f) == "kustomization.yaml" {
			continue
		}
		data, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		objs, err := manifests.Decode(data)
		if err != nil {
			return fmt.Errorf("read %s: %w", f, err)
		}
		for _, o := range objs {
			if err := c.Create(context.Background(), o); err != nil {
				return fmt.Errorf("install %s %s from %s: %w", o.GetKind(), o.GetName(), f, err)
			}
		}
	}
	return nil
}

// Stop stops the API server and etcd.
func (e *Environment) Stop() error {
	e.writeRequestCounts()
	err := e.env.Stop()
	for _, dir := range []string{e.certDir, e.binDir} {
		if dir != "" {
			err = errors.Join(err, os.RemoveAll(dir))
		}
	}
	return err
}

// StopAPIServer stops kube-apiserver as a rolling restart of a control plane does
// (SIGTERM: open watches end, new connections are refused) and leaves etcd running.
// Until StartAPIServer, every client of the Environment fails.
func (e *Environment) StopAPIServer() error {
	if err := e.env.ControlPlane.GetAPIServer().Stop(); err != nil {
		return fmt.Errorf("stop kube-apiserver: %w", err)
	}
	return nil
}

// StartAPIServer starts kube-apiserver again after StopAPIServer, on the same address
// and port, with the same certificates and the same etcd: every object survives, and
// Config, Client and every kubeconfig written before stay valid. It returns once the
// API server answers /healthz.
func (e *Environment) StartAPIServer() error {
	if err := e.env.ControlPlane.GetAPIServer().Start(); err != nil {
		return fmt.Errorf("start kube-apiserver again: %w", err)
	}
	return nil
}

// RestartAPIServer is StopAPIServer, downFor, then StartAPIServer. The outage clients
// see is downFor plus the time kube-apiserver takes to stop and to start again.
func (e *Environment) RestartAPIServer(downFor time.Duration) error {
	if err := e.StopAPIServer(); err != nil {
		return err
	}
	time.Sleep(downFor)
	return e.StartAPIServer()
}

// StartedCache is a started and synced cache of a test API server, for a simulator that
// acts on the events of informers as the controller it stands for does.
type StartedCache struct {
	ctrlcache.Cache
	cancel context.CancelFunc
}

// Stop stops the cache's informers.
func (c *StartedCache) Stop() { c.cancel() }

// StartCache starts a cache of the test API server, for every kind of its scheme, that
// runs until Stop or the end of ctx, and returns once it synced.
func (e *Environment) StartCache(ctx context.Context) (*StartedCache, error) {
	cache, err := ctrlcache.New(e.Config, ctrlcache.Options{Scheme: e.Scheme})
	if err != nil {
		return nil, fmt.Errorf("create a cache of the test API server: %w", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	go func() { _ = cache.Start(cctx) }()
	if !cache.WaitForCacheSync(cctx) {
		cancel()
		return nil, errors.New("the cache of the test API server did not start")
	}
	return &StartedCache{Cache: cache, cancel: cancel}, nil
}

// CRDs returns the CustomResourceDefinitions that were installed.
func (e *Environment) CRDs() []*apiextensionsv1.CustomResourceDefinition {
	return e.env.CRDs
}

// WriteKubeconfig writes a kubeconfig of an administrator of the test API server to
// path, for a process (the manager, kubectl) to use.
func (e *Environment) WriteKubeconfig(path string) error {
	data, err := e.Kubeconfig()
	if err != nil {
		return err
	}
	return os.WriteFile(path, data, 0o600)
}

// Kubeconfig returns a kubeconfig of an administrator of the test API server, for
// example as the value of a Cluster's <cluster>-kubeconfig Secret when the test API
// server plays the workload cluster too.
func (e *Environment) Kubeconfig() ([]byte, error) {
	user, err := e.env.AddUser(envtest.User{Name: "capi-inplace-admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return nil, fmt.Errorf("add test API server user: %w", err)
	}
	data, err := user.KubeConfig()
	if err != nil {
		return nil, fmt.Errorf("render kubeconfig: %w", err)
	}
	return data, nil
}

// CRDDirectories lists the directories of every CRD the test API server installs.
func CRDDirectories(root string) ([]string, error) {
	capiDir, err := moduleDir(root, "sigs.k8s.io/cluster-api")
	if err != nil {
		return nil, err
	}
	return []string{
		filepath.Join(root, "config", "crd", "bases"),
		filepath.Join(root, "test", "crds", "suc"),
		filepath.Join(root, "test", "crds", "longhorn"),
		filepath.Join(root, "test", "crds", "kubevirt"),
		filepath.Join(root, "test", "crds", "harvester"),
		filepath.Join(root, "test", "crds", "rancher"),
		filepath.Join(root, "test", "crds", "helm"),
		filepath.Join(root, "test", "crds", "multus"),
		filepath.Join(capiDir, "core", "config", "crd", "bases"),
		filepath.Join(capiDir, "controlplane", "kubeadm", "config", "crd", "bases"),
		filepath.Join(capiDir, "bootstrap", "kubeadm", "config", "crd", "bases"),
	}, nil
}

// ModuleDir returns the module cache directory of a dependency of the project (a module
// of go.mod at root), downloading it through the module proxy if it is not there yet.
func ModuleDir(root, module string) (string, error) { return moduleDir(root, module) }

func moduleDir(root, module string) (string, error) {
	if _, err := goCommand(root, "mod", "download", module); err != nil {
		return "", fmt.Errorf("download module %s: %w", module, err)
	}
	out, err := goCommand(root, "list", "-mod=readonly", "-m", "-f", "{{.Dir}}", module)
	if err != nil {
		return "", fmt.Errorf("locate module %s: %w", module, err)
	}
	if out == "" {
		return "", fmt.Errorf("module %s has no directory in the module cache after download", module)
	}
	return out, nil
}

// downloadedModuleDir downloads a module at a given version through the module proxy,
// outside of the project's module so that go.mod and go.sum stay as they are, and returns
// its directory in the module cache.
func downloadedModuleDir(moduleAtVersion string) (string, error) {
	out, err := goCommand(os.TempDir(), "mod", "download", "-json", moduleAtVersion)
	if err != nil {
		return "", fmt.Errorf("download module %s: %w", moduleAtVersion, err)
	}
	var info struct{ Dir, Error string }
	if err := json.Unmarshal([]byte(out), &info); err != nil {
		return "", fmt.Errorf("download module %s: read go mod download's answer %q: %w", moduleAtVersion, out, err)
	}
	if info.Dir == "" {
		return "", fmt.Errorf("download module %s: no directory in the module cache: %s", moduleAtVersion, info.Error)
	}
	return info.Dir, nil
}

// goCommand runs the go command in dir and returns its standard output; a failure's
// error carries its standard error.
func goCommand(dir string, args ...string) (string, error) {
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(context.Background(), "go", args...)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("go %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return strings.TrimSpace(stdout.String()), nil
}

// RepoRoot finds the root of the capi-inplace checkout from the working directory.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		data, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && bytes.HasPrefix(data, []byte("module github.com/capi-inplace/capi-inplace\n")) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("not inside the capi-inplace checkout: no go.mod of module github.com/capi-inplace/capi-inplace above the working directory")
		}
		dir = parent
	}
}

// RunManager starts mgr until the returned stop is called; stop ends it and waits until it
// has ended (at most 30 seconds), as a restart of the real manager would, and returns what
// Start returned.
func RunManager(ctx context.Context, mgr interface{ Start(context.Context) error }) (stop func() error) {
	mctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- mgr.Start(mctx) }()
	return func() error {
		cancel()
		select {
		case err := <-done:
			return err
		case <-time.After(30 * time.Second):
			return fmt.Errorf("the manager did not stop within 30s")
		}
	}
}
