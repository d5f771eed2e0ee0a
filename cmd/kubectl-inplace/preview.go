package main

import (
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/capi-inplace/capi-inplace/internal/inplacectl"
)

// previewOptions are preview's own flags.
type previewOptions struct {
	nodeOrder, pauseNodes []string
	maxUnavailable        string
	name                  string
	wait                  time.Duration
	output                string
	// pollInterval is how often the preview is read while waiting; tests shorten it.
	pollInterval time.Duration
}

func newPreviewCommand(conn *connection, stdout io.Writer) *cobra.Command {
	o := &previewOptions{wait: time.Minute, output: inplacectl.OutputTable, pollInterval: 500 * time.Millisecond}
	cmd := &cobra.Command{
		Use:   "preview CLUSTER VERSION",
		Short: "Show what an in-place upgrade of CLUSTER to VERSION would do, before anything changes",
		Long: "preview creates or refreshes an UpgradePreview of CLUSTER at VERSION (named CLUSTER-VERSION, or\n" +
			"--name), waits until capi-inplace computed it, and prints it: per machine in place, replaced or\n" +
			"refused and why, the order nodes would go, what each node would disrupt (VMs, pods a\n" +
			"PodDisruptionBudget blocks, volumes) and which preflight checks would hold it today.\n" +
			"It exits 1 when the preview failed.",
		Example: "  kubectl inplace preview -n demo harvester v1.35.6+rke2r1\n" +
			"  kubectl inplace preview -n demo harvester v1.35.6+rke2r1 --node-order demo-workers-2 --max-unavailable 2 -o yaml",
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) != 2 {
				return usageError{fmt.Errorf("preview takes CLUSTER and VERSION, got %d argument(s) %q: for example kubectl inplace preview -n demo harvester v1.35.6+rke2r1", len(args), args)}
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			return o.run(cmd, conn, args[0], args[1], stdout)
		},
	}
	f := cmd.Flags()
	f.StringSliceVar(&o.nodeOrder, "node-order", nil, "nodes to upgrade first, in this order (comma-separated), as the run's spec.nodeOrder")
	f.StringSliceVar(&o.pauseNodes, "pause-nodes", nil, "nodes the run would not start (comma-separated), as the run's spec.pauseNodes")
	f.StringVar(&o.maxUnavailable, "max-unavailable", "", "how many nodes may be down at once, a number or a percentage (default: the run's default, 1)")
	f.StringVar(&o.name, "name", "", "the UpgradePreview's name (default: CLUSTER-VERSION, lower case, '+' as '-')")
	f.DurationVar(&o.wait, "wait", o.wait, "how long to wait for capi-inplace to compute the preview")
	f.StringVarP(&o.output, "output", "o", o.output, "output format: table, yaml or json")
	return cmd
}

// validate refuses flags that cannot work before anything is read or written.
func (o *previewOptions) validate() error {
	if o.maxUnavailable != "" {
		if !validMaxUnavailable(o.maxUnavailable) {
			return usageError{fmt.Errorf("--max-unavailable=%s: give a whole number of at least 1 or a percentage such as 25%%", o.maxUnavailable)}
		}
	}
	if err := inplacectl.ValidOutput(o.output); err != nil {
		return usageError{err}
	}
	if o.wait <= 0 {
		return usageError{fmt.Errorf("--wait=%s: give a positive duration such as 60s", o.wait)}
	}
	return nil
}

// validMaxUnavailable accepts what an UpgradeTask's maxUnavailable accepts: a whole
// number of at least 1, or a percentage.
func validMaxUnavailable(v string) bool {
	mu := intstr.Parse(v)
	if mu.Type == intstr.Int {
		return mu.IntVal >= 1
	}
	n, err := strconv.Atoi(strings.TrimSuffix(v, "%"))
	return strings.HasSuffix(v, "%") && err == nil && n > 0 && n <= 100
}

func (o *previewOptions) request(namespace, cluster, version string) (inplacectl.PreviewRequest, error) {
	r := inplacectl.PreviewRequest{Namespace: namespace, Cluster: cluster, Version: version, Name: o.name, NodeOrder: o.nodeOrder, PauseNodes: o.pauseNodes}
	if o.maxUnavailable != "" {
		mu := intstr.Parse(o.maxUnavailable)
		r.MaxUnavailable = &mu
	}
	if err := r.Validate(); err != nil {
		return r, usageError{err}
	}
	return r, nil
}

func (o *previewOptions) run(cmd *cobra.Command, conn *connection, cluster, version string, stdout io.Writer) error {
	if err := o.validate(); err != nil {
		return err
	}
	c, namespace, err := conn.client()
	if err != nil {
		return err
	}
	r, err := o.request(namespace, cluster, version)
	if err != nil {
		return err
	}
	ctx := cmd.Context()
	if err := inplacectl.CheckCluster(ctx, c, r); err != nil {
		return err
	}
	token := inplacectl.NewRefreshToken(time.Now())
	if _, err := inplacectl.ApplyPreview(ctx, c, r, token); err != nil {
		return err
	}
	key := types.NamespacedName{Namespace: r.Namespace, Name: r.ObjectName()}
	preview, err := inplacectl.WaitForPreview(ctx, c, key, token, o.wait, o.pollInterval)
	if err != nil {
		if errors.Is(err, inplacectl.ErrPreviewNotComputed) {
			return fmt.Errorf("%w; a longer --wait gives it more time", err)
		}
		return fmt.Errorf("wait for UpgradePreview %s: %w", key, err)
	}
	if o.output == inplacectl.OutputTable {
		err = inplacectl.PrintPreview(stdout, preview)
	} else {
		err = inplacectl.PrintObject(stdout, preview, o.output)
	}
	if err != nil {
		return err
	}
	return inplacectl.PreviewFailure(preview)
}
