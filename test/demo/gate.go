package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/test/scenario"
)

// The health gate --gate-red-at plays: a CEL gate over one ConfigMap of the workload
// cluster, given to every task of the Cluster by the Cluster's gates annotation.
const (
	demoGateName      = "demo-health"
	demoGateNamespace = "default"
	// demoGateInterval is the manager's --gate-interval in the demo: the task sees the
	// gate turn green within a second.
	demoGateInterval = time.Second
	// demoGateHold is how long the gate stays red once a task showed the pause after the
	// node ended, so that the pause is seen holding the next node.
	demoGateHold = 3 * time.Second
)

// redGate plays --gate-red-at NODE: the gate turns red when NODE's NodeUpdate appears,
// stays red until NODE ended and a task shows the pause (Paused, reason GateRed), and
// some seconds more, then turns green; the task resumes by itself. It records what it
// saw, for the demo's checks.
type redGate struct {
	s    *scenario.Scenario
	view *view
	node string

	mu sync.Mutex
	// paused is the task that showed the pause after the node ended, and its message.
	paused, pausedMessage string
	// startedWhileRed are the NodeUpdates created between the pause seen and the gate
	// turned green: none may be.
	startedWhileRed []string
	// resumed is true when the paused task was seen no longer paused by the gate.
	resumed bool
	// problem says what went wrong playing the gate.
	problem string
}

// newRedGate writes the ConfigMap (green) and the Cluster's gates annotation.
func newRedGate(ctx context.Context, s *scenario.Scenario, v *view, node string) (*redGate, error) {
	n, ok := s.Node(node)
	if !ok {
		return nil, fmt.Errorf("--gate-red-at=%s: no such node", node)
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: demoGateNamespace, Name: demoGateName},
		Data: map[string]string{"healthy": "true"}}
	if err := s.Workload.Client.Create(ctx, cm); err != nil {
		return nil, fmt.Errorf("create ConfigMap %s/%s on the workload cluster: %w", demoGateNamespace, demoGateName, err)
	}
	gates, err := json.Marshal([]inplacev1.HealthGate{{
		Name: demoGateName,
		CEL: &inplacev1.CELGate{
			Resource:   inplacev1.GateResource{APIVersion: "v1", Kind: "ConfigMap", Namespace: demoGateNamespace},
			Expression: fmt.Sprintf(`objects.exists(c, c.metadata.name == %q && c.data.healthy == "true")`, demoGateName),
		},
	}})
	if err != nil {
		return nil, err
	}
	cluster := s.Cluster.DeepCopy()
	if err := s.Management.Client.Get(ctx, client.ObjectKeyFromObject(cluster), cluster); err != nil {
		return nil, err
	}
	patch := client.MergeFrom(cluster.DeepCopy())
	if cluster.Annotations == nil {
		cluster.Annotations = map[string]string{}
	}
	cluster.Annotations[inplacev1.GatesAnnotation] = string(gates)
	if err := s.Management.Client.Patch(ctx, cluster, patch); err != nil {
		return nil, fmt.Errorf("annotate the Cluster with its health gates: %w", err)
	}
	v.step(fmt.Sprintf("health gate %s on every task of the Cluster (annotation %s): ConfigMap %s/%s must say healthy=true; it turns red while %s is upgraded (--gate-red-at)",
		demoGateName, inplacev1.GatesAnnotation, demoGateNamespace, demoGateName, n.Name))
	return &redGate{s: s, view: v, node: n.Name}, nil
}

// run plays the gate until ctx ends or the task resumed.
func (g *redGate) run(ctx context.Context) {
	if err := g.play(ctx); err != nil && ctx.Err() == nil {
		g.mu.Lock()
		g.problem = err.Error()
		g.mu.Unlock()
		g.view.problem("--gate-red-at: " + err.Error())
	}
}

