package extension

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"sigs.k8s.io/cluster-api/util/cache"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
)

// CAPIAnswerCacheTTL is how long Cluster API's MachineDeployment controller keeps a
// CanUpdateMachineSet answer for a pair of MachineSets without asking again
// (cluster-api v1.14.2 util/cache/cache.go: HookCacheDefaultTTL, used by
// core/reconcilers/machinedeployment/machinedeployment_controller.go: SetupWithManager
// for canUpdateMachineSetCache). A Failure is not kept: CallExtension returns it as an
// error, and canUpdateMachineSetInPlace adds only answers to the cache.
const CAPIAnswerCacheTTL = cache.HookCacheDefaultTTL

// Refusal is a CanUpdateMachineSet answer "not in place" (Success, with changes left
// that no patch covers) that Cluster API keeps for CAPIAnswerCacheTTL, keyed as Cluster
// API keys it: the current and the desired MachineSet.
type Refusal struct {
	// OldMachineSet and NewMachineSet are the request's current and desired MachineSet.
	OldMachineSet client.ObjectKey `json:"old"`
	NewMachineSet client.ObjectKey `json:"new"`
	// At is when capi-inplace answered.
	At time.Time `json:"at"`
	// Message is the answer's message.
	Message string `json:"message"`
}

// Until is when Cluster API forgets the answer (unless its controller restarts earlier).
func (r Refusal) Until() time.Time { return r.At.Add(CAPIAnswerCacheTTL) }

// The refusal log of a namespace's MachineSets is a Lease there, holding its entries in
// one annotation (a Lease, as the disruption ledger's, so that the manager needs no
// rights on ConfigMaps).
// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=get;create;update

// RefusalLeaseName is the Lease of a namespace that keeps the refusals of its MachineSets.
const RefusalLeaseName = "inplace-capi-refusals"

// RefusalsAnnotation holds a refusal Lease's entries, as JSON.
const RefusalsAnnotation = inplacev1.AnnotationPrefix + "capi-refusals"

// RefusalLog remembers the "not in place" answers the hook server gave, for as long as
// Cluster API keeps them, so that UpgradePreview can name the machines Cluster API would
// replace on such an answer without asking again. With Client set, it keeps them in a
// Lease of the MachineSets' namespace (RefusalLeaseName), read live by Of: a restarted
// manager, and the leader whose preview controller reads the log while another replica's
// hook server answered, know what was answered. Without Client it lives in the process's
// memory (tests, and a manager that cannot write the Lease keeps that much).
type RefusalLog struct {
	// Client, when set, writes the namespace Leases; Reader reads them (the API server,
	// not a cache: another replica may have written them a moment ago). Reader defaults
	// to Client.
	Client client.Client
	Reader client.Reader

	mu      sync.Mutex
	entries map[[2]client.ObjectKey]Refusal
}

// NewRefusalLog returns an empty log kept in memory; set Client (and Reader) to keep it
// in Leases.
func NewRefusalLog() *RefusalLog {
	return &RefusalLog{entries: map[[2]client.ObjectKey]Refusal{}}
}

