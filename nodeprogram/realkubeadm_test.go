//go:build realkubeadm

package nodeprogram_test

// A by-hand check of `node kubeadm upgrade` against the real kubeadm, never part of make
// test or CI: `make check-real-kubeadm` builds kubeadm at the pinned Kubernetes version
// from the Go module proxy (k8s.io/kubernetes/cmd/kubeadm, hack/tools/kubernetes) into
// bin/k8s/kubeadm and runs this test as root with REAL_KUBEADM naming it.
//
// The test API server is made to look like a kubeadm cluster one minor below the target:
// the ConfigMaps kubeadm's upgrade reads (kubeadm-config, kubelet-config, kube-proxy,
// coredns), the CoreDNS Deployment, Nodes with kubeadm's labels, annotation and kubelet
// version, and the control plane's mirror pods. Each node is a fake host root (a
// temporary directory with kubeadm in /usr/bin, /etc/kubernetes with admin.conf,
// kubelet.conf and the static pod manifests), and kubeadm runs chrooted into it by the
// node program's own ChrootHost, as on a real node: nothing it reads or writes is this
// machine's /etc.
//
// kubeadm decides the cluster's version from the API server's /version (phases/upgrade/
// versiongetter.go, KubeVersionGetter.ClusterVersion), and the test API server is the
// pinned release. A proxy in front of it answers /version with the version the cluster
// is meant to run and passes every other request through, so that kubeadm sees a
// cluster at the old version.
//
// What runs, each with kubeadm's own words in the log (-v):
//   - `kubeadm upgrade plan <target>` on the first control plane node (never a dry run:
//     its health check's Job is created on the API server, and completed by the test);
//   - `kubeadm upgrade node --dry-run` before apply, to show why apply comes first;
//   - the node program's `node kubeadm upgrade` itself (nodeprogram.Main, the product's
//     command lines, nodeprogram.KubeadmUpgradeArgs) on the first control plane node
//     (`kubeadm upgrade apply <target> --yes`), another control plane node and a worker
//     (`kubeadm upgrade node`), each with and without a --kubeconfig of its own where it
//     passes one; its kubeadm gets --dry-run after its own arguments. Without the
//     host-only checks ignored, kubeadm fails those checks and nothing else;
//   - `kubeadm upgrade apply`'s preflight phase for real (a dry run is never interactive):
//     --yes keeps kubeadm from asking;
//   - kubeadm's version rules next to the node program's and the updater's Preflight's
//     refusals.
//
// What cannot run here (no real host): the preflight checks of hostOnlyChecks and the
// image pull (no container runtime, no kubelet binary); the real control plane phase of
// apply and node (phases/upgrade/staticpods.go, StaticPodControlPlane: it writes the
// static pod manifests, waits for the kubelet to restart the pods and reads etcd through
// the certificates in /etc/kubernetes/pki: no kubelet runs and no etcd listens at the
// node's address); the real kubelet-config, kubeconfig, addon and post-upgrade phases
// are run only as dry runs.

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"io/fs"
	"math/big"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/version"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/nodeprogram"
	"github.com/capi-inplace/capi-inplace/nodeupdater"
	"github.com/capi-inplace/capi-inplace/nodeupdater/kubeadmupdater"
	"github.com/capi-inplace/capi-inplace/test/testenv"
)

const (
	// realTarget is the version of the kubeadm under test (make check-real-kubeadm builds
	// KUBE_VERSION): the version every node is upgraded to.
	realTarget = "v1.36.3"
	// realOld is the cluster's version before the upgrade, one minor below.
	realOld = "v1.35.2"
	// realOldCoreDNS is a CoreDNS older than the one kubeadm v1.36 deploys (v1.14.2) that
	// kubeadm's CoreDNS migration knows, so that its migration check has work to judge.
	realOldCoreDNS = "v1.13.1"
)

// hostOnlyChecks are the preflight checks of `kubeadm upgrade apply` and `kubeadm upgrade
// node` that need a real host, named to kubeadm in --ignore-preflight-errors for the dry
// runs (and only those: the test first runs without them and asserts that these, and
// nothing else, fail). cmd/kubeadm/app/preflight/checks.go, RunUpgradeChecks:
// SystemVerification runs the host's `kubelet --version` (it fails here with "couldn't
// get kubelet version": no kubelet is installed in the fake root) and reads the kernel's
// version and configuration and the cgroups (system-validators);
// ContainerRuntimeVersion asks the container runtime over its CRI socket
// (unix:///var/run/containerd/containerd.sock), and no container runtime runs here.
var hostOnlyChecks = []string{"SystemVerification", "ContainerRuntimeVersion"}

// imagePullCheck is the preflight check that pulls the control plane's images through the
// container runtime (preflight.RunPullImagesCheck), which a dry run skips.
const imagePullCheck = "ImagePull"

// otherKubeconfig is a control plane node's kubeconfig other than kubeadm's default
// (kubeadm init writes super-admin.conf too), which the node program passes on to kubeadm.
const otherKubeconfig = "/etc/kubernetes/super-admin.conf"

// The nodes of the test cluster: two control plane nodes and a worker.
var (
	realControlPlanes = []string{"cp-1", "cp-2"}
	realWorker        = "w-1"
)

