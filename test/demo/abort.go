package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/rancher"
	"github.com/capi-inplace/capi-inplace/test/scenario"
)

// aborter plays --abort-at: it waits until Rancher has taken the node (cordoned it and
// asked for its pre-drain hook: the point of a node's route where an ending used to leave
// the node cordoned and Rancher's tier waiting for good), then aborts the UpgradeTask
// whose NodeUpdate runs there, and checks how the abort ended: Rancher's drain of the
// node withdrawn, the node uncordoned, and RKE2 restarted nowhere after the NodeUpdate
// ended.
type aborter struct {
	s    *scenario.Scenario
	view *view
	node string

	mu sync.Mutex
	// task and nodeUpdate are what was aborted, at aborted.
	task, nodeUpdate string
	aborted          time.Time
	// ended is when the node's NodeUpdate was seen final.
	ended   time.Time
	problem string
}

func newAborter(s *scenario.Scenario, v *view, node string) (*aborter, error) {
	n, ok := s.Node(node)
	if !ok {
		return nil, fmt.Errorf("--abort-at=%s: no such node", node)
	}
	if s.Planner == nil {
		return nil, fmt.Errorf("--abort-at=%s: Rancher does not provision the nodes' RKE2 in this run", node)
	}
	return &aborter{s: s, view: v, node: n.Name}, nil
}

func (a *aborter) run(ctx context.Context) {
	if err := a.play(ctx); err != nil && ctx.Err() == nil {
		a.mu.Lock()
		a.problem = err.Error()
		a.mu.Unlock()
		a.view.problem("--abort-at: " + err.Error())
	}
}

func (a *aborter) play(ctx context.Context) error {
	var nu *inplacev1.NodeUpdate
	if err := waitUntil(ctx, func() (bool, error) {
		n := nodeObject()
		if err := a.s.Workload.Client.Get(ctx, client.ObjectKey{Name: a.node}, n); err != nil {
			return false, err
		}
		secret, err := rancher.MachinePlan(ctx, a.s.Workload.Client, n)
		if err != nil || secret == nil || rancher.Asked(secret, rancher.PreDrainRequest) == "" || rancher.Answered(secret, rancher.PreDrainRequest, rancher.PreDrainHook) {
			return false, err
		}
		nu, err = a.running(ctx)
		return nu != nil, err
	}); err != nil {
		return err
	}
	task := nu.Labels[inplacev1.UpgradeTaskLabel]
	t := &inplacev1.UpgradeTask{}
	if err := a.s.Management.Client.Get(ctx, client.ObjectKey{Namespace: nu.Namespace, Name: task}, t); err != nil {
		return fmt.Errorf("read UpgradeTask %s of NodeUpdate %s: %w", task, nu.Name, err)
	}
	patch := []byte(fmt.Sprintf(`{"spec":{"phase":%q}}`, inplacev1.TaskActionAbort))
	if err := a.s.Management.Client.Patch(ctx, t, client.RawPatch("application/merge-patch+json", patch)); err != nil {
		return fmt.Errorf("abort UpgradeTask %s: %w", task, err)
	}
	a.mu.Lock()
	a.task, a.nodeUpdate, a.aborted = task, nu.Name, time.Now()
	a.mu.Unlock()
	a.view.step(fmt.Sprintf("UpgradeTask %s aborted (spec.phase Abort) while Rancher waits at %s's pre-drain hook, the node cordoned by Rancher (--abort-at)", task, a.node))
	return waitUntil(ctx, func() (bool, error) {
		cur := &inplacev1.NodeUpdate{}
		if err := a.s.Management.Client.Get(ctx, client.ObjectKeyFromObject(nu), cur); err != nil {
			return false, client.IgnoreNotFound(err)
		}
		if !cur.Status.Phase.IsFinal() {
			return false, nil
		}
		a.mu.Lock()
		a.ended = time.Now()
		a.mu.Unlock()
		a.view.step(fmt.Sprintf("NodeUpdate %s ended %s: Rancher's drain of %s withdrawn, its planner paused until a NodeUpdate waits for it again", cur.Name, cur.Status.Phase, a.node))
		return true, nil
	})
}

// running is the node's NodeUpdate that runs now, nil when none does.
func (a *aborter) running(ctx context.Context) (*inplacev1.NodeUpdate, error) {
	list := &inplacev1.NodeUpdateList{}
	if err := a.s.Management.Client.List(ctx, list, client.InNamespace(a.s.Cluster.Namespace)); err != nil {
		return nil, err
	}
	for i := range list.Items {
		nu := &list.Items[i]
		if nu.Spec.NodeName == a.node && !nu.Status.Phase.IsFinal() && nu.Labels[inplacev1.UpgradeTaskLabel] != "" {
			return nu, nil
		}
	}
	return nil, nil
}

// check says whether the abort ended as promised: the node's NodeUpdate ended, the node
// is not cordoned and its plan Secret is in no drain, and Rancher restarted RKE2 on it
// neither after its NodeUpdate ended nor at all (the abort came before the pre-drain
// answer).
func (a *aborter) check(ctx context.Context) scenario.Check {
	a.mu.Lock()
	defer a.mu.Unlock()
	c := scenario.Check{Name: fmt.Sprintf("the abort at %s's pre-drain hook ended settled: the node uncordoned, Rancher's drain of it withdrawn, no RKE2 restart there", a.node)}
	switch {
	case a.problem != "":
		c.Detail = a.problem
		return c
	case a.task == "":
		c.Detail = "Rancher never took the node while a NodeUpdate ran there: nothing was aborted"
		return c
	case a.ended.IsZero():
		c.Detail = fmt.Sprintf("NodeUpdate %s did not end after UpgradeTask %s was aborted", a.nodeUpdate, a.task)
		return c
	}
	n := nodeObject()
	if err := a.s.Workload.Client.Get(ctx, client.ObjectKey{Name: a.node}, n); err != nil {
		c.Detail = err.Error()
		return c
	}
	secret, err := rancher.MachinePlan(ctx, a.s.Workload.Client, n)
	switch {
	case err != nil:
		c.Detail = err.Error()
	case n.Spec.Unschedulable:
		c.Detail = a.node + " is left cordoned"
	case secret != nil && secret.Annotations[rancher.DrainOptionsAnnotation] != "":
		c.Detail = a.node + "'s plan Secret is left in Rancher's drain"
	default:
		c.OK = true
		for _, r := range a.s.Planner.Restarts() {
			if r.Node == a.node {
				c.OK, c.Detail = false, fmt.Sprintf("Rancher restarted RKE2 on %s (%s to %s) at %s", a.node, r.From, r.To, r.Start.Format(time.RFC3339Nano))
			}
		}
	}
	return c
}

func nodeObject() *corev1.Node { return &corev1.Node{} }

func waitUntil(ctx context.Context, cond func() (bool, error)) error {
	for {
		ok, err := cond()
		if err != nil || ok {
			return err
		}
		if err := sleep(ctx, 100*time.Millisecond); err != nil {
			return err
		}
	}
}
