package sim

import (
	"context"
	"fmt"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/version"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capi-inplace/capi-inplace/harvesteradapter/harvesterapi"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher/managementv3"
)

// HarvesterKubeVirt is Harvester's KubeVirt install CR, which the harvester chart renders.
var HarvesterKubeVirt = client.ObjectKey{Namespace: "harvester-system", Name: "kubevirt"}

// virt-operator, as the Rancher simulator plays it when Fleet deploys the harvester chart
// (harvester-release-steps.md fact 23.5: the chart carries KubeVirt; Harvester's
// wait_kubevirt waits for status.observedKubeVirtVersion to equal the release's kubevirt
// and status.phase Deployed). virt-operator reconciles the KubeVirt CR: when the version
// it is to install differs from the one deployed, it writes that version as
// status.targetKubeVirtVersion (with the install strategy's targetDeploymentID) and phase
// Deploying, rolls out the components, and once all are ready writes
// status.observedKubeVirtVersion and observedDeploymentID equal to the target and phase
// Deployed (kubevirt/kubevirt pkg/virt-operator/kubevirt.go, the install strategy's sync;
// the fields are KubeVirtStatus in staging/src/kubevirt.io/api/core/v1/types.go, phases
// KubeVirtPhaseDeploying and KubeVirtPhaseDeployed). The simulator takes the version the
// chart carries to be KubeVirtVersionOfChart; the rollout takes RolloutDelay.

// startKubeVirtDeploy plays virt-operator seeing the KubeVirt of the harvester chart mc
// that Fleet deployed: a version other than the deployed one becomes the target, phase
// Deploying. Another chart, or a cluster without the CR or its kind, is left alone.
func startKubeVirtDeploy(ctx context.Context, c client.Client, mc *managementv3.ManagedChart) error {
	if mc.Name != rancher.HarvesterChart {
		return nil
	}
	want := KubeVirtVersionOfChart(mc.Spec.Version)
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		kv := &kubevirtv1.KubeVirt{}
		if err := c.Get(ctx, HarvesterKubeVirt, kv); err != nil {
			if apierrors.IsNotFound(err) || meta.IsNoMatchError(err) {
				return nil
			}
			return err
		}
		if kv.Status.ObservedKubeVirtVersion == want || kv.Status.TargetKubeVirtVersion == want {
			return nil
		}
		kv.Status.TargetKubeVirtVersion = want
		kv.Status.TargetDeploymentID = deploymentID(want)
		kv.Status.Phase = kubevirtv1.KubeVirtPhaseDeploying
		return c.Status().Update(ctx, kv)
	})
}

// kubevirtRollout plays virt-operator finishing a deploy it started (startKubeVirtDeploy)
// once RolloutDelay has passed: observed version and deployment ID become the target's,
// phase Deployed.
func (r *Rancher) kubevirtRollout(ctx context.Context) error {
	kv := &kubevirtv1.KubeVirt{}
	if err := r.Client.Get(ctx, HarvesterKubeVirt, kv); err != nil {
		if apierrors.IsNotFound(err) || meta.IsNoMatchError(err) {
			return nil
		}
		return err
	}
	target := kv.Status.TargetKubeVirtVersion
	if target == "" || (kv.Status.ObservedKubeVirtVersion == target && kv.Status.Phase == kubevirtv1.KubeVirtPhaseDeployed) {
		return nil
	}
	if !r.due(fmt.Sprintf("kubevirt/%s/%s", kv.UID, target), orDefault(r.RolloutDelay, 50*time.Millisecond)) {
		return nil
	}
	kv.Status.ObservedKubeVirtVersion, kv.Status.ObservedDeploymentID = target, kv.Status.TargetDeploymentID
	kv.Status.Phase = kubevirtv1.KubeVirtPhaseDeployed
	kv.Status.ObservedGeneration = ptr.To(kv.Generation)
	return client.IgnoreNotFound(r.Client.Status().Update(ctx, kv))
}

