package upgradeplan

import (
	"context"
	"fmt"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/capi-inplace/capi-inplace/harvesteradapter/harvesterapi"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/harvesterapi/toolkit"
)

// guardName is the name of the ValidatingAdmissionPolicy, and of its binding, by which a
// plan keeps other upgraders off its workload cluster.
func guardName(pr *PlanRun) string {
	return "capi-inplace-upgrading-" + pr.Plan.Name
}

// ensureGuard keeps Harvester's own upgrade and upgrade-toolkit's off the workload
// cluster while the plan runs: a ValidatingAdmissionPolicy, with its binding, that the
// cluster's API server uses to refuse a new Upgrade (harvesterhci.io) or UpgradePlan
// (management.harvesterhci.io), with a message naming this plan. Neither tool has a rule
// that an outside object could satisfy: each admission webhook refuses a second upgrade
// of its own kind only (shared/facts/harvester-node-upgrade.md facts 4a and 47), and
// creating an Upgrade to be counted would make Harvester's upgrade controller run its own
// upgrade (the node sheet's "what an external upgrader must provide", item 1); the API
// server's admission is the one place both pass through. Both objects carry the plan's
// label, so every end of the plan removes them with the rest (removeLabelled). Written
// only when missing or changed: it runs at every look while the plan runs.
func ensureGuard(ctx context.Context, pr *PlanRun) error {
	name := guardName(pr)
	labels := map[string]string{LabelUpgradePlan: pr.Plan.Name}
	message := fmt.Sprintf("capi-inplace's UpgradePlan %s/%s is upgrading this cluster to Harvester %s: start another upgrade once it has Succeeded or Failed, or after it is deleted (one upgrader at a time)",
		pr.Plan.Namespace, pr.Plan.Name, pr.Plan.Spec.Version)
	policy := &admissionv1.ValidatingAdmissionPolicy{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if _, err := controllerutil.CreateOrUpdate(ctx, pr.Workload, policy, func() error {
		policy.Labels = mergeLabels(policy.Labels, labels)
		policy.Spec.FailurePolicy = ptr.To(admissionv1.Fail)
		// Written as the API server stores it, its defaults included (the selectors, the
		// match policy, the rules' scope; kubernetes v1.36.3
		// pkg/apis/admissionregistration/v1/defaults.go): without them every look would
		// find the stored policy different and write it again.
		policy.Spec.MatchConstraints = &admissionv1.MatchResources{
			NamespaceSelector: &metav1.LabelSelector{},
			ObjectSelector:    &metav1.LabelSelector{},
			MatchPolicy:       ptr.To(admissionv1.Equivalent),
			ResourceRules: []admissionv1.NamedRuleWithOperations{
				createRule(harvesterapi.GroupVersion.Group, "upgrades"),
				createRule(toolkit.GroupVersion.Group, "upgradeplans"),
			},
		}
		policy.Spec.Validations = []admissionv1.Validation{{Expression: "false", Message: message, Reason: ptr.To(metav1.StatusReasonForbidden)}}
		return nil
	}); err != nil {
		return fmt.Errorf("keep other upgraders off the cluster (ValidatingAdmissionPolicy %s): %w", name, err)
	}
	binding := &admissionv1.ValidatingAdmissionPolicyBinding{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if _, err := controllerutil.CreateOrUpdate(ctx, pr.Workload, binding, func() error {
		binding.Labels = mergeLabels(binding.Labels, labels)
		binding.Spec.PolicyName = name
		binding.Spec.ValidationActions = []admissionv1.ValidationAction{admissionv1.Deny}
		return nil
	}); err != nil {
		return fmt.Errorf("keep other upgraders off the cluster (ValidatingAdmissionPolicyBinding %s): %w", name, err)
	}
	return nil
}

func createRule(group, resource string) admissionv1.NamedRuleWithOperations {
	return admissionv1.NamedRuleWithOperations{RuleWithOperations: admissionv1.RuleWithOperations{
		Operations: []admissionv1.OperationType{admissionv1.Create},
		Rule:       admissionv1.Rule{APIGroups: []string{group}, APIVersions: []string{"*"}, Resources: []string{resource}, Scope: ptr.To(admissionv1.AllScopes)},
	}}
}

func mergeLabels(have, want map[string]string) map[string]string {
	if have == nil {
		have = map[string]string{}
	}
	for k, v := range want {
		have[k] = v
	}
	return have
}
