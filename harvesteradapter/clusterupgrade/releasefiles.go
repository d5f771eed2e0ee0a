package clusterupgrade

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/capi-inplace/capi-inplace/harvesteradapter/harvesterapi"
)

// The files of the release's upgrade image that the cluster upgrade applies, under
// Input.ReleaseFiles (the image's /usr/local/share, harvester-node-upgrade.md fact 4).
const (
	// extraManifestsDir holds manifests applied on every upgrade (fact 22).
	extraManifestsDir = "extra_manifests/cdi"
	// addonsDir holds one Harvester Addon per file, <name>.yaml (fact 29).
	addonsDir = "addons"
	// ExtraManifestsFieldOwner is the field manager that applies the extra manifests.
	ExtraManifestsFieldOwner = "capi-inplace-cluster-upgrade"
)

// plainAddons are the add-ons upgrade_addons brings to the release with upgrade_addon
// (harvester-release-steps.md fact 29; upgrade_manifests.sh and lib.sh at v1.8.2), in its
// order: each one's spec.version and spec.valuesContent from the release's file, or the
// whole file when the add-on is missing. Its other add-ons (rancher-monitoring and
// rancher-logging, whose values are patched per release, and nvidia-driver-toolkit,
// which keeps the user's driverLocation) and kube-ovn's (manage_kubeovn) follow them
// (addonvalues.go).
var plainAddons = []client.ObjectKey{
	{Namespace: "harvester-system", Name: "vm-import-controller"},
	{Namespace: "harvester-system", Name: "pcidevices-controller"},
	{Namespace: "harvester-system", Name: "harvester-seeder"},
	{Namespace: "kube-system", Name: "descheduler"},
}

// noReleaseFiles is the Skipped message of the sub-steps that need the release files.
func noReleaseFiles(what string) string {
	return "no release files were given (--release-files; the Job gets them from the HarvesterUpgrader's images.upgrade): " + what + " left as they are"
}

// applyExtraManifests is apply_extra_nonversion_manifests (fact 22): every
// extra_manifests/cdi/*.yaml of the release, in name order, applied (server-side, owning
// the fields it sets, as kubectl apply makes them the file's). A release without the
// directory has nothing to apply; an object that is already as its file says is not
// written (Skipped when all are, as on a cluster at the release or a resumed run).
func (r *runner) applyExtraManifests(ctx context.Context) (StepState, string, error) {
	if r.in.ReleaseFiles == "" {
		return StateSkipped, noReleaseFiles("the extra manifests"), nil
	}
	files, err := filepath.Glob(filepath.Join(r.in.ReleaseFiles, extraManifestsDir, "*.yaml"))
	if err != nil {
		return "", "", fmt.Errorf("list the release's extra manifests: %w", err)
	}
	if len(files) == 0 {
		return StateSkipped, fmt.Sprintf("the release has no extra manifests (%s/*.yaml)", extraManifestsDir), nil
	}
	slices.Sort(files)
	var applied, kept []string
	for _, f := range files {
		objs, err := readManifests(f)
		if err != nil {
			return "", "", err
		}
		for _, u := range objs {
			changed, err := r.applyManifest(ctx, u)
			if err != nil {
				return "", "", fmt.Errorf("apply %s from the release's %s: %w", objectName(u), filepath.Base(f), err)
			}
			if changed {
				r.logf("applied %s from %s", objectName(u), filepath.Base(f))
				applied = append(applied, objectName(u))
			} else {
				kept = append(kept, objectName(u))
			}
		}
	}
	message := ""
	if len(applied) > 0 {
		message = "applied the release's extra manifests: " + strings.Join(applied, ", ")
	}
	if len(kept) > 0 {
		message = joinSentences(message, "already as the release's extra manifests say: "+strings.Join(kept, ", "))
	}
	if len(applied) == 0 {
		return r.already(StepApplyExtraManifests, message, false)
	}
	return StateDone, message, nil
}

