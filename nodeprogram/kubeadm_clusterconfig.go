package nodeprogram

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"
)

// The ConfigMap in which kubeadm keeps the cluster's configuration (kubeadm's
// constants.KubeadmConfigConfigMap and ClusterConfigurationConfigMapKey). Its
// kubernetesVersion is the version the control plane was last applied at: `kubeadm
// upgrade apply` writes it once the control plane runs the new version.
const (
	kubeadmConfigNamespace  = "kube-system"
	kubeadmConfigName       = "kubeadm-config"
	clusterConfigurationKey = "ClusterConfiguration"
)

// readClusterConfiguration is Env.KubeadmClusterConfiguration's default: it reads the
// kubeadm-config ConfigMap with a client built from the kubeconfig file (the host's
// admin.conf). An API server that does not answer is worth retrying; a missing file, a
// refusal or a cluster without the ConfigMap is not.
func readClusterConfiguration(ctx context.Context, kubeconfig string) (string, error) {
	if _, err := os.Stat(kubeconfig); err != nil {
		return "", fmt.Errorf("read the kubeconfig: %w (a control plane node made by kubeadm has /etc/kubernetes/admin.conf; pass --kubeconfig otherwise)", err)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return "", fmt.Errorf("load the kubeconfig %s: %w", kubeconfig, err)
	}
	cfg.Timeout = 30 * time.Second
	c, err := corev1client.NewForConfig(cfg)
	if err != nil {
		return "", fmt.Errorf("client from %s: %w", kubeconfig, err)
	}
	cm, err := c.ConfigMaps(kubeadmConfigNamespace).Get(ctx, kubeadmConfigName, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return "", fmt.Errorf("the cluster has no ConfigMap %s/%s: it was not made by kubeadm", kubeadmConfigNamespace, kubeadmConfigName)
	case apierrors.IsForbidden(err), apierrors.IsUnauthorized(err):
		return "", fmt.Errorf("read ConfigMap %s/%s with %s: %w", kubeadmConfigNamespace, kubeadmConfigName, kubeconfig, err)
	case err != nil:
		return "", retryf("read ConfigMap %s/%s: %w", kubeadmConfigNamespace, kubeadmConfigName, err)
	}
	doc, ok := cm.Data[clusterConfigurationKey]
	if !ok {
		return "", fmt.Errorf("ConfigMap %s/%s has no key %s", kubeadmConfigNamespace, kubeadmConfigName, clusterConfigurationKey)
	}
	return doc, nil
}

// clusterVersion is the kubernetesVersion of a ClusterConfiguration document.
func clusterVersion(doc string) (kubeVersion, error) {
	var cc struct {
		KubernetesVersion string `json:"kubernetesVersion"`
	}
	if err := yaml.Unmarshal([]byte(doc), &cc); err != nil {
		return kubeVersion{}, fmt.Errorf("read the cluster's ClusterConfiguration: %w", err)
	}
	v, ok := parseKubeVersion(cc.KubernetesVersion)
	if !ok {
		return kubeVersion{}, fmt.Errorf("the cluster's ClusterConfiguration has kubernetesVersion %q, not a released version vMAJOR.MINOR.PATCH", cc.KubernetesVersion)
	}
	return v, nil
}

// checkUpgradeSkew refuses a target that kubeadm would refuse, or that capi-inplace
// does not do: kubeadm upgrades at most one minor release at a time, and capi-inplace
// never downgrades (kubeadm would allow a minor down, DESIGN.md does not).
//
// A jump of two minors is refused with the words kubeadm at the target says first (make
// check-real-kubeadm runs it): kubeadm reads the ClusterConfiguration before it judges
// the versions and refuses a cluster below its own minor minus one there
// (util/config/common.go, NormalizeKubernetesVersion, constants.MinimumControlPlaneVersion),
// so its "Specified version to upgrade to ... is too high" of phases/upgrade/policy.go is
// not reached when kubeadm is at the target, as `node kubeadm fetch` makes it.
func checkUpgradeSkew(cluster, target kubeVersion) error {
	switch {
	case target.major != cluster.major:
		return fmt.Errorf("the cluster runs %s and the target is %s: kubeadm upgrades within one major version only", cluster, target)
	case target.compare(cluster) < 0:
		return fmt.Errorf("the cluster runs %s (ClusterConfiguration kubernetesVersion) and the target %s is lower: capi-inplace does not downgrade; choose a version of at least %s", cluster, target, cluster)
	case target.minor > cluster.minor+1:
		return fmt.Errorf("the cluster runs %s (ClusterConfiguration kubernetesVersion) and the target %s is more than one minor above: kubeadm upgrades one minor version at a time, so upgrade to a v%d.%d.x first; kubeadm %s would refuse with: %s",
			cluster, target, cluster.major, cluster.minor+1, target, KubeadmMinimumVersionRefusal(target.major, target.minor, cluster.String()))
	}
	return nil
}

// KubeadmMinimumVersionRefusal is what kubeadm at version major.minor says of a cluster
// whose ClusterConfiguration is at current, more than one minor below it
// (util/config/common.go, NormalizeKubernetesVersion: its minimum control plane version is
// its own minor minus one). The updater's Preflight quotes it too.
func KubeadmMinimumVersionRefusal(major, minor int, current string) string {
	return fmt.Sprintf("this version of kubeadm only supports deploying clusters with the control plane version >= %d.%d.0. Current version: %s", major, minor-1, current)
}

// readClusterVersion reads the cluster's version with the host's kubeconfig.
func readClusterVersion(ctx context.Context, env *Env, kubeconfig string) (kubeVersion, error) {
	read := env.KubeadmClusterConfiguration
	if read == nil {
		read = readClusterConfiguration
	}
	doc, err := read(ctx, env.host().Path(kubeconfig))
	if err != nil {
		var r *retryError
		if errors.As(err, &r) {
			return kubeVersion{}, err
		}
		return kubeVersion{}, fmt.Errorf("read the cluster's version: %w", err)
	}
	return clusterVersion(doc)
}
