package sim

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher/managementv3"
)

// KubeVirt's workload updater, as virt-controller runs it (kubevirt/kubevirt
// pkg/virt-controller/watch/workload-updater/workload-updater.go, the same at v1.4.0, v1.5.0,
// v1.6.0 and v1.6.6; Harvester's upgrade hazard is harvester-release-steps.md fact 13):
//
//   - It acts only while the KubeVirt CR is fully deployed: status.phase Deployed and
//     status.observedDeploymentID equal to status.targetDeploymentID (execute).
//   - A VMI is outdated when it is Running, not final, not being deleted, and its
//     status.launcherContainerImageVersion is set and differs from the virt-launcher image
//     of the virt-controller now running (isOutdated; an empty one is not outdated). This
//     simulator names the launcher image after the CR's status.observedKubeVirtVersion
//     (launcherImage): virt-operator rolls out virt-controller with the new launcher image
//     when it deploys a version, which is what UpgradeKubeVirt plays. The hot-plug and
//     volume-update migrations the updater also starts are not played.
//   - spec.workloadUpdateStrategy.workloadUpdateMethods decides what is done: with
//     LiveMigrate, outdated VMIs that are LiveMigratable (condition LiveMigratable True,
//     VirtualMachineInstance.IsMigratable), not migrating (pkg/util/migrations IsMigrating)
//     and without an unfinished migration get one; with Evict, the others would have their
//     launcher pod evicted, batchEvictionSize (default 10, defaultBatchDeletionCount) every
//     batchEvictionInterval (default 1 minute, defaultBatchDeletionIntervalSeconds). Evict is
//     not played: the simulator records nothing for it. With no method (Harvester empties the
//     list during its upgrade, fact 13) nothing is done. The outdated count is written into
//     status.outdatedVirtualMachineInstanceWorkloads either way.
//   - The batches of migrations are NOT sized by batchEvictionSize (that governs evictions
//     only): each sync creates at most parallelMigrationsPerCluster (spec.configuration.
//     migrations, default 5: pkg/virt-config virt-config.go ParallelMigrationsPerClusterDefault)
//     minus the migrations in a running phase (VirtualMachineInstanceMigration.IsRunning:
//     not Unset, Pending, WaitingForSync, Synchronizing, Succeeded or Failed), picked at
//     random (rand.Shuffle). Pending migrations do not hold it back.
//   - Each migration is created with generateName kubevirt-workload-update-, the annotation
//     kubevirt.io/workloadUpdateMigration "" (WorkloadUpdateMigrationAnnotation), no label,
//     and spec.vmiName; the migration machinery of this simulator then carries it out.
//   - Pacing: the real controller syncs 5 s after a KubeVirt or migration event
//     (defaultThrottleInterval) and, while work is left, re-adds its key with
//     AddAfter(key, periodicReEnqueueIntervalSeconds), the untyped 30 read as a
//     time.Duration, i.e. 30 ns: it syncs again as soon as the migrations it created are
//     observed (its expectations). The simulator syncs once per Interval.
//
// Where Harvester keeps the methods: in the harvester ManagedChart's values,
// kubevirt.spec.workloadUpdateStrategy.workloadUpdateMethods (fact 13; since v1.6.0 the
// chart's default is [LiveMigrate]); Fleet renders the chart and applies the KubeVirt CR
// harvester-system/kubevirt with that spec. The simulator reads the CR, as virt-controller
// does. The Rancher simulator does not render charts: a test that wants the chain copies the
// value from the ManagedChart's spec.values into the CR's spec when the Rancher simulator has
// deployed the chart's generation (status.observedGeneration), then calls UpgradeKubeVirt as
// virt-operator would once the chart's new KubeVirt version is deployed (fact 23.5:
// Harvester's script waits for observedKubeVirtVersion and phase Deployed).

// WorkloadUpdateMigration is one migration the workload updater created.
type WorkloadUpdateMigration struct {
	// Migration is namespace/name of the VirtualMachineInstanceMigration.
	Migration string
	// VMI is namespace/name of the VMI it migrates.
	VMI string
	// Sync counts the updater's syncs that created migrations, from 1: the migrations of
	// one sync form one batch.
	Sync int
	// Version is the KubeVirt version deployed when it was created.
	Version string
	At      time.Time
}

type workloadUpdater struct {
	version    string
	syncs      int
	migrations []WorkloadUpdateMigration
}

// defaultParallelMigrationsPerCluster is KubeVirt's ParallelMigrationsPerClusterDefault.
const defaultParallelMigrationsPerCluster = 5

// WorkloadUpdateMigrationPrefix is the generateName of the workload updater's migrations.
const WorkloadUpdateMigrationPrefix = "kubevirt-workload-update-"

// LauncherImage is the virt-launcher image of a KubeVirt version in this simulator.
func LauncherImage(version string) string {
	if version == "" {
		return ""
	}
	return "registry.suse.com/suse/sles/15.6/virt-launcher:" + version
}

