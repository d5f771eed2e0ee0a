package kubeversion

import (
	"sync"

	"k8s.io/apimachinery/pkg/util/version"
)

// parsed memoizes ParseSemantic: a reconcile of an UpgradeTask judges the version of
// every machine of its target, and a Cluster has a handful of distinct versions, where
// k8s.io/apimachinery's parser runs a regular expression each time (a tenth of the
// manager's CPU time at 500 machines, issue #55).
var parsed struct {
	mu sync.RWMutex
	m  map[string]parseResult
}

type parseResult struct {
	v   *version.Version
	err error
}

// maxParsed bounds the memoized strings: a version string comes from an object a user
// wrote, so they are not a fixed set. Past it the memo starts again.
const maxParsed = 4096

// ParseSemantic is version.ParseSemantic, memoized. The *version.Version it returns is
// shared between callers: version.Version has no method that changes it (each With...
// returns a copy), so it must be used only through them.
func ParseSemantic(s string) (*version.Version, error) {
	parsed.mu.RLock()
	r, ok := parsed.m[s]
	parsed.mu.RUnlock()
	if ok {
		return r.v, r.err
	}
	v, err := version.ParseSemantic(s)
	parsed.mu.Lock()
	if parsed.m == nil || len(parsed.m) >= maxParsed {
		parsed.m = make(map[string]parseResult, 64)
	}
	parsed.m[s] = parseResult{v: v, err: err}
	parsed.mu.Unlock()
	return v, err
}