// applyManifest applies u unless it exists and applying it would change nothing (a dry
// run of the apply leaves its resourceVersion), and says whether it applied.
func (r *runner) applyManifest(ctx context.Context, u *unstructured.Unstructured) (bool, error) {
	opts := []client.ApplyOption{client.FieldOwner(ExtraManifestsFieldOwner), client.ForceOwnership}
	existing := &unstructured.Unstructured{}
	existing.SetGroupVersionKind(u.GroupVersionKind())
	err := r.c.Get(ctx, client.ObjectKeyFromObject(u), existing)
	switch {
	case err == nil:
		dry := u.DeepCopy()
		if err := r.c.Apply(ctx, client.ApplyConfigurationFromUnstructured(dry), append(opts, client.DryRunAll)...); err != nil {
			return false, err
		}
		if dry.GetResourceVersion() == existing.GetResourceVersion() {
			return false, nil
		}
	case !apierrors.IsNotFound(err):
		return false, err
	}
	return true, r.c.Apply(ctx, client.ApplyConfigurationFromUnstructured(u), opts...)
}

// readManifests reads the objects of a multi-document YAML file.
func readManifests(path string) ([]*unstructured.Unstructured, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read the release's manifest %s: %w", path, err)
	}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(raw), 4096)
	var objs []*unstructured.Unstructured
	for {
		u := &unstructured.Unstructured{}
		if err := dec.Decode(&u.Object); err != nil {
			if errors.Is(err, io.EOF) {
				return objs, nil
			}
			return nil, fmt.Errorf("the release's manifest %s is not YAML of Kubernetes objects: %w", path, err)
		}
		if len(u.Object) == 0 {
			continue
		}
		if u.GetAPIVersion() == "" || u.GetKind() == "" || u.GetName() == "" {
			return nil, fmt.Errorf("the release's manifest %s holds an object without apiVersion, kind or name", path)
		}
		objs = append(objs, u)
	}
}

func objectName(u *unstructured.Unstructured) string {
	if u.GetNamespace() != "" {
		return fmt.Sprintf("%s %s/%s", u.GetKind(), u.GetNamespace(), u.GetName())
	}
	return fmt.Sprintf("%s %s", u.GetKind(), u.GetName())
}

// upgradeAddons is upgrade_addons for plainAddons (fact 29): an add-on that exists gets
// the release file's spec.version and spec.valuesContent (a merge patch: whether it is
// enabled stays as it is, so the descheduler the plan turns off for the nodes stays
// off); a missing one is created from the file, as the file says (the release ships
// them disabled). The script waits for the Addon kind to be served first; so does this.
// An add-on whose file the release does not have is left and named.
func (r *runner) upgradeAddons(ctx context.Context) (StepState, string, error) {
	if r.in.ReleaseFiles == "" {
		return StateSkipped, noReleaseFiles("the add-ons"), nil
	}
	if err := r.waitAddonsServed(ctx); err != nil {
		return "", "", err
	}
	var did, kept, missing []string
	note := func(d, k string) {
		if d != "" {
			did = append(did, d)
		}
		if k != "" {
			kept = append(kept, k)
		}
	}
	for _, key := range plainAddons {
		want, err := readAddon(filepath.Join(r.in.ReleaseFiles, addonsDir, key.Name+".yaml"))
		if errors.Is(err, os.ErrNotExist) {
			missing = append(missing, key.Name)
			continue
		}
		if err != nil {
			return "", "", err
		}
		d, k, err := r.bringAddon(ctx, key, want)
		if err != nil {
			return "", "", err
		}
		note(d, k)
	}
	for _, upgrade := range []func(context.Context) (string, string, error){r.upgradeMonitoringAddon, r.upgradeLoggingAddon} {
		d, k, err := upgrade(ctx)
		if err != nil {
			return "", "", err
		}
		note(d, k)
	}
	for _, fromFile := range []struct {
		name    string
		upgrade func(context.Context) (string, string, error)
	}{{nvidiaAddon.Name, r.upgradeNvidiaAddon}, {kubeOVNAddon.Name, r.upgradeKubeOVN}} {
		d, k, err := fromFile.upgrade(ctx)
		switch {
		case errors.Is(err, os.ErrNotExist):
			missing = append(missing, fromFile.name)
		case err != nil:
			return "", "", err
		default:
			note(d, k)
		}
	}
	message := ""
	if len(did) > 0 {
		message = "add-ons brought to the release: " + strings.Join(did, ", ")
	}
	if len(kept) > 0 {
		message = joinSentences(message, "already at the release: "+strings.Join(kept, ", "))
	}
	if len(missing) > 0 {
		message = joinSentences(message, "the release ships no file for "+strings.Join(missing, ", ")+", left as they are")
	}
	if len(did) == 0 {
		return r.already(StepUpgradeAddons, message, false)
	}
	return StateDone, message, nil
}

