package main

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"sigs.k8s.io/controller-runtime/pkg/client"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/test/scenario"
)

// kubeadmPhases prints, for --updater=kubeadm, each node's NodeUpdate steps (kubeadm's
// phases on the node) and the kubeadm upgrade command it ran: what the live lines showed,
// whole, once the rollout ended.
func (d *realCAPI) kubeadmPhases(ctx context.Context) {
	v := d.view
	list := &inplacev1.NodeUpdateList{}
	if err := d.env.Client.List(ctx, list, client.InNamespace(demoNamespace)); err != nil {
		v.println(fmt.Sprintf("list the NodeUpdates: %v", err))
		return
	}
	upgrades := d.kubeadm.KubeadmUpgrades(demoNamespace, capiClusterName)
	v.println("")
	v.println("kubeadm phases per node (NodeUpdate status.steps) and the kubeadm upgrade it ran (the node program's choice):")
	for i := range d.before {
		m := &d.before[i]
		for _, nu := range list.Items {
			if nu.Spec.MachineName != m.Name {
				continue
			}
			var steps []string
			for _, s := range nu.Status.Steps {
				steps = append(steps, fmt.Sprintf("%s %s", s.Name, s.State))
			}
			v.println(fmt.Sprintf("  %-28s %s   %s", nu.Spec.NodeName, strings.Join(steps, ", "), strings.Join(upgrades[nu.Spec.NodeName], "; ")))
		}
	}
}

// kubeadmChecks are the checks of --updater=kubeadm: the node program's phases on every
// node in order, and the drain's cordons within the budget and all lifted.
func (d *realCAPI) kubeadmChecks(cpNodes, workerNodes []string) []scenario.Check {
	ran := map[string][]string{}
	failed := ""
	for _, r := range d.kubeadm.Runs() {
		ran[r.Node] = append(ran[r.Node], r.Args[1])
		if r.Exit != 0 && failed == "" {
			failed = fmt.Sprintf("%s: node kubeadm %s exited %d: %s", r.Node, r.Args[1], r.Exit, r.Message)
		}
	}
	phases := scenario.Check{Name: "each node ran the node program's kubeadm fetch, upgrade and kubelet, in this order, each once", OK: failed == ""}
	for _, n := range append(slices.Clone(cpNodes), workerNodes...) {
		if !slices.Equal(ran[n], []string{"fetch", "upgrade", "kubelet"}) {
			phases.OK, phases.Detail = false, fmt.Sprintf("%s ran %v", n, ran[n])
		}
	}
	if failed != "" {
		phases.Detail = failed
	}
	cp, workers := d.cordons.MaxCordoned(cpNodes...), d.cordons.MaxCordoned(workerNodes...)
	left := d.cordons.Cordoned()
	return []scenario.Check{phases,
		{Name: "at most 1 control plane node and 1 worker cordoned at once by the drain, and every node uncordoned at the end",
			OK: cp <= 1 && workers <= 1 && len(left) == 0, Detail: fmt.Sprintf("%d control plane and %d workers were; cordoned now: %v", cp, workers, left)},
	}
}
