package extension_test

import (
	"context"
	"fmt"
	"sync"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	runtimehooksv1 "sigs.k8s.io/cluster-api/api/runtime/hooks/v1alpha1"

	hooksv1 "github.com/capi-inplace/capi-inplace/api/hooks/v1alpha1"
	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/controllers/upgraderequest"
	"github.com/capi-inplace/capi-inplace/extension"
	"github.com/capi-inplace/capi-inplace/nodeupdater"
	"github.com/capi-inplace/capi-inplace/test/fixtures"
)

// noopUpdater stands in for an updater the manager runs; the hook only asks the registry
// whether its kind is served.
type noopUpdater struct{}

func (noopUpdater) Reconcile(context.Context, *inplacev1.NodeUpdate) (nodeupdater.Result, error) {
	return nodeupdater.Result{}, nil
}
func (noopUpdater) Abort(context.Context, *inplacev1.NodeUpdate) (bool, error) { return true, nil }
func (noopUpdater) Preflight(context.Context, nodeupdater.PreflightTarget) []nodeupdater.CheckResult {
	return nil
}

// The tests use ConfigMap as the updater configuration kind the manager runs: any kind the
// API server serves shows the same behaviour.
const updaterAnnotation = "ConfigMap/upgrader"

func newRegistry() *nodeupdater.Registry {
	reg := nodeupdater.NewRegistry()
	Expect(reg.Register(nodeupdater.Registration{
		GroupKind: schema.GroupKind{Kind: "ConfigMap"},
		NewConfig: func() client.Object { return &corev1.ConfigMap{} },
		Updater:   noopUpdater{},
	})).To(Succeed())
	return reg
}

type world struct {
	ns      string
	cluster *clusterv1.Cluster
	workers []*clusterv1.Machine
	cps     []*clusterv1.Machine
	handler *extension.ExternalUpgradeHandler
}

// newWorld creates a Cluster with a 3-machine control plane "cp" at v1.33.3+rke2r1, a
// 3-machine MachineDeployment "workers" at the same version, and the updater's ConfigMap.
func newWorld(clusterAnnotations map[string]string) *world {
	GinkgoHelper()
	w := &world{}
	var err error
	w.ns, err = fixtures.Namespace(ctx, k8s, "hook")
	Expect(err).NotTo(HaveOccurred())
	w.cluster, err = fixtures.Cluster(ctx, k8s, w.ns, "harvester", "cp", clusterAnnotations)
	Expect(err).NotTo(HaveOccurred())
	_, w.cps, err = fixtures.ControlPlane(ctx, k8s, w.ns, "harvester", "cp", "v1.33.3+rke2r1", 3, false)
	Expect(err).NotTo(HaveOccurred())
	_, w.workers, err = fixtures.MachineDeployment(ctx, k8s, w.ns, "harvester", "workers", "v1.33.3+rke2r1", 3)
	Expect(err).NotTo(HaveOccurred())
	Expect(k8s.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: w.ns, Name: "upgrader"}})).To(Succeed())
	w.handler = extension.NewExternalUpgradeHandler(&upgraderequest.Requester{Client: k8s, Registry: newRegistry()})
	return w
}

func (w *world) withDefault(ref string) *world {
	w.handler = extension.NewExternalUpgradeHandler(&upgraderequest.Requester{Client: k8s, Registry: newRegistry(), DefaultUpdater: ref})
	return w
}

// controlPlaneRuns records that every control plane machine reached v in place, so that
// workers may follow (no kubelet newer than the control plane).
func (w *world) controlPlaneRuns(v string) {
	GinkgoHelper()
	for _, m := range w.cps {
		Expect(retry.RetryOnConflict(retry.DefaultRetry, func() error {
			got := &clusterv1.Machine{}
			if err := k8s.Get(ctx, client.ObjectKeyFromObject(m), got); err != nil {
				return err
			}
			if got.Annotations == nil {
				got.Annotations = map[string]string{}
			}
			got.Annotations[inplacev1.UpgradeReleaseAnnotation] = v
			return k8s.Update(ctx, got)
		})).To(Succeed())
	}
}

