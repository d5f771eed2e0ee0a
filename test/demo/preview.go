package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capi-inplace/capi-inplace/internal/inplacectl"
)

// showPreview is --preview: before the upgrade is asked for, it asks for an UpgradePreview
// of the Cluster at the target version, as `kubectl inplace preview` does, waits for the
// manager to compute it and prints it with the plugin's printer. A preview that is not
// computed in time (a manager without the UpgradePreview controller) or that failed is
// said plainly and the upgrade runs anyway: the preview only shows, it never decides.
func showPreview(ctx context.Context, c client.Client, v *view, namespace, cluster, version string, wait time.Duration) {
	r := inplacectl.PreviewRequest{Namespace: namespace, Cluster: cluster, Version: version}
	v.step(fmt.Sprintf("kubectl inplace preview -n %s %s %s   (an UpgradePreview: what the upgrade would do, before anything changes)", namespace, cluster, version))
	token := inplacectl.NewRefreshToken(time.Now())
	if _, err := inplacectl.ApplyPreview(ctx, c, r, token); err != nil {
		v.problem(fmt.Sprintf("no preview: %v; the upgrade runs without one", err))
		return
	}
	key := types.NamespacedName{Namespace: namespace, Name: r.ObjectName()}
	preview, err := inplacectl.WaitForPreview(ctx, c, key, token, wait, 250*time.Millisecond)
	if err != nil {
		if errors.Is(err, inplacectl.ErrPreviewNotComputed) {
			err = fmt.Errorf("%w; a longer --preview-wait (now %s) gives it more time", err, wait)
		}
		v.problem(fmt.Sprintf("no preview: %v; the upgrade runs without one", err))
		return
	}
	var out bytes.Buffer
	if err := inplacectl.PrintPreview(&out, preview); err != nil {
		v.problem(fmt.Sprintf("print the preview: %v", err))
		return
	}
	for _, line := range strings.Split(strings.TrimRight(out.String(), "\n"), "\n") {
		v.println("    " + line)
	}
	if err := inplacectl.PreviewFailure(preview); err != nil {
		v.problem(err.Error() + "; the upgrade runs anyway")
	}
	v.println("")
}