func TestRealKubeadm(t *testing.T) {
	kubeadmBin := os.Getenv("REAL_KUBEADM")
	if kubeadmBin == "" {
		t.Fatal("REAL_KUBEADM must name a kubeadm binary (make check-real-kubeadm builds one)")
	}
	if os.Geteuid() != 0 {
		t.Fatal("run as root: kubeadm's preflight refuses anyone else (IsPrivilegedUser), and the fake node roots are entered with chroot(2)")
	}
	ctx := context.Background()
	env := testenv.ForTest(t)
	api := startVersionProxy(t, env.Config, realOld)
	seedKubeadmCluster(ctx, t, env.Client, realOld)
	completeHealthCheckJobs(ctx, t, env.Client)

	hosts := map[string]string{}
	for _, n := range append(slices.Clone(realControlPlanes), realWorker) {
		hosts[n] = fakeNodeRoot(t, kubeadmBin, api.URL, n, n != realWorker)
	}

	got := runKubeadm(ctx, t, hosts["cp-1"], "version", "-o", "short")
	if strings.TrimSpace(got.stdout) != realTarget {
		t.Fatalf("REAL_KUBEADM reports version %q, want %s (build it with make check-real-kubeadm)", got.stdout, realTarget)
	}

	t.Run("upgrade plan on the first control plane node", func(t *testing.T) {
		res := runKubeadm(ctx, t, hosts["cp-1"], "upgrade", "plan", realTarget)
		if res.err != nil {
			t.Fatalf("kubeadm upgrade plan %s: %v\n%s", realTarget, res.err, res.stdout)
		}
		t.Logf("kubeadm upgrade plan %s said:\n%s", realTarget, res.stdout)
		for _, want := range []string{
			"[upgrade/versions] Cluster version: " + strings.TrimPrefix(realOld, "v"),
			"[upgrade/versions] kubeadm version: " + realTarget,
			"[upgrade/versions] Target version: " + realTarget,
			"kubeadm upgrade apply " + realTarget,
		} {
			if !strings.Contains(res.stdout, want) {
				t.Errorf("kubeadm upgrade plan did not say %q", want)
			}
		}
	})

	// Why apply comes first: `kubeadm upgrade node` takes no version, it upgrades a node to
	// the ClusterConfiguration's kubernetesVersion, which only `kubeadm upgrade apply`
	// raises. Run before apply, it would not bring the node to the target.
	t.Run("order: kubeadm upgrade node before apply stays at the cluster's version", func(t *testing.T) {
		args := append(nodeprogram.KubeadmUpgradeArgs(false, realTarget, ""), "--dry-run", "--ignore-preflight-errors="+strings.Join(hostOnlyChecks, ","))
		res := runKubeadm(ctx, t, hosts["cp-2"], args...)
		if res.err != nil {
			t.Fatalf("kubeadm %s: %v\n%s", strings.Join(args, " "), res.err, res.stdout)
		}
		want := `[dryrun] Would upgrade your static Pod-hosted control plane to version "` + realOld + `"`
		if !strings.Contains(res.stdout, want) {
			t.Fatalf("kubeadm upgrade node before apply did not say %q\n%s", want, progressLines(res.stdout))
		}
		t.Logf("before apply, kubeadm %s said: %s", strings.Join(args, " "), grepLines(res.stdout, "Would upgrade your static Pod-hosted"))
	})

	t.Run("node kubeadm upgrade on the first control plane node: kubeadm upgrade apply", func(t *testing.T) {
		before := snapshot(ctx, t, env.Client, hosts["cp-1"])

		// Our flags alone: kubeadm refuses only for the checks that need a real host.
		res := runNodeUpgrade(ctx, t, hosts["cp-1"], nil, "--version", realTarget, "--role", "control-plane")
		wantKubeadmRan(t, res, nodeprogram.KubeadmUpgradeArgs(true, realTarget, ""))
		if res.code != nodeprogram.ExitFailed {
			t.Fatalf("without a container runtime kubeadm should fail its host preflight checks; exit %d\n%s", res.code, res.output)
		}
		wantOnlyHostChecksFailed(t, res.output)

		res = runNodeUpgrade(ctx, t, hosts["cp-1"], hostOnlyChecks, "--version", realTarget, "--role", "control-plane")
		wantKubeadmRan(t, res, nodeprogram.KubeadmUpgradeArgs(true, realTarget, ""))
		if res.code != nodeprogram.ExitOK {
			t.Fatalf("node kubeadm upgrade (kubeadm upgrade apply --dry-run): exit %d\n%s", res.code, res.output)
		}
		t.Logf("kubeadm upgrade apply %s --yes --dry-run said (its progress lines):\n%s", realTarget, progressLines(res.output))
		for _, want := range []string{
			"[upgrade/preflight] You have chosen to upgrade the cluster version to \"" + realTarget + "\"",
			"[upgrade/versions] Cluster version: " + realOld,
			"[dryrun] Would upgrade your static Pod-hosted control plane to version \"" + realTarget + "\"",
			"[upgrade/successful] Finished dryrunning successfully!",
		} {
			if !strings.Contains(res.output, want) {
				t.Errorf("kubeadm upgrade apply --dry-run did not say %q", want)
			}
		}

		res = runNodeUpgrade(ctx, t, hosts["cp-1"], hostOnlyChecks, "--version", realTarget, "--role", "control-plane", "--kubeconfig", otherKubeconfig)
		wantKubeadmRan(t, res, nodeprogram.KubeadmUpgradeArgs(true, realTarget, otherKubeconfig))
		if res.code != nodeprogram.ExitOK || !strings.Contains(res.output, `[dryrun] Creating a real client from "`+otherKubeconfig+`"`) {
			t.Fatalf("node kubeadm upgrade --kubeconfig %s (kubeadm upgrade apply --dry-run): exit %d\n%s", otherKubeconfig, res.code, res.output)
		}
		wantUnchanged(ctx, t, env.Client, hosts["cp-1"], before)
	})

	// A dry run is never interactive (applyData.SessionIsInteractive), so it cannot show
	// that --yes keeps kubeadm from asking. The preflight phase alone runs for real here:
	// it asks before it pulls the images, and it changes nothing on the node.
	t.Run("kubeadm upgrade apply's preflight phase for real: --yes keeps it from asking", func(t *testing.T) {
		before := snapshot(ctx, t, env.Client, hosts["cp-1"])
		args := nodeprogram.KubeadmUpgradeArgs(true, realTarget, "")
		// `upgrade apply <version> --yes` -> `upgrade apply phase preflight <version> --yes`
		phase := append([]string{"upgrade", "apply", "phase", "preflight"}, args[2:]...)
		ignore := "--ignore-preflight-errors=" + strings.Join(append(slices.Clone(hostOnlyChecks), imagePullCheck), ",")

		res := runKubeadm(ctx, t, hosts["cp-1"], append(phase, ignore)...)
		if res.err != nil {
			t.Fatalf("kubeadm %s: %v\n%s", strings.Join(phase, " "), res.err, res.stdout)
		}
		t.Logf("kubeadm %s %s said:\n%s", strings.Join(phase, " "), ignore, progressLines(res.stdout))
		if !strings.Contains(res.stdout, "[upgrade/preflight] Pulling images required for setting up a Kubernetes cluster") {
			t.Errorf("kubeadm's preflight phase did not reach the image pull")
		}

		without := slices.DeleteFunc(slices.Clone(phase), func(a string) bool { return a == "--yes" })
		res = runKubeadm(ctx, t, hosts["cp-1"], append(without, ignore)...)
		if res.err == nil || !strings.Contains(res.err.Error(), "won't proceed; the user didn't answer (Y|y) in order to continue") ||
			!strings.Contains(res.stdout, "Are you sure you want to proceed? [y/N]") {
			t.Fatalf("without --yes kubeadm should ask and, with no answer, not proceed: %v\n%s", res.err, res.stdout)
		}
		t.Logf("without --yes kubeadm said:\n%s", grepLines(res.stdout+"\n"+res.err.Error(), "proceed"))
		wantUnchanged(ctx, t, env.Client, hosts["cp-1"], before)
	})

	// What `kubeadm upgrade apply` leaves behind for the other nodes: the ClusterConfiguration
	// at the target (its upload-config phase) and the API server at the target.
	setClusterConfigurationVersion(ctx, t, env.Client, realTarget)
	api.setVersion(realTarget)

	t.Run("node kubeadm upgrade on another control plane node: kubeadm upgrade node", func(t *testing.T) {
		before := snapshot(ctx, t, env.Client, hosts["cp-2"])
		res := runNodeUpgrade(ctx, t, hosts["cp-2"], hostOnlyChecks, "--version", realTarget, "--role", "control-plane")
		wantKubeadmRan(t, res, nodeprogram.KubeadmUpgradeArgs(false, realTarget, ""))
		if res.code != nodeprogram.ExitOK {
			t.Fatalf("node kubeadm upgrade (kubeadm upgrade node --dry-run): exit %d\n%s", res.code, res.output)
		}
		t.Logf("kubeadm upgrade node --dry-run on a control plane node said (its progress lines):\n%s", progressLines(res.output))
		for _, want := range []string{
			`[upgrade/control-plane] Upgrading your Static Pod-hosted control plane instance to version "` + realTarget + `"`,
			`[dryrun] Would upgrade your static Pod-hosted control plane to version "` + realTarget + `"`,
			"[upgrade/successful] Finished dryrunning successfully!",
		} {
			if !strings.Contains(res.output, want) {
				t.Errorf("kubeadm upgrade node --dry-run on a control plane node did not say %q", want)
			}
		}

		res = runNodeUpgrade(ctx, t, hosts["cp-2"], hostOnlyChecks, "--version", realTarget, "--role", "control-plane", "--kubeconfig", otherKubeconfig)
		wantKubeadmRan(t, res, nodeprogram.KubeadmUpgradeArgs(false, realTarget, otherKubeconfig))
		if res.code != nodeprogram.ExitOK || !strings.Contains(res.output, `[dryrun] Creating a real client from "`+otherKubeconfig+`"`) {
			t.Fatalf("node kubeadm upgrade --kubeconfig %s (kubeadm upgrade node --dry-run): exit %d\n%s", otherKubeconfig, res.code, res.output)
		}
		wantUnchanged(ctx, t, env.Client, hosts["cp-2"], before)
	})

	t.Run("node kubeadm upgrade on a worker: kubeadm upgrade node", func(t *testing.T) {
		before := snapshot(ctx, t, env.Client, hosts[realWorker])
		res := runNodeUpgrade(ctx, t, hosts[realWorker], nil, "--version", realTarget, "--role", "worker")
		wantKubeadmRan(t, res, nodeprogram.KubeadmUpgradeArgs(false, realTarget, ""))
		if res.code != nodeprogram.ExitFailed {
			t.Fatalf("without a container runtime kubeadm should fail its host preflight checks; exit %d\n%s", res.code, res.output)
		}
		wantOnlyHostChecksFailed(t, res.output)

		res = runNodeUpgrade(ctx, t, hosts[realWorker], hostOnlyChecks, "--version", realTarget, "--role", "worker")
		wantKubeadmRan(t, res, nodeprogram.KubeadmUpgradeArgs(false, realTarget, ""))
		if res.code != nodeprogram.ExitOK {
			t.Fatalf("node kubeadm upgrade (kubeadm upgrade node --dry-run): exit %d\n%s", res.code, res.output)
		}
		t.Logf("kubeadm upgrade node --dry-run on a worker said (its progress lines):\n%s", progressLines(res.output))
		for _, want := range []string{
			"[upgrade/preflight] Skipping prepull. Not a control plane node.",
			"[upgrade/successful] Finished dryrunning successfully!",
		} {
			if !strings.Contains(res.output, want) {
				t.Errorf("kubeadm upgrade node --dry-run on a worker did not say %q", want)
			}
		}
		wantUnchanged(ctx, t, env.Client, hosts[realWorker], before)
	})

	// kubeadm's version rules (phases/upgrade/policy.go, EnforceVersionPolicies), judged
	// against the API server's version, next to the node program's refusal (judged against
	// the ClusterConfiguration) and the updater's Preflight (judged against the node's
	// kubelet): the cluster is put at the version in question on all three.
	preflight := &kubeadmupdater.Updater{Client: env.Client, Clusters: fixedCluster{env.Client}}
	for _, tc := range []struct {
		name    string
		cluster string
		// kubeadm's words when it refuses, and whether the node program and the Preflight
		// refuse with the same words (they do for kubeadm's own rule; a downgrade is refused
		// by capi-inplace with its own).
		kubeadmSays string
		sameWords   bool
	}{
		// kubeadm reads the ClusterConfiguration before it judges the versions, and refuses
		// a cluster below its own minor minus one there (util/config/common.go,
		// NormalizeKubernetesVersion, constants.MinimumControlPlaneVersion): the refusal
		// of EnforceVersionPolicies ("Specified version to upgrade to ... is too high") is
		// never reached when kubeadm is at the target.
		{name: "two minors up", cluster: "v1.34.5", sameWords: true,
			kubeadmSays: `this version of kubeadm only supports deploying clusters with the control plane version >= 1.35.0. Current version: v1.34.5`},
		{name: "two minors down", cluster: "v1.38.0",
			kubeadmSays: `Specified version to downgrade to "` + realTarget + `" is too low; kubeadm can downgrade only 1 minor version at a time`},
		// kubeadm allows a downgrade of one minor (MaximumAllowedMinorVersionDowngradeSkew);
		// capi-inplace never downgrades in place (DESIGN.md).
		{name: "one minor down", cluster: "v1.37.0"},
	} {
		t.Run("version rule: "+tc.name, func(t *testing.T) {
			setClusterVersion(ctx, t, env.Client, api, "cp-1", tc.cluster)
			t.Cleanup(func() { setClusterVersion(ctx, t, env.Client, api, "cp-1", realTarget) })

			args := append(nodeprogram.KubeadmUpgradeArgs(true, realTarget, ""), "--dry-run", "--ignore-preflight-errors="+strings.Join(hostOnlyChecks, ","))
			res := runKubeadm(ctx, t, hosts["cp-1"], args...)
			kubeadmWords := res.stdout
			if res.err != nil {
				kubeadmWords += res.err.Error()
			}
			t.Logf("cluster at %s: kubeadm %s said:\n%s", tc.cluster, strings.Join(args, " "),
				grepLines(kubeadmWords, "[upgrade/versions]", "Specified version", "fatal errors", "misalignments", "Finished dryrunning", "error:"))
			if tc.kubeadmSays == "" {
				if res.err != nil {
					t.Fatalf("kubeadm refused the upgrade from %s to %s: %v", tc.cluster, realTarget, res.err)
				}
			} else if res.err == nil || !strings.Contains(kubeadmWords, tc.kubeadmSays) {
				t.Fatalf("kubeadm did not refuse with %q (err %v)\n%s", tc.kubeadmSays, res.err, kubeadmWords)
			}

			node := runNodeUpgrade(ctx, t, hosts["cp-1"], hostOnlyChecks, "--version", realTarget, "--role", "control-plane")
			if node.code != nodeprogram.ExitFailed || len(node.ran) != 0 {
				t.Fatalf("the node program should refuse %s -> %s before running anything on the host: exit %d, ran %v\n%s", tc.cluster, realTarget, node.code, node.ran, node.output)
			}
			t.Logf("the node program said: %s", strings.TrimSpace(node.output))

			// The version rules are KubeadmVersionSkew's; the other check judges a
			// KubeadmControlPlane, which this cluster has none of.
			checks := slices.DeleteFunc(preflight.Preflight(ctx, nodeupdater.PreflightTarget{
				Namespace: "default", ClusterName: "kubeadm", NodeName: "cp-1", Version: realTarget, ControlPlane: true,
				UpdaterRef: inplacev1.UpdaterReference{Kind: "KubeadmUpdater", Name: "kubeadm"},
			}), func(c nodeupdater.CheckResult) bool { return c.Name != kubeadmupdater.KubeadmVersionSkewCheck })
			if len(checks) != 1 || checks[0].Passed {
				t.Fatalf("the updater's Preflight should hold %s -> %s: %+v", tc.cluster, realTarget, checks)
			}
			t.Logf("the updater's Preflight said: %s", checks[0].Message)
			if tc.sameWords {
				for who, said := range map[string]string{"the node program": node.output, "the updater's Preflight": checks[0].Message} {
					if !strings.Contains(said, tc.kubeadmSays) {
						t.Errorf("%s did not refuse with kubeadm's words %q: %s", who, tc.kubeadmSays, said)
					}
				}
			}
		})
	}
}

