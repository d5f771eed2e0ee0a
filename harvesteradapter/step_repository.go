package harvesteradapter

import (
	"context"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/types"

	harvesterv1 "github.com/capi-inplace/capi-inplace/harvesteradapter/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/releases"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/repository"
	"github.com/capi-inplace/capi-inplace/nodeupdater"
)

// repositoryStep makes sure the release is served and may be installed on the node.
var repositoryStep = step{
	name: StepRepository,
	timeout: func(t harvesterv1.Timeouts) time.Duration {
		return harvesterv1.DurationOr(t.Repository, harvesterv1.DefaultRepositoryTimeout)
	},
	run: (*Updater).runRepository,
}

// runRepository makes sure the release is served and may be installed on the node.
func (u *Updater) runRepository(ctx context.Context, r *nodeRun) (bool, string, error) {
	readURL := r.repo
	if r.cfg.Spec.Release.RepositoryURL == "" {
		ready, message, err := repository.Ensure(ctx, r.wc, r.cfg)
		if err != nil || !ready {
			return false, message, err
		}
		if u.RepositoryURL != nil {
			readURL = u.RepositoryURL(r.repo)
		}
	}
	data, err := u.Releases.ReadRelease(ctx, types.NamespacedName{Namespace: r.nu.Namespace, Name: r.nu.Spec.ClusterName}, readURL)
	if err != nil {
		return false, "", fmt.Errorf("read the release metadata of Harvester %s: %w", r.cfg.Spec.Release.Version, err)
	}
	meta, err := releases.ParseMetadata(data)
	if err != nil {
		return false, "", nodeupdater.Permanent("InvalidReleaseMetadata", err)
	}
	node, err := u.node(ctx, r)
	if err != nil {
		return false, "", err
	}
	current, err := releases.HarvesterVersionFromOSImage(node.Status.NodeInfo.OSImage)
	if err != nil {
		return false, "", nodeupdater.Permanent("UnknownHarvesterVersion", err)
	}
	if err := meta.CheckEligible(r.cfg.Spec.Release.Version, r.nu.Spec.Version, releases.ForcedFloor(r.plan, current, meta)); err != nil {
		return false, "", nodeupdater.Permanent("IneligibleRelease", err)
	}
	return true, fmt.Sprintf("Harvester %s (Kubernetes %s) is served at %s and installs over %s", meta.Harvester, meta.Kubernetes, r.repo, current), nil
}
