package clusterupgrade

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capi-inplace/capi-inplace/harvesteradapter/harvesterapi"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/releases"
)

// This file holds the release-specific sub-steps of the cluster upgrade: each runs only
// on the hops whose target release's script holds it, and there only for the previous
// versions its exact-format guard matches (harvester-release-steps.md facts 1, 2 and 57:
// `^v1\.7\.[0-9]$` matches formal v1.7 releases only, so v1.7.1-rc2 as previous version
// skips them, as it does in Harvester; a v1.7.a -> v1.7.b hop runs no v1.8 migration),
// and the wait for KubeVirt, which needs the release's KubeVirt version.

// keyedOut is the Skipped message of a hop-keyed sub-step that this upgrade does not
// run, or "" when it does: the releases key each on the hop, the target's script holding
// it and its guard matching the previous version (releases.ClusterMigrationRuns; facts 2
// and 57).
func (r *runner) keyedOut(step, what string) string {
	runs, why := releases.ClusterMigrationRuns(r.in.PreviousVersion, r.in.HarvesterVersion, step)
	if runs {
		return ""
	}
	return fmt.Sprintf("the nodes ran Harvester %s before this upgrade to %s, %s: %s only on such a hop, as the release's script",
		r.in.PreviousVersion, r.in.HarvesterVersion, why, what)
}

// OvercommitConfigSetting is Harvester's setting of its CPU, memory and storage
// overcommit ratios.
const OvercommitConfigSetting = "overcommit-config"

// OvercommitConfigDefaultV17 is overcommit-config's default in every v1.7 release
// (harvester/harvester pkg/settings/settings.go at v1.7.0, v1.7.1, v1.7.2 and v1.7.3:
// `{"cpu":1600,"memory":150,"storage":200}`); v1.8.0 lowered it to
// `{"cpu":1000,"memory":150,"storage":100}` (commit f38813f, fact 10).
const OvercommitConfigDefaultV17 = `{"cpu":1600,"memory":150,"storage":200}`

// preserveOvercommitConfig is preserve_overcommit_config (fact 10; umanif.sh@v1.8.2, for
// a previous version matching ^v1\.7\.[0-9]$): when Harvester's Setting overcommit-config
// has no explicit value, the cluster runs at the v1.7 default, and v1.8 lowers the default;
// so the v1.7 default is written as the value, and the effective overcommit stays what it
// was. A value someone set is left alone; a cluster without the Setting has nothing to
// keep (the script warns and goes on). It is a migration that keeps the effective value,
// not a change for the roll: it is not recorded for Restore. The script copies the
// Setting's default, which on a v1.7 cluster is OvercommitConfigDefaultV17; this writes
// that constant, so that a run resumed after Harvester's chart was upgraded (its default
// then v1.8's) still writes v1.7's.
func (r *runner) preserveOvercommitConfig(ctx context.Context) (StepState, string, error) {
	if msg := r.keyedOut(StepPreserveOvercommitConfig, "overcommit-config is kept at v1.7's default"); msg != "" {
		return StateSkipped, msg, nil
	}
	key := client.ObjectKey{Name: OvercommitConfigSetting}
	s := &harvesterapi.Setting{}
	if err := r.c.Get(ctx, key, s); err != nil {
		if apierrors.IsNotFound(err) || meta.IsNoMatchError(err) {
			return StateSkipped, fmt.Sprintf("Harvester's Setting %s does not exist: there is no value to keep", OvercommitConfigSetting), nil
		}
		return "", "", fmt.Errorf("read Harvester's Setting %s: %w", OvercommitConfigSetting, err)
	}
	if s.Value != "" {
		return r.already(StepPreserveOvercommitConfig, fmt.Sprintf("Harvester's Setting %s already has the value %s", OvercommitConfigSetting, s.Value), r.ours(s))
	}
	before := s.DeepCopy()
	s.Value = OvercommitConfigDefaultV17
	if s.Annotations == nil {
		s.Annotations = map[string]string{}
	}
	s.Annotations[lastUpgradeNameAnnotation] = r.in.Plan
	if err := r.c.Patch(ctx, s, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})); err != nil {
		return "", "", fmt.Errorf("set the value of Harvester's Setting %s to v1.7's default %s: %w", OvercommitConfigSetting, OvercommitConfigDefaultV17, err)
	}
	message := fmt.Sprintf("Harvester's Setting %s had no value: set to v1.7's default %s, which v1.8 lowers", OvercommitConfigSetting, OvercommitConfigDefaultV17)
	if before.Default != "" && before.Default != OvercommitConfigDefaultV17 {
		message += fmt.Sprintf(" (its default read %s)", before.Default)
	}
	return StateDone, message, nil
}

