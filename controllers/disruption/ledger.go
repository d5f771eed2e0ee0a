package disruption

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
)

// The disruption ledger of a Cluster is the one place where the NodeUpdates that are past
// their first disruption (their node cordoned by the updater, RKE2 restarting, the reboot
// armed) are written down, across every task and path. An updater asks it before each
// disruptive step (Admit): the answer is read from the API server, not from a cache, and
// the claim is written with the ledger's resourceVersion as a precondition, so two
// NodeUpdates that ask at the same moment cannot both pass where the budget has room for
// one: the second write conflicts, reads the first claim and holds.
//
// The ledger is a coordination.k8s.io Lease in the Cluster's namespace (a Lease, not a
// ConfigMap, so the manager needs no rights on ConfigMaps), owned by nothing and holding
// its entries in one annotation. An entry whose NodeUpdate has ended, is gone or was made
// again (another UID) is dropped by the next Admit: the ledger needs no clean-up to stay
// right, and deleting it by hand only loses claims that the next steps write again.

// The ledger Lease of each Cluster, in the Cluster's namespace.
// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=get;create;update

// LedgerAnnotation holds the ledger's entries, as JSON, on the Lease.
const LedgerAnnotation = inplacev1.AnnotationPrefix + "disrupting"

// Annotations the UpgradeTask controller sets on each NodeUpdate it starts, for the
// ledger: the target the node belongs to and the task's maxUnavailable resolved against
// that target. A NodeUpdate without them (started by hand, or by a manager that predates
// them) is judged with its owning task's spec read live, else with a budget of one.
const (
	TargetAnnotation         = inplacev1.AnnotationPrefix + "target"
	MaxUnavailableAnnotation = inplacev1.AnnotationPrefix + "max-unavailable"
)

// Target values name the kind of target first, so the control plane is recognized.
const (
	controlPlaneTargetPrefix = "ControlPlane/"
	// MachineDeploymentTargetPrefix prefixes the target of a MachineDeployment's nodes.
	MachineDeploymentTargetPrefix = "MachineDeployment/"
)

// ControlPlaneTarget is the target value of a control plane's nodes.
func ControlPlaneTarget(name string) string { return controlPlaneTargetPrefix + name }

// LedgerName is the name of the Cluster's ledger Lease: deterministic, so every reconcile
// and every replica of the manager finds the same one.
func LedgerName(cluster string) string {
	const prefix = "inplace-disruptions-"
	if len(prefix)+len(cluster) <= 253 {
		return prefix + cluster
	}
	sum := sha256.Sum256([]byte(cluster))
	return prefix + cluster[:253-len(prefix)-9] + "-" + hex.EncodeToString(sum[:])[:8]
}

// Entry is one NodeUpdate past its first disruption.
type Entry struct {
	NodeUpdate   string      `json:"nodeUpdate"`
	UID          types.UID   `json:"uid"`
	Node         string      `json:"node"`
	Target       string      `json:"target"`
	ControlPlane bool        `json:"controlPlane,omitempty"`
	Since        metav1.Time `json:"since"`
}

// Claim is what a NodeUpdate asks the ledger before a disruptive step.
type Claim struct {
	Entry
	// MaxUnavailable is how many nodes of the target may be past their first disruption
	// at once, this one included.
	MaxUnavailable int
	// Step names the step about to disrupt the node, for the hold message ("cordon",
	// "restart RKE2", "reboot").
	Step string
}

// ClaimFor builds a NodeUpdate's claim from its annotations (set by the UpgradeTask
// controller when it started it); controlPlane is the updater's own knowledge of the node
// (its role labels), which adds to the target's.
func ClaimFor(ctx context.Context, live client.Reader, nu *inplacev1.NodeUpdate, controlPlane bool, step string) Claim {
	target := nu.Annotations[TargetAnnotation]
	limit, err := strconv.Atoi(nu.Annotations[MaxUnavailableAnnotation])
	if target == "" || err != nil || limit < 1 {
		target, limit = claimFromTask(ctx, live, nu)
	}
	return Claim{
		Entry: Entry{NodeUpdate: nu.Name, UID: nu.UID, Node: nu.Spec.NodeName, Target: target,
			ControlPlane: controlPlane || strings.HasPrefix(target, controlPlaneTargetPrefix)},
		MaxUnavailable: limit,
		Step:           step,
	}
}