// fixedCluster gives the test API server as every workload cluster.
type fixedCluster struct{ c client.Client }

func (f fixedCluster) Client(context.Context, types.NamespacedName) (client.Client, error) {
	return f.c, nil
}

// setClusterVersion puts the cluster at v as kubeadm, the node program and the updater's
// Preflight read it: the API server's /version, the ClusterConfiguration and the node's
// kubelet.
func setClusterVersion(ctx context.Context, t *testing.T, c client.Client, api *versionProxy, node, v string) {
	t.Helper()
	api.setVersion(v)
	setClusterConfigurationVersion(ctx, t, c, v)
	n := &corev1.Node{}
	if err := c.Get(ctx, types.NamespacedName{Name: node}, n); err != nil {
		t.Fatal(err)
	}
	n.Status.NodeInfo.KubeletVersion = v
	if err := c.Status().Update(ctx, n); err != nil {
		t.Fatal(err)
	}
}

// --- the fake cluster ---

// versionProxy stands in front of the test API server and answers /version with the
// version the cluster is meant to run.
type versionProxy struct {
	URL string
	mu  sync.Mutex
	ver string
}

func (p *versionProxy) setVersion(v string) { p.mu.Lock(); p.ver = v; p.mu.Unlock() }

func startVersionProxy(t *testing.T, cfg *rest.Config, v string) *versionProxy {
	t.Helper()
	upstream, err := url.Parse(cfg.Host)
	if err != nil {
		t.Fatal(err)
	}
	transport, err := rest.TransportFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	p := &versionProxy{ver: v}
	reverse := httputil.NewSingleHostReverseProxy(upstream)
	reverse.Transport = transport
	reverse.FlushInterval = -1
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/version" {
			reverse.ServeHTTP(w, r)
			return
		}
		p.mu.Lock()
		gitVersion := p.ver
		p.mu.Unlock()
		var major, minor, patch int
		_, _ = fmt.Sscanf(gitVersion, "v%d.%d.%d", &major, &minor, &patch)
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(version.Info{
			Major: fmt.Sprint(major), Minor: fmt.Sprint(minor), GitVersion: gitVersion,
			GitTreeState: "clean", GoVersion: "go1.26.8", Compiler: "gc", Platform: "linux/amd64",
		})
	}))
	t.Cleanup(srv.Close)
	p.URL = srv.URL
	return p
}