// The legacy CAPI webhook configurations clean_capi_legacy_webhooks deletes (fact 16.8,
// harvester commit 2e8ad85): kubebuilder's default names, which the Cluster API that
// Rancher embedded in Harvester v1.7 (Rancher's embedded-cluster-api feature, which the
// v1.7 scripts switch on, fact 42) registered. That CAPI runs capi-controller-manager in
// cattle-provisioning-capi-system (harvester pkg/controller/master/rancher/register.go at
// v1.7.0 to v1.7.2, capiControllerDeploymentNamespace); v1.8 has it in
// cattle-capi-system (commit b19aa4c) and no longer uses the legacy webhooks.
const (
	legacyCAPIMutatingWebhooks   = "mutating-webhook-configuration"
	legacyCAPIValidatingWebhooks = "validating-webhook-configuration"
	LegacyCAPINamespace          = "cattle-provisioning-capi-system"
)

// cleanCAPILegacyWebhooks is clean_capi_legacy_webhooks (fact 16.8; umanif.sh@v1.8.2,
// inside upgrade_rancher just before its helm upgrade, for a previous version matching
// ^v1\.7\.[0-9]$). The script deletes both configurations by name; their names are generic
// (any kubebuilder project's default), so this deletes one only when every webhook of it
// calls a Service in the legacy CAPI's namespace (LegacyCAPINamespace), and otherwise
// leaves it and says whose it looks to be. Missing ones are fine (the script ignores
// them). Nothing is recorded: the release does not bring them back.
func (r *runner) cleanCAPILegacyWebhooks(ctx context.Context) (StepState, string, error) {
	if msg := r.keyedOut(StepCleanCAPILegacyWebhooks, "the legacy CAPI webhooks are removed"); msg != "" {
		return StateSkipped, msg, nil
	}
	var deleted, kept, absent []string
	mutating := &admissionregistrationv1.MutatingWebhookConfiguration{}
	mutating.Name = legacyCAPIMutatingWebhooks
	validating := &admissionregistrationv1.ValidatingWebhookConfiguration{}
	validating.Name = legacyCAPIValidatingWebhooks
	for _, cfg := range []struct {
		obj      client.Object
		kind     string
		services func() []*admissionregistrationv1.ServiceReference
	}{
		{mutating, "MutatingWebhookConfiguration", func() []*admissionregistrationv1.ServiceReference {
			var out []*admissionregistrationv1.ServiceReference
			for _, w := range mutating.Webhooks {
				out = append(out, w.ClientConfig.Service)
			}
			return out
		}},
		{validating, "ValidatingWebhookConfiguration", func() []*admissionregistrationv1.ServiceReference {
			var out []*admissionregistrationv1.ServiceReference
			for _, w := range validating.Webhooks {
				out = append(out, w.ClientConfig.Service)
			}
			return out
		}},
	} {
		name := cfg.obj.GetName()
		what := cfg.kind + " " + name
		if err := r.c.Get(ctx, client.ObjectKey{Name: name}, cfg.obj); err != nil {
			if apierrors.IsNotFound(err) {
				absent = append(absent, what)
				continue
			}
			return "", "", fmt.Errorf("read %s: %w", what, err)
		}
		services := cfg.services()
		var others []string
		for _, s := range services {
			switch {
			case s == nil:
				others = append(others, "a URL")
			case s.Namespace != LegacyCAPINamespace:
				others = append(others, "Service "+s.Namespace+"/"+s.Name)
			}
		}
		if len(services) == 0 {
			others = append(others, "no Service (it has no webhooks)")
		}
		if len(others) > 0 {
			slices.Sort(others)
			kept = append(kept, fmt.Sprintf("%s left: its webhooks call %s, not the legacy CAPI's Services in %s, so it is not the legacy CAPI's", what, strings.Join(slices.Compact(others), ", "), LegacyCAPINamespace))
			continue
		}
		uid := cfg.obj.GetUID()
		if err := r.c.Delete(ctx, cfg.obj, client.Preconditions{UID: &uid}); err != nil && !apierrors.IsNotFound(err) {
			return "", "", fmt.Errorf("delete the legacy CAPI's %s: %w", what, err)
		}
		deleted = append(deleted, what)
	}
	var parts []string
	if len(deleted) > 0 {
		parts = append(parts, fmt.Sprintf("deleted the legacy CAPI's %s (their webhooks call Services in %s)", strings.Join(deleted, " and "), LegacyCAPINamespace))
	}
	parts = append(parts, kept...)
	if len(absent) > 0 {
		parts = append(parts, fmt.Sprintf("%s not on the cluster", strings.Join(absent, " and ")))
	}
	message := strings.Join(parts, "; ")
	if len(deleted) > 0 {
		return StateDone, message, nil
	}
	return r.already(StepCleanCAPILegacyWebhooks, message, false)
}