func joinSentences(a, b string) string {
	if a == "" {
		return b
	}
	return a + "; " + b
}

// waitAddonsServed is wait_for_addons_crd: the script waits as long as the Addon kind is
// not served.
func (r *runner) waitAddonsServed(ctx context.Context) error {
	return r.poll(ctx, "the Addon kind (addons.harvesterhci.io) to be served", "Harvester serves it from v1.2 on; look at the harvester chart's CRDs",
		func(ctx context.Context) (bool, string, error) {
			err := r.c.List(ctx, &harvesterapi.AddonList{}, client.Limit(1))
			switch {
			case meta.IsNoMatchError(err) || apierrors.IsNotFound(err):
				return false, "addons.harvesterhci.io is not served", nil
			case err != nil:
				return false, "", fmt.Errorf("list the Addons: %w", err)
			}
			return true, "", nil
		})
}

// readAddon reads one add-on file of the release.
func readAddon(path string) (*harvesterapi.Addon, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	a := &harvesterapi.Addon{}
	if err := yaml.Unmarshal(raw, a); err != nil {
		return nil, fmt.Errorf("the release's add-on file %s is not an Addon: %w", path, err)
	}
	if a.Kind != "Addon" || a.Spec.Chart == "" || a.Spec.Version == "" {
		return nil, fmt.Errorf("the release's add-on file %s is not an Addon with a chart and version (kind %q, chart %q, version %q)", path, a.Kind, a.Spec.Chart, a.Spec.Version)
	}
	return a, nil
}

// bringAddon is upgrade_addon for one add-on and the release's file of it: an add-on that
// exists gets the file's spec.version and spec.valuesContent by merge patch (enabled
// stays), a missing one is created as the file says. It says what it did, or what was
// already there. An add-on created by someone else between the read and the create (the
// Job of a plan deleted a moment before, whose pod still runs until it is terminated; the
// release's kubectl apply does not mind either) is read again and brought as one that
// exists.
func (r *runner) bringAddon(ctx context.Context, key client.ObjectKey, want *harvesterapi.Addon) (did, kept string, err error) {
	a := &harvesterapi.Addon{}
	err = r.c.Get(ctx, key, a)
	switch {
	case apierrors.IsNotFound(err):
		want.Namespace, want.Name, want.ResourceVersion = key.Namespace, key.Name, ""
		err := r.c.Create(ctx, want)
		if apierrors.IsAlreadyExists(err) {
			err = r.c.Get(ctx, key, a)
			if err == nil {
				if a.Spec.Version == want.Spec.Version && a.Spec.ValuesContent == want.Spec.ValuesContent {
					return "", fmt.Sprintf("%s at %s", key.Name, a.Spec.Version), nil
				}
				return r.patchAddon(ctx, a, want.Spec.Version, want.Spec.ValuesContent)
			}
		}
		if err != nil {
			return "", "", fmt.Errorf("install add-on %s from the release's %s/%s.yaml: %w", key, addonsDir, key.Name, err)
		}
		return fmt.Sprintf("%s installed at %s (enabled %t)", key.Name, want.Spec.Version, want.Spec.Enabled), "", nil
	case err != nil:
		return "", "", fmt.Errorf("read add-on %s: %w", key, err)
	case a.Spec.Version == want.Spec.Version && a.Spec.ValuesContent == want.Spec.ValuesContent:
		return "", fmt.Sprintf("%s at %s", key.Name, a.Spec.Version), nil
	}
	return r.patchAddon(ctx, a, want.Spec.Version, want.Spec.ValuesContent)
}

// patchAddon sets a's spec.version and spec.valuesContent by merge patch and says so.
func (r *runner) patchAddon(ctx context.Context, a *harvesterapi.Addon, version, values string) (string, string, error) {
	before := a.DeepCopy()
	was := a.Spec.Version
	a.Spec.Version, a.Spec.ValuesContent = version, values
	if err := r.c.Patch(ctx, a, client.MergeFrom(before)); err != nil {
		return "", "", fmt.Errorf("set add-on %s/%s to version %s: %w", a.Namespace, a.Name, version, err)
	}
	return fmt.Sprintf("%s %s (was %s)", a.Name, version, was), "", nil
}
