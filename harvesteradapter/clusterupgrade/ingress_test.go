package clusterupgrade_test

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/capi-inplace/capi-inplace/harvesteradapter/clusterupgrade"
)

// ensure_ingress_class_name (harvester-release-steps.md fact 21).
var _ = Describe("Run and Rancher's Ingress", func() {
	ingressClass := func() *string {
		GinkgoHelper()
		ing := &networkingv1.Ingress{}
		Expect(env.Client.Get(ctx, clusterupgrade.RancherExposeKey, ing)).To(Succeed())
		return ing.Spec.IngressClassName
	}
	class := func(name string, isDefault bool) {
		GinkgoHelper()
		c := &networkingv1.IngressClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: networkingv1.IngressClassSpec{Controller: "example.com/" + name}}
		if isDefault {
			// The script selects on the annotation's presence, whatever its value.
			c.Annotations = map[string]string{"ingressclass.kubernetes.io/is-default-class": "false"}
		}
		Expect(env.Client.Create(ctx, c)).To(Succeed())
		DeferCleanup(func() { Expect(env.Client.Delete(ctx, c)).To(Succeed()) })
	}

	It("gives rancher-expose nginx when no IngressClass is the default", func() {
		seed(oldRelease)
		settle()
		Expect(ingressClass()).To(BeNil(), "seeded without a class, as an older install")
		steps := runStates(input("up-ing-none"), newProgress())
		Expect(ingressClass()).To(Equal(ptr.To("nginx")))
		Expect(stepNamed(steps, clusterupgrade.StepEnsureIngressClassName).Message).To(ContainSubstring("given ingress class nginx (no IngressClass is the default)"))
	})

	It("gives rancher-expose the oldest IngressClass that carries the default annotation, and a second run keeps it", func() {
		seed(oldRelease)
		settle()
		class("traefik", false)
		class("z-first", true)
		time.Sleep(1100 * time.Millisecond) // creationTimestamp has a resolution of a second
		class("a-second", true)
		p := newProgress()
		runStates(input("up-ing-oldest"), p)
		Expect(ingressClass()).To(Equal(ptr.To("z-first")))
		steps := runStates(input("up-ing-oldest"), p)
		Expect(stepNamed(steps, clusterupgrade.StepEnsureIngressClassName).Message).To(ContainSubstring("has ingress class z-first (done by an earlier run)"))
	})

	It("keeps a class an operator set", func() {
		seed(oldRelease)
		settle()
		ing := &networkingv1.Ingress{}
		Expect(env.Client.Get(ctx, clusterupgrade.RancherExposeKey, ing)).To(Succeed())
		ing.Spec.IngressClassName = ptr.To("traefik")
		Expect(env.Client.Update(ctx, ing)).To(Succeed())
		steps := runStates(input("up-ing-operator"), newProgress())
		Expect(ingressClass()).To(Equal(ptr.To("traefik")))
		Expect(stepNamed(steps, clusterupgrade.StepEnsureIngressClassName).State).To(Equal(clusterupgrade.StateSkipped))
	})
})