// phases maps each UpgradeTask of the namespace to what its spec asks (Ongoing, Abort).
func (w *world) phases() map[string]inplacev1.TaskAction {
	GinkgoHelper()
	out := map[string]inplacev1.TaskAction{}
	for _, t := range w.tasks() {
		out[t.Name] = t.Spec.Phase
	}
	return out
}

func (w *world) mdRequest(version string) *hooksv1.ExternalUpgradeRequestRequest {
	return &hooksv1.ExternalUpgradeRequestRequest{
		Cluster:              clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: w.ns, Name: "harvester"}},
		MachineDeploymentRef: &inplacev1.MachineDeploymentReference{Name: "workers"},
		NewMachineSpec:       hooksv1.NewMachineSpec{Version: version},
	}
}

func (w *world) cpRequest(version string) *hooksv1.ExternalUpgradeRequestRequest {
	return &hooksv1.ExternalUpgradeRequestRequest{
		Cluster:         clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: w.ns, Name: "harvester"}},
		ControlPlaneRef: &inplacev1.ControlPlaneReference{APIGroup: "controlplane.cluster.x-k8s.io", Kind: "KubeadmControlPlane", Name: "cp"},
		NewMachineSpec:  hooksv1.NewMachineSpec{Version: version},
	}
}

func (w *world) call(req *hooksv1.ExternalUpgradeRequestRequest) *hooksv1.ExternalUpgradeRequestResponse {
	GinkgoHelper()
	resp := &hooksv1.ExternalUpgradeRequestResponse{}
	w.handler.ExternalUpgradeRequest(ctx, req, resp)
	return resp
}

func (w *world) tasks() []inplacev1.UpgradeTask {
	GinkgoHelper()
	list := &inplacev1.UpgradeTaskList{}
	Expect(k8s.List(ctx, list, client.InNamespace(w.ns))).To(Succeed())
	return list.Items
}

func expectDecline(resp *hooksv1.ExternalUpgradeRequestResponse, message string) {
	GinkgoHelper()
	Expect(resp.Status).To(Equal(runtimehooksv1.ResponseStatusSuccess), "message: %s", resp.Message)
	Expect(resp.Decision).To(Equal(hooksv1.DecisionDecline), "message: %s", resp.Message)
	Expect(resp.UpgradeTaskName).To(BeEmpty())
	Expect(resp.Message).To(Equal(message))
}

var annotated = map[string]string{inplacev1.UpdaterAnnotation: updaterAnnotation}

