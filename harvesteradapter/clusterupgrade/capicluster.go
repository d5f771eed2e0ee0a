package clusterupgrade

import (
	"context"
	"fmt"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/version"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher"
)

// wait_capi_cluster (harvester-release-steps.md facts 16.3, 16.14 and 40; umanif.sh
// @v1.7.3 and @v1.8.0, then @v1.8.1, @v1.8.2 and @v1.9.0-rc6): upgrade_rancher waits on
// the Cluster API Cluster fleet-local/local, which Rancher generates for the local cluster
// (facts 64 to 66), once before its helm upgrade and again once the local fleet-agent has
// rolled out after it. Up to v1.8.0 the first wait is for the phase Provisioned with any
// status.observedGeneration (the script passes 0), and the second for Provisioned at an
// observedGeneration greater than the one read after the first; from v1.8.1 on both wait
// for Provisioned at observedGeneration == metadata.generation, held for 30 s, the timer
// starting again whenever it is not (harvester PR #10672: once Rancher Turtles owns
// Cluster API, Rancher's upgrade need not change the Cluster, and the older wait hung,
// issue #10719).

// capiClusterKey is the Cluster API Cluster Rancher generates for the local cluster.
var capiClusterKey = client.ObjectKey{Namespace: rancher.FleetLocal, Name: rancher.LocalCluster}

// capiClusterKind is the kind of Cluster API's Cluster, read at the version the API server
// prefers (see readCAPICluster).
var capiClusterKind = schema.GroupKind{Group: "cluster.x-k8s.io", Kind: "Cluster"}

// capiGenerationKey is the progress ConfigMap's key holding the observedGeneration the
// Cluster API Cluster had before Rancher's upgrade, which the second wait of a target
// before v1.8.1 compares with, also when a resumed run no longer does the first.
const capiGenerationKey = "capi-cluster-generation-before-rancher"

// capiStableFromVersion is the first release whose wait_capi_cluster holds the Cluster
// stable for a while (fact 40).
var capiStableFromVersion = version.MustParseSemantic("v1.8.1")

// waitsCAPIStable says whether the target release's wait_capi_cluster is the v1.8.1 one:
// Provisioned at its generation, held for Input.CAPIStableFor.
func waitsCAPIStable(harvesterVersion string) bool {
	v, err := version.ParseSemantic(harvesterVersion)
	return err == nil && !v.LessThan(capiStableFromVersion)
}

// capiCluster is what the wait reads of the Cluster API Cluster.
type capiCluster struct {
	generation, observedGeneration int64
	phase                          string
	// version is the API version it was read at.
	version string
}

func (c capiCluster) String() string {
	return fmt.Sprintf("phase %q, observedGeneration %d of generation %d", c.phase, c.observedGeneration, c.generation)
}

// provisionedAtGeneration says whether Cluster API has reconciled the Cluster's
// generation and found it Provisioned (the v1.8.1 condition).
func (c capiCluster) provisionedAtGeneration() bool {
	return c.phase == "Provisioned" && c.observedGeneration == c.generation
}

// readCAPICluster reads the Cluster API Cluster at the version the API server prefers, as
// the release's `kubectl get clusters.cluster.x-k8s.io` does: Rancher v2.12 and v2.13
// embed Cluster API releases that serve cluster.x-k8s.io v1beta1, Rancher Turtles' serve
// v1beta2 as well, and the three fields read (metadata.generation, status.observedGeneration,
// status.phase) are the same in both. The mapping comes from discovery, through the
// client's REST mapper. A missing Cluster is not an error: the release's script waits
// for it too (fact 66).
func (r *runner) readCAPICluster(ctx context.Context) (capiCluster, bool, error) {
	mapping, err := r.c.RESTMapper().RESTMapping(capiClusterKind)
	if err != nil {
		return capiCluster{}, false, fmt.Errorf("find the served version of Cluster API's %s (is Rancher's Cluster API installed?): %w", capiClusterKind, err)
	}
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(mapping.GroupVersionKind)
	if err := r.c.Get(ctx, capiClusterKey, u); apierrors.IsNotFound(err) {
		return capiCluster{}, false, nil
	} else if err != nil {
		return capiCluster{}, false, fmt.Errorf("read Cluster API Cluster %s: %w", capiClusterKey, err)
	}
	observed, _, err := unstructured.NestedInt64(u.Object, "status", "observedGeneration")
	if err != nil {
		return capiCluster{}, false, fmt.Errorf("read Cluster API Cluster %s: status.observedGeneration: %w", capiClusterKey, err)
	}
	phase, _, err := unstructured.NestedString(u.Object, "status", "phase")
	if err != nil {
		return capiCluster{}, false, fmt.Errorf("read Cluster API Cluster %s: status.phase: %w", capiClusterKey, err)
	}
	return capiCluster{generation: u.GetGeneration(), observedGeneration: observed, phase: phase, version: mapping.GroupVersionKind.Version}, true, nil
}

// waitCAPIClusterBeforeRancher is the wait_capi_cluster before Rancher's helm upgrade
// (fact 16.3). For a target before v1.8.1 it records the observedGeneration it ends at,
// which waitCAPIClusterAfterFleetAgent then waits to be passed.
func (r *runner) waitCAPIClusterBeforeRancher(ctx context.Context) error {
	if waitsCAPIStable(r.in.HarvesterVersion) {
		_, err := r.waitCAPIClusterStable(ctx, "before Rancher's upgrade")
		return err
	}
	cl, err := r.waitCAPIClusterPast(ctx, 0, "before Rancher's upgrade")
	if err != nil {
		return err
	}
	if err := patchData(ctx, r.c, r.p.ConfigMap, capiGenerationKey, strconv.FormatInt(cl.observedGeneration, 10)); err != nil {
		return fmt.Errorf("record the Cluster API Cluster's observedGeneration %d in the progress ConfigMap %s: %w", cl.observedGeneration, r.p.ConfigMap, err)
	}
	return nil
}