// Longhorn's storage-version migration (fact 19).
const (
	// LonghornValidatorWebhook is Longhorn's ValidatingWebhookConfiguration.
	LonghornValidatorWebhook = "longhorn-webhook-validator"
	// FieldLonghornSettingsUpdate stands for the UPDATE operation of the rules of
	// LonghornValidatorWebhook on longhorn.io settings; its recorded value is the
	// operations of those rules before, as JSON.
	FieldLonghornSettingsUpdate = "webhooks.rules[longhorn.io/settings].operations"
	// StorageMigratedAnnotation marks a Longhorn object MigrateLonghornV1beta1CRDs
	// rewrote, with the plan's name (the script annotates migration-time).
	StorageMigratedAnnotation = "inplace.cluster.x-k8s.io/storage-version-migrated"

	longhornGroup       = "longhorn.io"
	longhornOldVersion  = "v1beta1"
	longhornSettingsRes = "settings"
)

// longhornSettingsRule says whether a webhook rule is the one the script edits: apiGroups
// exactly [longhorn.io] and resources exactly [settings].
func longhornSettingsRule(rule admissionregistrationv1.RuleWithOperations) bool {
	return slices.Equal(rule.APIGroups, []string{longhornGroup}) && slices.Equal(rule.Resources, []string{longhornSettingsRes})
}

