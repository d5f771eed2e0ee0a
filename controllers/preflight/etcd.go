package preflight

import (
	"context"
	"slices"

	"k8s.io/apimachinery/pkg/types"

	"github.com/capi-inplace/capi-inplace/workloadcluster/etcdhealth"
)

// EtcdView reads etcd's own view of a Cluster's control plane (etcdhealth.Views in the
// manager). An error says that the view could not be read.
type EtcdView interface {
	Read(ctx context.Context, cluster types.NamespacedName, controlPlaneNodes []string) (etcdhealth.Report, error)
}

// EtcdHealthy holds a control plane node unless etcd itself says that the control plane
// is whole: every control plane node a started, voting member, every member answering
// with a leader, no alarm (or, where the management cluster holds no etcd CA, the API
// server's /readyz/etcd and the etcd static pods). Node Ready and a MachineHealthCheck
// say that a kubelet answers, not that etcd would keep its quorum without this node. An
// etcd that cannot be read holds the node; it never passes it. It passes for
// MachineDeployments.
type EtcdHealthy struct {
	// View reads etcd's view.
	View EtcdView
}

// Name implements Check.
func (EtcdHealthy) Name() string { return EtcdHealthyName }

// Check implements Check. The view is read once per round (Input), whatever the number
// of candidates.
func (e EtcdHealthy) Check(ctx context.Context, in *Input, _ MachineNode) Result {
	if !in.ControlPlane {
		return passed(EtcdHealthyName)
	}
	if e.View == nil {
		return failed(EtcdHealthyName, "no view of etcd is configured; the manager holds control plane nodes until it has one")
	}
	if in.etcd == nil {
		var nodes []string
		for _, m := range in.ControlPlaneMachines {
			if name := m.NodeName(); name != "" {
				nodes = append(nodes, name)
			}
		}
		slices.Sort(nodes)
		report, err := e.View.Read(ctx, types.NamespacedName{Namespace: in.Cluster.Namespace, Name: in.Cluster.Name}, nodes)
		in.etcd = &etcdRead{report: report, err: err}
	}
	r := in.etcd
	switch {
	case r.err != nil:
		return failed(EtcdHealthyName, "etcd's view could not be read (%s): %v; the node is held until it can", r.report.Source, r.err)
	case !r.report.Healthy():
		return failed(EtcdHealthyName, "etcd is not healthy according to %s: %s", r.report.Source, joinLimited(r.report.Problems, 5))
	}
	return passed(EtcdHealthyName)
}

// etcdRead is etcd's view as read once in a round.
type etcdRead struct {
	report etcdhealth.Report
	err    error
}
