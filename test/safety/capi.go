package safety

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	runtimecatalog "sigs.k8s.io/cluster-api/api/runtime/catalog"
	runtimehooksv1 "sigs.k8s.io/cluster-api/api/runtime/hooks/v1alpha1"
	runtimev1 "sigs.k8s.io/cluster-api/api/runtime/v1beta2"

	"github.com/capi-inplace/capi-inplace/extension"
	"github.com/capi-inplace/capi-inplace/test/capisim"
)

// capiPlayer plays Cluster API rolling out a topology version bump in place, calling
// UpdateMachine in-process (facts: shared/facts/capi-inplace-updates.md):
//   - the control plane first, KCP one machine at a time (fact 22 with maxSurge 0: every
//     control plane machine is updated in place, one after the other);
//   - then the MachineDeployments, one after the other (topology's default upgrade
//     concurrency), each with at most its own maxUnavailable machines updating at once
//     (facts 26 and 27: an in-place update counts as unavailable; maxSurge 0);
//   - topology moves to the workers only once every control plane kubelet reports the
//     version (fact 34);
//   - a machine is marked (update-in-progress, pending-hooks naming UpdateMachine,
//     spec.version the desired one) before UpdateMachine is called (facts 17, 18, 19), and
//     once marked its update is carried on even if the topology version changes meanwhile
//     (fact 17);
//   - a Failure answer is retried (fact 21); after a few, the player gives up on the
//     rollout and removes the machine's marks, standing for the operator or a
//     MachineHealthCheck that ends a machine stuck failing (fact 19.4, the escape hatch).
type capiPlayer struct {
	w *World

	mu      sync.Mutex
	desired string
	// maxUnavailable per MachineDeployment for the current bump.
	maxUnavailable map[string]int
	bumped         chan struct{}
	busy           bool
	cancel         context.CancelFunc
	wg             sync.WaitGroup
}

func newCAPIPlayer(w *World) *capiPlayer {
	return &capiPlayer{w: w, bumped: make(chan struct{}, 1)}
}

// Bump sets the topology version, as a user bumping Cluster.spec.topology.version. Cluster
// API's webhook refuses a topology downgrade; Bump does too.
func (p *capiPlayer) Bump(ctx context.Context, version string, maxUnavailable map[string]int) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.desired != "" && semverLess(version, p.desired) {
		return false
	}
	p.desired, p.maxUnavailable = version, maxUnavailable
	if p.cancel == nil {
		rctx, cancel := context.WithCancel(ctx)
		p.cancel = cancel
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			p.run(rctx)
		}()
	}
	select {
	case p.bumped <- struct{}{}:
	default:
	}
	return true
}

// Busy reports whether a rollout is under way.
func (p *capiPlayer) Busy() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.busy
}

// Stop stops the player and removes the marks of the machines it left in the middle of
// their update (the escape hatch of fact 19.4).
func (p *capiPlayer) Stop(ctx context.Context) {
	p.mu.Lock()
	cancel := p.cancel
	p.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	p.wg.Wait()
	for _, target := range Targets() {
		for _, m := range p.w.Machines(target) {
			_ = p.unmark(ctx, m)
		}
	}
}

func (p *capiPlayer) current() (string, map[string]int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.desired, p.maxUnavailable
}

func (p *capiPlayer) setBusy(b bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.busy = b
}

func (p *capiPlayer) run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-p.bumped:
		}
		p.setBusy(true)
		p.rollout(ctx)
		p.setBusy(false)
	}
}

