package config

import (
	"encoding/json"
	"fmt"

	"k8s.io/apimachinery/pkg/runtime"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	harvesterv1 "github.com/capi-inplace/capi-inplace/harvesteradapter/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/suc"
	"github.com/capi-inplace/capi-inplace/nodeupdater"
)

// Snapshot is what a node is upgraded with: the HarvesterUpgrader as it was when
// the node's NodeUpdate started, its images resolved (images.go: an empty images.node is
// the manager's node image at the manager's version), kept in the NodeUpdate's
// status.updaterConfig. Every later reconcile and the abort read it instead of the live
// HarvesterUpgrader, so that editing the HarvesterUpgrader, or upgrading the manager,
// changes the nodes not yet started and never rewrites a running node's Plans: SUC deletes a running Job whose Plan's version changed and
// replaces one whose pod template changed (shared/facts/suc.md, facts 43 and 49).
type Snapshot struct {
	// Kind is HarvesterUpgrader.
	Kind string `json:"kind"`
	// Name is the HarvesterUpgrader's name, in the NodeUpdate's namespace.
	Name string `json:"name"`
	// Generation is the HarvesterUpgrader's metadata.generation the snapshot was taken at.
	Generation int64 `json:"generation"`
	// Spec is the HarvesterUpgrader's spec, defaults applied by the API server and
	// images.node resolved by the updater.
	Spec harvesterv1.HarvesterUpgraderSpec `json:"spec"`
}

// Take returns the configuration the node is upgraded with: the snapshot in
// the NodeUpdate's status if there is one, else cfg, which it then records there. A
// configuration SUC would misread is refused before anything is written for the node.
func Take(nu *inplacev1.NodeUpdate, cfg *harvesterv1.HarvesterUpgrader) (*harvesterv1.HarvesterUpgrader, error) {
	if snap, ok, err := ReadSnapshot(nu); err != nil || ok {
		return snap, err
	}
	if err := Check(cfg); err != nil {
		return nil, err
	}
	raw, err := json.Marshal(Snapshot{Kind: GroupKind.Kind, Name: cfg.Name, Generation: cfg.Generation, Spec: cfg.Spec})
	if err != nil {
		return nil, fmt.Errorf("record the configuration of node %s: %w", nu.Spec.NodeName, err)
	}
	nu.Status.UpdaterConfig = &runtime.RawExtension{Raw: raw}
	return cfg, nil
}

// ReadSnapshot reads the configuration recorded in the NodeUpdate's status, if any.
func ReadSnapshot(nu *inplacev1.NodeUpdate) (*harvesterv1.HarvesterUpgrader, bool, error) {
	if nu.Status.UpdaterConfig == nil || len(nu.Status.UpdaterConfig.Raw) == 0 {
		return nil, false, nil
	}
	snap := Snapshot{}
	if err := json.Unmarshal(nu.Status.UpdaterConfig.Raw, &snap); err != nil || snap.Kind != GroupKind.Kind {
		return nil, false, nodeupdater.Permanentf("InvalidUpdaterConfig",
			"status.updaterConfig of NodeUpdate %s/%s is not a HarvesterUpgrader snapshot (%v): the node cannot be upgraded with a configuration it did not start with; create a new NodeUpdate",
			nu.Namespace, nu.Name, err)
	}
	if snap.Spec.Images.Node == "" {
		// Written by a manager from before images.node, whose Plans ran
		// rancher/harvester-upgrade: resolving an image now would rewrite the node's
		// running Plans, which SUC answers by replacing their Jobs (fact 49).
		return nil, false, nodeupdater.Permanentf("InvalidUpdaterConfig",
			"status.updaterConfig of NodeUpdate %s/%s names no node image (it was recorded by an older manager): the node cannot be upgraded with an image it did not start with; create a new NodeUpdate",
			nu.Namespace, nu.Name)
	}
	cfg := &harvesterv1.HarvesterUpgrader{Spec: snap.Spec}
	cfg.Name, cfg.Namespace, cfg.Generation = snap.Name, nu.Namespace, snap.Generation
	return cfg, true, nil
}

// Check refuses what the API server's validation lets through but SUC would
// misread, with what to change.
func Check(cfg *harvesterv1.HarvesterUpgrader) error {
	timeout, err := suc.DrainTimeout(cfg.Spec.Drain.Timeout)
	if err != nil {
		return nodeupdater.Permanentf("InvalidDrainTimeout", "HarvesterUpgrader %s/%s: %v", cfg.Namespace, cfg.Name, err)
	}
	if limit := harvesterv1.DurationOr(cfg.Spec.Timeouts.Drain, harvesterv1.DefaultDrainTimeout); timeout > limit {
		return nodeupdater.Permanentf("InvalidDrainTimeout",
			"HarvesterUpgrader %s/%s: drain.timeout %s is longer than timeouts.drain %s, the drain Job's deadline: shorten the drain timeout or raise timeouts.drain",
			cfg.Namespace, cfg.Name, timeout, limit)
	}
	return nil
}
