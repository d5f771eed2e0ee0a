package extension

import (
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"

	"gomodules.xyz/jsonpatch/v2"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/version"

	runtimehooksv1 "sigs.k8s.io/cluster-api/api/runtime/hooks/v1alpha1"

	"github.com/capi-inplace/capi-inplace/internal/kubeversion"
	"github.com/capi-inplace/capi-inplace/nodeupdater"
)

// versionVerdict says whether a version change can be done in place.
type versionVerdict struct {
	// changed is true when current and desired versions differ.
	changed bool
	// covered is true when the change is an upgrade capi-inplace does in place.
	covered bool
	// reason says why a change is not covered.
	reason string
}

// judgeVersion decides whether the change from current to desired is an in-place upgrade:
// both valid semantic versions, newer by kubeversion.Compare, and for a control plane not
// more than one minor version. A change of build metadata only is an upgrade when the
// distribution's counter grows (v1.33.3+rke2r1 to v1.33.3+rke2r2), a downgrade when it
// shrinks, and not covered when it has no order (+foo to +bar, metadata on one side only).
// Versions are compared as versions, never as strings.
func judgeVersion(current, desired string, controlPlane bool) versionVerdict {
	if current == desired {
		return versionVerdict{}
	}
	v := versionVerdict{changed: true}
	cur, err := version.ParseSemantic(current)
	if err != nil {
		v.reason = fmt.Sprintf("the current version %q is not a valid semantic version", current)
		return v
	}
	want, err := version.ParseSemantic(desired)
	if err != nil {
		v.reason = fmt.Sprintf("the desired version %q is not a valid semantic version (MAJOR.MINOR.PATCH, for example v1.33.3+rke2r1)", desired)
		return v
	}
	order, err := kubeversion.Compare(cur, want)
	switch {
	case err != nil:
		v.reason = fmt.Sprintf("%s to %s cannot be ordered: %v", current, desired, err)
	case order > 0:
		v.reason = fmt.Sprintf("%s to %s is a downgrade; in-place downgrades are not supported", current, desired)
	case order == 0:
		// The same release written differently (v1.33.3 and 1.33.3): nothing to do in place.
		v.covered = true
	case controlPlane && (want.Major() != cur.Major() || want.Minor() > cur.Minor()+1):
		v.reason = fmt.Sprintf("%s to %s skips a minor version, which Kubernetes does not support for a control plane; upgrade to v%d.%d first", current, desired, cur.Major(), cur.Minor()+1)
	default:
		v.covered = true
	}
	return v
}

// fieldPaths returns the paths, relative to the object's spec (or template spec), that
// fields covers for an object of the given role and kind.
func fieldPaths(fields []nodeupdater.InPlaceField, object nodeupdater.FieldObject, kind string, versionCovered bool) [][]string {
	var out [][]string
	for _, f := range fields {
		if f.Object != object || len(f.Path) == 0 || (f.WithVersion && !versionCovered) {
			continue
		}
		if len(f.Kinds) > 0 && !slices.ContainsFunc(f.Kinds, func(k string) bool { return k == kind || k+"Template" == kind }) {
			continue
		}
		out = append(out, f.Path)
	}
	return out
}

// objectDoc is one object of a hook request as a JSON document.
type objectDoc struct {
	// raw is the object as the request carried it.
	raw []byte
	// doc is raw decoded; nil when the request carried no object.
	doc map[string]any
}

// decodeObject decodes an object of a hook request. An absent object (CAPI sends no
// bootstrap config for machines without one) is not an error.
func decodeObject(field string, ext runtime.RawExtension) (objectDoc, error) {
	raw := ext.Raw
	if len(raw) == 0 && ext.Object != nil {
		b, err := json.Marshal(ext.Object)
		if err != nil {
			return objectDoc{}, fmt.Errorf("%s cannot be encoded: %w", field, err)
		}
		raw = b
	}
	if len(raw) == 0 || string(raw) == "null" {
		return objectDoc{}, nil
	}
	var doc map[string]any
	if err := json.Unmarshal(raw, &doc); err != nil {
		return objectDoc{}, fmt.Errorf("%s is not a JSON object: %w", field, err)
	}
	return objectDoc{raw: raw, doc: doc}, nil
}

