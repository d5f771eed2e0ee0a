package sim

import (
	"context"
	"fmt"
	"sync"
	"time"

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
		client: c, namespace: namespace, hold: hold, abortDelay: 300 * time.Millisecond, logf: logf,
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
				_ = fixtures.SetNodeReady(ctx, s.client, nu.Spec.NodeName, true)
				s.finish(ctx, nu, inplacev1.NodeUpdatePhaseAborted, "")
			}
			continue
		}
		started, ok := s.seen[nu.Name]
		if !ok {
			s.seen[nu.Name] = now
			if !s.nodesStayReady {
				_ = fixtures.SetNodeReady(ctx, s.client, nu.Spec.NodeName, false)
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
		_ = fixtures.SetNodeReady(ctx, s.client, nu.Spec.NodeName, true)
		s.finish(ctx, nu, inplacev1.NodeUpdatePhaseSucceeded, "")
	}
}

func (s *ExternalUpdater) finish(ctx context.Context, nu *inplacev1.NodeUpdate, phase inplacev1.NodeUpdatePhase, message string) {
	nu.Status.Phase = phase
	nu.Status.CompletionTime = ptr.To(metav1.Now())
	if phase == inplacev1.NodeUpdatePhaseFailed {
		nu.Status.FailureReason = inplacev1.StepFailedReason
		nu.Status.FailureMessage = message
	}
	if err := s.client.Status().Update(ctx, nu); err != nil && s.logf != nil {
		s.logf("%s", fmt.Sprintf("external updater simulator: finish %s: %v", nu.Name, err))
	}
}
