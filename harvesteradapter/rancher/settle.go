package rancher

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Rancher's drain of a node, as its planner and machine-drain controller keep it on the
// node's plan Secret (rancher@v2.14.4 pkg/capr/common.go; pkg/capr/planner/drain.go;
// pkg/controllers/capr/machinedrain/machinedrain.go): the planner writes the drain
// options into DrainOptionsAnnotation when it takes the node; the machine-drain
// controller cordons the node, asks for the pre-drain hooks the options name, drains
// when enabled and sets DrainDoneAnnotation to the same value; the planner delivers the
// plan and, once it is applied, asks for the uncordon (UnCordonAnnotation); the
// machine-drain controller asks for the post-drain hooks, uncordons and removes every
// one of these annotations. The controller keeps working from the options the drain
// started with, whatever the strategy says later: a drain that names our hooks waits for
// our answers for good.
const (
	DrainOptionsAnnotation = "rke.cattle.io/drain-options"
	DrainDoneAnnotation    = "rke.cattle.io/drain-done"
	UnCordonAnnotation     = "rke.cattle.io/uncordon"
)

// InOurDrain says whether Rancher drains the node under options that name our hooks.
func InOurDrain(secret *corev1.Secret) bool {
	return strings.Contains(secret.Annotations[DrainOptionsAnnotation], PreDrainHook) ||
		strings.Contains(secret.Annotations[DrainOptionsAnnotation], PostDrainHook)
}

// Withdraw takes back Rancher's drain of a node whose pre-drain hook we have not
// answered, while the planner is paused (PausePlanner): its drain annotations and
// requests go, and the node Rancher cordoned for it is uncordoned. Nothing was delivered
// yet (the planner delivers only after drain-done), so the node is where it was before
// Rancher took it; resumed, the planner takes it again from the start (drain.go: no
// drain-options, so it writes them). It does nothing once our pre-drain hook answered.
// It says whether it changed anything.
func Withdraw(ctx context.Context, c client.Client, secret *corev1.Secret, node string) (bool, error) {
	a := secret.Annotations
	if Answered(secret, PreDrainRequest, PreDrainHook) || a[DrainDoneAnnotation] != "" {
		return false, nil
	}
	changed := false
	if a[DrainOptionsAnnotation] != "" || a[PreDrainRequest] != "" || a[PreDrainHook] != "" {
		remove := map[string]any{DrainOptionsAnnotation: nil, PreDrainRequest: nil, PreDrainHook: nil, PostDrainHook: nil,
			WithdrawnAtAnnotation: time.Now().UTC().Format(time.RFC3339Nano)}
		if err := patchSecretAnnotations(ctx, c, secret, remove); err != nil {
			return false, fmt.Errorf("withdraw Rancher's drain of node %s: %w", node, err)
		}
		changed = true
	}
	uncordoned, err := Uncordon(ctx, c, node)
	return changed || uncordoned, err
}

// DefaultPlannerSettle is how long, by default, an ending of a node Rancher may be taking
// holds with the planner paused, and a withdrawn drain is watched (SettleWithdrawn).
const DefaultPlannerSettle = 5 * time.Second

// WithdrawnAtAnnotation, on a node's plan Secret, says when Withdraw last took Rancher's
// drain of the node back (RFC 3339), for SettleWithdrawn.
const WithdrawnAtAnnotation = "harvester.inplace.cluster.x-k8s.io/drain-withdrawn-at"

// SettleWithdrawn says whether a drain Withdraw took back has settled: settle has passed
// since. Until then each call uncordons the node again. Rancher's machine-drain
// controller handles the Secret its informer cache holds when the Secret's key comes out
// of its queue (rancher@v2.14.4 pkg/controllers/capr/machinedrain/machinedrain.go
// OnChange), so a version from before the withdrawal can still reach it: its drain
// cordons the node first, with the Node read fresh, and then finds the pre-drain request
// already there in that version and writes nothing (drain, RunCordonOrUncordon,
// updateSecretAnnotationIfCheckTrue only when the request differs). The node would stay
// cordoned with no drain on its Secret, and no one to lift it. The call that finds settle
// passed uncordons once more and removes the annotation; one that finds it passed long
// ago (twice settle: the annotation outlived a drain Rancher started since) only removes
// it. A Secret in a drain again is not settled: the caller withdraws that first.
func SettleWithdrawn(ctx context.Context, c client.Client, secret *corev1.Secret, node string, settle time.Duration, now time.Time) (bool, error) {
	v := secret.Annotations[WithdrawnAtAnnotation]
	if v == "" {
		return true, nil
	}
	if InOurDrain(secret) || secret.Annotations[PreDrainRequest] != "" {
		return false, nil
	}
	at, err := time.Parse(time.RFC3339Nano, v)
	if err == nil && now.Sub(at) < 2*settle {
		if _, err := Uncordon(ctx, c, node); err != nil {
			return false, err
		}
		if now.Sub(at) < settle {
			return false, nil
		}
	}
	if err := patchSecretAnnotations(ctx, c, secret, map[string]any{WithdrawnAtAnnotation: nil}); err != nil {
		if apierrors.IsConflict(err) {
			return false, nil // written meanwhile: the next call looks again
		}
		return false, err
	}
	return true, nil
}

