// Package preflight holds the checks that decide whether a node may be started now, as
// small named units shared by the UpgradeTask controller and Cluster API's UpdateMachine
// hook path. Node checks (Check) look at one candidate machine; gates (Gate) look at the
// task as a whole (paused, maintenance window, soak delay) and hold every node at once.
package preflight

import (
	"context"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/controllers/disruption"
	"github.com/capi-inplace/capi-inplace/nodeupdater"
)

// Result is the outcome of one named check for one node (the same type updaters return).
type Result = nodeupdater.CheckResult

// MachineNode is a Machine with its Node in the workload cluster, as read for this round.
type MachineNode struct {
	// Machine is the CAPI Machine.
	Machine *clusterv1.Machine
	// Node is the Machine's Node; nil when the machine has no nodeRef or the Node was not found.
	Node *corev1.Node
}

// NodeName is the name of the machine's node, from the node itself or the machine's nodeRef.
func (m MachineNode) NodeName() string {
	if m.Node != nil {
		return m.Node.Name
	}
	if m.Machine != nil {
		return m.Machine.Status.NodeRef.Name
	}
	return ""
}

// Input is what every check may look at, read once per round.
type Input struct {
	// Cluster is the CAPI Cluster.
	Cluster *clusterv1.Cluster
	// Version is the target version.
	Version string
	// UpdaterRef names the updater configuration.
	UpdaterRef inplacev1.UpdaterReference
	// ControlPlane is true when the target is a control plane.
	ControlPlane bool
	// MaxUnavailable is the resolved number of nodes of the target that may be unavailable at once.
	MaxUnavailable int
	// Unavailable names the nodes (or machines without one) of the target that are
	// unavailable now: NotReady or missing, being upgraded, or picked earlier this round.
	Unavailable []string
	// ControlPlaneMachines are every machine of the control plane, when ControlPlane is true.
	ControlPlaneMachines []MachineNode
	// Budget is what is disrupted in the whole Cluster now, across every task and path;
	// nil means nothing is known to be.
	Budget *disruption.Budget
	// Picked are the machines this round already picked to start with the candidate.
	Picked []MachineNode

	// etcd is etcd's view as EtcdHealthy read it this round; nil until it has.
	etcd *etcdRead
}

// disruptedExcept names the Cluster's disrupted nodes other than the candidate's.
func (in *Input) disruptedExcept(c MachineNode) []string {
	if in.Budget == nil {
		return nil
	}
	return in.Budget.DisruptedNodes(c.Machine.Name)
}

// pickedNodes names the nodes picked earlier this round.
func (in *Input) pickedNodes() []string {
	out := make([]string, 0, len(in.Picked))
	for _, p := range in.Picked {
		out = append(out, p.NodeName())
	}
	slices.Sort(out)
	return out
}

// Check is one named preflight check of a candidate node.
type Check interface {
	// Name names the check in conditions, events and messages, for example NodeReady.
	Name() string
	// Check says whether the candidate may be started now, and if not, why.
	Check(ctx context.Context, in *Input, candidate MachineNode) Result
}

// Default returns the checks every node passes before it is started, in the order they
// are reported: node checks first, then availability, control plane health and the
// updater's own checks (which may be the most expensive, so they run last).
func Default(registry *nodeupdater.Registry) []Check {
	return []Check{NodeReady{}, NotDeleting{}, NodeSchedulable{}, Availability{}, ControlPlaneHealthy{}, ControlPlaneQuorum{}, UpdaterChecks{Registry: registry}}
}

// WithEtcd returns the Default checks with etcd's own view of the control plane
// (EtcdHealthy) after ControlPlaneQuorum: the manager's checks. A control plane node is
// then started only when etcd says that its control plane is whole.
func WithEtcd(registry *nodeupdater.Registry, view EtcdView) []Check {
	return []Check{NodeReady{}, NotDeleting{}, NodeSchedulable{}, Availability{}, ControlPlaneHealthy{}, ControlPlaneQuorum{}, EtcdHealthy{View: view}, UpdaterChecks{Registry: registry}}
}

// Run runs every check for a candidate and returns every result, in order.
func Run(ctx context.Context, checks []Check, in *Input, candidate MachineNode) []Result {
	out := make([]Result, 0, len(checks))
	for _, c := range checks {
		out = append(out, c.Check(ctx, in, candidate))
	}
	return out
}

// FirstFailure returns the first result that did not pass, or nil when all passed.
func FirstFailure(results []Result) *Result {
	for i := range results {
		if !results[i].Passed {
			return &results[i]
		}
	}
	return nil
}

// Describe renders a failed result for a message: "<name>: <message>".
func Describe(r Result) string {
	return r.Name + ": " + r.Message
}

// ResolveMaxUnavailable turns maxUnavailable (an integer or a percentage of total,
// rounded down) into a number of nodes, never less than one.
func ResolveMaxUnavailable(maxUnavailable *intstr.IntOrString, total int) (int, error) {
	if maxUnavailable == nil {
		return 1, nil
	}
	n, err := intstr.GetScaledValueFromIntOrPercent(maxUnavailable, total, false)
	if err != nil {
		return 0, fmt.Errorf("maxUnavailable %s: %w", maxUnavailable.String(), err)
	}
	if n < 1 {
		n = 1
	}
	return n, nil
}

// NodeIsReady reports whether the node's Ready condition is True.
func NodeIsReady(node *corev1.Node) bool {
	if node == nil {
		return false
	}
	for _, c := range node.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func passed(name string) Result { return Result{Name: name, Passed: true} }

func failed(name, format string, args ...any) Result {
	return Result{Name: name, Passed: false, Message: fmt.Sprintf(format, args...)}
}

func joinLimited(names []string, limit int) string {
	if len(names) <= limit {
		return strings.Join(names, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(names[:limit], ", "), len(names)-limit)
}
