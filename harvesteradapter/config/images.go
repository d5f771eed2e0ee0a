package config

import (
	"context"
	"fmt"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	harvesterv1 "github.com/capi-inplace/capi-inplace/harvesteradapter/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/suc"
	"github.com/capi-inplace/capi-inplace/nodeupdater"
)

// DefaultNodeImageRepository is where the capi-inplace image is published. The manager's
// own node image is this repository tagged with the manager's version (main.go,
// --harvester-node-image).
const DefaultNodeImageRepository = "ghcr.io/capi-inplace/capi-inplace"

// CheckNodeImage refuses a node image that is not a usable, fully tagged reference: the
// manager's --harvester-node-image must name one exact image, never one SUC would tag
// with a Plan's version (shared/facts/suc.md, fact 35).
func CheckNodeImage(image string) error {
	switch {
	case image == "":
		return fmt.Errorf("the node image is empty")
	case strings.ContainsAny(image, " \t\n"):
		return fmt.Errorf("the node image %q contains spaces", image)
	case !imageTagged(image):
		return fmt.Errorf("the node image %q has neither a tag nor a digest; give one, such as %s:v0.1.0", image, image)
	}
	return nil
}

// imageTagged tells whether an image reference has a tag or a digest.
func imageTagged(image string) bool {
	return strings.Contains(image, "@") || strings.Contains(image[strings.LastIndex(image, "/")+1:], ":")
}

// resolveImages fills in what the HarvesterUpgrader leaves to the manager: an empty
// images.node is the manager's own node image, and an untagged one gets the manager's
// version. It runs on the live HarvesterUpgrader, before the snapshot of a starting node
// is taken (snapshot.go), so the snapshot holds the exact image and a later manager (a
// new version, another --harvester-node-image) never changes a running node's Plans.
func (r Reader) ResolveImages(cfg *harvesterv1.HarvesterUpgrader) error {
	images := &cfg.Spec.Images
	if images.Node == "" {
		if r.NodeImage == "" {
			return nodeupdater.Permanentf("NoNodeImage",
				"HarvesterUpgrader %s/%s sets no images.node and the manager has no node image: set images.node, or start the manager with --harvester-node-image", cfg.Namespace, cfg.Name)
		}
		images.Node = r.NodeImage
	}
	if !imageTagged(images.Node) {
		if r.Version == "" {
			return nodeupdater.Permanentf("UntaggedNodeImage",
				"HarvesterUpgrader %s/%s: images.node %q has no tag and the manager knows no version to give it: add a tag", cfg.Namespace, cfg.Name, images.Node)
		}
		images.Node = suc.ImageWithTag(images.Node, r.Version)
	}
	return nil
}

// Reader reads HarvesterUpgraders on the management cluster.
type Reader struct {
	// Client reads them.
	Client client.Reader
	// NodeImage is the manager's own node image, fully tagged (--harvester-node-image):
	// what a HarvesterUpgrader without images.node runs on the nodes.
	NodeImage string
	// Version is the manager's version, the tag an untagged images.node gets.
	Version string
}

// GroupKind is the configuration kind the Harvester updater serves.
var GroupKind = schema.GroupKind{Group: harvesterv1.GroupVersion.Group, Kind: "HarvesterUpgrader"}

// Get reads the HarvesterUpgrader namespace/name, its images resolved (ResolveImages).
func (r Reader) Get(ctx context.Context, namespace, name string) (*harvesterv1.HarvesterUpgrader, error) {
	cfg := &harvesterv1.HarvesterUpgrader{}
	if err := r.Client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, cfg); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nodeupdater.Permanentf("UpdaterConfigNotFound", "HarvesterUpgrader %s/%s does not exist: create it, or point updaterRef at an existing one", namespace, name)
		}
		return nil, fmt.Errorf("get HarvesterUpgrader %s/%s: %w", namespace, name, err)
	}
	if err := r.ResolveImages(cfg); err != nil {
		return nil, err
	}
	return cfg, nil
}