func (g *redGate) play(ctx context.Context) error {
	// Red as soon as the node's NodeUpdate exists.
	if err := g.waitFor(ctx, func() (bool, error) {
		nu, err := g.nodeUpdate(ctx)
		return nu != nil, err
	}); err != nil {
		return err
	}
	if err := g.setHealthy(ctx, false); err != nil {
		return err
	}
	g.view.step(fmt.Sprintf("health gate %s made red: %s is being upgraded; it finishes, no other node starts", demoGateName, g.node))

	// The node ended and a task shows the pause.
	var task string
	if err := g.waitFor(ctx, func() (bool, error) {
		nu, err := g.nodeUpdate(ctx)
		if err != nil || nu == nil || !nu.Status.Phase.IsFinal() {
			return false, err
		}
		t, msg, err := g.pausedByGate(ctx)
		if t == "" || err != nil {
			return false, err
		}
		task = t
		g.mu.Lock()
		g.paused, g.pausedMessage = t, msg
		g.mu.Unlock()
		return true, nil
	}); err != nil {
		return err
	}
	g.view.step(fmt.Sprintf("UpgradeTask %s paused: %s", task, g.pausedMessage))
	before, err := g.nodeUpdateNames(ctx)
	if err != nil {
		return err
	}
	if err := sleep(ctx, demoGateHold); err != nil {
		return err
	}
	after, err := g.nodeUpdateNames(ctx)
	if err != nil {
		return err
	}
	var started []string
	for name := range after {
		if !before[name] {
			started = append(started, name)
		}
	}
	g.mu.Lock()
	g.startedWhileRed = started
	g.mu.Unlock()
	if err := g.setHealthy(ctx, true); err != nil {
		return err
	}
	g.view.step(fmt.Sprintf("health gate %s made green again: the task resumes by itself", demoGateName))

	return g.waitFor(ctx, func() (bool, error) {
		t := &inplacev1.UpgradeTask{}
		if err := g.s.Management.Client.Get(ctx, client.ObjectKey{Namespace: g.s.Cluster.Namespace, Name: task}, t); err != nil {
			return false, err
		}
		c := meta.FindStatusCondition(t.Status.Conditions, inplacev1.PausedCondition)
		if c != nil && c.Status == metav1.ConditionTrue && c.Reason == inplacev1.GateRedReason {
			return false, nil
		}
		g.mu.Lock()
		g.resumed = true
		g.mu.Unlock()
		g.view.step(fmt.Sprintf("UpgradeTask %s resumed (%s)", task, t.Status.Phase))
		return true, nil
	})
}

// check says whether the gate did what the demo promised: the task paused after the
// node, started no node while the gate was red, and resumed by itself.
func (g *redGate) check() scenario.Check {
	g.mu.Lock()
	defer g.mu.Unlock()
	c := scenario.Check{Name: fmt.Sprintf("health gate %s red after %s paused the task, no node started while it was red, and the task resumed when it turned green", demoGateName, g.node)}
	switch {
	case g.problem != "":
		c.Detail = g.problem
	case g.paused == "":
		c.Detail = "no task showed the pause (Paused, reason GateRed) after the node ended"
	case len(g.startedWhileRed) > 0:
		c.Detail = "NodeUpdates started while the gate was red: " + strings.Join(g.startedWhileRed, ", ")
	case !g.resumed:
		c.Detail = fmt.Sprintf("UpgradeTask %s was not seen resuming", g.paused)
	default:
		c.OK = true
	}
	return c
}

func (g *redGate) setHealthy(ctx context.Context, healthy bool) error {
	cm := &corev1.ConfigMap{}
	if err := g.s.Workload.Client.Get(ctx, client.ObjectKey{Namespace: demoGateNamespace, Name: demoGateName}, cm); err != nil {
		return err
	}
	patch := client.MergeFrom(cm.DeepCopy())
	cm.Data["healthy"] = fmt.Sprint(healthy)
	return g.s.Workload.Client.Patch(ctx, cm, patch)
}

// nodeUpdate is the node's NodeUpdate, nil while there is none.
func (g *redGate) nodeUpdate(ctx context.Context) (*inplacev1.NodeUpdate, error) {
	list := &inplacev1.NodeUpdateList{}
	if err := g.s.Management.Client.List(ctx, list, client.InNamespace(g.s.Cluster.Namespace)); err != nil {
		return nil, err
	}
	for i := range list.Items {
		if list.Items[i].Spec.NodeName == g.node {
			return &list.Items[i], nil
		}
	}
	return nil, nil
}

func (g *redGate) nodeUpdateNames(ctx context.Context) (map[string]bool, error) {
	list := &inplacev1.NodeUpdateList{}
	if err := g.s.Management.Client.List(ctx, list, client.InNamespace(g.s.Cluster.Namespace)); err != nil {
		return nil, err
	}
	names := map[string]bool{}
	for _, nu := range list.Items {
		names[nu.Name] = true
	}
	return names, nil
}

// pausedByGate names a task of the Cluster paused by a red health gate, and its message.
func (g *redGate) pausedByGate(ctx context.Context) (string, string, error) {
	tasks := &inplacev1.UpgradeTaskList{}
	if err := g.s.Management.Client.List(ctx, tasks, client.InNamespace(g.s.Cluster.Namespace)); err != nil {
		return "", "", err
	}
	for _, t := range tasks.Items {
		c := meta.FindStatusCondition(t.Status.Conditions, inplacev1.PausedCondition)
		if c != nil && c.Status == metav1.ConditionTrue && c.Reason == inplacev1.GateRedReason {
			return t.Name, c.Message, nil
		}
	}
	return "", "", nil
}

func (g *redGate) waitFor(ctx context.Context, cond func() (bool, error)) error {
	for {
		ok, err := cond()
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		if err := sleep(ctx, 200*time.Millisecond); err != nil {
			return err
		}
	}
}
