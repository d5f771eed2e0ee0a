package clusterupgrade_test

import (
	"encoding/json"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capi-inplace/capi-inplace/harvesteradapter/clusterupgrade"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher"
)

// update_local_rke_state_secret (harvester-release-steps.md fact 18).
var _ = Describe("Run and the local-rke-state Secret", func() {
	stateKey := client.ObjectKey{Namespace: rancher.FleetLocal, Name: rancher.LocalRKEStateSecret}
	backupKey := client.ObjectKey{Namespace: rancher.FleetLocal, Name: "capi-inplace-local-rke-state-backup"}
	rancherKey := client.ObjectKey{Namespace: rancher.CattleSystem, Name: rancher.RancherDeployment}
	data := map[string][]byte{"serverToken": []byte("server-token"), "agentToken": []byte("agent-token")}

	// makeOpaque replaces the seeded state Secret by an Opaque one, as a cluster installed
	// before Rancher v2.7 has it.
	makeOpaque := func() {
		GinkgoHelper()
		s := &corev1.Secret{}
		Expect(env.Client.Get(ctx, stateKey, s)).To(Succeed())
		Expect(env.Client.Delete(ctx, s)).To(Succeed())
		opaque := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: stateKey.Namespace, Name: stateKey.Name, Labels: map[string]string{"kept": "yes"}}, Type: corev1.SecretTypeOpaque, Data: data}
		Expect(env.Client.Create(ctx, opaque)).To(Succeed())
	}
	expectConverted := func() {
		GinkgoHelper()
		s := &corev1.Secret{}
		Expect(env.Client.Get(ctx, stateKey, s)).To(Succeed())
		Expect(string(s.Type)).To(Equal(rancher.RKEClusterStateType))
		Expect(s.Data).To(Equal(data), "the state is kept")
		Expect(s.Labels).To(HaveKeyWithValue("kept", "yes"))
		Expect(apierrors.IsNotFound(env.Client.Get(ctx, backupKey, &corev1.Secret{}))).To(BeTrue(), "the copy is gone")
		dep := &appsv1.Deployment{}
		Expect(env.Client.Get(ctx, rancherKey, dep)).To(Succeed())
		Expect(ptr.Deref(dep.Spec.Replicas, 1)).To(Equal(int32(3)), "Rancher is back at its replicas")
	}

	It("leaves a Secret of Rancher's type alone", func() {
		seed(oldRelease)
		settle()
		steps := runStates(input("up-rke-typed"), newProgress())
		Expect(stepNamed(steps, clusterupgrade.StepUpdateLocalRKEStateSecret).State).To(Equal(clusterupgrade.StateSkipped))
		Expect(stepNamed(steps, clusterupgrade.StepUpdateLocalRKEStateSecret).Message).To(ContainSubstring("is of type rke.cattle.io/cluster-state"))
	})

	It("re-creates an Opaque Secret with Rancher's type and its content, Rancher scaled to 0 meanwhile and back", func() {
		seed(oldRelease)
		settle()
		makeOpaque()
		steps := runStates(input("up-rke-opaque"), newProgress())
		expectConverted()
		Expect(stepNamed(steps, clusterupgrade.StepUpdateLocalRKEStateSecret).Message).To(ContainSubstring("Rancher scaled to 0 meanwhile and back to 3"))
	})

	// halfWay leaves the cluster as a run that died half-way through the conversion: it
	// kept the copy, recorded Rancher's replicas, scaled Rancher to 0 and deleted the
	// Secret.
	halfWay := func(p clusterupgrade.Progress) {
		GinkgoHelper()
		Expect(env.Client.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: p.ConfigMap.Namespace, Name: p.ConfigMap.Name}})).To(Succeed())
		s := &corev1.Secret{}
		Expect(env.Client.Get(ctx, stateKey, s)).To(Succeed())
		Expect(env.Client.Delete(ctx, s)).To(Succeed())
		backup := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: backupKey.Namespace, Name: backupKey.Name, Labels: map[string]string{"kept": "yes"}}, Type: corev1.SecretTypeOpaque, Data: data}
		Expect(env.Client.Create(ctx, backup)).To(Succeed())
		DeferCleanup(func() { Expect(client.IgnoreNotFound(env.Client.Delete(ctx, backup))).To(Succeed()) })
		Expect(clusterupgrade.Record(ctx, env.Client, p.ConfigMap, rancherKey, clusterupgrade.FieldRancherReplicas, json.RawMessage("3"))).To(Succeed())
		dep := &appsv1.Deployment{}
		Expect(env.Client.Get(ctx, rancherKey, dep)).To(Succeed())
		dep.Spec.Replicas = ptr.To[int32](0)
		Expect(env.Client.Update(ctx, dep)).To(Succeed())
	}

	It("finishes, from its copy, a conversion an earlier run left with the Secret deleted and Rancher at 0", func() {
		seed(oldRelease)
		settle()
		p := newProgress()
		halfWay(p)
		steps := runStates(input("up-rke-resume"), p)
		Expect(stepNamed(steps, clusterupgrade.StepUpdateLocalRKEStateSecret).State).To(Equal(clusterupgrade.StateDone))
		expectConverted()
	})

	It("has Restore finish such a conversion when the plan ends", func() {
		seed(oldRelease)
		settle()
		p := newProgress()
		halfWay(p)
		Expect(clusterupgrade.Restore(ctx, env.Client, p.ConfigMap)).To(Succeed())
		expectConverted()
		Expect(clusterupgrade.Restore(ctx, env.Client, p.ConfigMap)).To(Succeed(), "again: nothing left to do")
		expectConverted()
	})
})