var _ = Describe("ExternalUpgradeRequest", func() {
	It("accepts a valid request with the created UpgradeTask, and the same request twice creates one task", func() {
		w := newWorld(annotated)
		w.controlPlaneRuns("v1.34.1+rke2r1")
		req := w.mdRequest("v1.34.1+rke2r1")
		req.Options = hooksv1.UpgradeOptions{MaxUnavailable: ptr.To(intstr.FromInt32(2)), PauseNodes: []string{"n1"}}
		resp := w.call(req)
		Expect(resp.Status).To(Equal(runtimehooksv1.ResponseStatusSuccess), resp.Message)
		Expect(resp.Decision).To(Equal(hooksv1.DecisionAccept), resp.Message)
		Expect(resp.UpgradeTaskName).To(HavePrefix("workers-v1.34.1-rke2r1-"))

		again := w.call(w.mdRequestWith(req))
		Expect(again.Decision).To(Equal(hooksv1.DecisionAccept))
		Expect(again.UpgradeTaskName).To(Equal(resp.UpgradeTaskName))

		tasks := w.tasks()
		Expect(tasks).To(HaveLen(1))
		t := tasks[0]
		Expect(t.Name).To(Equal(resp.UpgradeTaskName))
		Expect(t.Spec.ClusterName).To(Equal("harvester"))
		Expect(t.Spec.MachineDeploymentRef.Name).To(Equal("workers"))
		Expect(t.Spec.Version).To(Equal("v1.34.1+rke2r1"))
		Expect(t.Spec.UpdaterRef).To(Equal(inplacev1.UpdaterReference{Kind: "ConfigMap", Name: "upgrader"}))
		Expect(t.Spec.Pacing).To(Equal(inplacev1.PacingExtension))
		Expect(*t.Spec.MaxUnavailable).To(Equal(intstr.FromInt32(2)))
		Expect(t.Spec.PauseNodes).To(Equal([]string{"n1"}))
		Expect(t.Labels).To(HaveKeyWithValue(inplacev1.ClusterNameLabel, "harvester"))
	})

	It("creates one task when the same request arrives several times at once", func() {
		w := newWorld(annotated)
		w.controlPlaneRuns("v1.34.1+rke2r1")
		names := make(chan string, 5)
		var wg sync.WaitGroup
		for range 5 {
			wg.Add(1)
			go func() {
				defer GinkgoRecover()
				defer wg.Done()
				resp := &hooksv1.ExternalUpgradeRequestResponse{}
				w.handler.ExternalUpgradeRequest(ctx, w.mdRequest("v1.34.1+rke2r1"), resp)
				Expect(resp.Decision).To(Equal(hooksv1.DecisionAccept), resp.Message)
				names <- resp.UpgradeTaskName
			}()
		}
		wg.Wait()
		close(names)
		seen := map[string]bool{}
		for n := range names {
			seen[n] = true
		}
		Expect(seen).To(HaveLen(1))
		Expect(w.tasks()).To(HaveLen(1))
	})

	It("aborts the older unfinished task of the same target when a new request comes, and leaves other targets alone", func() {
		w := newWorld(annotated)
		By("the workers may ask for the version a live task upgrades the control plane to")
		cp := w.call(w.cpRequest("v1.34.2+rke2r1"))
		Expect(cp.Decision).To(Equal(hooksv1.DecisionAccept), cp.Message)
		first := w.call(w.mdRequest("v1.34.1+rke2r1"))
		Expect(first.Decision).To(Equal(hooksv1.DecisionAccept), first.Message)

		second := w.call(w.mdRequest("v1.34.2+rke2r1"))
		Expect(second.Decision).To(Equal(hooksv1.DecisionAccept))
		Expect(second.UpgradeTaskName).NotTo(Equal(first.UpgradeTaskName))

		phases := map[string]inplacev1.TaskAction{}
		for _, t := range w.tasks() {
			phases[t.Name] = t.Spec.Phase
		}
		Expect(phases).To(Equal(map[string]inplacev1.TaskAction{
			first.UpgradeTaskName:  inplacev1.TaskActionAbort,
			second.UpgradeTaskName: inplacev1.TaskActionOngoing,
			cp.UpgradeTaskName:     inplacev1.TaskActionOngoing,
		}))
	})

	It("retries the same request under a new name once its task failed", func() {
		w := newWorld(annotated)
		w.controlPlaneRuns("v1.34.1+rke2r1")
		first := w.call(w.mdRequest("v1.34.1+rke2r1"))
		t := &inplacev1.UpgradeTask{}
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: w.ns, Name: first.UpgradeTaskName}, t)).To(Succeed())
		t.Status.Phase = inplacev1.TaskPhaseFailed
		Expect(k8s.Status().Update(ctx, t)).To(Succeed())

		retry := w.call(w.mdRequest("v1.34.1+rke2r1"))
		Expect(retry.Decision).To(Equal(hooksv1.DecisionAccept))
		Expect(retry.UpgradeTaskName).To(Equal(first.UpgradeTaskName + "-2"))
		Expect(w.tasks()).To(HaveLen(2))
	})

	It("takes the updater from the request, then from --default-updater, when the Cluster names none", func() {
		w := newWorld(nil)
		w.controlPlaneRuns("v1.34.1+rke2r1")
		req := w.mdRequest("v1.34.1+rke2r1")
		req.UpdaterRef = &inplacev1.UpdaterReference{Kind: "ConfigMap", Name: "upgrader"}
		Expect(w.call(req).Decision).To(Equal(hooksv1.DecisionAccept))

		w2 := newWorld(nil).withDefault("ConfigMap/upgrader")
		resp := w2.call(w2.cpRequest("v1.34.0"))
		Expect(resp.Decision).To(Equal(hooksv1.DecisionAccept), resp.Message)
		Expect(w2.tasks()[0].Spec.UpdaterRef.Name).To(Equal("upgrader"))
	})

	DescribeTable("declines with a reason a person can act on",
		func(clusterAnnotations map[string]string, build func(w *world) *hooksv1.ExternalUpgradeRequestRequest, message func(w *world) string) {
			w := newWorld(clusterAnnotations)
			resp := w.call(build(w))
			expectDecline(resp, message(w))
			Expect(w.tasks()).To(BeEmpty(), "a declined request must create no UpgradeTask")
		},
		Entry("no updater configured", nil,
			func(w *world) *hooksv1.ExternalUpgradeRequestRequest { return w.mdRequest("v1.34.1+rke2r1") },
			func(w *world) string {
				return fmt.Sprintf("no updater configured for Cluster %s/harvester: set the annotation inplace.cluster.x-k8s.io/updater: <Kind>/<name> on the Cluster (for example HarvesterUpgrader/default), pass updaterRef in the request, or start the manager with --default-updater", w.ns)
			}),
		Entry("a version that is not semver", annotated,
			func(w *world) *hooksv1.ExternalUpgradeRequestRequest { return w.mdRequest("1.34") },
			func(*world) string {
				return `version "1.34" is not a valid semantic version: give MAJOR.MINOR.PATCH with an optional v prefix, pre-release and build metadata, for example v1.33.3 or v1.33.3+rke2r1`
			}),
		Entry("no version at all", annotated,
			func(w *world) *hooksv1.ExternalUpgradeRequestRequest { return w.mdRequest("") },
			func(*world) string {
				return "the request carries no version: set newMachineSpec.version (for example v1.33.3 or v1.33.3+rke2r1)"
			}),
		Entry("a downgrade", annotated,
			func(w *world) *hooksv1.ExternalUpgradeRequestRequest { return w.mdRequest("v1.32.9+rke2r1") },
			func(*world) string {
				return "version v1.32.9+rke2r1 is older than v1.33.3+rke2r1, which machine workers-1 already runs: in-place downgrades are not supported"
			}),
		Entry("a downgrade below a version reached in place", annotated,
			func(w *world) *hooksv1.ExternalUpgradeRequestRequest {
				m := w.workers[1].DeepCopy()
				Expect(k8s.Get(ctx, client.ObjectKeyFromObject(m), m)).To(Succeed())
				m.Annotations = map[string]string{inplacev1.UpgradeReleaseAnnotation: "v1.34.2+rke2r1"}
				Expect(k8s.Update(ctx, m)).To(Succeed())
				return w.mdRequest("v1.34.1+rke2r1")
			},
			func(*world) string {
				return "version v1.34.1+rke2r1 is older than v1.34.2+rke2r1, which machine workers-2 already runs: in-place downgrades are not supported"
			}),
		Entry("a downgrade of the distribution's build (+rke2rN ordered by N)", annotated,
			func(w *world) *hooksv1.ExternalUpgradeRequestRequest { return w.mdRequest("v1.33.3+rke2r0") },
			func(*world) string {
				return "version v1.33.3+rke2r0 is older than v1.33.3+rke2r1, which machine workers-1 already runs: in-place downgrades are not supported"
			}),
		Entry("a downgrade of a control plane's K3s build", annotated,
			func(w *world) *hooksv1.ExternalUpgradeRequestRequest {
				for _, m := range w.cps {
					got := &clusterv1.Machine{}
					Expect(k8s.Get(ctx, client.ObjectKeyFromObject(m), got)).To(Succeed())
					got.Annotations = map[string]string{inplacev1.UpgradeReleaseAnnotation: "v1.33.3+k3s10"}
					Expect(k8s.Update(ctx, got)).To(Succeed())
				}
				return w.cpRequest("v1.33.3+k3s9")
			},
			func(*world) string {
				return "version v1.33.3+k3s9 is older than v1.33.3+k3s10, which machine cp-1 already runs: in-place downgrades are not supported"
			}),
		Entry("build metadata that has no order", annotated,
			func(w *world) *hooksv1.ExternalUpgradeRequestRequest { return w.mdRequest("v1.33.3+foo") },
			func(*world) string {
				return "version v1.33.3+foo and v1.33.3+rke2r1, which machine workers-1 runs, cannot be ordered: they differ only in build metadata (+foo and +rke2r1), which has no order: capi-inplace orders only +rke2rN and +k3sN, by N, between two versions of the same form. Ask for a version with a higher MAJOR.MINOR.PATCH, or for the machine's build form with a higher N (for example v1.33.3+rke2r2)"
			}),
		Entry("build metadata dropped", annotated,
			func(w *world) *hooksv1.ExternalUpgradeRequestRequest { return w.mdRequest("v1.33.3") },
			func(*world) string {
				return "version v1.33.3 and v1.33.3+rke2r1, which machine workers-1 runs, cannot be ordered: they differ only in build metadata (none and +rke2r1), which has no order: capi-inplace orders only +rke2rN and +k3sN, by N, between two versions of the same form. Ask for a version with a higher MAJOR.MINOR.PATCH, or for the machine's build form with a higher N (for example v1.33.3+rke2r2)"
			}),
		Entry("workers newer than the control plane", annotated,
			func(w *world) *hooksv1.ExternalUpgradeRequestRequest { return w.mdRequest("v1.34.1+rke2r1") },
			func(w *world) string {
				return fmt.Sprintf("version v1.34.1+rke2r1 is newer than v1.33.3+rke2r1, which control plane machine cp-1 of Cluster %s/harvester runs, and no UpgradeTask upgrades KubeadmControlPlane cp to v1.34.1+rke2r1 or newer: a worker's kubelet must never be newer than its control plane. Upgrade the control plane first (or annotate the Cluster with inplace.cluster.x-k8s.io/in-place-upgrade-to, which upgrades the control plane, then the workers)", w.ns)
			}),
		Entry("one worker machine newer than the control plane", annotated,
			func(w *world) *hooksv1.ExternalUpgradeRequestRequest {
				w.controlPlaneRuns("v1.34.0+rke2r1")
				req := w.mdRequest("v1.34.1+rke2r1")
				req.MachinesRequiringUpgrade = []string{"workers-2"}
				return req
			},
			func(w *world) string {
				return fmt.Sprintf("version v1.34.1+rke2r1 is newer than v1.34.0+rke2r1, which control plane machine cp-1 of Cluster %s/harvester runs, and no UpgradeTask upgrades KubeadmControlPlane cp to v1.34.1+rke2r1 or newer: a worker's kubelet must never be newer than its control plane. Upgrade the control plane first (or annotate the Cluster with inplace.cluster.x-k8s.io/in-place-upgrade-to, which upgrades the control plane, then the workers)", w.ns)
			}),
		Entry("a control plane with maxUnavailable 2", annotated,
			func(w *world) *hooksv1.ExternalUpgradeRequestRequest {
				req := w.cpRequest("v1.34.1+rke2r1")
				req.Options.MaxUnavailable = ptr.To(intstr.FromInt32(2))
				return req
			},
			func(*world) string {
				return "maxUnavailable 2 would let 2 of the 3 machines of KubeadmControlPlane cp be upgraded at once: capi-inplace upgrades a control plane one node at a time, so that etcd and the API servers keep quorum. Set maxUnavailable to 1 or leave it out"
			}),
		Entry("a control plane with maxUnavailable 67%", annotated,
			func(w *world) *hooksv1.ExternalUpgradeRequestRequest {
				req := w.cpRequest("v1.34.1+rke2r1")
				req.Options.MaxUnavailable = ptr.To(intstr.FromString("67%"))
				return req
			},
			func(*world) string {
				return "maxUnavailable 67% would let 2 of the 3 machines of KubeadmControlPlane cp be upgraded at once: capi-inplace upgrades a control plane one node at a time, so that etcd and the API servers keep quorum. Set maxUnavailable to 1 or leave it out"
			}),
		Entry("a control plane skipping a minor version", annotated,
			func(w *world) *hooksv1.ExternalUpgradeRequestRequest { return w.cpRequest("v1.35.0+rke2r1") },
			func(*world) string {
				return "control plane machine cp-1 runs v1.33.3+rke2r1; v1.35.0+rke2r1 would skip a minor version, which Kubernetes does not support for a control plane: upgrade to v1.34 first"
			}),
		Entry("unknown machines", annotated,
			func(w *world) *hooksv1.ExternalUpgradeRequestRequest {
				req := w.mdRequest("v1.34.1+rke2r1")
				req.MachinesRequiringUpgrade = []string{"workers-1", "ghost", "cp-1"}
				return req
			},
			func(w *world) string {
				return fmt.Sprintf("machine(s) cp-1, ghost are not machines of MachineDeployment workers in Cluster %s/harvester", w.ns)
			}),
		Entry("a MachineDeployment of another Cluster", annotated,
			func(w *world) *hooksv1.ExternalUpgradeRequestRequest {
				_, err := fixtures.Cluster(ctx, k8s, w.ns, "other", "", nil)
				Expect(err).NotTo(HaveOccurred())
				_, _, err = fixtures.MachineDeployment(ctx, k8s, w.ns, "other", "other-workers", "v1.33.3", 1)
				Expect(err).NotTo(HaveOccurred())
				req := w.mdRequest("v1.34.1+rke2r1")
				req.MachineDeploymentRef.Name = "other-workers"
				return req
			},
			func(w *world) string {
				return fmt.Sprintf("MachineDeployment %s/other-workers belongs to Cluster other, not to Cluster harvester", w.ns)
			}),
		Entry("a control plane that is not the Cluster's", annotated,
			func(w *world) *hooksv1.ExternalUpgradeRequestRequest {
				req := w.cpRequest("v1.34.1+rke2r1")
				req.ControlPlaneRef.Name = "other-cp"
				return req
			},
			func(w *world) string {
				return fmt.Sprintf("KubeadmControlPlane %s/other-cp is not the control plane of Cluster harvester (its spec.controlPlaneRef names KubeadmControlPlane cp)", w.ns)
			}),
		Entry("a MachineDeployment that does not exist", annotated,
			func(w *world) *hooksv1.ExternalUpgradeRequestRequest {
				req := w.mdRequest("v1.34.1+rke2r1")
				req.MachineDeploymentRef.Name = "nope"
				return req
			},
			func(w *world) string { return fmt.Sprintf("MachineDeployment %s/nope not found", w.ns) }),
		Entry("a Cluster that does not exist", annotated,
			func(w *world) *hooksv1.ExternalUpgradeRequestRequest {
				req := w.mdRequest("v1.34.1+rke2r1")
				req.Cluster.Name = "nope"
				return req
			},
			func(w *world) string { return fmt.Sprintf("Cluster %s/nope not found", w.ns) }),
		Entry("both a control plane and a MachineDeployment", annotated,
			func(w *world) *hooksv1.ExternalUpgradeRequestRequest {
				req := w.mdRequest("v1.34.1+rke2r1")
				req.ControlPlaneRef = w.cpRequest("v1.34.1").ControlPlaneRef
				return req
			},
			func(*world) string {
				return "the request must name exactly one of controlPlaneRef or machineDeploymentRef"
			}),
		Entry("an updater annotation that is malformed", map[string]string{inplacev1.UpdaterAnnotation: "HarvesterUpgrader"},
			func(w *world) *hooksv1.ExternalUpgradeRequestRequest { return w.mdRequest("v1.34.1+rke2r1") },
			func(w *world) string {
				return fmt.Sprintf(`the Cluster's inplace.cluster.x-k8s.io/updater annotation of Cluster %s/harvester: updater reference "HarvesterUpgrader" is not of the form Kind/name (for example HarvesterUpgrader/default)`, w.ns)
			}),
		Entry("an updater kind nobody serves", map[string]string{inplacev1.UpdaterAnnotation: "HarvesterUpgrader/default"},
			func(w *world) *hooksv1.ExternalUpgradeRequestRequest { return w.mdRequest("v1.34.1+rke2r1") },
			func(*world) string {
				return "updater kind HarvesterUpgrader (from HarvesterUpgrader/default) is not served: the manager runs no updater for it and no CustomResourceDefinition of that kind carries the label inplace.cluster.x-k8s.io/node-updater=v1alpha1; install its updater or name another (named by the Cluster's inplace.cluster.x-k8s.io/updater annotation)"
			}),
		Entry("an updater object that does not exist", map[string]string{inplacev1.UpdaterAnnotation: "ConfigMap/missing"},
			func(w *world) *hooksv1.ExternalUpgradeRequestRequest { return w.mdRequest("v1.34.1+rke2r1") },
			func(w *world) string {
				return fmt.Sprintf("updater ConfigMap/missing not found in namespace %s: create the ConfigMap object or name another updater (named by the Cluster's inplace.cluster.x-k8s.io/updater annotation)", w.ns)
			}),
	)

	It("declines when a task of another origin holds the name the request would get", func() {
		w := newWorld(annotated)
		w.controlPlaneRuns("v1.34.1+rke2r1")
		first := w.call(w.mdRequest("v1.34.1+rke2r1"))
		Expect(first.Decision).To(Equal(hooksv1.DecisionAccept))
		t := &inplacev1.UpgradeTask{}
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: w.ns, Name: first.UpgradeTaskName}, t)).To(Succeed())
		Expect(k8s.Delete(ctx, t)).To(Succeed())
		byHand := &inplacev1.UpgradeTask{
			ObjectMeta: metav1.ObjectMeta{Namespace: w.ns, Name: first.UpgradeTaskName},
			Spec:       *t.Spec.DeepCopy(),
		}
		Expect(k8s.Create(ctx, byHand)).To(Succeed())

		expectDecline(w.call(w.mdRequest("v1.34.1+rke2r1")),
			fmt.Sprintf("UpgradeTask %s/%s exists and was not created by this request; delete it or rename it", w.ns, first.UpgradeTaskName))
	})

	It("accepts a control plane at maxUnavailable 1 or a percentage that is one node, and a worker's maxUnavailable above 1", func() {
		w := newWorld(annotated)
		for _, mu := range []intstr.IntOrString{intstr.FromInt32(1), intstr.FromString("50%")} {
			req := w.cpRequest("v1.34.1+rke2r1")
			req.Options.MaxUnavailable = ptr.To(mu)
			resp := w.call(req)
			Expect(resp.Decision).To(Equal(hooksv1.DecisionAccept), "%s: %s", mu.String(), resp.Message)
		}
		w.controlPlaneRuns("v1.34.1+rke2r1")
		req := w.mdRequest("v1.34.1+rke2r1")
		req.Options.MaxUnavailable = ptr.To(intstr.FromInt32(3))
		resp := w.call(req)
		Expect(resp.Decision).To(Equal(hooksv1.DecisionAccept), resp.Message)
	})

	It("declines a control plane maxUnavailable above 1 without aborting the live task of that control plane", func() {
		w := newWorld(annotated)
		first := w.call(w.cpRequest("v1.34.1+rke2r1"))
		Expect(first.Decision).To(Equal(hooksv1.DecisionAccept), first.Message)
		before := w.phases()
		req := w.cpRequest("v1.34.2+rke2r1")
		req.Options.MaxUnavailable = ptr.To(intstr.FromInt32(3))
		resp := w.call(req)
		expectDecline(resp, "maxUnavailable 3 would let 3 of the 3 machines of KubeadmControlPlane cp be upgraded at once: capi-inplace upgrades a control plane one node at a time, so that etcd and the API servers keep quorum. Set maxUnavailable to 1 or leave it out")
		Expect(resp.Reason).To(Equal("ControlPlaneMaxUnavailable"))
		Expect(w.phases()).To(Equal(before), "a refused request creates and aborts nothing")
		Expect(before).To(Equal(map[string]inplacev1.TaskAction{first.UpgradeTaskName: inplacev1.TaskActionOngoing}))
	})

	It("declines workers newer than the control plane with reason VersionSkew, and changes nothing", func() {
		w := newWorld(annotated)
		By("a live task upgrading the control plane to an older version than the workers' does not count")
		cp := w.call(w.cpRequest("v1.34.0+rke2r1"))
		Expect(cp.Decision).To(Equal(hooksv1.DecisionAccept), cp.Message)
		before := w.phases()
		resp := w.call(w.mdRequest("v1.34.1+rke2r1"))
		Expect(resp.Decision).To(Equal(hooksv1.DecisionDecline), resp.Message)
		Expect(resp.Reason).To(Equal(inplacev1.VersionSkewReason))
		Expect(w.phases()).To(Equal(before), "a refused request creates and aborts nothing")

		By("neither does a dry run of the control plane's upgrade")
		dry := w.cpRequest("v1.34.1+rke2r1")
		dry.Options.DryRun = true
		Expect(w.call(dry).Decision).To(Equal(hooksv1.DecisionAccept))
		before = w.phases()
		resp = w.call(w.mdRequest("v1.34.1+rke2r1"))
		Expect(resp.Reason).To(Equal(inplacev1.VersionSkewReason), resp.Message)
		Expect(w.phases()).To(Equal(before))
	})

	It("counts a Planned dry run as live: the same request finds it, a newer request aborts it", func() {
		w := newWorld(annotated)
		w.controlPlaneRuns("v1.34.2+rke2r1")
		dry := w.mdRequest("v1.34.1+rke2r1")
		dry.Options.DryRun = true
		first := w.call(dry)
		Expect(first.Decision).To(Equal(hooksv1.DecisionAccept), first.Message)
		t := &inplacev1.UpgradeTask{}
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: w.ns, Name: first.UpgradeTaskName}, t)).To(Succeed())
		t.Status.Phase = inplacev1.TaskPhasePlanned
		Expect(k8s.Status().Update(ctx, t)).To(Succeed())

		again := w.call(w.mdRequestWith(dry))
		Expect(again.UpgradeTaskName).To(Equal(first.UpgradeTaskName), "the same dry run again is the same task")
		Expect(w.tasks()).To(HaveLen(1))

		second := w.call(w.mdRequest("v1.34.2+rke2r1"))
		Expect(second.Decision).To(Equal(hooksv1.DecisionAccept), second.Message)
		Expect(w.phases()).To(Equal(map[string]inplacev1.TaskAction{
			first.UpgradeTaskName:  inplacev1.TaskActionAbort,
			second.UpgradeTaskName: inplacev1.TaskActionOngoing,
		}))
	})

	It("aborts the older task even when it declines the new request", func() {
		w := newWorld(annotated)
		w.controlPlaneRuns("v1.34.1+rke2r1")
		first := w.call(w.mdRequest("v1.34.1+rke2r1"))
		Expect(first.Decision).To(Equal(hooksv1.DecisionAccept))
		resp := w.call(w.mdRequest("v1.32.0"))
		Expect(resp.Decision).To(Equal(hooksv1.DecisionDecline))
		Expect(resp.Message).To(HaveSuffix(fmt.Sprintf("(the older unfinished UpgradeTask(s) %s of MachineDeployment workers were aborted)", first.UpgradeTaskName)))
		t := &inplacev1.UpgradeTask{}
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: w.ns, Name: first.UpgradeTaskName}, t)).To(Succeed())
		Expect(t.Spec.Phase).To(Equal(inplacev1.TaskActionAbort))
	})
})

func (w *world) mdRequestWith(req *hooksv1.ExternalUpgradeRequestRequest) *hooksv1.ExternalUpgradeRequestRequest {
	return req.DeepCopy()
}
