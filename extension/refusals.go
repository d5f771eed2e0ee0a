package extension

import (
	"sort"
	"sync"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"sigs.k8s.io/cluster-api/util/cache"
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
	OldMachineSet, NewMachineSet client.ObjectKey
	// At is when capi-inplace answered.
	At time.Time
	// Message is the answer's message.
	Message string
}

// Until is when Cluster API forgets the answer (unless its controller restarts earlier).
func (r Refusal) Until() time.Time { return r.At.Add(CAPIAnswerCacheTTL) }

// RefusalLog remembers the "not in place" answers the hook server gave, for as long as
// Cluster API keeps them, so that UpgradePreview can name the machines Cluster API would
// replace on such an answer without asking again. It lives in the manager's memory: a
// restarted manager has forgotten what it answered before.
type RefusalLog struct {
	mu      sync.Mutex
	entries map[[2]client.ObjectKey]Refusal
}

// NewRefusalLog returns an empty log.
func NewRefusalLog() *RefusalLog {
	return &RefusalLog{entries: map[[2]client.ObjectKey]Refusal{}}
}

// answered records the answer Cluster API now keeps for a pair: Cluster API asks only
// when it keeps no answer for the pair (the first time, after CAPIAnswerCacheTTL, or
// after its controller restarted), so the latest call's answer is the one it keeps. A
// refusal is kept; an answer in place forgets an earlier refusal. Entries Cluster API
// has forgotten are dropped, so the log stays as small as Cluster API's cache.
func (l *RefusalLog) answered(old, desired client.ObjectKey, refused bool, message string, at time.Time) {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for k, e := range l.entries {
		if !e.Until().After(at) {
			delete(l.entries, k)
		}
	}
	key := [2]client.ObjectKey{old, desired}
	if !refused {
		delete(l.entries, key)
		return
	}
	l.entries[key] = Refusal{OldMachineSet: old, NewMachineSet: desired, At: at, Message: message}
}

// Of returns the refusals Cluster API still keeps at now for the MachineSet as the
// current one, oldest first.
func (l *RefusalLog) Of(ms client.ObjectKey, now time.Time) []Refusal {
	if l == nil {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []Refusal
	for _, e := range l.entries {
		if e.OldMachineSet == ms && e.Until().After(now) {
			out = append(out, e)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].At.Before(out[j].At) })
	return out
}
