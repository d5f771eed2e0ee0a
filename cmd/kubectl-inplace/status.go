package main

import (
	"bytes"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

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
			"what holds the waiting ones, and each failure with the node's own error.",
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
