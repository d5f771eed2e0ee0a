package upgradetask

import (
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
)

// pendingTainted lists which of the named nodes carry the upgrade-pending taint, as the
// API server has them.
func pendingTainted(nodes ...string) []string {
	var out []string
	for _, name := range nodes {
		n := &corev1.Node{}
		Expect(k8s.Get(ctx, client.ObjectKey{Name: name}, n)).To(Succeed())
		for _, t := range n.Spec.Taints {
			if t.Key == inplacev1.UpgradePendingTaint {
				out = append(out, name)
			}
		}
	}
	return out
}