// rollout rolls the desired version out until it is done, it gave up, or the desired
// version changed (then the next rollout starts from the control plane again).
func (p *capiPlayer) rollout(ctx context.Context) {
	version, mus := p.current()
	for _, m := range p.w.Machines(controlPlane) {
		if !p.needsUpdate(ctx, m, version) {
			continue
		}
		if err := p.updateMachine(ctx, m, version); err != nil {
			p.w.History.Action("CAPI: KCP gives up the rollout to %s at machine %s: %v", version, m, err)
			return
		}
		if v, _ := p.current(); v != version {
			return
		}
	}
	for _, m := range p.w.Machines(controlPlane) {
		if p.kubelet(ctx, m) != version {
			p.w.History.Action("CAPI: topology holds the workers: control plane machine %s does not report %s", m, version)
			return
		}
	}
	for _, md := range machineDeployments {
		sem := make(chan struct{}, max(mus[md], 1))
		var wg sync.WaitGroup
		var failed sync.Once
		var gaveUp atomic.Bool
		for _, m := range p.w.Machines(md) {
			if !p.needsUpdate(ctx, m, version) {
				continue
			}
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				wg.Wait()
				return
			}
			if v, _ := p.current(); v != version || gaveUp.Load() {
				<-sem
				break
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				if err := p.updateMachine(ctx, m, version); err != nil {
					failed.Do(func() {
						p.w.History.Action("CAPI: MachineDeployment %s gives up the rollout to %s at machine %s: %v", md, version, m, err)
						gaveUp.Store(true)
					})
				}
			}()
		}
		wg.Wait()
		if v, _ := p.current(); v != version || gaveUp.Load() || ctx.Err() != nil {
			return
		}
	}
}

func (p *capiPlayer) needsUpdate(ctx context.Context, machine, version string) bool {
	m := &clusterv1.Machine{}
	if err := p.w.env.Client.Get(ctx, client.ObjectKey{Namespace: p.w.ns, Name: machine}, m); err != nil {
		return false
	}
	if !m.DeletionTimestamp.IsZero() {
		return false
	}
	_, marked := m.Annotations[clusterv1.UpdateInProgressAnnotation]
	return marked || m.Spec.Version != version
}

func (p *capiPlayer) kubelet(ctx context.Context, machine string) string {
	m := &clusterv1.Machine{}
	if err := p.w.env.Client.Get(ctx, client.ObjectKey{Namespace: p.w.ns, Name: machine}, m); err != nil || m.Status.NodeInfo == nil {
		return ""
	}
	return m.Status.NodeInfo.KubeletVersion
}

var pendingUpdateMachine = map[string]string{runtimev1.PendingHooksAnnotation: runtimecatalog.HookName(runtimehooksv1.UpdateMachine)}

// updateMachine marks the machine and calls UpdateMachine until done, retrying a Failure
// a few times.
func (p *capiPlayer) updateMachine(ctx context.Context, machine, version string) error {
	p.w.History.Action("CAPI: update machine %s in place to %s", machine, version)
	key := client.ObjectKey{Namespace: p.w.ns, Name: machine}
	var err error
	for attempt := 0; attempt < 4; attempt++ {
		err = capisim.UpdateMachineWith(ctx, p.w.env.Client, p.call, key, version, capisim.UpdateOptions{
			Poll: 50 * time.Millisecond, Annotations: pendingUpdateMachine, CallErrors: 1000,
		})
		if err == nil {
			p.w.History.Action("CAPI: machine %s updated to %s", machine, version)
			return nil
		}
		if ctx.Err() != nil || p.w.isDeleted(machine) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	_ = p.unmark(ctx, machine)
	return err
}

func (p *capiPlayer) call(ctx context.Context, req *runtimehooksv1.UpdateMachineRequest, resp *runtimehooksv1.UpdateMachineResponse) error {
	return p.w.withHooks(func(h *extension.InPlaceHooks, _ *extension.ExternalUpgradeHandler) error {
		h.UpdateMachine(ctx, req, resp)
		return nil
	})
}

// unmark removes the update-in-progress and pending-hooks annotations.
func (p *capiPlayer) unmark(ctx context.Context, machine string) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		m := &clusterv1.Machine{}
		if err := p.w.env.Client.Get(ctx, client.ObjectKey{Namespace: p.w.ns, Name: machine}, m); err != nil {
			return client.IgnoreNotFound(err)
		}
		_, a := m.Annotations[clusterv1.UpdateInProgressAnnotation]
		_, b := m.Annotations[runtimev1.PendingHooksAnnotation]
		if !a && !b {
			return nil
		}
		delete(m.Annotations, clusterv1.UpdateInProgressAnnotation)
		delete(m.Annotations, runtimev1.PendingHooksAnnotation)
		if err := p.w.env.Client.Update(ctx, m); err != nil {
			return err
		}
		p.w.History.Action("CAPI: marks of machine %s removed", machine)
		return nil
	})
}

func (p *capiPlayer) String() string {
	v, mus := p.current()
	return fmt.Sprintf("topology %s %v", v, mus)
}
