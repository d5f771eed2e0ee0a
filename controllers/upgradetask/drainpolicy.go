package upgradetask

import (
	"encoding/json"
	"fmt"
	"strings"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
)

// drainPolicy is the drain policy the task's NodeUpdates carry: the task's own
// spec.drainPolicy, else the Cluster's drain-policy annotation, else none (Hold). A
// Cluster annotation that cannot be used is the problem returned, which holds the task's
// new nodes (the DrainPolicy gate) until a person fixes or removes it: a node must not
// start under a policy other than the one asked.
func drainPolicy(task *inplacev1.UpgradeTask, cluster *clusterv1.Cluster) (*inplacev1.DrainPolicy, string) {
	if task.Spec.DrainPolicy != nil {
		return task.Spec.DrainPolicy.DeepCopy(), ""
	}
	if cluster == nil {
		return nil, ""
	}
	raw, ok := cluster.Annotations[inplacev1.DrainPolicyAnnotation]
	if !ok {
		return nil, ""
	}
	bad := func(why string) (*inplacev1.DrainPolicy, string) {
		return nil, fmt.Sprintf("the Cluster %s annotation %s=%q is not usable: %s; write a JSON drain policy such as {\"mode\":\"Skip\",\"gracePeriod\":\"10m\"} or remove the annotation",
			cluster.Name, inplacev1.DrainPolicyAnnotation, raw, why)
	}
	p := &inplacev1.DrainPolicy{}
	dec := json.NewDecoder(strings.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(p); err != nil {
		return bad(err.Error())
	}
	switch p.Mode {
	case "":
		p.Mode = inplacev1.DrainModeHold
	case inplacev1.DrainModeHold, inplacev1.DrainModeSkip, inplacev1.DrainModeEvict:
	default:
		return bad(fmt.Sprintf("mode %q is not %s, %s or %s", p.Mode, inplacev1.DrainModeHold, inplacev1.DrainModeSkip, inplacev1.DrainModeEvict))
	}
	if p.GracePeriod != nil && p.GracePeriod.Duration <= 0 {
		return bad("gracePeriod must be more than 0s")
	}
	return p, ""
}