// typedDoc encodes a typed object of a request (the Machine, the MachineSet) as a document.
func typedDoc(obj any) (objectDoc, error) {
	raw, err := json.Marshal(obj)
	if err != nil {
		return objectDoc{}, err
	}
	var doc map[string]any
	if err := json.Unmarshal(raw, &doc); err != nil {
		return objectDoc{}, err
	}
	return objectDoc{raw: raw, doc: doc}, nil
}

func (o objectDoc) kind() string {
	k, _ := o.doc["kind"].(string)
	return k
}

// coverPatch copies, for each path under prefix, desired's value onto current (or removes
// it where desired has none), and returns the RFC 6902 JSON patch that turns current into
// the result, with the dotted paths it changed. No change gives no patch.
func coverPatch(current, desired objectDoc, prefix []string, paths [][]string) (runtimehooksv1.Patch, []string, error) {
	if current.doc == nil || desired.doc == nil || len(paths) == 0 {
		return runtimehooksv1.Patch{}, nil, nil
	}
	modified := runtime.DeepCopyJSON(current.doc)
	var changed []string
	for _, p := range paths {
		full := append(slices.Clone(prefix), p...)
		want, wantFound := lookup(desired.doc, full)
		have, haveFound := lookup(modified, full)
		if wantFound == haveFound && reflect.DeepEqual(want, have) {
			continue
		}
		var ok bool
		if wantFound {
			ok = set(modified, full, runtime.DeepCopyJSONValue(want))
		} else {
			ok = remove(modified, full)
			pruneEmpty(modified, desired.doc, full[:len(full)-1], len(prefix))
		}
		if ok {
			changed = append(changed, strings.Join(p, "."))
		}
	}
	if len(changed) == 0 {
		return runtimehooksv1.Patch{}, nil, nil
	}
	after, err := json.Marshal(modified)
	if err != nil {
		return runtimehooksv1.Patch{}, nil, err
	}
	ops, err := jsonpatch.CreatePatch(current.raw, after)
	if err != nil {
		return runtimehooksv1.Patch{}, nil, fmt.Errorf("compute JSON patch: %w", err)
	}
	patch, err := json.Marshal(ops)
	if err != nil {
		return runtimehooksv1.Patch{}, nil, err
	}
	return runtimehooksv1.Patch{PatchType: runtimehooksv1.JSONPatchType, Patch: patch}, changed, nil
}

// lookup returns the value at path and whether it is there.
func lookup(doc map[string]any, path []string) (any, bool) {
	var cur any = doc
	for _, p := range path {
		m, ok := cur.(map[string]any)
		if !ok {
			return nil, false
		}
		if cur, ok = m[p]; !ok {
			return nil, false
		}
	}
	return cur, true
}

// set writes value at path, creating missing maps; false when a non-map is in the way.
func set(doc map[string]any, path []string, value any) bool {
	m := doc
	for _, p := range path[:len(path)-1] {
		next, found := m[p]
		if !found || next == nil {
			child := map[string]any{}
			m[p] = child
			m = child
			continue
		}
		child, ok := next.(map[string]any)
		if !ok {
			return false
		}
		m = child
	}
	m[path[len(path)-1]] = value
	return true
}

// remove deletes the value at path; false when it is not there.
func remove(doc map[string]any, path []string) bool {
	parent, ok := lookup(doc, path[:len(path)-1])
	if !ok {
		return false
	}
	m, ok := parent.(map[string]any)
	if !ok {
		return false
	}
	if _, found := m[path[len(path)-1]]; !found {
		return false
	}
	delete(m, path[len(path)-1])
	return true
}

// pruneEmpty removes the maps along path, deepest first, that a removal left empty and
// that desired does not have either, so that {"featureGates":{}} does not stay behind
// where desired has no featureGates (Go's omitempty drops an empty map). It stops at keep
// elements of path (the object's spec).
func pruneEmpty(doc, desired map[string]any, path []string, keep int) {
	for n := len(path); n > keep; n-- {
		v, ok := lookup(doc, path[:n])
		if !ok {
			continue
		}
		if m, isMap := v.(map[string]any); !isMap || len(m) > 0 {
			return
		}
		if _, inDesired := lookup(desired, path[:n]); inDesired {
			return
		}
		remove(doc, path[:n])
	}
}
