package clusterupgrade_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	longhornv1 "github.com/longhorn/longhorn-manager/k8s/pkg/apis/longhorn/v1beta2"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capi-inplace/capi-inplace/harvesteradapter/clusterupgrade"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/harvesterapi"
	"github.com/capi-inplace/capi-inplace/test/sim"
)

func overcommitConfig() *harvesterapi.Setting {
	GinkgoHelper()
	s := &harvesterapi.Setting{}
	Expect(env.Client.Get(ctx, client.ObjectKey{Name: clusterupgrade.OvercommitConfigSetting}, s)).To(Succeed())
	return s
}

func runStates(in clusterupgrade.Input, p clusterupgrade.Progress) []clusterupgrade.StepProgress {
	GinkgoHelper()
	Expect(clusterupgrade.Run(ctx, env.Client, in, p)).To(Succeed())
	steps, err := clusterupgrade.ReadProgress(ctx, env.Client, p.ConfigMap)
	Expect(err).NotTo(HaveOccurred())
	return steps
}

// hopInput is input for a hop from previous to target: the hop-keyed sub-steps key on
// both (releases.ClusterMigrationRuns).
func hopInput(plan, previous, target string) clusterupgrade.Input {
	in := input(plan)
	in.PreviousVersion, in.HarvesterVersion = previous, target
	in.RancherFeatures = mustFeatures(target)
	return in
}

// webhookRules are rules on a group nothing here serves, so the API server never calls
// the webhook.
func webhookRules() []admissionregistrationv1.RuleWithOperations {
	return []admissionregistrationv1.RuleWithOperations{{
		Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
		Rule:       admissionregistrationv1.Rule{APIGroups: []string{"example.invalid"}, APIVersions: []string{"v1"}, Resources: []string{"things"}},
	}}
}

