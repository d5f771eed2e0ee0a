package harvesteradapter_test

import (
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	harvesterv1 "github.com/capi-inplace/capi-inplace/harvesteradapter/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/longhorn"
	"github.com/capi-inplace/capi-inplace/nodeupdater"
)

// createLonghornVolume writes an attached, healthy Longhorn volume with a healthy replica
// on each of nodes. Longhorn's CRD makes several enums required when present; a typed
// Volume would send them empty, so it is written with only the fields Longhorn sets.
func createLonghornVolume(name, dataEngine string, nodes ...string) {
	GinkgoHelper()
	vol := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "longhorn.io/v1beta2", "kind": "Volume",
		"metadata": map[string]any{"name": name, "namespace": longhorn.Namespace},
		"spec":     map[string]any{"dataEngine": dataEngine, "numberOfReplicas": int64(len(nodes))},
	}}
	Expect(workload.Client.Create(ctx, vol)).To(Succeed())
	Expect(unstructured.SetNestedMap(vol.Object, map[string]any{"state": "attached", "robustness": "healthy"}, "status")).To(Succeed())
	Expect(workload.Client.Status().Update(ctx, vol)).To(Succeed())
	for _, n := range nodes {
		r := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "longhorn.io/v1beta2", "kind": "Replica",
			"metadata": map[string]any{"name": name + "-r-" + n, "namespace": longhorn.Namespace},
			"spec":     map[string]any{"volumeName": name, "nodeID": n, "dataEngine": dataEngine, "healthyAt": "2026-11-01T00:00:00Z"},
		}}
		Expect(workload.Client.Create(ctx, r)).To(Succeed())
	}
}

var _ = Describe("The Longhorn preflight across the nodes down together", func() {
	It("holds a node whose v1 volume keeps its other healthy replica only on a node that is down or picked this round", func() {
		c := newHarvesterCluster(3, "Harvester v1.7.1", func(h *harvesterv1.HarvesterUpgrader) { h.Spec.UpgradeOS = ptr.To(false) })
		vol := "pvc-v1-" + c.name
		createLonghornVolume(vol, "v1", c.nodes[0], c.nodes[1])

		held := func(disrupted, picked []string) map[string]string {
			out := map[string]string{}
			for _, r := range c.updater.Preflight(ctx, nodeupdater.PreflightTarget{
				Namespace: c.ns, ClusterName: c.name, NodeName: c.nodes[0], Version: "v1.35.6+rke2r1",
				UpdaterRef: inplacev1.UpdaterReference{Kind: "HarvesterUpgrader", Name: c.config.Name},
				Disrupted:  disrupted, Picked: picked,
			}) {
				if !r.Passed {
					out[r.Name] = r.Message
				}
			}
			return out
		}

		Expect(held([]string{c.nodes[1]}, nil)).To(HaveKeyWithValue(longhorn.CheckLonghornV1ReplicaElsewhere, And(
			ContainSubstring(vol+" (healthy replicas on "+c.nodes[0]+", "+c.nodes[1]+")"),
			ContainSubstring(c.nodes[0]+" (this node), "+c.nodes[1]+" (down)"))))
		Expect(held(nil, []string{c.nodes[1]})).To(HaveKeyWithValue(longhorn.CheckLonghornV1ReplicaElsewhere,
			ContainSubstring(c.nodes[1]+" (picked this round)")))
		// Volumes of other specs share the workload cluster's Longhorn: only this one's
		// absence from the message is this spec's to assert.
		Expect(held([]string{c.nodes[2]}, nil)[longhorn.CheckLonghornV1ReplicaElsewhere]).NotTo(ContainSubstring(vol),
			"a replica on a node that stays up keeps the volume served")
	})
})
