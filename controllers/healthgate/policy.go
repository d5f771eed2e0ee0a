package healthgate

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/capi-inplace/capi-inplace/internal/fence"
)

// The manager reaches a workload cluster with the Cluster's `<cluster>-kubeconfig`, which
// Cluster API issues as system:masters. A gate is written by whoever may write an
// UpgradeTask's spec.gates or annotate the Cluster; the Policy keeps what a gate can make
// the manager do within what the operator allowed, so that a gate never lends the
// manager's power (docs/upgradetask.md, "Who may define a gate").

// DefaultJobNamespace is the namespace of the workload cluster where Job gates run unless
// the operator names another (the manager's --gate-job-namespace).
const DefaultJobNamespace = "capi-inplace-gates"

// JobServiceAccount is the ServiceAccount every gate Job runs under, created by the
// manager in the Job namespace and bound to nothing: a gate's pod has no rights on the
// workload cluster unless the operator binds some to it.
const JobServiceAccount = "capi-inplace-gate"

// DefaultCELMaxObjects bounds how many objects a CEL gate reads.
const DefaultCELMaxObjects = 1000

// DefaultCELDeniedKinds are the kinds no CEL gate may read unless the operator says
// otherwise (the manager's --gate-cel-denied-kinds): a bool can still be read out a bit
// at a time (a gate per guess), so what must stay secret is not read at all.
const DefaultCELDeniedKinds = "v1/Secret"

// Pod Security admission's labels (k8s.io/pod-security-admission/api): the Job namespace
// enforces the restricted profile.
const (
	PodSecurityEnforceLabel = "pod-security.kubernetes.io/enforce"
	PodSecurityRestricted   = "restricted"
)

// Policy is what the operator allows gates to do.
type Policy struct {
	// JobNamespace is the one namespace of the workload cluster where Job gates run; a
	// gate that names another is red.
	JobNamespace string
	// AnnotationJobGates allows Job gates in the Cluster's gates annotation. Without it
	// they are red: annotating a Cluster is a lesser right than writing an UpgradeTask
	// in some installations (Cluster API's own controllers and GitOps tools write
	// Clusters).
	AnnotationJobGates bool
	// CELDeniedKinds are the kinds (every version) that CEL gates may not read.
	CELDeniedKinds []schema.GroupKind
	// CELMaxObjects bounds how many objects one CEL gate reads; more is a red gate.
	CELMaxObjects int
	// Fetch fences the calls of Prometheus gates (internal/fence); its zero value is
	// the strict one (https only, no link-local, metadata or loopback address).
	Fetch fence.Policy
}

// DefaultPolicy is the Policy of the manager's flags' defaults.
func DefaultPolicy() *Policy {
	denied, err := ParseKinds(DefaultCELDeniedKinds)
	if err != nil {
		panic(err) // a constant that parses
	}
	return &Policy{JobNamespace: DefaultJobNamespace, CELDeniedKinds: denied, CELMaxObjects: DefaultCELMaxObjects}
}

// ParseKinds parses a comma-separated list of kinds: `Kind` or `v1/Kind` for the core
// group, `group/Kind` or `group/version/Kind` for another group. The version never
// matters: a kind is denied in every version.
func ParseKinds(list string) ([]schema.GroupKind, error) {
	var out []schema.GroupKind
	for _, item := range strings.Split(list, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		parts := strings.Split(item, "/")
		kind := parts[len(parts)-1]
		group := ""
		switch len(parts) {
		case 1:
		case 2:
			// "v1/Secret" is the core group's apiVersion; "longhorn.io/Setting" a group.
			if parts[0] != "v1" {
				group = parts[0]
			}
		case 3:
			group = parts[0]
		default:
			return nil, fmt.Errorf("kind %q has %d slashes; write Kind, v1/Kind, group/Kind or group/version/Kind", item, len(parts)-1)
		}
		if kind == "" || (len(parts) > 1 && parts[0] == "") {
			return nil, fmt.Errorf("kind %q has an empty part; write Kind, v1/Kind, group/Kind or group/version/Kind", item)
		}
		out = append(out, schema.GroupKind{Group: group, Kind: kind})
	}
	return out, nil
}

// celDenied tells whether the policy denies CEL gates the kind of the group.
func (p *Policy) celDenied(group, kind string) bool {
	for _, gk := range p.CELDeniedKinds {
		// Kinds are case-sensitive to the API server, but a gate's "secret" must not slip
		// past a "Secret" on the list.
		if gk.Group == group && strings.EqualFold(gk.Kind, kind) {
			return true
		}
	}
	return false
}

func (p *Policy) celMaxObjects() int {
	if p.CELMaxObjects <= 0 {
		return DefaultCELMaxObjects
	}
	return p.CELMaxObjects
}

// Namespace is the Job namespace: JobNamespace, or DefaultJobNamespace when it is empty.
func (p *Policy) Namespace() string {
	if p.JobNamespace == "" {
		return DefaultJobNamespace
	}
	return p.JobNamespace
}
