// Package healthgate evaluates the health gates of an UpgradeTask (spec.gates and the
// Cluster's inplace.cluster.x-k8s.io/gates annotation): a Prometheus query or alerts, a
// CEL expression over objects of the workload cluster, or a Job run there. Each gate
// gives a Result; a red gate pauses the task, it never fails it.
package healthgate

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
)

// DefaultTimeout bounds the evaluation of one gate.
const DefaultTimeout = 10 * time.Second

// AnnotationGateName is the name of the red gate that stands for a Cluster's gates
// annotation that cannot be read.
const AnnotationGateName = "cluster-gates-annotation"

// Result is the outcome of one gate.
type Result struct {
	// Name is the gate's name.
	Name string
	// Green is true when the gate lets nodes start.
	Green bool
	// Message says what the gate saw, and why it is red.
	Message string
}

// Input is what the gates of one task are evaluated against.
type Input struct {
	// Namespace is the task's namespace, where Prometheus gates' Secrets are.
	Namespace string
	// Task is the task's name; Job gates are named after it.
	Task string
	// Ended counts the task's nodes that ended; a Job gate runs once per count.
	Ended int
	// Workload is a client of the workload cluster; nil with WorkloadErr when it cannot
	// be reached.
	Workload client.Client
	// WorkloadErr says why the workload cluster cannot be reached.
	WorkloadErr error
	// FromCluster names the gates that come from the Cluster's gates annotation
	// (FromCluster), which the Policy may allow less.
	FromCluster map[string]bool
}

// Evaluator evaluates gates. Its zero value is not usable: Management must be set.
type Evaluator struct {
	// Management reads the Secrets of Prometheus gates, in the management cluster.
	Management client.Reader
	// Timeout bounds each gate's evaluation; zero means DefaultTimeout.
	Timeout time.Duration
	// Policy is what the operator allows gates to do; nil means DefaultPolicy().
	Policy *Policy
}

// Evaluate evaluates every gate, concurrently, each within the timeout, and returns their
// results in the order of gates.
func (e *Evaluator) Evaluate(ctx context.Context, gates []inplacev1.HealthGate, in Input) []Result {
	timeout := e.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	results := make([]Result, len(gates))
	var wg sync.WaitGroup
	for i := range gates {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			gctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			g := &gates[i]
			green, msg := e.evaluate(gctx, g, in)
			if !green && gctx.Err() != nil && ctx.Err() == nil {
				msg = fmt.Sprintf("not evaluated within %s: %s", timeout, msg)
			}
			results[i] = Result{Name: g.Name, Green: green, Message: msg}
		}(i)
	}
	wg.Wait()
	return results
}

func (e *Evaluator) evaluate(ctx context.Context, g *inplacev1.HealthGate, in Input) (bool, string) {
	if err := Validate(g); err != nil {
		return false, err.Error()
	}
	policy := e.Policy
	if policy == nil {
		policy = DefaultPolicy()
	}
	switch {
	case g.Prometheus != nil:
		return e.prometheus(ctx, g.Prometheus, in)
	case g.CEL != nil:
		if in.Workload == nil {
			return false, fmt.Sprintf("cannot reach the workload cluster: %v", in.WorkloadErr)
		}
		return evaluateCEL(ctx, g.CEL, in.Workload, policy)
	default:
		if msg := refuseJob(g, in, policy); msg != "" {
			return false, msg
		}
		if in.Workload == nil {
			return false, fmt.Sprintf("cannot reach the workload cluster: %v", in.WorkloadErr)
		}
		return evaluateJob(ctx, g, in, policy.Namespace())
	}
}

// Validate checks what the API server's validation checks of a gate in spec.gates, for
// gates that come from the Cluster's annotation.
func Validate(g *inplacev1.HealthGate) error {
	kinds := 0
	for _, set := range []bool{g.Prometheus != nil, g.CEL != nil, g.Job != nil} {
		if set {
			kinds++
		}
	}
	if kinds != 1 {
		return fmt.Errorf("gate %q sets %d of prometheus, cel and job; set exactly one", g.Name, kinds)
	}
	if p := g.Prometheus; p != nil {
		if (len(p.Alerts) > 0) == (p.Query != "") {
			return fmt.Errorf("gate %q: set exactly one of prometheus.alerts and prometheus.query", g.Name)
		}
		if p.SecretRef.Name == "" {
			return fmt.Errorf("gate %q: prometheus.secretRef.name is empty; name the Secret with the key address", g.Name)
		}
	}
	if c := g.CEL; c != nil && (c.Expression == "" || c.Resource.APIVersion == "" || c.Resource.Kind == "") {
		return fmt.Errorf("gate %q: cel needs expression, resource.apiVersion and resource.kind", g.Name)
	}
	return nil
}

// FromCluster returns the names of the gates of merged (Merge's) that are not the
// task's own: those of the Cluster's gates annotation.
func FromCluster(task, merged []inplacev1.HealthGate) map[string]bool {
	own := map[string]bool{}
	for _, g := range task {
		own[g.Name] = true
	}
	out := map[string]bool{}
	for _, g := range merged {
		if !own[g.Name] {
			out[g.Name] = true
		}
	}
	return out
}

// Merge returns the task's gates followed by the Cluster's (its GatesAnnotation) whose
// names the task does not use: the task's own gate wins on a name clash. An annotation
// that is not a JSON list of gates, or that has a gate without a name, gives a red
// Result named AnnotationGateName that says what to fix.
func Merge(task []inplacev1.HealthGate, cluster *clusterv1.Cluster) ([]inplacev1.HealthGate, []Result) {
	gates := append([]inplacev1.HealthGate(nil), task...)
	if cluster == nil {
		return gates, nil
	}
	raw, ok := cluster.Annotations[inplacev1.GatesAnnotation]
	if !ok {
		return gates, nil
	}
	var fromCluster []inplacev1.HealthGate
	bad := func(msg string) []Result {
		return []Result{{Name: AnnotationGateName, Message: fmt.Sprintf("annotation %s of Cluster %s/%s %s; fix it (a JSON list of gates as in UpgradeTask spec.gates) or remove it",
			inplacev1.GatesAnnotation, cluster.Namespace, cluster.Name, msg)}}
	}
	if err := json.Unmarshal([]byte(raw), &fromCluster); err != nil {
		return gates, bad(fmt.Sprintf("is not a JSON list of gates: %v", err))
	}
	own := map[string]bool{}
	for _, g := range task {
		own[g.Name] = true
	}
	seen := map[string]bool{}
	for i, g := range fromCluster {
		if g.Name == "" {
			return gates, bad(fmt.Sprintf("has a gate without a name (item %d)", i))
		}
		if seen[g.Name] {
			return gates, bad(fmt.Sprintf("names gate %q twice", g.Name))
		}
		seen[g.Name] = true
		if !own[g.Name] {
			gates = append(gates, g)
		}
	}
	return gates, nil
}