// clusterConfiguration is a kubeadm v1beta4 ClusterConfiguration as `kubeadm init`
// uploads it (kube-system/kubeadm-config, key ClusterConfiguration).
func clusterConfiguration(v string) string {
	return `apiVersion: kubeadm.k8s.io/v1beta4
kind: ClusterConfiguration
kubernetesVersion: ` + v + `
clusterName: kubernetes
controlPlaneEndpoint: 10.0.0.10:6443
certificatesDir: /etc/kubernetes/pki
imageRepository: registry.k8s.io
networking:
  dnsDomain: cluster.local
  serviceSubnet: 10.96.0.0/12
  podSubnet: 10.244.0.0/16
etcd:
  local:
    dataDir: /var/lib/etcd
apiServer: {}
controllerManager: {}
scheduler: {}
dns: {}
proxy: {}
`
}

const kubeletConfiguration = `apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: /etc/kubernetes/pki/ca.crt
authorization:
  mode: Webhook
cgroupDriver: systemd
clusterDNS:
- 10.96.0.10
clusterDomain: cluster.local
containerRuntimeEndpoint: unix:///var/run/containerd/containerd.sock
rotateCertificates: true
staticPodPath: /etc/kubernetes/manifests
`

const kubeProxyConfiguration = `apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
bindAddress: 0.0.0.0
clientConnection:
  kubeconfig: /var/lib/kube-proxy/kubeconfig.conf
clusterCIDR: 10.244.0.0/16
mode: iptables
`