// launcherImage is the launcher image of the KubeVirt version last seen deployed, "" when
// the simulator plays no KubeVirt CR or none is deployed yet.
func (k *KubeVirt) launcherImage() string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return LauncherImage(k.updater.version)
}

// WorkloadUpdateMigrations returns every migration the workload updater created, in order.
func (k *KubeVirt) WorkloadUpdateMigrations() []WorkloadUpdateMigration {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([]WorkloadUpdateMigration(nil), k.updater.migrations...)
}

// deploymentID stands for virt-operator's deployment ID of a version's install strategy.
func deploymentID(version string) string {
	sum := sha256.Sum256([]byte(version))
	return hex.EncodeToString(sum[:8])
}

// UpgradeKubeVirt plays virt-operator having deployed version for KubeVirtCR: the CR's
// status names it as target and observed version, with equal target and observed
// deployment IDs, and phase Deployed (the state Harvester's wait_kubevirt waits for, fact
// 23.5). Running VMIs started before then are outdated from now on.
func (k *KubeVirt) UpgradeKubeVirt(ctx context.Context, version string) error {
	if k.KubeVirtCR.Name == "" {
		return fmt.Errorf("the KubeVirt simulator plays no KubeVirt CR: set KubeVirtCR")
	}
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		kv := &kubevirtv1.KubeVirt{}
		if err := k.Client.Get(ctx, k.KubeVirtCR, kv); err != nil {
			return err
		}
		id := deploymentID(version)
		kv.Status.TargetKubeVirtVersion, kv.Status.ObservedKubeVirtVersion = version, version
		kv.Status.TargetDeploymentID, kv.Status.ObservedDeploymentID = id, id
		kv.Status.Phase = kubevirtv1.KubeVirtPhaseDeployed
		kv.Status.ObservedGeneration = ptr.To(kv.Generation)
		return k.Client.Status().Update(ctx, kv)
	})
}

// syncWorkloadUpdates is one sync of the workload updater (see the file comment).
func (k *KubeVirt) syncWorkloadUpdates(ctx context.Context) error {
	if k.KubeVirtCR.Name == "" {
		return nil
	}
	kv := &kubevirtv1.KubeVirt{}
	if err := k.Client.Get(ctx, k.KubeVirtCR, kv); err != nil {
		return client.IgnoreNotFound(err)
	}
	k.mu.Lock()
	k.updater.version = kv.Status.ObservedKubeVirtVersion
	k.mu.Unlock()
	if kv.Status.Phase != kubevirtv1.KubeVirtPhaseDeployed || kv.Status.ObservedDeploymentID != kv.Status.TargetDeploymentID {
		return nil
	}
	current := LauncherImage(kv.Status.ObservedKubeVirtVersion)

	migrations := &kubevirtv1.VirtualMachineInstanceMigrationList{}
	if err := k.Client.List(ctx, migrations, k.inNamespace()...); err != nil {
		return err
	}
	unfinished := map[string]bool{}
	running := 0
	for i := range migrations.Items {
		m := &migrations.Items[i]
		if m.IsFinal() {
			continue
		}
		unfinished[m.Namespace+"/"+m.Spec.VMIName] = true
		if m.IsRunning() {
			running++
		}
	}
	liveMigrate := false
	for _, method := range kv.Spec.WorkloadUpdateStrategy.WorkloadUpdateMethods {
		if method == kubevirtv1.WorkloadUpdateMethodLiveMigrate {
			liveMigrate = true
		}
	}

	vmis := &kubevirtv1.VirtualMachineInstanceList{}
	if err := k.Client.List(ctx, vmis, k.inNamespace()...); err != nil {
		return err
	}
	outdated := 0
	var candidates []*kubevirtv1.VirtualMachineInstance
	for i := range vmis.Items {
		vmi := &vmis.Items[i]
		if !vmi.IsRunning() || vmi.IsFinal() || vmi.DeletionTimestamp != nil {
			continue
		}
		if vmi.Status.LauncherContainerImageVersion == "" || vmi.Status.LauncherContainerImageVersion == current {
			continue
		}
		outdated++
		if migrating(vmi) || unfinished[vmi.Namespace+"/"+vmi.Name] {
			continue
		}
		if liveMigrate && vmi.IsMigratable() {
			candidates = append(candidates, vmi)
		}
	}
	if got := kv.Status.OutdatedVirtualMachineInstanceWorkloads; got == nil || *got != outdated {
		patch := client.MergeFrom(kv.DeepCopy())
		kv.Status.OutdatedVirtualMachineInstanceWorkloads = ptr.To(outdated)
		if err := k.Client.Status().Patch(ctx, kv, patch); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
	}

	limit := defaultParallelMigrationsPerCluster
	if m := kv.Spec.Configuration.MigrationConfiguration; m != nil && m.ParallelMigrationsPerCluster != nil {
		limit = int(*m.ParallelMigrationsPerCluster)
	}
	n := min(max(limit-running, 0), len(candidates))
	if n == 0 {
		return nil
	}
	rand.Shuffle(len(candidates), func(i, j int) { candidates[i], candidates[j] = candidates[j], candidates[i] })
	k.mu.Lock()
	k.updater.syncs++
	sync := k.updater.syncs
	k.mu.Unlock()
	for _, vmi := range candidates[:n] {
		m := &kubevirtv1.VirtualMachineInstanceMigration{
			ObjectMeta: metav1.ObjectMeta{
				Namespace:    vmi.Namespace,
				GenerateName: WorkloadUpdateMigrationPrefix,
				Annotations:  map[string]string{kubevirtv1.WorkloadUpdateMigrationAnnotation: ""},
			},
			Spec: kubevirtv1.VirtualMachineInstanceMigrationSpec{VMIName: vmi.Name},
		}
		if err := k.Client.Create(ctx, m); err != nil {
			return fmt.Errorf("create the workload update migration of %s/%s: %w", vmi.Namespace, vmi.Name, err)
		}
		k.mu.Lock()
		k.updater.migrations = append(k.updater.migrations, WorkloadUpdateMigration{
			Migration: m.Namespace + "/" + m.Name, VMI: vmi.Namespace + "/" + vmi.Name,
			Sync: sync, Version: kv.Status.ObservedKubeVirtVersion, At: time.Now(),
		})
		k.mu.Unlock()
	}
	return nil
}