// WithdrawUnapplied takes back Rancher's drain of a node whose pre-drain hook we answered
// but whose plan rancher-system-agent has not applied (the agent silent, the node's
// update ended): every drain annotation, hook request and answer goes, and the node
// Rancher cordoned is uncordoned. The planner delivers the plan once the drain is done
// and never drains a node again for a plan it delivered (rancher@v2.14.4
// pkg/capr/planner/planner.go reconcile: p.drain only for a changing plan, r.change); with no
// drain-options its undrain asks for no uncordon (drain.go undrain), and the
// machine-drain controller has nothing to do (machinedrain.go OnChange). So when the
// agent applies the plan later, Rancher waits at no hook. Only where the restart guard
// keeps that application from restarting RKE2. It says whether it changed anything.
func WithdrawUnapplied(ctx context.Context, c client.Client, secret *corev1.Secret, node string) (bool, error) {
	remove := map[string]any{}
	for _, key := range []string{DrainOptionsAnnotation, DrainDoneAnnotation, UnCordonAnnotation, PreDrainRequest, PreDrainHook, PostDrainRequest, PostDrainHook} {
		if _, ok := secret.Annotations[key]; ok {
			remove[key] = nil
		}
	}
	changed := false
	if len(remove) > 0 {
		if err := patchSecretAnnotations(ctx, c, secret, remove); err != nil {
			return false, fmt.Errorf("withdraw Rancher's drain of node %s: %w", node, err)
		}
		changed = true
	}
	uncordoned, err := Uncordon(ctx, c, node)
	return changed || uncordoned, err
}

// PostDrainAnsweredAhead says whether our post-drain hook is answered on the node's plan
// Secret before Rancher asked for it (PreAnswer): the planner, once it runs, passes that
// node's post-drain hook at once and goes on to the next node.
func PostDrainAnsweredAhead(secret *corev1.Secret) bool {
	value := secret.Annotations[DrainOptionsAnnotation]
	return value != "" && secret.Annotations[PostDrainRequest] == "" && secret.Annotations[PostDrainHook] == value
}

// PreAnswer answers, ahead of Rancher's requests, both of our hooks that a drain of the
// node names, so that the machine-drain controller finishes it by itself however the
// strategy changes: drain-done, then, once the plan is applied and the planner asks for
// the uncordon, the uncordon (machinedrain.go checkHookAnnotations compares each hook's
// annotation with the drain options' value, asked or not). Only where the restart guard
// keeps RKE2 from restarting when the plan is delivered. It says whether it changed
// anything.
func PreAnswer(ctx context.Context, c client.Client, secret *corev1.Secret) (bool, error) {
	value := secret.Annotations[DrainOptionsAnnotation]
	if value == "" || !InOurDrain(secret) {
		return false, nil
	}
	set := map[string]any{}
	for _, hook := range []string{PreDrainHook, PostDrainHook} {
		if secret.Annotations[hook] != value {
			set[hook] = value
		}
	}
	if len(set) == 0 {
		return false, nil
	}
	return true, patchSecretAnnotations(ctx, c, secret, set)
}

// Uncordon makes the node schedulable; it says whether it was cordoned. It reads nothing
// first: one JSON patch tests that the node is cordoned and uncordons it, so the answer
// is the API server's at the moment of the write. A read made before (through a client
// that answers a reconcile's reads once, say) can be older than a cordon of Rancher's
// machine-drain controller, which cordons whenever the Secret it handles asks for a
// drain, paused planner or not (rancher@v2.14.4 pkg/controllers/capr/machinedrain
// machinedrain.go drain): acting on it, an uncordon would be skipped and the node left
// cordoned by no one's roll (soak seed 183).
func Uncordon(ctx context.Context, c client.Client, name string) (bool, error) {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
	patch := []byte(`[{"op":"test","path":"/spec/unschedulable","value":true},{"op":"remove","path":"/spec/unschedulable"}]`)
	switch err := c.Patch(ctx, node, client.RawPatch(types.JSONPatchType, patch)); {
	case err == nil:
		return true, nil
	case apierrors.IsNotFound(err):
		return false, nil
	case apierrors.IsInvalid(err):
		return false, nil // the test failed: the node is not cordoned
	default:
		return false, fmt.Errorf("uncordon node %s: %w", name, err)
	}
}

func patchSecretAnnotations(ctx context.Context, c client.Client, secret *corev1.Secret, annotations map[string]any) error {
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{
		"annotations":     annotations,
		"resourceVersion": secret.ResourceVersion,
	}})
	if err != nil {
		return err
	}
	if err := c.Patch(ctx, secret, client.RawPatch(types.MergePatchType, patch)); err != nil {
		return fmt.Errorf("annotate machine-plan Secret %s/%s: %w", secret.Namespace, secret.Name, err)
	}
	return nil
}