// claimFromTask reads the target and maxUnavailable of a NodeUpdate without annotations
// from its UpgradeTask; without one, the NodeUpdate is a target of its own with room for
// one node.
func claimFromTask(ctx context.Context, live client.Reader, nu *inplacev1.NodeUpdate) (string, int) {
	taskName := ""
	for _, o := range nu.OwnerReferences {
		if o.Kind == "UpgradeTask" {
			taskName = o.Name
		}
	}
	task := &inplacev1.UpgradeTask{}
	if taskName == "" || live.Get(ctx, client.ObjectKey{Namespace: nu.Namespace, Name: taskName}, task) != nil {
		return "NodeUpdate/" + nu.Name, 1
	}
	target := TaskTarget(task)
	limit := 1
	if task.Spec.ControlPlaneRef == nil && task.Spec.MaxUnavailable != nil {
		total := max(len(task.Status.Machines), 1)
		if v, err := intstr.GetScaledValueFromIntOrPercent(task.Spec.MaxUnavailable, total, false); err == nil && v > 1 {
			limit = v
		}
	}
	return target, limit
}

// TaskTarget is the target value of a task's nodes.
func TaskTarget(task *inplacev1.UpgradeTask) string {
	switch {
	case task.Spec.ControlPlaneRef != nil:
		return ControlPlaneTarget(task.Spec.ControlPlaneRef.Name)
	case task.Spec.MachineDeploymentRef != nil:
		return MachineDeploymentTargetPrefix + task.Spec.MachineDeploymentRef.Name
	}
	return "UpgradeTask/" + task.Name
}

// ledgerAttempts bounds the rounds of one Admit against concurrent writers.
const ledgerAttempts = 5

// Admit asks the Cluster's ledger whether the claim's node may take its next disruptive
// step, and writes the claim down when it may. It returns "" when the node may go on, and
// otherwise why it is held (nothing is written then). live must read from the API server,
// never from a cache; c writes.
func Admit(ctx context.Context, live client.Reader, c client.Client, namespace, cluster string, claim Claim, now time.Time) (string, error) {
	key := client.ObjectKey{Namespace: namespace, Name: LedgerName(cluster)}
	for range ledgerAttempts {
		lease := &coordinationv1.Lease{}
		switch err := live.Get(ctx, key, lease); {
		case apierrors.IsNotFound(err):
			lease = nil
		case err != nil:
			return "", fmt.Errorf("read the disruption ledger (Lease %s): %w", key, err)
		}
		entries, err := parseLedger(lease)
		if err != nil {
			return "", err
		}
		kept, err := pruneLedger(ctx, live, namespace, entries, claim.UID)
		if err != nil {
			return "", err
		}
		var self *Entry
		others := make([]Entry, 0, len(kept))
		for i := range kept {
			if kept[i].UID == claim.UID {
				self = &kept[i]
				continue
			}
			others = append(others, kept[i])
		}
		if held := judge(claim, others); held != "" {
			return held, nil
		}
		if self != nil && len(kept) == len(entries) {
			return "", nil // written down already; nothing to prune
		}
		mine := claim.Entry
		mine.Since = metav1.NewTime(now.Truncate(time.Second))
		if self != nil {
			mine.Since = self.Since
		}
		err = writeLedger(ctx, c, key, lease, append(others, mine))
		switch {
		case err == nil:
			return "", nil
		case apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err):
			continue // another claim was written since the read: read it and judge again
		default:
			return "", fmt.Errorf("write the disruption ledger (Lease %s): %w", key, err)
		}
	}
	return fmt.Sprintf("holding node %s before it is allowed to %s: the disruption ledger (Lease %s) changed %d times while this claim was written; asking again",
		claim.Node, claim.Step, key, ledgerAttempts), nil
}