var _ = Describe("The hop-keyed sub-steps and the wait for KubeVirt", Ordered, func() {
	It("keeps overcommit-config at v1.7's default on a hop from v1.7.1, on the simulated cluster (no legacy webhooks there), once", func() {
		seed(oldRelease)
		settle()
		Expect(overcommitConfig().Default).To(Equal(`{"cpu":1600,"memory":150,"storage":200}`), "Seed: a v1.7 cluster's default")
		Expect(overcommitConfig().Value).To(BeEmpty())

		p := newProgress()
		in := hopInput("up-v171", "v1.7.1", "v1.8.1")
		steps := runStates(in, p)
		Expect(states(steps)).To(Equal(want(clusterupgrade.StateDone, map[string]clusterupgrade.StepState{
			clusterupgrade.StepPreserveOvercommitConfig:   clusterupgrade.StateDone,
			clusterupgrade.StepCleanCAPILegacyWebhooks:    clusterupgrade.StateSkipped,
			clusterupgrade.StepMigrateLonghornV1beta1CRDs: clusterupgrade.StateSkipped,
		})))
		Expect(overcommitConfig().Value).To(Equal(clusterupgrade.OvercommitConfigDefaultV17))
		Expect(stepNamed(steps, clusterupgrade.StepCleanCAPILegacyWebhooks).Message).To(ContainSubstring("MutatingWebhookConfiguration mutating-webhook-configuration and ValidatingWebhookConfiguration validating-webhook-configuration not on the cluster"))
		Expect(stepNamed(steps, clusterupgrade.StepMigrateLonghornV1beta1CRDs).Message).To(ContainSubstring("v1.7.1 before this upgrade to v1.8.1, not a hop v1.6.x -> v1.7.x"))
		rv := overcommitConfig().ResourceVersion

		By("a resumed run does not write it again")
		steps = runStates(in, p)
		Expect(stepNamed(steps, clusterupgrade.StepPreserveOvercommitConfig).State).To(Equal(clusterupgrade.StateDone))
		Expect(stepNamed(steps, clusterupgrade.StepPreserveOvercommitConfig).Message).To(ContainSubstring("done by an earlier run"))
		Expect(overcommitConfig().ResourceVersion).To(Equal(rv))

		By("a value someone set stays, Skipped; an RC as previous version is not a v1.7 release (fact 2)")
		s := overcommitConfig()
		before := s.DeepCopy()
		s.Value, s.Annotations = `{"cpu":800,"memory":100,"storage":100}`, nil
		Expect(env.Client.Patch(ctx, s, client.MergeFrom(before))).To(Succeed())
		rv = overcommitConfig().ResourceVersion
		other := in
		other.Plan = "up-v171-user"
		steps = runStates(other, newProgress())
		Expect(stepNamed(steps, clusterupgrade.StepPreserveOvercommitConfig).State).To(Equal(clusterupgrade.StateSkipped))
		Expect(stepNamed(steps, clusterupgrade.StepPreserveOvercommitConfig).Message).To(ContainSubstring(`already has the value {"cpu":800`))
		Expect(overcommitConfig().ResourceVersion).To(Equal(rv))
		Expect(env.Client.Patch(ctx, s, client.RawPatch("application/merge-patch+json", []byte(`{"value":null}`)))).To(Succeed())
		rc := in
		rc.Plan, rc.PreviousVersion = "up-v171-rc", "v1.7.1-rc2"
		steps = runStates(rc, newProgress())
		Expect(stepNamed(steps, clusterupgrade.StepPreserveOvercommitConfig).State).To(Equal(clusterupgrade.StateSkipped))
		Expect(stepNamed(steps, clusterupgrade.StepPreserveOvercommitConfig).Message).To(ContainSubstring("v1.7.1-rc2 before this upgrade to v1.8.1, which does not match ^v1\\.7\\.[0-9]$"))
		Expect(overcommitConfig().Value).To(BeEmpty())
	})

	It("deletes a legacy CAPI webhook configuration only on a hop from v1.7 and only when it calls the legacy CAPI", func() {
		seed(oldRelease)
		settle()
		mutating := &admissionregistrationv1.MutatingWebhookConfiguration{
			ObjectMeta: metav1.ObjectMeta{Name: "mutating-webhook-configuration"},
			Webhooks: []admissionregistrationv1.MutatingWebhook{{
				Name: "default.cluster.cluster.x-k8s.io", AdmissionReviewVersions: []string{"v1"},
				SideEffects:   ptr.To(admissionregistrationv1.SideEffectClassNone),
				FailurePolicy: ptr.To(admissionregistrationv1.Ignore),
				ClientConfig: admissionregistrationv1.WebhookClientConfig{Service: &admissionregistrationv1.ServiceReference{
					Namespace: clusterupgrade.LegacyCAPINamespace, Name: "capi-webhook-service", Path: ptr.To("/mutate")}},
				Rules: webhookRules(),
			}},
		}
		validating := &admissionregistrationv1.ValidatingWebhookConfiguration{
			ObjectMeta: metav1.ObjectMeta{Name: "validating-webhook-configuration"},
			Webhooks: []admissionregistrationv1.ValidatingWebhook{{
				Name: "validation.example.invalid", AdmissionReviewVersions: []string{"v1"},
				SideEffects:   ptr.To(admissionregistrationv1.SideEffectClassNone),
				FailurePolicy: ptr.To(admissionregistrationv1.Ignore),
				ClientConfig: admissionregistrationv1.WebhookClientConfig{Service: &admissionregistrationv1.ServiceReference{
					Namespace: "someone-system", Name: "webhook-service", Path: ptr.To("/validate")}},
				Rules: webhookRules(),
			}},
		}
		Expect(env.Client.Create(ctx, mutating)).To(Succeed())
		Expect(env.Client.Create(ctx, validating)).To(Succeed())
		DeferCleanup(func() {
			_ = env.Client.Delete(ctx, mutating)
			_ = env.Client.Delete(ctx, validating)
		})

		By("Skipped on a hop from v1.5.1: both stay")
		steps := runStates(input("up-capi-151"), newProgress())
		Expect(stepNamed(steps, clusterupgrade.StepCleanCAPILegacyWebhooks).State).To(Equal(clusterupgrade.StateSkipped))
		Expect(stepNamed(steps, clusterupgrade.StepCleanCAPILegacyWebhooks).Message).To(ContainSubstring("v1.5.1 before this upgrade to v1.6.0, not a hop v1.7.x -> v1.8.x"))
		Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(mutating), &admissionregistrationv1.MutatingWebhookConfiguration{})).To(Succeed())

		By("Skipped on a patch hop v1.7.0 -> v1.7.2, whose previous version the guard matches: v1.7's scripts do not hold the migration, and Rancher v2.13's CAPI uses its webhooks")
		steps = runStates(hopInput("up-capi-patch", "v1.7.0", "v1.7.2"), newProgress())
		Expect(stepNamed(steps, clusterupgrade.StepCleanCAPILegacyWebhooks).State).To(Equal(clusterupgrade.StateSkipped))
		Expect(stepNamed(steps, clusterupgrade.StepCleanCAPILegacyWebhooks).Message).To(ContainSubstring("v1.7.0 before this upgrade to v1.7.2, not a hop v1.7.x -> v1.8.x"))
		Expect(stepNamed(steps, clusterupgrade.StepPreserveOvercommitConfig).State).To(Equal(clusterupgrade.StateSkipped))
		Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(mutating), &admissionregistrationv1.MutatingWebhookConfiguration{})).To(Succeed(), "a patch hop deleted the CAPI webhooks Rancher v2.13 uses")
		Expect(overcommitConfig().Value).To(BeEmpty(), "a patch hop wrote overcommit-config")

		By("on a hop from v1.7.0 to v1.8.1: the legacy CAPI's goes, the other stays, and the step says why")
		in := hopInput("up-capi-170", "v1.7.0", "v1.8.1")
		p := newProgress()
		steps = runStates(in, p)
		step := stepNamed(steps, clusterupgrade.StepCleanCAPILegacyWebhooks)
		Expect(step.State).To(Equal(clusterupgrade.StateDone))
		Expect(step.Message).To(ContainSubstring("deleted the legacy CAPI's MutatingWebhookConfiguration mutating-webhook-configuration"))
		Expect(step.Message).To(ContainSubstring("ValidatingWebhookConfiguration validating-webhook-configuration left: its webhooks call Service someone-system/webhook-service"))
		Expect(apierrors.IsNotFound(env.Client.Get(ctx, client.ObjectKeyFromObject(mutating), &admissionregistrationv1.MutatingWebhookConfiguration{}))).To(BeTrue())
		Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(validating), &admissionregistrationv1.ValidatingWebhookConfiguration{})).To(Succeed())
		Expect(clusterupgrade.StepNames()).To(ContainElements(clusterupgrade.StepCleanCAPILegacyWebhooks, clusterupgrade.StepUpgradeRancher))
		names := clusterupgrade.StepNames()
		Expect(names[slices.Index(names, clusterupgrade.StepCleanCAPILegacyWebhooks)+1]).To(Equal(clusterupgrade.StepUpgradeRancher), "right before Rancher's upgrade, as the script")

		By("a resumed run finds its work done")
		steps = runStates(in, p)
		Expect(stepNamed(steps, clusterupgrade.StepCleanCAPILegacyWebhooks).State).To(Equal(clusterupgrade.StateDone))
		Expect(stepNamed(steps, clusterupgrade.StepCleanCAPILegacyWebhooks).Message).To(ContainSubstring("done by an earlier run"))
		Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(validating), &admissionregistrationv1.ValidatingWebhookConfiguration{})).To(Succeed())
	})

	It("migrates Longhorn's objects stored at v1beta1 on a hop from v1.6, with the validator's UPDATE on settings off meanwhile and back after", func() {
		seed(oldRelease)
		settle()
		Expect(env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "longhorn-system"}})).To(Or(Succeed(), WithTransform(apierrors.IsAlreadyExists, BeTrue())))
		// An old cluster: settings.longhorn.io still serves v1beta1 beside v1beta2 (the
		// storage version), and the API server lists both as stored (a CRD's
		// status.storedVersions is what the API server keeps; it is set here through the
		// status subresource, as a cluster that began on Longhorn 1.2 has it).
		crdKey := client.ObjectKey{Name: "settings.longhorn.io"}
		Expect(retry.RetryOnConflict(retry.DefaultRetry, func() error {
			crd := &apiextensionsv1.CustomResourceDefinition{}
			if err := env.Client.Get(ctx, crdKey, crd); err != nil {
				return err
			}
			v1beta1 := *crd.Spec.Versions[0].DeepCopy()
			v1beta1.Name, v1beta1.Storage, v1beta1.Served = "v1beta1", false, true
			crd.Spec.Versions = append([]apiextensionsv1.CustomResourceDefinitionVersion{v1beta1}, crd.Spec.Versions...)
			return env.Client.Update(ctx, crd)
		})).To(Succeed())
		Eventually(func() error {
			crd := &apiextensionsv1.CustomResourceDefinition{}
			if err := env.Client.Get(ctx, crdKey, crd); err != nil {
				return err
			}
			crd.Status.StoredVersions = []string{"v1beta1", "v1beta2"}
			return env.Client.Status().Update(ctx, crd)
		}).Should(Succeed())
		DeferCleanup(func() {
			// Back to v1beta2 alone, status first (the API server refuses a spec without a
			// version that status.storedVersions lists). Each attempt reads the CRD again
			// and does only what is left, so a conflict or a slow API server is retried
			// until the timeout, and the error the API server gave is the one reported.
			Eventually(func() error {
				crd := &apiextensionsv1.CustomResourceDefinition{}
				if err := env.Client.Get(ctx, crdKey, crd); err != nil {
					return err
				}
				if !slices.Equal(crd.Status.StoredVersions, []string{"v1beta2"}) {
					crd.Status.StoredVersions = []string{"v1beta2"}
					if err := env.Client.Status().Update(ctx, crd); err != nil {
						return fmt.Errorf("status.storedVersions back to [v1beta2]: %w", err)
					}
				}
				if i := slices.IndexFunc(crd.Spec.Versions, func(v apiextensionsv1.CustomResourceDefinitionVersion) bool { return v.Name == "v1beta1" }); i >= 0 {
					crd.Spec.Versions = slices.Delete(crd.Spec.Versions, i, i+1)
					if err := env.Client.Update(ctx, crd); err != nil {
						return fmt.Errorf("spec.versions without v1beta1: %w", err)
					}
				}
				return nil
			}).WithTimeout(30 * time.Second).Should(Succeed())
		})
		Eventually(func() error {
			return env.Client.List(ctx, &longhornv1.SettingList{}, client.InNamespace("longhorn-system"))
		}).WithTimeout(30 * time.Second).Should(Succeed())
		var settings []*longhornv1.Setting
		for _, name := range []string{"migration-test-a", "migration-test-b"} {
			s := &longhornv1.Setting{ObjectMeta: metav1.ObjectMeta{Namespace: "longhorn-system", Name: name}, Value: "1"}
			Expect(env.Client.Create(ctx, s)).To(Succeed())
			settings = append(settings, s)
			DeferCleanup(func() { _ = env.Client.Delete(ctx, s) })
		}
		// Longhorn's validator, whose Service does not run here: with UPDATE on settings
		// in its rules, the API server refuses every update of a Longhorn Setting.
		validator := &admissionregistrationv1.ValidatingWebhookConfiguration{
			ObjectMeta: metav1.ObjectMeta{Name: clusterupgrade.LonghornValidatorWebhook},
			Webhooks: []admissionregistrationv1.ValidatingWebhook{{
				Name: "validator.longhorn.io", AdmissionReviewVersions: []string{"v1"},
				SideEffects:   ptr.To(admissionregistrationv1.SideEffectClassNone),
				FailurePolicy: ptr.To(admissionregistrationv1.Fail),
				ClientConfig: admissionregistrationv1.WebhookClientConfig{Service: &admissionregistrationv1.ServiceReference{
					Namespace: "longhorn-system", Name: "longhorn-admission-webhook", Path: ptr.To("/v1/webhook/validation")}},
				Rules: []admissionregistrationv1.RuleWithOperations{{
					Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update},
					Rule:       admissionregistrationv1.Rule{APIGroups: []string{"longhorn.io"}, APIVersions: []string{"v1beta2"}, Resources: []string{"settings"}},
				}},
			}},
		}
		Expect(env.Client.Create(ctx, validator)).To(Succeed())
		DeferCleanup(func() { _ = env.Client.Delete(ctx, validator) })
		Eventually(func() error {
			s := &longhornv1.Setting{}
			if err := env.Client.Get(ctx, client.ObjectKeyFromObject(settings[0]), s); err != nil {
				return err
			}
			s.Value = "2"
			return env.Client.Update(ctx, s)
		}).WithTimeout(30*time.Second).Should(MatchError(ContainSubstring("longhorn-admission-webhook")), "the validator is in force")
		storedVersions := func() []string {
			crd := &apiextensionsv1.CustomResourceDefinition{}
			Expect(env.Client.Get(ctx, crdKey, crd)).To(Succeed())
			return crd.Status.StoredVersions
		}
		settingUpdateOps := func() []admissionregistrationv1.OperationType {
			cfg := &admissionregistrationv1.ValidatingWebhookConfiguration{}
			Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(validator), cfg)).To(Succeed())
			return cfg.Webhooks[0].Rules[0].Operations
		}

		By("Skipped on a hop from v1.5.1: nothing migrated")
		steps := runStates(input("up-lh-151"), newProgress())
		Expect(stepNamed(steps, clusterupgrade.StepMigrateLonghornV1beta1CRDs).State).To(Equal(clusterupgrade.StateSkipped))
		Expect(storedVersions()).To(Equal([]string{"v1beta1", "v1beta2"}))

		By("on a hop from v1.6.1: every object rewritten, storedVersions [v1beta2], the validator as it was")
		// The API server applies a change of a webhook configuration from its own watch,
		// a moment later. Here that moment is two seconds: a copy of the validator with
		// UPDATE still in its rules, gone two seconds after the run starts. A rewrite in
		// between is refused as it would be on a loaded API server, and must be tried
		// again, not fail the upgrade.
		lagging := validator.DeepCopy()
		lagging.ObjectMeta = metav1.ObjectMeta{Name: "longhorn-webhook-validator-as-still-applied"}
		Expect(env.Client.Create(ctx, lagging)).To(Succeed())
		DeferCleanup(func() { _ = env.Client.Delete(ctx, lagging) })
		Eventually(func() error {
			s := &longhornv1.Setting{}
			if err := env.Client.Get(ctx, client.ObjectKeyFromObject(settings[0]), s); err != nil {
				return err
			}
			s.Value = "3"
			return env.Client.Update(ctx, s)
		}).WithTimeout(30*time.Second).Should(MatchError(ContainSubstring(`webhook "validator.longhorn.io"`)), "the copy is in force")
		go func() {
			defer GinkgoRecover()
			time.Sleep(2 * time.Second)
			Expect(env.Client.Delete(ctx, lagging)).To(Succeed())
		}()
		in := hopInput("up-lh-161", "v1.6.1", "v1.7.1")
		p := newProgress()
		steps = runStates(in, p)
		step := stepNamed(steps, clusterupgrade.StepMigrateLonghornV1beta1CRDs)
		Expect(step.State).To(Equal(clusterupgrade.StateDone))
		Expect(step.Message).To(ContainSubstring("settings.longhorn.io"))
		Expect(storedVersions()).To(Equal([]string{"v1beta2"}))
		for _, s := range settings {
			cur := &longhornv1.Setting{}
			Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(s), cur)).To(Succeed())
			Expect(cur.Annotations).To(HaveKeyWithValue(clusterupgrade.StorageMigratedAnnotation, "up-lh-161"), s.Name)
			Expect(cur.ResourceVersion).NotTo(Equal(s.ResourceVersion), "%s was written again", s.Name)
		}
		Expect(settingUpdateOps()).To(ConsistOf(admissionregistrationv1.Create, admissionregistrationv1.Update))
		changes, err := clusterupgrade.ReadChanges(ctx, env.Client, p.ConfigMap)
		Expect(err).NotTo(HaveOccurred())
		Expect(changes).To(ContainElement(clusterupgrade.Change{Object: "/" + clusterupgrade.LonghornValidatorWebhook, Field: clusterupgrade.FieldLonghornSettingsUpdate, Before: json.RawMessage(`["CREATE","UPDATE"]`)}))

		By("a resumed run does not migrate again")
		cur := &longhornv1.Setting{}
		Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(settings[0]), cur)).To(Succeed())
		steps = runStates(in, p)
		Expect(stepNamed(steps, clusterupgrade.StepMigrateLonghornV1beta1CRDs).Message).To(ContainSubstring("done by an earlier run"))
		again := &longhornv1.Setting{}
		Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(settings[0]), again)).To(Succeed())
		Expect(again.ResourceVersion).To(Equal(cur.ResourceVersion))

		By("a run that died with UPDATE off: Restore puts it back")
		cfg := &admissionregistrationv1.ValidatingWebhookConfiguration{}
		Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(validator), cfg)).To(Succeed())
		before := cfg.DeepCopy()
		cfg.Webhooks[0].Rules[0].Operations = []admissionregistrationv1.OperationType{admissionregistrationv1.Create}
		Expect(env.Client.Patch(ctx, cfg, client.MergeFrom(before))).To(Succeed())
		Expect(clusterupgrade.Restore(ctx, env.Client, p.ConfigMap)).To(Succeed())
		Expect(settingUpdateOps()).To(ConsistOf(admissionregistrationv1.Create, admissionregistrationv1.Update))
	})

	It("waits for KubeVirt to deploy the release's version, and skips the wait when the release names none", func() {
		seed(oldRelease)
		settle()
		By("a KubeVirt that never reaches the version: the run gives up naming the CR and what it saw")
		in := input("up-kv")
		in.KubeVirtVersion = "v9.9.9"
		in.Timeout = 40 * time.Second // KubeVirt never reaches the version: the run ends at this bound, well past the sub-steps before on a loaded machine
		p := newProgress()
		Expect(clusterupgrade.Run(ctx, env.Client, in, p)).To(MatchError(And(
			ContainSubstring("WaitKubeVirt"),
			ContainSubstring("gave up waiting for KubeVirt harvester-system/kubevirt to report observedKubeVirtVersion v9.9.9 and phase Deployed"),
			ContainSubstring(`observedKubeVirtVersion "v-harvester-1.6.0", phase "Deployed"`))))
		Expect(kubevirtCR().Status.ObservedKubeVirtVersion).To(Equal(sim.KubeVirtVersionOfChart("1.6.0")), "virt-operator rolled out the chart's KubeVirt")
		harvester := chart("harvester")

		By("resumed with the release's version: the wait ends, nothing is patched again")
		in.KubeVirtVersion = sim.KubeVirtVersionOfChart("1.6.0")
		in.Timeout = 30 * time.Second
		steps := runStates(in, p)
		Expect(stepNamed(steps, clusterupgrade.StepWaitKubeVirt).State).To(Equal(clusterupgrade.StateDone))
		Expect(stepNamed(steps, clusterupgrade.StepWaitKubeVirt).Message).To(ContainSubstring("reports v-harvester-1.6.0 Deployed"))
		Expect(chart("harvester").Generation).To(Equal(harvester.Generation))

		By("the release names no KubeVirt: Skipped")
		in = input("up-kv-none")
		in.KubeVirtVersion = ""
		steps = runStates(in, newProgress())
		Expect(stepNamed(steps, clusterupgrade.StepWaitKubeVirt).State).To(Equal(clusterupgrade.StateSkipped))
		Expect(stepNamed(steps, clusterupgrade.StepWaitKubeVirt).Message).To(ContainSubstring("the release metadata names no KubeVirt version"))
	})

	It("waits while virt-operator rolls KubeVirt out", func() {
		seed(oldRelease, func(r *sim.Rancher) { r.RolloutDelay = 2 * time.Second })
		settle()
		p := newProgress()
		var deploying atomic.Bool
		runCtx, cancel := context.WithCancel(ctx)
		defer cancel()
		go func() {
			defer GinkgoRecover()
			for runCtx.Err() == nil {
				kv := kubevirtCR()
				if kv.Status.Phase == "Deploying" && kv.Status.TargetKubeVirtVersion == sim.KubeVirtVersionOfChart("1.6.0") {
					deploying.Store(true)
					return
				}
				time.Sleep(20 * time.Millisecond)
			}
		}()
		steps := runStates(input("up-kv-roll"), p)
		cancel()
		Expect(deploying.Load()).To(BeTrue(), "virt-operator went through Deploying")
		Expect(stepNamed(steps, clusterupgrade.StepWaitKubeVirt).State).To(Equal(clusterupgrade.StateDone))
		Expect(kubevirtCR().Status.Phase).To(BeEquivalentTo("Deployed"))
	})
})

