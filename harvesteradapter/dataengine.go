package harvesteradapter

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/dataengine"
	"github.com/capi-inplace/capi-inplace/nodeupdater"
)

// dataEngineSwap swaps the Longhorn v2 data engine of one node live, through one of
// Longhorn's APIs. Longhorn's direction has moved between APIs, so each API is a
// backend, chosen by what the workload cluster serves.
type dataEngineSwap interface {
	// Ensure asks Longhorn for the swap (idempotently) and says whether it is done and
	// what Longhorn reports. A swap Longhorn reports failed is a permanent error.
	Ensure(ctx context.Context, c client.Client, nu *inplacev1.NodeUpdate) (done bool, message string, err error)
	// Cleanup removes what Ensure created for the node.
	Cleanup(ctx context.Context, c client.Client, nu *inplacev1.NodeUpdate) error
}

// chooseDataEngineSwap returns the backend the workload cluster serves, or nil when it
// serves none of them.
func chooseDataEngineSwap(c client.Client) (dataEngineSwap, error) {
	served, err := kindServed(c, schema.GroupKind{Group: dataengine.GroupVersion.Group, Kind: "DataEngineUpgradeManager"}, dataengine.GroupVersion.Version)
	if err != nil || !served {
		return nil, err
	}
	return proposalSwap{}, nil
}

func kindServed(c client.Client, gk schema.GroupKind, version string) (bool, error) {
	_, err := c.RESTMapper().RESTMapping(gk, version)
	switch {
	case err == nil:
		return true, nil
	case meta.IsNoMatchError(err):
		return false, nil
	default:
		return false, fmt.Errorf("ask the workload cluster whether it serves %s: %w", gk, err)
	}
}

// proposalSwap is the backend of Longhorn's live upgrade proposal: one
// DataEngineUpgradeManager per node, created by the adapter, advanced by Longhorn.
type proposalSwap struct{}

func dataEngineUpgradeName(node string) string {
	return "capi-inplace-" + node
}

func (proposalSwap) Ensure(ctx context.Context, c client.Client, nu *inplacev1.NodeUpdate) (bool, string, error) {
	dum := &dataengine.DataEngineUpgradeManager{}
	key := client.ObjectKey{Namespace: LonghornNamespace, Name: dataEngineUpgradeName(nu.Spec.NodeName)}
	err := c.Get(ctx, key, dum)
	if apierrors.IsNotFound(err) {
		dum = &dataengine.DataEngineUpgradeManager{
			ObjectMeta: metav1.ObjectMeta{Name: key.Name, Namespace: key.Namespace, Labels: map[string]string{LabelNodeUpdate: string(nu.UID)}},
			Spec:       dataengine.DataEngineUpgradeManagerSpec{DataEngine: "v2", Nodes: []string{nu.Spec.NodeName}},
		}
		if err := c.Create(ctx, dum); err != nil && !apierrors.IsAlreadyExists(err) {
			return false, "", fmt.Errorf("create DataEngineUpgradeManager %s: %w", key.Name, err)
		}
		return false, "asked Longhorn to upgrade the v2 data engine of node " + nu.Spec.NodeName, nil
	}
	if err != nil {
		return false, "", fmt.Errorf("get DataEngineUpgradeManager %s: %w", key.Name, err)
	}
	switch dum.Status.State {
	case dataengine.UpgradeStateCompleted:
		return true, "Longhorn upgraded the v2 data engine of node " + nu.Spec.NodeName, nil
	case dataengine.UpgradeStateError:
		return false, "", nodeupdater.Permanentf("LonghornDataEngineUpgradeFailed",
			"Longhorn failed to upgrade the v2 data engine of node %s: %s", nu.Spec.NodeName, dum.Status.Message)
	default:
		state := string(dum.Status.State)
		if state == "" {
			state = "pending"
		}
		return false, fmt.Sprintf("Longhorn v2 data engine upgrade of node %s: %s", nu.Spec.NodeName, state), nil
	}
}

func (proposalSwap) Cleanup(ctx context.Context, c client.Client, nu *inplacev1.NodeUpdate) error {
	dum := &dataengine.DataEngineUpgradeManager{ObjectMeta: metav1.ObjectMeta{Namespace: LonghornNamespace, Name: dataEngineUpgradeName(nu.Spec.NodeName)}}
	if err := c.Delete(ctx, dum); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete DataEngineUpgradeManager %s: %w", dum.Name, err)
	}
	return nil
}
