// Package kubeversion orders Kubernetes versions the way capi-inplace upgrades them: by
// semantic version, and, for two versions of the same release that differ only in build
// metadata, by the distribution's own release counter (+rke2rN, +k3sN). Every path that
// judges whether a change is an upgrade (request admission, Cluster API's CanUpdate
// hooks, "is this machine at the target") asks this package, so that no path orders
// versions differently.
package kubeversion

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/util/version"
)

// counted are the build metadata forms whose counter orders two builds of the same
// release: RKE2's +rke2rN and K3s's +k3sN. N has no leading zero, so that two strings of
// one form that differ always differ in N.
var counted = []*regexp.Regexp{
	regexp.MustCompile(`^rke2r(0|[1-9][0-9]*)$`),
	regexp.MustCompile(`^k3s(0|[1-9][0-9]*)$`),
}

// AmbiguousError says that two versions differ only in build metadata that has no order:
// neither is known to be newer.
type AmbiguousError struct {
	// A and B are the build metadata of the two versions, without the '+'; empty for none.
	A, B string
}

func (e *AmbiguousError) Error() string {
	return fmt.Sprintf("they differ only in build metadata (%s and %s), which has no order: capi-inplace orders only +rke2rN and +k3sN, by N, between two versions of the same form",
		metadata(e.A), metadata(e.B))
}

func metadata(m string) string {
	if m == "" {
		return "none"
	}
	return "+" + m
}

// Compare returns -1 when a is older than b, 0 when they are the same release, +1 when a
// is newer. The semantic version (major, minor, patch, pre-release) decides first; for the
// same semantic version, equal build metadata is the same release, +rke2rN against
// +rke2rM (or +k3sN against +k3sM) is ordered by N, and any other difference (+foo
// against +bar, metadata on one side only, +rke2r1 against +k3s1) is an *AmbiguousError.
func Compare(a, b *version.Version) (int, error) {
	switch {
	case a.LessThan(b):
		return -1, nil
	case b.LessThan(a):
		return 1, nil
	}
	ma, mb := a.BuildMetadata(), b.BuildMetadata()
	if ma == mb {
		return 0, nil
	}
	for _, form := range counted {
		na, nb := form.FindStringSubmatch(ma), form.FindStringSubmatch(mb)
		if na != nil && nb != nil {
			return compareCounters(na[1], nb[1]), nil
		}
	}
	return 0, &AmbiguousError{A: ma, B: mb}
}

// compareCounters orders two decimal counters without leading zeros, of any length.
func compareCounters(a, b string) int {
	switch {
	case len(a) != len(b):
		if len(a) < len(b) {
			return -1
		}
		return 1
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// CompareStrings parses a and b as semantic versions and compares them (Compare).
func CompareStrings(a, b string) (int, error) {
	va, err := ParseSemantic(a)
	if err != nil {
		return 0, fmt.Errorf("version %q: %w", a, err)
	}
	vb, err := ParseSemantic(b)
	if err != nil {
		return 0, fmt.Errorf("version %q: %w", b, err)
	}
	return Compare(va, vb)
}

// SameRelease reports whether a and b are the same release: Compare says 0.
func SameRelease(a, b *version.Version) bool {
	c, err := Compare(a, b)
	return err == nil && c == 0
}

// NextBuild returns v with the counter of its +rke2rN or +k3sN build metadata one higher,
// for example v1.33.3+rke2r2 for v1.33.3+rke2r1, as an example of a version that is newer
// by build only; false when v carries no counted build metadata. v keeps its own spelling
// (the v prefix, the pre-release).
func NextBuild(v string) (string, bool) {
	base, meta, found := strings.Cut(v, "+")
	if !found {
		return "", false
	}
	for _, form := range counted {
		m := form.FindStringSubmatch(meta)
		if m == nil {
			continue
		}
		n, err := strconv.ParseUint(m[1], 10, 63)
		if err != nil {
			return "", false
		}
		return base + "+" + strings.TrimSuffix(meta, m[1]) + strconv.FormatUint(n+1, 10), true
	}
	return "", false
}
