package v1alpha1_test

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
)

var _ = Describe("A drain policy", func() {
	It("defaults to Hold with a 10m grace period, and refuses an unknown mode or a grace period of 0", func() {
		task := validTask()
		task.Spec.DrainPolicy = &inplacev1.DrainPolicy{}
		Expect(k8s.Create(ctx, task)).To(Succeed())
		got := &inplacev1.UpgradeTask{}
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(task), got)).To(Succeed())
		Expect(got.Spec.DrainPolicy.Mode).To(Equal(inplacev1.DrainModeHold))
		Expect(got.Spec.DrainPolicy.GracePeriod).To(Equal(&metav1.Duration{Duration: 10 * time.Minute}))

		bad := validTask()
		bad.Spec.DrainPolicy = &inplacev1.DrainPolicy{Mode: "Force"}
		expectInvalid(k8s.Create(ctx, bad), `supported values: "Hold", "Evict", "Skip"`)

		bad = validTask()
		bad.Spec.DrainPolicy = &inplacev1.DrainPolicy{Mode: inplacev1.DrainModeEvict, GracePeriod: &metav1.Duration{}}
		expectInvalid(k8s.Create(ctx, bad), "drainPolicy.gracePeriod must be more than 0s")

		evict := validTask()
		evict.Spec.DrainPolicy = &inplacev1.DrainPolicy{Mode: inplacev1.DrainModeEvict, GracePeriod: &metav1.Duration{Duration: 2 * time.Second}}
		Expect(k8s.Create(ctx, evict)).To(Succeed())
	})

	It("is fixed on a NodeUpdate once set", func() {
		nu := validNodeUpdate()
		nu.Spec.DrainPolicy = &inplacev1.DrainPolicy{Mode: inplacev1.DrainModeEvict, GracePeriod: &metav1.Duration{Duration: time.Minute}}
		Expect(k8s.Create(ctx, nu)).To(Succeed())
		nu.Spec.DrainPolicy.Mode = inplacev1.DrainModeHold
		expectInvalid(k8s.Update(ctx, nu), "drainPolicy is immutable")
	})
})