const corefile = `.:53 {
    errors
    health {
       lameduck 5s
    }
    ready
    kubernetes cluster.local in-addr.arpa ip6.arpa {
       pods insecure
       fallthrough in-addr.arpa ip6.arpa
       ttl 30
    }
    prometheus :9153
    forward . /etc/resolv.conf {
       max_concurrent 1000
    }
    cache 30
    loop
    reload
    loadbalance
}
`

// seedKubeadmCluster creates what kubeadm's upgrade reads from a cluster that `kubeadm
// init` and `kubeadm join` made at version v: cmd/kubeadm/app/util/config/cluster.go
// (the kubeadm-config ConfigMap, the Node's CRI socket annotation, the kube-apiserver
// mirror pod's advertise address annotation), componentconfigs (kubelet-config,
// kube-proxy), phases/addons/dns (coredns ConfigMap and Deployment),
// phases/upgrade/health.go (control plane Nodes Ready) and versiongetter.go (the kubelet
// versions of the Nodes, the mirror pods' images).
func seedKubeadmCluster(ctx context.Context, t *testing.T, c client.Client, v string) {
	t.Helper()
	ns := metav1.NamespaceSystem
	objects := []client.Object{
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "kubeadm-config"},
			Data: map[string]string{"ClusterConfiguration": clusterConfiguration(v)}},
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "kubelet-config"},
			Data: map[string]string{"kubelet": kubeletConfiguration}},
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "kube-proxy", Labels: map[string]string{"app": "kube-proxy"}},
			Data: map[string]string{"config.conf": kubeProxyConfiguration}},
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "coredns"},
			Data: map[string]string{"Corefile": corefile}},
		coreDNSDeployment(),
	}
	for _, o := range objects {
		if err := c.Create(ctx, o); err != nil {
			t.Fatalf("create %T %s: %v", o, o.GetName(), err)
		}
	}
	for i, name := range append(slices.Clone(realControlPlanes), realWorker) {
		cp := name != realWorker
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{
			Name:        name,
			Labels:      map[string]string{"kubernetes.io/hostname": name, "kubernetes.io/os": "linux"},
			Annotations: map[string]string{"kubeadm.alpha.kubernetes.io/cri-socket": "unix:///var/run/containerd/containerd.sock"},
		}}
		if cp {
			node.Labels["node-role.kubernetes.io/control-plane"] = ""
			node.Labels["node.kubernetes.io/exclude-from-external-load-balancers"] = ""
			node.Spec.Taints = []corev1.Taint{{Key: "node-role.kubernetes.io/control-plane", Effect: corev1.TaintEffectNoSchedule}}
		}
		if err := c.Create(ctx, node); err != nil {
			t.Fatalf("create node %s: %v", name, err)
		}
		node.Status = corev1.NodeStatus{
			Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
				LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}},
			Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: fmt.Sprintf("10.0.0.%d", 11+i)}, {Type: corev1.NodeHostName, Address: name}},
			NodeInfo:  corev1.NodeSystemInfo{KubeletVersion: v, OperatingSystem: "linux", Architecture: "amd64", ContainerRuntimeVersion: "containerd://2.1.4"},
		}
		if err := c.Status().Update(ctx, node); err != nil {
			t.Fatalf("node %s status: %v", name, err)
		}
		if !cp {
			continue
		}
		for _, p := range controlPlanePods(name, fmt.Sprintf("10.0.0.%d", 11+i), v) {
			if err := c.Create(ctx, p); err != nil {
				t.Fatalf("create pod %s: %v", p.Name, err)
			}
		}
	}
}