// migrateLonghornV1beta1CRDs is migrate_longhorn_v1beta1_crds (fact 19; umanif.sh@v1.8.2,
// for a previous version matching ^v1\.6\.[0-9]$): Longhorn 1.10 (Harvester v1.7) no
// longer serves v1beta1, and a cluster that began on Longhorn 1.2 or older may still keep
// objects stored at v1beta1 (commit da2cf8c). For each longhorn.io CRD whose
// status.storedVersions still lists v1beta1, every object is rewritten (the script patches
// an annotation in: so does this, StorageMigratedAnnotation, so the API server stores it
// at the CRD's storage version), then storedVersions is set to the storage version alone.
// Longhorn's validator refuses updates of settings while this runs (the script's reason
// for the edit), so UPDATE is first taken off its rules on longhorn.io settings, the
// operations before recorded (Restore adds UPDATE back if the run dies in between), and
// given back at the end of the step.
func (r *runner) migrateLonghornV1beta1CRDs(ctx context.Context) (StepState, string, error) {
	if msg := r.keyedOut(StepMigrateLonghornV1beta1CRDs, "Longhorn's v1beta1 objects are migrated to v1beta2"); msg != "" {
		return StateSkipped, msg, nil
	}
	crds := &apiextensionsv1.CustomResourceDefinitionList{}
	if err := r.c.List(ctx, crds); err != nil {
		return "", "", fmt.Errorf("list the CustomResourceDefinitions: %w", err)
	}
	var pending []*apiextensionsv1.CustomResourceDefinition
	for i := range crds.Items {
		crd := &crds.Items[i]
		if crd.Spec.Group == longhornGroup && slices.Contains(crd.Status.StoredVersions, longhornOldVersion) {
			pending = append(pending, crd)
		}
	}
	if len(pending) == 0 {
		// A run that stopped after the CRDs and before giving the webhook back.
		if err := r.giveBackSettingsUpdate(ctx); err != nil {
			return "", "", err
		}
		return r.already(StepMigrateLonghornV1beta1CRDs, "no longhorn.io CustomResourceDefinition lists v1beta1 in status.storedVersions", false)
	}
	if err := r.takeSettingsUpdate(ctx); err != nil {
		return "", "", err
	}
	var done []string
	for _, crd := range pending {
		n, err := r.rewriteObjects(ctx, crd)
		if err != nil {
			return "", "", err
		}
		storage := storageVersion(crd)
		if storage == "" {
			return "", "", fmt.Errorf("CustomResourceDefinition %s has no storage version: the API server requires one; look at it (kubectl get crd %s -o yaml)", crd.Name, crd.Name)
		}
		before := crd.DeepCopy()
		crd.Status.StoredVersions = []string{storage}
		if err := r.c.Status().Patch(ctx, crd, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})); err != nil {
			return "", "", fmt.Errorf("set status.storedVersions of CustomResourceDefinition %s to [%s] after rewriting its %d objects: %w", crd.Name, storage, n, err)
		}
		done = append(done, fmt.Sprintf("%s (%d objects)", crd.Name, n))
	}
	if err := r.giveBackSettingsUpdate(ctx); err != nil {
		return "", "", err
	}
	return StateDone, fmt.Sprintf("rewrote at their storage version, and set storedVersions to it alone, %s; %s's UPDATE on longhorn.io settings was off meanwhile and is back",
		strings.Join(done, ", "), LonghornValidatorWebhook), nil
}

func storageVersion(crd *apiextensionsv1.CustomResourceDefinition) string {
	for _, v := range crd.Spec.Versions {
		if v.Storage {
			return v.Name
		}
	}
	return ""
}

// rewriteObjects writes every object of crd again, at its storage version, with
// StorageMigratedAnnotation; objects a resumed run finds marked with this plan are not
// written again. It returns how many objects the CRD has.
func (r *runner) rewriteObjects(ctx context.Context, crd *apiextensionsv1.CustomResourceDefinition) (int, error) {
	gvk := schema.GroupVersionKind{Group: crd.Spec.Group, Version: storageVersion(crd), Kind: crd.Spec.Names.ListKind}
	if gvk.Kind == "" {
		gvk.Kind = crd.Spec.Names.Kind + "List"
	}
	list := &unstructured.UnstructuredList{}
	list.SetGroupVersionKind(gvk)
	if err := r.c.List(ctx, list); err != nil {
		return 0, fmt.Errorf("list the %s of CustomResourceDefinition %s to rewrite them: %w", crd.Spec.Names.Plural, crd.Name, err)
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{StorageMigratedAnnotation: r.in.Plan}}})
	if err != nil {
		return 0, err
	}
	for i := range list.Items {
		obj := &list.Items[i]
		if obj.GetAnnotations()[StorageMigratedAnnotation] == r.in.Plan {
			continue
		}
		err := retryValidatorLag(ctx, func() error { return r.c.Patch(ctx, obj, client.RawPatch(types.MergePatchType, patch)) })
		if err != nil && !apierrors.IsNotFound(err) {
			return 0, fmt.Errorf("rewrite %s %s at version %s (annotate it %s): %w; Longhorn's webhooks may refuse it: look at the error, fix the object and run again",
				crd.Spec.Names.Kind, client.ObjectKeyFromObject(obj), gvk.Version, StorageMigratedAnnotation, err)
		}
	}
	return len(list.Items), nil
}

var longhornValidatorKey = client.ObjectKey{Name: LonghornValidatorWebhook}

// LonghornValidatorWebhookName is the name of the webhook in LonghornValidatorWebhook
// (longhorn-manager webhook/server/server.go), which the API server names in the error of
// a request it sent there.
const LonghornValidatorWebhookName = "validator.longhorn.io"

// validatorLagTimeout bounds how long a rewrite refused by Longhorn's validator is tried
// again after UPDATE was taken off its rules.
var validatorLagTimeout = 30 * time.Second

