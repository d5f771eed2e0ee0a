package clusterupgrade_test

import (
	"encoding/json"

	longhornv1 "github.com/longhorn/longhorn-manager/k8s/pkg/apis/longhorn/v1beta2"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	storagev1 "k8s.io/api/storage/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capi-inplace/capi-inplace/harvesteradapter/clusterupgrade"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher"
	"github.com/capi-inplace/capi-inplace/test/sim"
)

// The values upgrade_managedchart_harvester adds to the harvester chart it re-applies
// (harvester-release-steps.md fact 23.2).
var _ = Describe("Run and the harvester chart's values", func() {
	const ns = "longhorn-system"

	// cluster seeds the old release with Longhorn's two settings at the given values, the
	// harvester chart's values given extra (merged over the seeded ones), and, when
	// otherDefault, another default StorageClass.
	cluster := func(drainPolicy, detach string, extra map[string]any, otherDefault bool) {
		GinkgoHelper()
		seed(oldRelease)
		settle()
		Expect(sim.SetLonghornSetting(ctx, env.Client, ns, "node-drain-policy", drainPolicy)).To(Succeed())
		Expect(sim.SetLonghornSetting(ctx, env.Client, ns, "detach-manually-attached-volumes-when-cordoned", detach)).To(Succeed())
		DeferCleanup(func() {
			Expect(env.Client.DeleteAllOf(ctx, &longhornv1.Setting{}, client.InNamespace(ns))).To(Succeed())
		})
		if extra != nil {
			mc := chart(rancher.HarvesterChart)
			values := map[string]any{}
			Expect(json.Unmarshal(mc.Spec.Values.Raw, &values)).To(Succeed())
			for k, v := range extra {
				values[k] = v
			}
			raw, err := json.Marshal(values)
			Expect(err).NotTo(HaveOccurred())
			before := mc.DeepCopy()
			mc.Spec.Values = &apiextensionsv1.JSON{Raw: raw}
			Expect(env.Client.Patch(ctx, mc, client.MergeFrom(before))).To(Succeed())
			settle()
		}
		if otherDefault {
			sc := &storagev1.StorageClass{
				ObjectMeta:  metav1.ObjectMeta{Name: "ceph-rbd", Annotations: map[string]string{"storageclass.kubernetes.io/is-default-class": "true"}},
				Provisioner: "rbd.csi.ceph.com",
			}
			Expect(env.Client.Create(ctx, sc)).To(Succeed())
			DeferCleanup(func() { Expect(env.Client.Delete(ctx, sc)).To(Succeed()) })
		}
	}
	values := func() map[string]any {
		GinkgoHelper()
		out := map[string]any{}
		Expect(json.Unmarshal(chart(rancher.HarvesterChart).Spec.Values.Raw, &out)).To(Succeed())
		return out
	}

	It("sets Longhorn's drain policy and cordon detach where Longhorn is at its defaults, the limit as a string, and no second default StorageClass", func() {
		cluster("block-if-contains-last-replica", "false",
			map[string]any{"longhorn": map[string]any{"defaultSettings": map[string]any{"concurrentAutomaticEngineUpgradePerNodeLimit": 3}}}, true)
		steps := runStates(input("up-values"), newProgress())
		v := values()
		Expect(v).To(HaveKeyWithValue("storageClass", map[string]any{"defaultStorageClass": false}))
		Expect(v).To(HaveKeyWithValue("longhorn", map[string]any{"defaultSettings": map[string]any{
			"nodeDrainPolicy": "allow-if-replica-is-stopped", "detachManuallyAttachedVolumesWhenCordoned": true,
			"concurrentAutomaticEngineUpgradePerNodeLimit": "3",
		}}))
		Expect(v).To(HaveKeyWithValue("kubevirt", map[string]any{"spec": map[string]any{"workloadUpdateStrategy": map[string]any{"workloadUpdateMethods": []any{}}}}),
			"the roll's KubeVirt change is kept")
		Expect(stepNamed(steps, clusterupgrade.StepUpgradeHarvesterChart).Message).To(And(
			ContainSubstring("storageClass.defaultStorageClass=false (StorageClass ceph-rbd is the default)"),
			ContainSubstring(`longhorn.defaultSettings.nodeDrainPolicy="allow-if-replica-is-stopped"`)))
	})

	It("keeps what an operator chose: Longhorn settings changed from their defaults and values the chart already sets", func() {
		cluster("always-allow", "false",
			map[string]any{"longhorn": map[string]any{"defaultSettings": map[string]any{"detachManuallyAttachedVolumesWhenCordoned": false}}}, false)
		runStates(input("up-values-kept"), newProgress())
		v := values()
		Expect(v).NotTo(HaveKey("storageClass"), "harvester-longhorn stays the only default")
		Expect(v).To(HaveKeyWithValue("longhorn", map[string]any{"defaultSettings": map[string]any{"detachManuallyAttachedVolumesWhenCordoned": false}}),
			"node-drain-policy is the operator's always-allow; the chart's own false is kept")
	})
})
