package sim_test

import (
	"fmt"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capi-inplace/capi-inplace/test/sim"
)

var _ = Describe("A Follower", func() {
	It("goes on after the API server ends its watch, from where it stopped, losing no change", func() {
		namespace := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "follow-"}}
		Expect(env.Client.Create(ctx, namespace)).To(Succeed())
		ns := namespace.Name
		wc, err := client.NewWithWatch(env.Config, client.Options{Scheme: env.Scheme})
		Expect(err).NotTo(HaveOccurred())
		var mu sync.Mutex
		var seen []string
		// The first watch asks the server to end it after a second, as the server ends a
		// watch whose reader falls behind; the follower's next watches do not ask it.
		f, err := sim.Follow(ctx, wc, &corev1.ConfigMapList{}, func(ev watch.Event) {
			if cm, ok := ev.Object.(*corev1.ConfigMap); ok && cm.Name != "kube-root-ca.crt" {
				mu.Lock()
				seen = append(seen, fmt.Sprintf("%s %s=%s", ev.Type, cm.Name, cm.Data["v"]))
				mu.Unlock()
			}
		}, client.InNamespace(ns), &client.ListOptions{Raw: &metav1.ListOptions{TimeoutSeconds: ptr.To[int64](1)}})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(f.Stop)

		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "c"}, Data: map[string]string{"v": "1"}}
		Expect(env.Client.Create(ctx, cm)).To(Succeed())
		time.Sleep(1500 * time.Millisecond) // the first watch has ended
		for _, v := range []string{"2", "3"} {
			cm.Data["v"] = v
			Expect(env.Client.Update(ctx, cm)).To(Succeed())
		}
		Expect(env.Client.Delete(ctx, cm)).To(Succeed())
		Eventually(func() []string {
			mu.Lock()
			defer mu.Unlock()
			return append([]string(nil), seen...)
		}, 10*time.Second, 20*time.Millisecond).Should(Equal([]string{"ADDED c=1", "MODIFIED c=2", "MODIFIED c=3", "DELETED c=3"}))
		Consistently(f.Gaps, 200*time.Millisecond).Should(BeZero())
	})
})