// retryValidatorLag runs write, and runs it again while the API server still sends it to
// Longhorn's validator. Taking UPDATE off the validator's rules is a write of its
// ValidatingWebhookConfiguration, which every API server applies from its own watch of
// the configurations, a moment later (seconds on a loaded one); a write made in between
// still goes to the validator, which may refuse it. Any other error, and the validator's
// after validatorLagTimeout, is returned as it is.
func retryValidatorLag(ctx context.Context, write func() error) error {
	err := write()
	if !validatorRefused(err) {
		return err
	}
	deadline := time.Now().Add(validatorLagTimeout)
	for delay := 100 * time.Millisecond; validatorRefused(err) && time.Now().Before(deadline); delay = min(2*delay, 2*time.Second) {
		select {
		case <-ctx.Done():
			return err
		case <-time.After(delay):
		}
		err = write()
	}
	return err
}

// validatorRefused tells whether err is the API server's answer for a request that went
// to Longhorn's validator: its denial or a failure to call it.
func validatorRefused(err error) bool {
	return err != nil && strings.Contains(err.Error(), `webhook "`+LonghornValidatorWebhookName+`"`)
}

// takeSettingsUpdate records the operations of the validator's rules on longhorn.io
// settings and takes UPDATE off them. A cluster without the validator has nothing to take.
func (r *runner) takeSettingsUpdate(ctx context.Context) error {
	cfg := &admissionregistrationv1.ValidatingWebhookConfiguration{}
	if err := r.c.Get(ctx, longhornValidatorKey, cfg); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("read ValidatingWebhookConfiguration %s: %w", LonghornValidatorWebhook, err)
	}
	var before []admissionregistrationv1.OperationType
	changed := false
	patched := cfg.DeepCopy()
	for i := range patched.Webhooks {
		for j := range patched.Webhooks[i].Rules {
			rule := &patched.Webhooks[i].Rules[j]
			if !longhornSettingsRule(*rule) || !slices.Contains(rule.Operations, admissionregistrationv1.Update) {
				continue
			}
			if before == nil {
				before = slices.Clone(rule.Operations)
			}
			rule.Operations = slices.DeleteFunc(rule.Operations, func(op admissionregistrationv1.OperationType) bool { return op == admissionregistrationv1.Update })
			changed = true
		}
	}
	if !changed {
		return nil
	}
	raw, err := json.Marshal(before)
	if err != nil {
		return err
	}
	if err := r.remember(ctx, longhornValidatorKey, FieldLonghornSettingsUpdate, raw); err != nil {
		return err
	}
	if err := r.c.Patch(ctx, patched, client.MergeFromWithOptions(cfg, client.MergeFromWithOptimisticLock{})); err != nil {
		return fmt.Errorf("take UPDATE off the rules of ValidatingWebhookConfiguration %s on longhorn.io settings: %w", LonghornValidatorWebhook, err)
	}
	return nil
}

// giveBackSettingsUpdate adds UPDATE back to the validator's rules on longhorn.io settings
// when this upgrade recorded taking it.
func (r *runner) giveBackSettingsUpdate(ctx context.Context) error {
	changes, err := ReadChanges(ctx, r.c, r.p.ConfigMap)
	if err != nil {
		return err
	}
	for _, ch := range changes {
		if ch.Field == FieldLonghornSettingsUpdate {
			if err := restoreSettingsUpdate(ctx, r.c, ch.Before); err != nil {
				return fmt.Errorf("give UPDATE back to the rules of ValidatingWebhookConfiguration %s on longhorn.io settings: %w", LonghornValidatorWebhook, err)
			}
		}
	}
	return nil
}