func coreDNSDeployment() *appsv1.Deployment {
	labels := map[string]string{"k8s-app": "kube-dns"}
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: metav1.NamespaceSystem, Name: "coredns", Labels: labels},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](2),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					Containers: []corev1.Container{{Name: "coredns", Image: "registry.k8s.io/coredns/coredns:" + realOldCoreDNS,
						Args: []string{"-conf", "/etc/coredns/Corefile"}}},
				},
			},
		},
	}
}

// controlPlanePods are a control plane node's static pods as kubeadm writes them (the
// labels and annotations of cmd/kubeadm/app/util/staticpod and phases/controlplane),
// named as the kubelet names their mirror pods.
func controlPlanePods(node, ip, v string) []*corev1.Pod {
	pod := func(component, image string, annotations map[string]string) *corev1.Pod {
		a := map[string]string{"kubernetes.io/config.source": "file", "kubernetes.io/config.mirror": "0123456789abcdef" + component}
		for k, val := range annotations {
			a[k] = val
		}
		return &corev1.Pod{
			TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
			ObjectMeta: metav1.ObjectMeta{Namespace: metav1.NamespaceSystem, Name: component + "-" + node,
				Labels: map[string]string{"component": component, "tier": "control-plane"}, Annotations: a},
			Spec: corev1.PodSpec{
				NodeName:          node,
				HostNetwork:       true,
				PriorityClassName: "system-node-critical",
				Containers:        []corev1.Container{{Name: component, Image: image, Command: []string{component}}},
			},
		}
	}
	return []*corev1.Pod{
		pod("etcd", "registry.k8s.io/etcd:3.6.5-0", map[string]string{"kubeadm.kubernetes.io/etcd.advertise-client-urls": "https://" + ip + ":2379"}),
		pod("kube-apiserver", "registry.k8s.io/kube-apiserver:"+v, map[string]string{"kubeadm.kubernetes.io/kube-apiserver.advertise-address.endpoint": ip + ":6443"}),
		pod("kube-controller-manager", "registry.k8s.io/kube-controller-manager:"+v, nil),
		pod("kube-scheduler", "registry.k8s.io/kube-scheduler:"+v, nil),
	}
}

func setClusterConfigurationVersion(ctx context.Context, t *testing.T, c client.Client, v string) {
	t.Helper()
	cm := &corev1.ConfigMap{}
	if err := c.Get(ctx, types.NamespacedName{Namespace: metav1.NamespaceSystem, Name: "kubeadm-config"}, cm); err != nil {
		t.Fatal(err)
	}
	cm.Data["ClusterConfiguration"] = clusterConfiguration(v)
	if err := c.Update(ctx, cm); err != nil {
		t.Fatal(err)
	}
}

// completeHealthCheckJobs plays the Job controller for kubeadm's "CreateJob" health check
// (phases/upgrade/health.go): `kubeadm upgrade plan` is never a dry run, creates a Job
// upgrade-health-check-<ms> in kube-system on the real API server and waits for it to
// complete; this API server runs no Job controller and no kubelet.
func completeHealthCheckJobs(ctx context.Context, t *testing.T, c client.Client) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			jobs := &batchv1.JobList{}
			if err := c.List(ctx, jobs, client.InNamespace(metav1.NamespaceSystem)); err == nil {
				for i := range jobs.Items {
					j := &jobs.Items[i]
					if !strings.HasPrefix(j.Name, "upgrade-health-check-") || j.Status.CompletionTime != nil {
						continue
					}
					now := metav1.Now()
					j.Status.StartTime = &now
					j.Status.CompletionTime = &now
					j.Status.Succeeded = 1
					j.Status.Conditions = []batchv1.JobCondition{
						{Type: batchv1.JobSuccessCriteriaMet, Status: corev1.ConditionTrue, LastProbeTime: now, LastTransitionTime: now},
						{Type: batchv1.JobComplete, Status: corev1.ConditionTrue, LastProbeTime: now, LastTransitionTime: now},
					}
					if err := c.Status().Update(ctx, j); err != nil {
						t.Logf("complete health check Job %s: %v", j.Name, err)
					}
				}
			}
			select {
			case <-ctx.Done():
			case <-time.After(200 * time.Millisecond):
			}
		}
	}()
}

