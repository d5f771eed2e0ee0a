package capisim

import (
	"context"
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	runtimecatalog "sigs.k8s.io/cluster-api/api/runtime/catalog"
	runtimehooksv1 "sigs.k8s.io/cluster-api/api/runtime/hooks/v1alpha1"
	runtimev1 "sigs.k8s.io/cluster-api/api/runtime/v1beta2"
)

// CallUpdateMachine sends one UpdateMachine request to the extension and returns its answer.
type CallUpdateMachine func(ctx context.Context, req *runtimehooksv1.UpdateMachineRequest, resp *runtimehooksv1.UpdateMachineResponse) error

// SpecOnly is a Machine as Cluster API puts it in a hook request: type, name, namespace,
// labels, annotations and spec; no status.
func SpecOnly(m *clusterv1.Machine) clusterv1.Machine {
	return clusterv1.Machine{
		TypeMeta:   metav1.TypeMeta{APIVersion: clusterv1.GroupVersion.String(), Kind: "Machine"},
		ObjectMeta: metav1.ObjectMeta{Name: m.Name, Namespace: m.Namespace, Labels: m.Labels, Annotations: m.Annotations},
		Spec:       *m.Spec.DeepCopy(),
	}
}

// SpecOnlySet is a MachineSet as Cluster API puts it in a hook request.
func SpecOnlySet(ms *clusterv1.MachineSet) clusterv1.MachineSet {
	return clusterv1.MachineSet{
		TypeMeta:   metav1.TypeMeta{APIVersion: clusterv1.GroupVersion.String(), Kind: "MachineSet"},
		ObjectMeta: metav1.ObjectMeta{Name: ms.Name, Namespace: ms.Namespace, Labels: ms.Labels, Annotations: ms.Annotations},
		Spec:       *ms.Spec.DeepCopy(),
	}
}

// UpdateOptions say how UpdateMachineWith plays the Machine controller.
type UpdateOptions struct {
	// Settings are the ExtensionConfig's settings, sent with every request.
	Settings map[string]string
	// Poll is the wait between two calls, used instead of the answer's retryAfterSeconds
	// so that simulated upgrades run at their own pace; default 1s.
	Poll time.Duration
	// Progress, when set, sees every answer.
	Progress func(*runtimehooksv1.UpdateMachineResponse)
	// Annotations are written on the Machine together with the update-in-progress
	// annotation and Cluster API's pending-hooks annotation naming UpdateMachine (always
	// written, as Cluster API does: facts/capi-inplace-updates.md 17, 18), and removed
	// with them when the update is done.
	Annotations map[string]string
	// Objects, when set, fills in the request's other desired objects (bootstrap config,
	// infrastructure machine) for the machine as it is before each call.
	Objects func(m *clusterv1.Machine, desired *runtimehooksv1.UpdateMachineRequestObjects)
	// CallErrors is how many calls in a row may fail without an answer (the extension
	// unreachable, restarting) before UpdateMachineWith gives up; 0 gives up at the first.
	// Cluster API itself retries with backoff forever.
	CallErrors int
}

// UpdateMachine does for one machine what Cluster API does once it decided to update it in
// place: the owning controller marks the machine with the update-in-progress annotation
// and writes the desired version into Machine.spec.version, then the Machine controller
// calls UpdateMachine until the answer is done (Success with no retry; the annotation is
// then removed) or failed (Failure, returned as an error with the extension's message). It
// calls again after poll rather than after the answer's retryAfterSeconds, so that
// simulated upgrades run at their own pace. progress, when set, sees every answer.
func UpdateMachine(ctx context.Context, c client.Client, call CallUpdateMachine, key client.ObjectKey, version string, settings map[string]string, poll time.Duration, progress func(*runtimehooksv1.UpdateMachineResponse)) error {
	return UpdateMachineWith(ctx, c, call, key, version, UpdateOptions{Settings: settings, Poll: poll, Progress: progress})
}

// UpdateMachineWith is UpdateMachine with all its options. The request is built again
// from the Machine before every call, as the Machine controller does on each reconcile.
func UpdateMachineWith(ctx context.Context, c client.Client, call CallUpdateMachine, key client.ObjectKey, version string, opts UpdateOptions) error {
	if opts.Poll <= 0 {
		opts.Poll = time.Second
	}
	marks := map[string]string{runtimev1.PendingHooksAnnotation: runtimecatalog.HookName(runtimehooksv1.UpdateMachine)}
	for k, v := range opts.Annotations {
		marks[k] = v
	}
	opts.Annotations = marks
	machine := &clusterv1.Machine{}
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := c.Get(ctx, key, machine); err != nil {
			return err
		}
		if marked(machine, opts.Annotations) && machine.Spec.Version == version {
			return nil
		}
		if machine.Annotations == nil {
			machine.Annotations = map[string]string{}
		}
		machine.Annotations[clusterv1.UpdateInProgressAnnotation] = ""
		for k, v := range opts.Annotations {
			machine.Annotations[k] = v
		}
		machine.Spec.Version = version
		return c.Update(ctx, machine)
	}); err != nil {
		return fmt.Errorf("write the desired version into Machine %s: %w", key, err)
	}
	failures := 0
	for {
		if err := c.Get(ctx, key, machine); err != nil {
			return fmt.Errorf("read Machine %s: %w", key, err)
		}
		req := &runtimehooksv1.UpdateMachineRequest{
			CommonRequest: runtimehooksv1.CommonRequest{Settings: opts.Settings},
			Desired:       runtimehooksv1.UpdateMachineRequestObjects{Machine: SpecOnly(machine)},
		}
		if opts.Objects != nil {
			opts.Objects(machine, &req.Desired)
		}
		resp := &runtimehooksv1.UpdateMachineResponse{}
		if err := call(ctx, req, resp); err != nil {
			if ctx.Err() != nil || failures >= opts.CallErrors {
				return fmt.Errorf("call UpdateMachine for Machine %s: %w", key, err)
			}
			failures++
			if err := wait(ctx, opts.Poll); err != nil {
				return fmt.Errorf("machine %s not updated before the deadline: %w", key, err)
			}
			continue
		}
		failures = 0
		if opts.Progress != nil {
			opts.Progress(resp)
		}
		if resp.Status == runtimehooksv1.ResponseStatusFailure {
			return fmt.Errorf("the UpdateMachine hook failed for Machine %s: %s", key, resp.Message)
		}
		if resp.RetryAfterSeconds == 0 {
			return retry.RetryOnConflict(retry.DefaultRetry, func() error {
				if err := c.Get(ctx, key, machine); err != nil {
					return err
				}
				delete(machine.Annotations, clusterv1.UpdateInProgressAnnotation)
				for k := range opts.Annotations {
					delete(machine.Annotations, k)
				}
				return c.Update(ctx, machine)
			})
		}
		if err := wait(ctx, opts.Poll); err != nil {
			return fmt.Errorf("machine %s not updated before the deadline; last answer: %s", key, resp.Message)
		}
	}
}

// marked says whether m carries the update-in-progress annotation and the extra ones.
func marked(m *clusterv1.Machine, extra map[string]string) bool {
	if _, ok := m.Annotations[clusterv1.UpdateInProgressAnnotation]; !ok {
		return false
	}
	for k, v := range extra {
		if got, ok := m.Annotations[k]; !ok || got != v {
			return false
		}
	}
	return true
}

func wait(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}
