package capisim

import (
	"context"
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	runtimehooksv1 "sigs.k8s.io/cluster-api/api/runtime/hooks/v1alpha1"
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

// UpdateMachine does for one machine what Cluster API does once it decided to update it in
// place: the owning controller marks the machine with the update-in-progress annotation
// and writes the desired version into Machine.spec.version, then the Machine controller
// calls UpdateMachine until the answer is done (Success with no retry; the annotation is
// then removed) or failed (Failure, returned as an error with the extension's message). It
// calls again after poll rather than after the answer's retryAfterSeconds, so that
// simulated upgrades run at their own pace. progress, when set, sees every answer.
func UpdateMachine(ctx context.Context, c client.Client, call CallUpdateMachine, key client.ObjectKey, version string, settings map[string]string, poll time.Duration, progress func(*runtimehooksv1.UpdateMachineResponse)) error {
	machine := &clusterv1.Machine{}
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := c.Get(ctx, key, machine); err != nil {
			return err
		}
		if _, marked := machine.Annotations[clusterv1.UpdateInProgressAnnotation]; marked && machine.Spec.Version == version {
			return nil
		}
		if machine.Annotations == nil {
			machine.Annotations = map[string]string{}
		}
		machine.Annotations[clusterv1.UpdateInProgressAnnotation] = ""
		machine.Spec.Version = version
		return c.Update(ctx, machine)
	}); err != nil {
		return fmt.Errorf("write the desired version into Machine %s: %w", key, err)
	}
	req := &runtimehooksv1.UpdateMachineRequest{
		CommonRequest: runtimehooksv1.CommonRequest{Settings: settings},
		Desired:       runtimehooksv1.UpdateMachineRequestObjects{Machine: SpecOnly(machine)},
	}
	for {
		resp := &runtimehooksv1.UpdateMachineResponse{}
		if err := call(ctx, req, resp); err != nil {
			return fmt.Errorf("call UpdateMachine for Machine %s: %w", key, err)
		}
		if progress != nil {
			progress(resp)
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
				return c.Update(ctx, machine)
			})
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("machine %s not updated before the deadline; last answer: %s", key, resp.Message)
		case <-time.After(poll):
		}
	}
}
