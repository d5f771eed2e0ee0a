// Package inplacectl is what `kubectl inplace` does, without a command line: it asks for
// an UpgradePreview and waits for it, gathers the objects of a running upgrade, and prints
// both for a person. The printers take objects and write to an io.Writer, so that they
// are tested without a cluster and the demo prints what the plugin prints.
package inplacectl

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
)

// PreviewRequest is the upgrade a person wants previewed, and where.
type PreviewRequest struct {
	// Namespace holds the Cluster and the UpgradePreview.
	Namespace string
	// Cluster is the CAPI Cluster's name.
	Cluster string
	// Version is the Kubernetes version to preview the upgrade to.
	Version string
	// Name is the UpgradePreview's name; empty means PreviewName(Cluster, Version).
	Name string
	// MaxUnavailable, NodeOrder and PauseNodes are the options the run would get.
	MaxUnavailable *intstr.IntOrString
	NodeOrder      []string
	PauseNodes     []string
}

// Validate says what is missing from the request, in the words of the command line.
func (r PreviewRequest) Validate() error {
	var missing []string
	if r.Cluster == "" {
		missing = append(missing, "the Cluster's name")
	}
	if r.Version == "" {
		missing = append(missing, "the version to upgrade to (for example v1.35.6+rke2r1)")
	}
	if len(missing) > 0 {
		return fmt.Errorf("missing %s: usage is kubectl inplace preview CLUSTER VERSION", strings.Join(missing, " and "))
	}
	if r.Namespace == "" {
		return errors.New("no namespace: give -n NAMESPACE or set one in the kubeconfig's context")
	}
	return nil
}

var notInName = regexp.MustCompile(`[^a-z0-9.-]+`)

// PreviewName is the name a preview of cluster at version gets unless one is given: the
// same request always names the same object, so asking again refreshes it instead of
// piling up previews. "+" and other characters a name cannot hold become "-".
func PreviewName(cluster, version string) string {
	name := notInName.ReplaceAllString(strings.ToLower(cluster+"-"+version), "-")
	if len(name) > 253 {
		name = name[:253]
	}
	return strings.Trim(name, "-.")
}

// ObjectName is the request's UpgradePreview name.
func (r PreviewRequest) ObjectName() string {
	if r.Name != "" {
		return r.Name
	}
	return PreviewName(r.Cluster, r.Version)
}

// ErrClusterNotFound says that the request names a Cluster that does not exist.
var ErrClusterNotFound = errors.New("cluster not found")

// CheckCluster fails with ErrClusterNotFound, and what to do, when the request's Cluster
// does not exist. Any other error (a user who may not read Clusters) is left to the
// preview controller to judge, so it does not stop the preview.
func CheckCluster(ctx context.Context, c client.Client, r PreviewRequest) error {
	err := c.Get(ctx, types.NamespacedName{Namespace: r.Namespace, Name: r.Cluster}, &clusterv1.Cluster{})
	if apierrors.IsNotFound(err) {
		return fmt.Errorf("%w: there is no Cluster %q in namespace %q: `kubectl get clusters -A` lists them; give the right one, with -n for its namespace", ErrClusterNotFound, r.Cluster, r.Namespace)
	}
	return nil
}

// ApplyPreview creates the request's UpgradePreview, or updates its spec, and sets the
// refresh annotation to token, so that an existing preview is computed again. It returns
// the object as written.
func ApplyPreview(ctx context.Context, c client.Client, r PreviewRequest, token string) (*inplacev1.UpgradePreview, error) {
	if err := r.Validate(); err != nil {
		return nil, err
	}
	key := types.NamespacedName{Namespace: r.Namespace, Name: r.ObjectName()}
	preview := &inplacev1.UpgradePreview{}
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		err := c.Get(ctx, key, preview)
		if apierrors.IsNotFound(err) {
			preview = &inplacev1.UpgradePreview{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}
			r.fill(preview, token)
			return c.Create(ctx, preview)
		}
		if err != nil {
			return err
		}
		r.fill(preview, token)
		return c.Update(ctx, preview)
	})
	if err != nil {
		return nil, fmt.Errorf("create or update UpgradePreview %s: %w", key, err)
	}
	return preview, nil
}

// fill writes the request into the preview's spec and the refresh annotation. The
// template changes and updater of an existing preview are kept: the command line does not
// set them, someone else may have.
func (r PreviewRequest) fill(p *inplacev1.UpgradePreview, token string) {
	p.Spec.ClusterName, p.Spec.Version = r.Cluster, r.Version
	p.Spec.MaxUnavailable, p.Spec.NodeOrder, p.Spec.PauseNodes = r.MaxUnavailable, r.NodeOrder, r.PauseNodes
	if p.Annotations == nil {
		p.Annotations = map[string]string{}
	}
	p.Annotations[inplacev1.RefreshAnnotation] = token
}

// NewRefreshToken is a value of the refresh annotation that no earlier request used.
func NewRefreshToken(now time.Time) string {
	return now.UTC().Format("20060102T150405.000000000Z")
}

// ErrPreviewNotComputed says the wait for a preview ended before it was computed.
var ErrPreviewNotComputed = errors.New("the preview was not computed in time")

// WaitForPreview polls the preview until it was computed for token (status.observedRefresh)
// and is Ready or Failed, or until timeout. A timeout says what was seen and the likely
// cause: no manager, or a manager without the preview controller.
func WaitForPreview(ctx context.Context, c client.Client, key types.NamespacedName, token string, timeout, interval time.Duration) (*inplacev1.UpgradePreview, error) {
	deadline := time.Now().Add(timeout)
	preview := &inplacev1.UpgradePreview{}
	for {
		if err := c.Get(ctx, key, preview); err != nil {
			return nil, fmt.Errorf("read UpgradePreview %s: %w", key, err)
		}
		if computedFor(preview, token) {
			return preview, nil
		}
		if !time.Now().Before(deadline) {
			return preview, fmt.Errorf("%w: UpgradePreview %s was not computed within %s (phase %q, computed for refresh %q, asked %q): "+
				"is the capi-inplace manager running, and is it a version with the UpgradePreview controller? "+
				"`kubectl get upgradepreview -n %s %s -o yaml` shows it",
				ErrPreviewNotComputed, key, timeout, preview.Status.Phase, preview.Status.ObservedRefresh, token, key.Namespace, key.Name)
		}
		select {
		case <-ctx.Done():
			return preview, ctx.Err()
		case <-time.After(min(interval, time.Until(deadline)+time.Millisecond)):
		}
	}
}

func computedFor(p *inplacev1.UpgradePreview, token string) bool {
	if p.Status.ObservedRefresh != token {
		return false
	}
	return p.Status.Phase == inplacev1.PreviewPhaseReady || p.Status.Phase == inplacev1.PreviewPhaseFailed
}

// PreviewFailure is the error of a preview whose phase is Failed, with its message, so a
// command exits non-zero after printing it.
func PreviewFailure(p *inplacev1.UpgradePreview) error {
	if p.Status.Phase != inplacev1.PreviewPhaseFailed {
		return nil
	}
	msg := p.Status.Message
	if msg == "" {
		msg = "no message given"
	}
	return fmt.Errorf("UpgradePreview %s/%s failed: %s", p.Namespace, p.Name, Clean(msg))
}