// restoreSettingsUpdate adds UPDATE back to the validator's rules on longhorn.io settings
// that lack it, when the recorded operations (before) had it, as the script does (`. +
// ["UPDATE"] | unique`): the rest of the rules stay as they are now, whatever Longhorn's
// upgrade made of them. A validator that is gone has nothing to restore.
func restoreSettingsUpdate(ctx context.Context, c client.Client, before json.RawMessage) error {
	var ops []admissionregistrationv1.OperationType
	if err := json.Unmarshal(before, &ops); err != nil {
		return fmt.Errorf("the recorded value %s is not a list of operations: %w", before, err)
	}
	if !slices.Contains(ops, admissionregistrationv1.Update) {
		return nil
	}
	cfg := &admissionregistrationv1.ValidatingWebhookConfiguration{}
	if err := c.Get(ctx, longhornValidatorKey, cfg); err != nil {
		return client.IgnoreNotFound(err)
	}
	patched := cfg.DeepCopy()
	changed := false
	for i := range patched.Webhooks {
		for j := range patched.Webhooks[i].Rules {
			rule := &patched.Webhooks[i].Rules[j]
			if longhornSettingsRule(*rule) && !slices.Contains(rule.Operations, admissionregistrationv1.Update) {
				rule.Operations = append(rule.Operations, admissionregistrationv1.Update)
				changed = true
			}
		}
	}
	if !changed {
		return nil
	}
	return c.Patch(ctx, patched, client.MergeFromWithOptions(cfg, client.MergeFromWithOptimisticLock{}))
}

// KubeVirtKey is Harvester's KubeVirt install CR.
var KubeVirtKey = client.ObjectKey{Namespace: "harvester-system", Name: "kubevirt"}

var kubevirtGVK = schema.GroupVersionKind{Group: "kubevirt.io", Version: "v1", Kind: "KubeVirt"}

// waitKubeVirt is upgrade_harvester's wait_kubevirt (fact 23.5; umanif.sh@v1.8.2, right
// after the harvester chart's wait): the harvester chart carries KubeVirt, and
// virt-operator deploys the new version after the chart; the script waits, without a
// timeout, until the KubeVirt CR harvester-system/kubevirt reports
// status.observedKubeVirtVersion equal to the release's kubevirt and status.phase
// Deployed (virt-operator sets both once every component of the version is rolled out:
// kubevirt/kubevirt pkg/virt-operator/kubevirt.go, KubeVirtStatus in
// staging/src/kubevirt.io/api/core/v1/types.go). The run's timeout bounds it here. The CR
// is read as an unstructured object (the program carries no KubeVirt types). A release
// whose metadata names no KubeVirt version gives nothing to wait for.
func (r *runner) waitKubeVirt(ctx context.Context) (StepState, string, error) {
	want := r.in.KubeVirtVersion
	if want == "" {
		return StateSkipped, "the release metadata names no KubeVirt version (no kubevirt field): nothing to wait for", nil
	}
	what := fmt.Sprintf("KubeVirt %s to report observedKubeVirtVersion %s and phase Deployed", KubeVirtKey, want)
	err := r.poll(ctx, what,
		"virt-operator deploys the version the harvester chart carries; look at the KubeVirt CR's status and virt-operator's logs (kubectl -n harvester-system logs deploy/virt-operator)",
		func(ctx context.Context) (bool, string, error) {
			kv := &unstructured.Unstructured{}
			kv.SetGroupVersionKind(kubevirtGVK)
			if err := r.c.Get(ctx, KubeVirtKey, kv); err != nil {
				if apierrors.IsNotFound(err) || meta.IsNoMatchError(err) {
					return false, "", fmt.Errorf("KubeVirt %s does not exist: a Harvester cluster has it (the harvester chart creates it); without it there is no KubeVirt to wait for: look at the harvester chart's deployment", KubeVirtKey)
				}
				return false, "", fmt.Errorf("read KubeVirt %s: %w", KubeVirtKey, err)
			}
			observed, _, _ := unstructured.NestedString(kv.Object, "status", "observedKubeVirtVersion")
			phase, _, _ := unstructured.NestedString(kv.Object, "status", "phase")
			return observed == want && phase == "Deployed", fmt.Sprintf("observedKubeVirtVersion %q, phase %q", observed, phase), nil
		})
	if err != nil {
		return "", "", err
	}
	// Done when this upgrade deployed the harvester chart that carries it.
	ours := r.current[StepUpgradeHarvesterChart].State == StateDone
	return r.already(StepWaitKubeVirt, fmt.Sprintf("KubeVirt %s reports %s Deployed", KubeVirtKey, want), ours)
}