// seedKubeVirt is the KubeVirt CR of a Harvester cluster (deployedKubeVirt gives it the
// status of the KubeVirt its chart carries), with the workload update methods the seeded harvester chart
// renders ([LiveMigrate], fact 13).
func seedKubeVirt() *kubevirtv1.KubeVirt {
	kv := &kubevirtv1.KubeVirt{ObjectMeta: metav1.ObjectMeta{Namespace: HarvesterKubeVirt.Namespace, Name: HarvesterKubeVirt.Name}}
	kv.Spec.WorkloadUpdateStrategy.WorkloadUpdateMethods = []kubevirtv1.WorkloadUpdateMethod{kubevirtv1.WorkloadUpdateMethodLiveMigrate}
	return kv
}

func deployedKubeVirt(kv *kubevirtv1.KubeVirt, chart string) {
	v := KubeVirtVersionOfChart(chart)
	kv.Status.TargetKubeVirtVersion, kv.Status.ObservedKubeVirtVersion = v, v
	kv.Status.TargetDeploymentID, kv.Status.ObservedDeploymentID = deploymentID(v), deploymentID(v)
	kv.Status.Phase = kubevirtv1.KubeVirtPhaseDeployed
	kv.Status.ObservedGeneration = ptr.To(kv.Generation)
}

// OvercommitConfigDefault is Harvester's default of its overcommit-config Setting in
// release harvesterVersion, which Harvester writes into the Setting's default at start
// (harvester/harvester pkg/settings/settings.go: `{"cpu":1600,"memory":150,"storage":200}`
// up to v1.7.x, `{"cpu":1000,"memory":150,"storage":100}` from v1.8.0, commit f38813f;
// harvester-release-steps.md fact 10).
func OvercommitConfigDefault(harvesterVersion string) string {
	v, err := version.ParseSemantic(harvesterVersion)
	if err == nil && v.AtLeast(version.MustParseSemantic("v1.8.0-0")) {
		return `{"cpu":1000,"memory":150,"storage":100}`
	}
	return `{"cpu":1600,"memory":150,"storage":200}`
}

// seedOvercommitConfig is Harvester's overcommit-config Setting as a cluster at release
// harvesterVersion has it when nobody set it: the release's default and no value.
func seedOvercommitConfig(harvesterVersion string) *harvesterapi.Setting {
	return &harvesterapi.Setting{
		ObjectMeta: metav1.ObjectMeta{Name: "overcommit-config"},
		Default:    OvercommitConfigDefault(harvesterVersion),
	}
}

// seedHarvesterObjects re-creates the Harvester objects Seed adds to Rancher's: the
// overcommit-config Setting, the containerd-registry Setting without a value (no mirror
// configured; sync_containerd_registry_to_rancher annotates it, fact 24) and the KubeVirt
// CR, deployed. A cluster whose API server does not serve their kinds gets none.
func seedHarvesterObjects(ctx context.Context, c client.Client, rel HarvesterRelease) error {
	for _, setting := range []*harvesterapi.Setting{seedOvercommitConfig(rel.Version), {ObjectMeta: metav1.ObjectMeta{Name: "containerd-registry"}}} {
		if err := recreate(ctx, c, setting); err != nil && !noKind(err) {
			return err
		}
	}
	kv := seedKubeVirt()
	if err := recreate(ctx, c, kv); err != nil {
		if noKind(err) {
			return nil
		}
		return err
	}
	deployedKubeVirt(kv, rel.Chart)
	if err := c.Status().Update(ctx, kv); err != nil {
		return fmt.Errorf("seed the status of KubeVirt %s: %w", HarvesterKubeVirt, err)
	}
	return nil
}

// noKind says whether err is the API server (or the client's scheme) not knowing a kind.
func noKind(err error) bool {
	return meta.IsNoMatchError(err) || strings.Contains(err.Error(), "no kind is registered") || strings.Contains(err.Error(), "no matches for kind")
}