// migrating is KubeVirt's IsMigrating (pkg/util/migrations): the VMI's migration state has
// started and has not ended.
func migrating(vmi *kubevirtv1.VirtualMachineInstance) bool {
	s := vmi.Status.MigrationState
	if s == nil {
		return false
	}
	now := time.Now()
	return s.StartTimestamp != nil && !now.Before(s.StartTimestamp.Time) && (s.EndTimestamp == nil || now.Before(s.EndTimestamp.Time))
}

// KubeVirtVersionOfChart is the KubeVirt version the simulator takes a harvester chart
// version to ship. Each Harvester release ships its own KubeVirt in its chart (fact 23.5:
// wait_kubevirt waits for the release's kubevirt version once the chart is deployed); the
// simulator needs only that two chart versions ship two KubeVirt versions.
func KubeVirtVersionOfChart(chartVersion string) string {
	return "v-harvester-" + chartVersion
}

// ApplyHarvesterChart plays what Fleet's deploy of the harvester ManagedChart does to
// KubeVirt, for Rancher.OnDeployed: the chart renders the KubeVirt CR from its values, so
// the CR's spec.workloadUpdateStrategy.workloadUpdateMethods becomes the chart's
// kubevirt.spec.workloadUpdateStrategy.workloadUpdateMethods, unset when the chart has none
// (harvester-release-steps.md fact 13: "since v1.6.0 the chart sets workloadUpdateMethods:
// [LiveMigrate]"; v1.8.1+ empty the chart value, not the CR, because Fleet owns the CR);
// and a chart version that ships another KubeVirt makes virt-operator deploy it (fact
// 23.5), after which the workload updater acts on the methods the CR then holds. Any other
// chart is not KubeVirt's: nothing happens.
func (k *KubeVirt) ApplyHarvesterChart(ctx context.Context, mc *managementv3.ManagedChart) error {
	if mc.Name != rancher.HarvesterChart || k.KubeVirtCR.Name == "" {
		return nil
	}
	var values struct {
		KubeVirt struct {
			Spec struct {
				WorkloadUpdateStrategy struct {
					WorkloadUpdateMethods []kubevirtv1.WorkloadUpdateMethod `json:"workloadUpdateMethods"`
				} `json:"workloadUpdateStrategy"`
			} `json:"spec"`
		} `json:"kubevirt"`
	}
	if mc.Spec.Values != nil {
		if err := json.Unmarshal(mc.Spec.Values.Raw, &values); err != nil {
			return fmt.Errorf("the harvester chart's values do not render: %w", err)
		}
	}
	methods := values.KubeVirt.Spec.WorkloadUpdateStrategy.WorkloadUpdateMethods
	var observed string
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		kv := &kubevirtv1.KubeVirt{}
		if err := k.Client.Get(ctx, k.KubeVirtCR, kv); err != nil {
			return err
		}
		observed = kv.Status.ObservedKubeVirtVersion
		if slices.Equal(kv.Spec.WorkloadUpdateStrategy.WorkloadUpdateMethods, methods) {
			return nil
		}
		kv.Spec.WorkloadUpdateStrategy.WorkloadUpdateMethods = methods
		return k.Client.Update(ctx, kv)
	})
	if err != nil {
		return fmt.Errorf("apply the harvester chart to the KubeVirt CR %s: %w", k.KubeVirtCR, err)
	}
	if want := KubeVirtVersionOfChart(mc.Spec.Version); observed != want {
		return k.UpgradeKubeVirt(ctx, want)
	}
	return nil
}