// waitCAPIClusterAfterFleetAgent is the wait_capi_cluster once fleet-agent has rolled out
// after Rancher's upgrade (fact 16.14), and says what it found.
func (r *runner) waitCAPIClusterAfterFleetAgent(ctx context.Context) (string, error) {
	if waitsCAPIStable(r.in.HarvesterVersion) {
		cl, err := r.waitCAPIClusterStable(ctx, "after Rancher's upgrade")
		if err != nil {
			return "", err
		}
		return fmt.Sprintf("Cluster API Cluster %s (read at %s) Provisioned at generation %d for %s", capiClusterKey, cl.version, cl.generation, r.in.CAPIStableFor), nil
	}
	before, err := r.capiGenerationBeforeRancher(ctx)
	if err != nil {
		return "", err
	}
	cl, err := r.waitCAPIClusterPast(ctx, before, "after Rancher's upgrade")
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("Cluster API Cluster %s (read at %s) Provisioned at observedGeneration %d (%d before Rancher's upgrade)", capiClusterKey, cl.version, cl.observedGeneration, before), nil
}

// capiGenerationBeforeRancher is the observedGeneration recorded before Rancher's
// upgrade; 0 when none was (Rancher upgraded by a run that did not record it), which
// leaves the wait the first one's.
func (r *runner) capiGenerationBeforeRancher(ctx context.Context) (int64, error) {
	cm := &corev1.ConfigMap{}
	if err := r.c.Get(ctx, r.p.ConfigMap, cm); err != nil {
		return 0, fmt.Errorf("read the progress ConfigMap %s: %w", r.p.ConfigMap, err)
	}
	raw, ok := cm.Data[capiGenerationKey]
	if !ok {
		r.logf("no observedGeneration of Cluster API Cluster %s recorded before Rancher's upgrade: waiting for it to be Provisioned", capiClusterKey)
		return 0, nil
	}
	g, err := strconv.ParseInt(raw, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("the progress ConfigMap %s holds %q under %s, not a generation: delete that key to wait for Cluster API Cluster %s to be Provisioned only", r.p.ConfigMap, raw, capiGenerationKey, capiClusterKey)
	}
	return g, nil
}

// capiRemedy is what the wait's error tells the operator to look at.
func capiRemedy() string {
	return fmt.Sprintf("Rancher's Cluster API reconciles it from the provisioning Cluster; look at `kubectl -n %s get clusters.cluster.x-k8s.io %s -o yaml`, its conditions, and at Rancher's logs", capiClusterKey.Namespace, capiClusterKey.Name)
}

// waitCAPIClusterPast is the wait_capi_cluster of releases before v1.8.1: until the
// Cluster is Provisioned at an observedGeneration greater than after.
func (r *runner) waitCAPIClusterPast(ctx context.Context, after int64, when string) (capiCluster, error) {
	var last capiCluster
	what := fmt.Sprintf("Cluster API Cluster %s to be Provisioned at an observedGeneration greater than %d (%s, as the %s release's wait_capi_cluster)", capiClusterKey, after, when, r.in.HarvesterVersion)
	remedy := capiRemedy()
	if after > 0 {
		remedy += "; this release's wait expects Rancher's upgrade to give it a new generation, which a Rancher upgrade under Rancher Turtles need not do (harvester issue #10719; v1.8.1 and later wait for Provisioned at its generation instead)"
	}
	err := r.poll(ctx, what, remedy, func(ctx context.Context) (bool, string, error) {
		cl, found, err := r.readCAPICluster(ctx)
		if err != nil || !found {
			return false, "not found", err
		}
		last = cl
		return cl.phase == "Provisioned" && cl.observedGeneration > after, cl.String(), nil
	})
	return last, err
}

// waitCAPIClusterStable is the wait_capi_cluster of v1.8.1 and later: until the Cluster
// has been Provisioned at its generation for Input.CAPIStableFor, each look that finds it
// otherwise (or missing) starting the time again.
func (r *runner) waitCAPIClusterStable(ctx context.Context, when string) (capiCluster, error) {
	var (
		last        capiCluster
		stableSince time.Time
	)
	what := fmt.Sprintf("Cluster API Cluster %s to be Provisioned at its generation for %s (%s, as the %s release's wait_capi_cluster)", capiClusterKey, r.in.CAPIStableFor, when, r.in.HarvesterVersion)
	err := r.poll(ctx, what, capiRemedy(), func(ctx context.Context) (bool, string, error) {
		cl, found, err := r.readCAPICluster(ctx)
		if err != nil {
			return false, "", err
		}
		if !found {
			stableSince = time.Time{}
			return false, "not found", nil
		}
		last = cl
		if !cl.provisionedAtGeneration() {
			if !stableSince.IsZero() {
				r.logf("Cluster API Cluster %s changed (%s): its stability starts again", capiClusterKey, cl)
			}
			stableSince = time.Time{}
			return false, cl.String(), nil
		}
		now := r.in.Clock.Now()
		if stableSince.IsZero() {
			stableSince = now
		}
		stable := now.Sub(stableSince)
		if stable >= r.in.CAPIStableFor {
			return true, "", nil
		}
		// The status names no duration, so that poll reports it once, not at every look.
		return false, fmt.Sprintf("%s; waiting for it to stay so %s", cl, r.in.CAPIStableFor), nil
	})
	return last, err
}
