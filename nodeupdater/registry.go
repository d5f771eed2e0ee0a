package nodeupdater

import (
	"context"
	"fmt"
	"sort"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
)

// Registration ties an updater configuration kind to the Updater the manager runs for it.
type Registration struct {
	// GroupKind is the configuration kind, for example
	// HarvesterUpgrader.harvester.inplace.cluster.x-k8s.io.
	GroupKind schema.GroupKind
	// NewConfig returns an empty object of the configuration kind, used to read the
	// object an updaterRef names.
	NewConfig func() client.Object
	// Updater does the work.
	Updater Updater
}

// Registry holds the updaters the manager runs, by configuration kind. It is filled in
// main.go before the manager starts and only read afterwards.
type Registry struct {
	byKind map[string][]Registration
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry {
	return &Registry{byKind: map[string][]Registration{}}
}

// Register adds an updater. Registering the same GroupKind twice is an error.
func (r *Registry) Register(reg Registration) error {
	if reg.GroupKind.Kind == "" || reg.Updater == nil || reg.NewConfig == nil {
		return fmt.Errorf("updater registration for %q needs a kind, a config constructor and an updater", reg.GroupKind)
	}
	for _, existing := range r.byKind[reg.GroupKind.Kind] {
		if existing.GroupKind == reg.GroupKind {
			return fmt.Errorf("an updater for %s is already registered", reg.GroupKind)
		}
	}
	r.byKind[reg.GroupKind.Kind] = append(r.byKind[reg.GroupKind.Kind], reg)
	return nil
}

// Lookup finds the updater an updaterRef names. A reference without apiGroup matches
// its kind in any group, as long as only one group has it. found is false when the
// manager runs no updater for the kind.
func (r *Registry) Lookup(ref inplacev1.UpdaterReference) (reg Registration, found bool, err error) {
	candidates := r.byKind[ref.Kind]
	if ref.APIGroup != "" {
		for _, c := range candidates {
			if c.GroupKind.Group == ref.APIGroup {
				return c, true, nil
			}
		}
		return Registration{}, false, nil
	}
	switch len(candidates) {
	case 0:
		return Registration{}, false, nil
	case 1:
		return candidates[0], true, nil
	default:
		groups := make([]string, 0, len(candidates))
		for _, c := range candidates {
			groups = append(groups, c.GroupKind.Group)
		}
		sort.Strings(groups)
		return Registration{}, false, fmt.Errorf("updater kind %s is served by several API groups (%v); set updaterRef.apiGroup (annotation form Kind.group/name)", ref.Kind, groups)
	}
}

// Kinds lists the registered configuration kinds, for messages and logs.
func (r *Registry) Kinds() []schema.GroupKind {
	var out []schema.GroupKind
	for _, regs := range r.byKind {
		for _, reg := range regs {
			out = append(out, reg.GroupKind)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].String() < out[j].String() })
	return out
}

// AtTarget asks the updater target.UpdaterRef names whether the node already runs the
// target, for a node whose kubelet reports it. An updater that is not a TargetJudge, or
// that the manager does not run, leaves the kubelet version as the answer: true.
func (r *Registry) AtTarget(ctx context.Context, target PreflightTarget) (bool, string, error) {
	if r == nil {
		return true, "", nil
	}
	reg, found, err := r.Lookup(target.UpdaterRef)
	if err != nil || !found {
		return true, "", err
	}
	judge, ok := reg.Updater.(TargetJudge)
	if !ok {
		return true, "", nil
	}
	return judge.AtTarget(ctx, target)
}