// answered records the answer Cluster API now keeps for a pair: Cluster API asks only
// when it keeps no answer for the pair (the first time, after CAPIAnswerCacheTTL, or
// after its controller restarted), so the latest call's answer is the one it keeps. A
// refusal is kept; an answer in place forgets an earlier refusal. Entries Cluster API
// has forgotten are dropped, so the log stays as small as Cluster API's cache. With
// Client, an error writing the Lease is returned (the answer stands; only the preview
// does not know of it).
func (l *RefusalLog) answered(ctx context.Context, old, desired client.ObjectKey, refused bool, message string, at time.Time) error {
	if l == nil {
		return nil
	}
	if l.Client == nil {
		l.mu.Lock()
		defer l.mu.Unlock()
		if l.entries == nil {
			l.entries = map[[2]client.ObjectKey]Refusal{}
		}
		record(l.entries, old, desired, refused, message, at)
		return nil
	}
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		lease, entries, err := l.read(ctx, old.Namespace)
		if err != nil {
			return err
		}
		record(entries, old, desired, refused, message, at)
		list := make([]Refusal, 0, len(entries))
		for _, e := range entries {
			list = append(list, e)
		}
		sortRefusals(list)
		raw, err := json.Marshal(list)
		if err != nil {
			return err
		}
		if lease == nil {
			if !refused {
				return nil // nothing kept, nothing to write
			}
			lease = &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: old.Namespace, Name: RefusalLeaseName,
				Annotations: map[string]string{RefusalsAnnotation: string(raw)}}}
			err = l.Client.Create(ctx, lease)
			if apierrors.IsAlreadyExists(err) {
				return apierrors.NewConflict(coordinationv1.Resource("leases"), RefusalLeaseName, err) // read again
			}
			return err
		}
		if lease.Annotations[RefusalsAnnotation] == string(raw) {
			return nil
		}
		if lease.Annotations == nil {
			lease.Annotations = map[string]string{}
		}
		lease.Annotations[RefusalsAnnotation] = string(raw)
		return l.Client.Update(ctx, lease) // with the resourceVersion read: a conflict reads again
	})
}

// record puts an answer into entries and drops the entries Cluster API has forgotten.
func record(entries map[[2]client.ObjectKey]Refusal, old, desired client.ObjectKey, refused bool, message string, at time.Time) {
	for k, e := range entries {
		if !e.Until().After(at) {
			delete(entries, k)
		}
	}
	key := [2]client.ObjectKey{old, desired}
	if !refused {
		delete(entries, key)
		return
	}
	entries[key] = Refusal{OldMachineSet: old, NewMachineSet: desired, At: at, Message: message}
}

// read returns the namespace's refusal Lease (nil when there is none) and its entries.
func (l *RefusalLog) read(ctx context.Context, namespace string) (*coordinationv1.Lease, map[[2]client.ObjectKey]Refusal, error) {
	reader := l.Reader
	if reader == nil {
		reader = l.Client
	}
	entries := map[[2]client.ObjectKey]Refusal{}
	lease := &coordinationv1.Lease{}
	err := reader.Get(ctx, client.ObjectKey{Namespace: namespace, Name: RefusalLeaseName}, lease)
	switch {
	case apierrors.IsNotFound(err):
		return nil, entries, nil
	case err != nil:
		return nil, nil, fmt.Errorf("read the refusal log Lease %s/%s: %w", namespace, RefusalLeaseName, err)
	}
	if raw := lease.Annotations[RefusalsAnnotation]; raw != "" {
		var list []Refusal
		if err := json.Unmarshal([]byte(raw), &list); err != nil {
			// Not ours to trust, nor to keep: the next answer writes the log anew.
			return lease, entries, nil
		}
		for _, e := range list {
			entries[[2]client.ObjectKey{e.OldMachineSet, e.NewMachineSet}] = e
		}
	}
	return lease, entries, nil
}

// Of returns the refusals Cluster API still keeps at now for the MachineSet as the
// current one, oldest first.
func (l *RefusalLog) Of(ctx context.Context, ms client.ObjectKey, now time.Time) ([]Refusal, error) {
	if l == nil {
		return nil, nil
	}
	entries := map[[2]client.ObjectKey]Refusal{}
	if l.Client != nil {
		var err error
		if _, entries, err = l.read(ctx, ms.Namespace); err != nil {
			return nil, err
		}
	} else {
		l.mu.Lock()
		for k, e := range l.entries {
			entries[k] = e
		}
		l.mu.Unlock()
	}
	var out []Refusal
	for _, e := range entries {
		if e.OldMachineSet == ms && e.Until().After(now) {
			out = append(out, e)
		}
	}
	sortRefusals(out)
	return out, nil
}

func sortRefusals(list []Refusal) {
	sort.Slice(list, func(i, j int) bool {
		if !list[i].At.Equal(list[j].At) {
			return list[i].At.Before(list[j].At)
		}
		return list[i].NewMachineSet.String() < list[j].NewMachineSet.String()
	})
}