// judge says why the claim may not pass beside the others, "" when it may.
func judge(claim Claim, others []Entry) string {
	if claim.ControlPlane {
		var cp []string
		for _, o := range others {
			if o.ControlPlane {
				cp = append(cp, fmt.Sprintf("%s (NodeUpdate %s)", o.Node, o.NodeUpdate))
			}
		}
		if len(cp) > 0 {
			slices.Sort(cp)
			return fmt.Sprintf("holding control plane node %s before it is allowed to %s: control plane node(s) %s are past their first disruption; one control plane node at a time keeps etcd's and the API server's quorum",
				claim.Node, claim.Step, Describe(cp, 5))
		}
	}
	var same []string
	for _, o := range others {
		if o.Target == claim.Target {
			same = append(same, fmt.Sprintf("%s (NodeUpdate %s)", o.Node, o.NodeUpdate))
		}
	}
	if len(same)+1 > claim.MaxUnavailable {
		slices.Sort(same)
		return fmt.Sprintf("holding node %s before it is allowed to %s: %d node(s) of %s are past their first disruption (%s); maxUnavailable is %d",
			claim.Node, claim.Step, len(same), claim.Target, Describe(same, 5), claim.MaxUnavailable)
	}
	return ""
}

func parseLedger(lease *coordinationv1.Lease) ([]Entry, error) {
	if lease == nil || lease.Annotations[LedgerAnnotation] == "" {
		return nil, nil
	}
	var entries []Entry
	if err := json.Unmarshal([]byte(lease.Annotations[LedgerAnnotation]), &entries); err != nil {
		// Not ours to guess at: a ledger nobody can read would let every claim through.
		return nil, fmt.Errorf("the disruption ledger (Lease %s/%s, annotation %s) is not a JSON list of entries: %w; delete the annotation to let the NodeUpdates write their claims again",
			lease.Namespace, lease.Name, LedgerAnnotation, err)
	}
	return entries, nil
}

// pruneLedger keeps the entries whose NodeUpdate still runs, read live; self is kept as it
// is (its caller is running it).
func pruneLedger(ctx context.Context, live client.Reader, namespace string, entries []Entry, self types.UID) ([]Entry, error) {
	kept := make([]Entry, 0, len(entries))
	for _, e := range entries {
		if e.UID == self {
			kept = append(kept, e)
			continue
		}
		nu := &inplacev1.NodeUpdate{}
		err := live.Get(ctx, client.ObjectKey{Namespace: namespace, Name: e.NodeUpdate}, nu)
		switch {
		case apierrors.IsNotFound(err):
			continue
		case err != nil:
			return nil, fmt.Errorf("read NodeUpdate %s/%s of the disruption ledger: %w", namespace, e.NodeUpdate, err)
		case nu.UID != e.UID || nu.Status.Phase.IsFinal():
			continue
		}
		kept = append(kept, e)
	}
	return kept, nil
}

func writeLedger(ctx context.Context, c client.Client, key client.ObjectKey, lease *coordinationv1.Lease, entries []Entry) error {
	slices.SortFunc(entries, func(a, b Entry) int { return strings.Compare(a.NodeUpdate, b.NodeUpdate) })
	data, err := json.Marshal(entries)
	if err != nil {
		return err
	}
	if lease == nil {
		lease = &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name,
			Annotations: map[string]string{LedgerAnnotation: string(data)}}}
		return c.Create(ctx, lease)
	}
	if lease.Annotations == nil {
		lease.Annotations = map[string]string{}
	}
	lease.Annotations[LedgerAnnotation] = string(data)
	// Update carries the resourceVersion read: a claim written since makes it conflict.
	return c.Update(ctx, lease)
}

// Ledger asks the Clusters' ledgers for an updater: Live reads from the API server, never
// from a cache; Client writes.
type Ledger struct {
	Live   client.Reader
	Client client.Client
}

// Admit asks the ledger of nu's Cluster whether nu's node may take step (ClaimFor, then
// Admit): "" when it may, and its claim is written down; otherwise why it is held.
func (l *Ledger) Admit(ctx context.Context, nu *inplacev1.NodeUpdate, controlPlane bool, step string) (string, error) {
	claim := ClaimFor(ctx, l.Live, nu, controlPlane, step)
	return Admit(ctx, l.Live, l.Client, nu.Namespace, nu.Spec.ClusterName, claim, time.Now())
}
