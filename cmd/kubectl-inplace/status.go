package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"sort"
	"time"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	harvesterv1 "github.com/capi-inplace/capi-inplace/harvesteradapter/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/internal/inplacectl"
)

// statusOptions are status's own flags.
type statusOptions struct {
	watch bool
	// interval is how often --watch reads the objects again.
	interval time.Duration
}

func newStatusCommand(conn *connection, stdout io.Writer) *cobra.Command {
	o := &statusOptions{interval: 2 * time.Second}
	cmd := &cobra.Command{
		Use:   "status CLUSTER",
		Short: "Show how an in-place upgrade of CLUSTER is going, on one screen",
		Long: "status shows the Cluster's in-place-upgrade-* annotations, each of its UpgradeTasks (the newest\n" +
			"per control plane and MachineDeployment) with its phase, progress and Paused or Degraded\n" +
			"condition, each machine in order with its NodeUpdate's current step and how long it has run,\n" +
			"what holds the waiting ones, and each failure with the node's own error; then the Cluster's\n" +
			"Harvester UpgradePlans, and what holds one that waits (a failed node, in its own words, and the\n" +
			"ways on).",
		Example: "  kubectl inplace status -n demo harvester\n  kubectl inplace status -n demo harvester -w",
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usageError{fmt.Errorf("status takes CLUSTER, got %d argument(s) %q: for example kubectl inplace status -n demo harvester", len(args), args)}
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			return o.run(cmd, conn, args[0], stdout)
		},
	}
	cmd.Flags().BoolVarP(&o.watch, "watch", "w", false, "redraw every 2 seconds until interrupted (Ctrl-C)")
	return cmd
}

func (o *statusOptions) run(cmd *cobra.Command, conn *connection, cluster string, stdout io.Writer) error {
	c, namespace, err := conn.client()
	if err != nil {
		return err
	}
	ctx := cmd.Context()
	tty := isTerminal(stdout)
	for {
		st, err := inplacectl.CollectStatus(ctx, c, namespace, cluster, time.Now())
		if err != nil {
			return err
		}
		var screen bytes.Buffer
		if err := inplacectl.PrintStatus(&screen, st); err != nil {
			return err
		}
		plans, err := clusterPlans(ctx, c, namespace, cluster)
		if err != nil {
			_, _ = fmt.Fprintf(&screen, "\nUpgradePlans: %v\n", err)
		}
		printPlans(&screen, plans)
		if err := o.draw(stdout, screen.Bytes(), tty); err != nil {
			return err
		}
		if !o.watch {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil // Ctrl-C ends a watch; it is not a failure
		case <-time.After(o.interval):
		}
	}
}

// draw writes one screen: on a terminal, watch redraws it in place; elsewhere (a pipe, a
// log) each screen follows the last under a line with the time, so nothing is lost.
func (o *statusOptions) draw(w io.Writer, screen []byte, tty bool) error {
	if o.watch {
		if tty {
			if _, err := io.WriteString(w, "\033[H\033[2J"); err != nil {
				return err
			}
		} else if _, err := fmt.Fprintf(w, "--- %s\n", time.Now().UTC().Format(time.RFC3339)); err != nil {
			return err
		}
	}
	_, err := w.Write(screen)
	return err
}

// clusterPlans are the Harvester adapter's UpgradePlans of cluster in namespace, oldest
// first. They are read as unstructured objects: the plugin's client knows capi-inplace's
// own kinds and Cluster API's, and a management cluster without the Harvester adapter
// serves no UpgradePlan (then there are none).
func clusterPlans(ctx context.Context, c client.Client, namespace, cluster string) ([]harvesterv1.UpgradePlan, error) {
	list := &unstructured.UnstructuredList{}
	list.SetGroupVersionKind(harvesterv1.GroupVersion.WithKind("UpgradePlanList"))
	if err := c.List(ctx, list, client.InNamespace(namespace)); err != nil {
		if meta.IsNoMatchError(err) || apierrors.IsNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("cannot list the UpgradePlans in namespace %s: %w", namespace, err)
	}
	var out []harvesterv1.UpgradePlan
	for _, u := range list.Items {
		plan := harvesterv1.UpgradePlan{}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &plan); err != nil {
			return out, fmt.Errorf("UpgradePlan %s/%s is not what this plugin reads: %w", u.GetNamespace(), u.GetName(), err)
		}
		if plan.Spec.ClusterName == cluster {
			out = append(out, plan)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].CreationTimestamp.Before(&out[j].CreationTimestamp) })
	return out, nil
}

// printPlans prints each UpgradePlan: its release, phase and nodes at the release, then,
// while it runs, what holds it, in its own words (its Degraded condition: a failed node
// in the node's words first, the settings the cluster keeps for the roll until the plan
// ends, and the ways on), or, once it failed, why.
func printPlans(w io.Writer, plans []harvesterv1.UpgradePlan) {
	for i := range plans {
		// What the cluster wrote is shown without the controls a terminal would act on.
		p := inplacectl.CleanCopy(&plans[i])
		phase := string(p.Status.Phase)
		if phase == "" {
			phase = "not started"
		}
		line := fmt.Sprintf("\nUpgradePlan %s: Harvester %s: %s", p.Name, p.Spec.Version, phase)
		if p.Status.Upgraded != "" {
			line += ", " + p.Status.Upgraded + " nodes run the release"
		}
		_, _ = fmt.Fprintln(w, line)
		switch p.Status.Phase {
		case harvesterv1.UpgradePlanSucceeded:
		case harvesterv1.UpgradePlanFailed:
			_, _ = fmt.Fprintf(w, "  failed: %s\n", p.Status.Message)
		default:
			if c := meta.FindStatusCondition(p.Status.Conditions, harvesterv1.UpgradePlanDegraded); c != nil && c.Status == metav1.ConditionTrue {
				_, _ = fmt.Fprintf(w, "  held in %s: %s\n", phase, c.Message)
			}
		}
	}
}