var _ = Describe("A sub-step whose write loses a race", func() {
	It("is run again when another writer changed the object between its read and its write, keeping that writer's change", func() {
		seed(oldRelease)
		settle()
		Expect(overcommitConfig().Value).To(BeEmpty())
		raced := 0
		c := racingClient(func(obj client.Object) bool {
			s, ok := obj.(*harvesterapi.Setting)
			return ok && s.Name == clusterupgrade.OvercommitConfigSetting && raced == 0
		}, func(client.Object) {
			raced++
			other := overcommitConfig()
			other.Labels = map[string]string{"written-by": "someone-else"}
			Expect(env.Client.Update(ctx, other)).To(Succeed())
		})
		in := hopInput("up-race", "v1.7.1", "v1.8.1")
		p := newProgress()
		Expect(clusterupgrade.Run(ctx, c, in, p)).To(Succeed())
		Expect(raced).To(Equal(1), "the other write came once, between the step's read and its patch")
		steps, err := clusterupgrade.ReadProgress(ctx, env.Client, p.ConfigMap)
		Expect(err).NotTo(HaveOccurred())
		Expect(stepNamed(steps, clusterupgrade.StepPreserveOvercommitConfig).State).To(Equal(clusterupgrade.StateDone))
		Expect(overcommitConfig().Value).To(Equal(clusterupgrade.OvercommitConfigDefaultV17))
		Expect(overcommitConfig().Labels).To(HaveKeyWithValue("written-by", "someone-else"), "the other writer's change is kept")
	})
})
