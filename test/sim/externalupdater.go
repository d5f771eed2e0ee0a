package sim

import (
	"context"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/test/fixtures"
)

// ExternalUpdater plays an updater served outside the manager and the nodes it upgrades,
// as the NodeUpdate contract for external updaters describes it (docs/nodeupdate-contract.md):
// it writes status.phase, status.currentStep and the result of the NodeUpdates of one
// namespace. A new NodeUpdate takes its node NotReady and runs for Hold; then the node
// comes back Ready and the NodeUpdate succeeds, or fails with the message given for its
// machine. An aborted NodeUpdate stops after AbortDelay, its node Ready again.
type ExternalUpdater struct {
	client     client.Client
	namespace  string
	hold       time.Duration
	abortDelay time.Duration
	logf       func(format string, args ...any)
	// nodesStayReady keeps the nodes Ready while their NodeUpdates run, as in the first
	// steps of a real node upgrade (repository, image preload) before the drain.
	nodesStayReady bool
	// nodes reaches the node of a NodeUpdate; the management client at first.
	nodes Nodes

	mu        sync.Mutex
	fail      map[string]string
	seen      map[string]time.Time
	abortSeen map[string]time.Time
	stop      func()
}

// RunExternalUpdater starts an ExternalUpdater for the NodeUpdates of namespace, which
// looks at them every 50ms until Stop. logf receives what it could not write.
func RunExternalUpdater(ctx context.Context, c client.Client, namespace string, hold time.Duration, logf func(format string, args ...any)) *ExternalUpdater {
	s := &ExternalUpdater{
		client: c, namespace: namespace, hold: hold, abortDelay: 300 * time.Millisecond, logf: logf, nodes: managementNodes{c},
		fail: map[string]string{}, seen: map[string]time.Time{}, abortSeen: map[string]time.Time{},
	}
	sctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-sctx.Done():
				return
			case <-time.After(50 * time.Millisecond):
			}
			s.step(sctx)
		}
	}()
	s.stop = func() { cancel(); <-done }
	return s
}

// Stop ends the simulator and waits until it has stopped.
func (s *ExternalUpdater) Stop() { s.stop() }

// SetAbortDelay sets how long an aborted NodeUpdate takes to stop; 300ms at first.
func (s *ExternalUpdater) SetAbortDelay(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.abortDelay = d
}

// KeepNodesReady makes the NodeUpdates run without taking their nodes NotReady, as the
// first steps of a real node upgrade do (repository, image preload): only the
// NodeUpdates, not the nodes' readiness, then tell that the nodes are being upgraded.
func (s *ExternalUpdater) KeepNodesReady() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.nodesStayReady = true
}

// Nodes is how an ExternalUpdater reaches the node a NodeUpdate upgrades: the kubelet's
// side of the work, readiness and the version it reports.
type Nodes interface {
	// SetReady sets the node's Ready condition, as its kubelet would.
	SetReady(ctx context.Context, nu *inplacev1.NodeUpdate, ready bool) error
	// Upgraded makes the node report what the NodeUpdate upgraded it to (the kubelet
	// version, for one): called when the NodeUpdate succeeds, before it is marked so.
	Upgraded(ctx context.Context, nu *inplacev1.NodeUpdate) error
}

// managementNodes are Nodes on the management API server (the tests where it plays the
// workload cluster too); their kubelet version is not looked at, so Upgraded does nothing.
type managementNodes struct{ c client.Client }

func (m managementNodes) SetReady(ctx context.Context, nu *inplacev1.NodeUpdate, ready bool) error {
	return fixtures.SetNodeReady(ctx, m.c, nu.Spec.NodeName, ready)
}

func (managementNodes) Upgraded(context.Context, *inplacev1.NodeUpdate) error { return nil }

// UseNodes makes the simulator reach the nodes through n instead of the management client.
func (s *ExternalUpdater) UseNodes(n Nodes) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.nodes = n
}

// FailMachine makes the NodeUpdate of machine fail with message once it has run.
func (s *ExternalUpdater) FailMachine(machine, message string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fail[machine] = message
}

func (s *ExternalUpdater) step(ctx context.Context) {
	s.mu.Lock()
	defer s.mu.Unlock()
	list := &inplacev1.NodeUpdateList{}
	if err := s.client.List(ctx, list, client.InNamespace(s.namespace)); err != nil {
		return
	}
	now := time.Now()
	for i := range list.Items {
		nu := &list.Items[i]
		if nu.Status.Phase.IsFinal() {
			continue
		}
		if nu.Spec.Phase == inplacev1.TaskActionAbort {
			if _, ok := s.abortSeen[nu.Name]; !ok {
				s.abortSeen[nu.Name] = now
			}
			if now.Sub(s.abortSeen[nu.Name]) >= s.abortDelay {
				s.setReady(ctx, nu, true)
				s.finish(ctx, nu, inplacev1.NodeUpdatePhaseAborted, "")
			}
			continue
		}
		started, ok := s.seen[nu.Name]
		if !ok {
			s.seen[nu.Name] = now
			if !s.nodesStayReady {
				s.setReady(ctx, nu, false)
			}
			nu.Status.Phase = inplacev1.NodeUpdatePhaseInProgress
			nu.Status.CurrentStep = "KubernetesUpgrade"
			nu.Status.StartTime = ptr.To(metav1.Now())
			_ = s.client.Status().Update(ctx, nu)
			continue
		}
		if now.Sub(started) < s.hold {
			continue
		}
		if msg, failing := s.fail[nu.Spec.MachineName]; failing {
			s.finish(ctx, nu, inplacev1.NodeUpdatePhaseFailed, msg)
			continue
		}
		if err := s.nodes.Upgraded(ctx, nu); err != nil {
			// The node did not take the new version: try again at the next look.
			s.log("external updater simulator: upgrade the node of %s: %v", nu.Name, err)
			continue
		}
		s.setReady(ctx, nu, true)
		s.finish(ctx, nu, inplacev1.NodeUpdatePhaseSucceeded, "")
	}
}

func (s *ExternalUpdater) setReady(ctx context.Context, nu *inplacev1.NodeUpdate, ready bool) {
	// A node that is gone (its machine deleted) has no readiness to set.
	if err := s.nodes.SetReady(ctx, nu, ready); err != nil && !apierrors.IsNotFound(err) {
		s.log("external updater simulator: set the node of %s Ready=%v: %v", nu.Name, ready, err)
	}
}

func (s *ExternalUpdater) log(format string, args ...any) {
	if s.logf != nil {
		s.logf(format, args...)
	}
}

func (s *ExternalUpdater) finish(ctx context.Context, nu *inplacev1.NodeUpdate, phase inplacev1.NodeUpdatePhase, message string) {
	nu.Status.Phase = phase
	nu.Status.CompletionTime = ptr.To(metav1.Now())
	if phase == inplacev1.NodeUpdatePhaseFailed {
		nu.Status.FailureReason = inplacev1.StepFailedReason
		nu.Status.FailureMessage = message
	}
	if err := s.client.Status().Update(ctx, nu); err != nil {
		s.log("external updater simulator: finish %s: %v", nu.Name, err)
	}
}