// --- the fake node ---

// fakeNodeRoot is a node's root as kubeadm sees it: kubeadm in /usr/bin (where `node
// kubeadm fetch` installs it), /tmp for its dry-run directories, and /etc/kubernetes as
// `kubeadm init` or `join` left it: admin.conf on a control plane node, kubelet.conf
// (whose client certificate names the node, kubeadm's GetNodeName) and the static pod
// manifests of a control plane node (staticpodutil.IsControlPlaneNode looks for
// kube-apiserver.yaml). The kubeconfigs point at the version proxy.
func fakeNodeRoot(t *testing.T, kubeadmBin, server, node string, controlPlane bool) string {
	t.Helper()
	root := t.TempDir()
	for _, d := range []string{"usr/bin", "tmp", "etc/kubernetes/manifests", "etc/kubernetes/pki", "var/lib/kubelet"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(filepath.Join(root, "tmp"), 0o1777); err != nil {
		t.Fatal(err)
	}
	installBinary(t, kubeadmBin, filepath.Join(root, "usr/bin/kubeadm"))
	writeFile(t, filepath.Join(root, "var/lib/kubelet/config.yaml"), kubeletConfiguration)
	writeKubeconfig(t, filepath.Join(root, "etc/kubernetes/kubelet.conf"), server, "system:node:"+node, true)
	if !controlPlane {
		return root
	}
	writeKubeconfig(t, filepath.Join(root, "etc/kubernetes/admin.conf"), server, "kubernetes-admin", false)
	writeKubeconfig(t, filepath.Join(root, otherKubeconfig), server, "kubernetes-super-admin", false)
	for _, p := range controlPlanePods(node, "10.0.0.11", realOld) {
		p.Annotations = nil
		data, err := yaml.Marshal(p)
		if err != nil {
			t.Fatal(err)
		}
		writeFile(t, filepath.Join(root, "etc/kubernetes/manifests", p.Labels["component"]+".yaml"), string(data))
	}
	return root
}

// installBinary puts the kubeadm under test into a fake root: a hard link when it can
// (the binary is 130 MB), a copy otherwise.
func installBinary(t *testing.T, src, dst string) {
	t.Helper()
	if err := os.Link(src, dst); err == nil {
		return
	}
	in, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close() //nolint:errcheck // read only
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

// writeKubeconfig writes a kubeconfig for the version proxy (plain HTTP: the proxy holds
// the test API server's credentials). withCert gives it a client certificate whose
// common name is user, which is where kubeadm reads a node's name from kubelet.conf.
func writeKubeconfig(t *testing.T, path, server, user string, withCert bool) {
	t.Helper()
	auth := &clientcmdapi.AuthInfo{}
	if withCert {
		auth.ClientCertificateData, auth.ClientKeyData = selfSignedClientCert(t, user)
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["kubernetes"] = &clientcmdapi.Cluster{Server: server}
	cfg.AuthInfos[user] = auth
	cfg.Contexts["default"] = &clientcmdapi.Context{Cluster: "kubernetes", AuthInfo: user}
	cfg.CurrentContext = "default"
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
}

func selfSignedClientCert(t *testing.T, cn string) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: cn, Organization: []string{"system:nodes"}},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
}

// --- running kubeadm and the node program ---

type kubeadmResult struct {
	stdout string
	err    error
}

// runKubeadm runs the real kubeadm in a fake node root, the way the node program runs
// host commands (ChrootHost).
func runKubeadm(ctx context.Context, t *testing.T, root string, args ...string) kubeadmResult {
	t.Helper()
	out, err := nodeprogram.NewChrootHost(root).Run(ctx, nodeprogram.Command{Name: "/usr/bin/kubeadm", Args: args})
	return kubeadmResult{stdout: string(out), err: err}
}

// dryRunHost is the node program's ChrootHost, except that each `kubeadm upgrade` it runs
// gets --dry-run (and the host-only checks to ignore) after the node program's own
// arguments, and that it keeps what the commands printed.
type dryRunHost struct {
	*nodeprogram.ChrootHost
	ignore []string
	ran    []nodeprogram.Command
	output strings.Builder
}

func (h *dryRunHost) Run(ctx context.Context, c nodeprogram.Command) ([]byte, error) {
	h.ran = append(h.ran, c)
	if len(c.Args) > 0 && c.Args[0] == "upgrade" {
		c.Args = append(slices.Clone(c.Args), "--dry-run")
		if len(h.ignore) > 0 {
			c.Args = append(c.Args, "--ignore-preflight-errors="+strings.Join(h.ignore, ","))
		}
	}
	out, err := h.ChrootHost.Run(ctx, c)
	h.output.Write(out)
	if err != nil {
		h.output.WriteString(err.Error())
	}
	return out, err
}

type nodeResult struct {
	code   int
	ran    []nodeprogram.Command
	output string // what the host commands and the node program printed
}

// runNodeUpgrade runs `capi-inplace node kubeadm upgrade args...` on a fake node root.
func runNodeUpgrade(ctx context.Context, t *testing.T, root string, ignore []string, args ...string) nodeResult {
	t.Helper()
	host := &dryRunHost{ChrootHost: nodeprogram.NewChrootHost(root), ignore: ignore}
	var stdout, stderr bytes.Buffer
	env := &nodeprogram.Env{Host: host, Stdout: &stdout, Stderr: &stderr}
	code := nodeprogram.Main(ctx, append([]string{"--termination-log=", "kubeadm", "upgrade"}, args...), env)
	return nodeResult{code: code, ran: host.ran, output: host.output.String() + stdout.String() + stderr.String()}
}

// wantKubeadmRan checks that the node program checked kubeadm's version and then ran
// kubeadm with exactly args.
func wantKubeadmRan(t *testing.T, res nodeResult, args []string) {
	t.Helper()
	var got []string
	for _, c := range res.ran {
		got = append(got, c.String())
	}
	want := []string{"/usr/bin/kubeadm version -o short", "/usr/bin/kubeadm " + strings.Join(args, " ")}
	if !slices.Equal(got, want) {
		t.Fatalf("the node program ran %q, want %q\n%s", got, want, res.output)
	}
}

// wantOnlyHostChecksFailed checks that kubeadm's preflight failed, and only for the
// checks that need a real host.
func wantOnlyHostChecksFailed(t *testing.T, output string) {
	t.Helper()
	var failed []string
	for _, line := range strings.Split(output, "\n") {
		if _, rest, ok := strings.Cut(line, "[ERROR "); ok {
			name, _, _ := strings.Cut(rest, "]")
			failed = append(failed, name)
		}
	}
	t.Logf("kubeadm's preflight without a host said:\n%s", grepLines(output, "[ERROR ", "[preflight]", "error execution phase"))
	slices.Sort(failed)
	failed = slices.Compact(failed)
	want := slices.Sorted(slices.Values(hostOnlyChecks))
	if !slices.Equal(failed, want) {
		t.Fatalf("kubeadm's preflight failed %q, want exactly the host-only checks %q\n%s", failed, want, output)
	}
}

// --- what must not change ---

type state struct {
	files map[string]string // path under /etc/kubernetes and /var/lib/kubelet -> SHA-256
	// dryRunFiles are the files in kubeadm's dry-run directories,
	// /etc/kubernetes/tmp/kubeadm-upgrade-<apply|node>-dryrun* (constants.GetDryRunDir,
	// overridden by KUBEADM_UPGRADE_DRYRUN_DIR), where a dry run writes what it would write.
	dryRunFiles   []string
	kubeadmConfig string // resourceVersion of kube-system/kubeadm-config
	kubeletConfig string
	kubeProxy     string
	coredns       string
	nodes         map[string]string
}

// snapshot records the node root's kubeadm and kubelet files and the cluster objects an
// upgrade writes, to show that a dry run changed none of them.
func snapshot(ctx context.Context, t *testing.T, c client.Client, root string) state {
	t.Helper()
	s := state{files: map[string]string{}, nodes: map[string]string{}}
	for _, dir := range []string{"etc/kubernetes", "var/lib/kubelet"} {
		err := filepath.WalkDir(filepath.Join(root, dir), func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(root, p)
			if strings.HasPrefix(rel, "etc/kubernetes/tmp/kubeadm-upgrade-") && strings.Contains(rel, "-dryrun") {
				s.dryRunFiles = append(s.dryRunFiles, "/"+rel)
				return nil
			}
			s.files[rel] = fmt.Sprintf("%x", sha256.Sum256(data))
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	rv := func(o client.Object, name string) string {
		if err := c.Get(ctx, types.NamespacedName{Namespace: metav1.NamespaceSystem, Name: name}, o); err != nil {
			t.Fatal(err)
		}
		return o.GetResourceVersion()
	}
	s.kubeadmConfig = rv(&corev1.ConfigMap{}, "kubeadm-config")
	s.kubeletConfig = rv(&corev1.ConfigMap{}, "kubelet-config")
	s.kubeProxy = rv(&corev1.ConfigMap{}, "kube-proxy")
	s.coredns = rv(&appsv1.Deployment{}, "coredns")
	nodes := &corev1.NodeList{}
	if err := c.List(ctx, nodes); err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes.Items {
		s.nodes[n.Name] = n.ResourceVersion
	}
	return s
}

// wantUnchanged checks that a dry run changed nothing on the node and in the cluster but
// for kubeadm's own dry-run directories.
func wantUnchanged(ctx context.Context, t *testing.T, c client.Client, root string, before state) {
	t.Helper()
	after := snapshot(ctx, t, c, root)
	if added := slices.DeleteFunc(slices.Clone(after.dryRunFiles), func(p string) bool { return slices.Contains(before.dryRunFiles, p) }); len(added) > 0 {
		t.Logf("kubeadm wrote in its dry-run directory: %q", added)
	}
	for p, sum := range before.files {
		if after.files[p] != sum {
			t.Errorf("the dry run changed or removed /%s", p)
		}
	}
	for p := range after.files {
		if _, ok := before.files[p]; !ok {
			t.Errorf("the dry run wrote /%s", p)
		}
	}
	after.files, before.files, after.dryRunFiles, before.dryRunFiles = nil, nil, nil, nil
	if fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("the dry run changed the cluster (resource versions of kubeadm-config, kubelet-config, kube-proxy, coredns, the nodes):\nbefore %v\nafter  %v", before, after)
	}
}

// --- output ---

// progressLines are kubeadm's own lines about what it does, without the objects and
// files it prints in a dry run.
func progressLines(s string) string {
	return grepLines(s, "[upgrade", "[dryrun] Would", "[preflight]", "[addons]", "[WARNING", "[ERROR", "error:", "succeeded", "capi-inplace node")
}

func grepLines(s string, words ...string) string {
	var out []string
	for _, line := range strings.Split(s, "\n") {
		for _, w := range words {
			if strings.Contains(line, w) {
				out = append(out, line)
				break
			}
		}
	}
	return strings.Join(out, "\n")
}
