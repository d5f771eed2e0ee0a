package install

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/capi-inplace/capi-inplace/test/manifests"
	"github.com/capi-inplace/capi-inplace/test/testenv"
)

const providerLabel = "cluster.x-k8s.io/provider"

func kustomizeBuild(folder string) []*unstructured.Unstructured {
	GinkgoHelper()
	objs, err := manifests.Build(env.RepoRoot, folder)
	Expect(err).NotTo(HaveOccurred())
	return objs
}

func decodeObjects(data []byte) []*unstructured.Unstructured {
	GinkgoHelper()
	objs, err := manifests.Decode(data)
	Expect(err).NotTo(HaveOccurred())
	return objs
}

func findObject(objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	GinkgoHelper()
	for _, o := range objs {
		if o.GetKind() == kind && o.GetName() == name {
			return o
		}
	}
	Fail("no " + kind + " " + name + " in the rendered manifests")
	return nil
}

func convert[T any](u *unstructured.Unstructured, into *T) *T {
	GinkgoHelper()
	Expect(runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, into)).To(Succeed())
	return into
}

var _ = Describe("config/default", Ordered, func() {
	var objs []*unstructured.Unstructured

	BeforeAll(func() {
		objs = kustomizeBuild("config/default")
	})

	It("renders the manager, its RBAC, both hook Services, the serving certificate and the ExtensionConfig", func() {
		var kinds []string
		for _, o := range objs {
			kinds = append(kinds, o.GetKind()+"/"+o.GetName())
		}
		Expect(kinds).To(ContainElements(
			"Namespace/capi-inplace-system",
			"CustomResourceDefinition/upgradetasks.inplace.cluster.x-k8s.io",
			"CustomResourceDefinition/nodeupdates.inplace.cluster.x-k8s.io",
			"ServiceAccount/capi-inplace-manager",
			"ClusterRole/capi-inplace-manager-role",
			"ClusterRoleBinding/capi-inplace-manager-rolebinding",
			"Role/capi-inplace-leader-election-role",
			"Deployment/capi-inplace-controller-manager",
			"Service/capi-inplace-webhook-service",
			"Service/capi-inplace-external-hook-service",
			"Issuer/capi-inplace-selfsigned-issuer",
			"Certificate/capi-inplace-serving-cert",
			"ExtensionConfig/capi-inplace",
			"NetworkPolicy/capi-inplace-hooks",
			"ValidatingAdmissionPolicy/capi-inplace-upgradeplan-deletion",
			"ValidatingAdmissionPolicyBinding/capi-inplace-upgradeplan-deletion",
		))
	})

	It("labels every object for clusterctl", func() {
		for _, o := range objs {
			Expect(o.GetLabels()).To(HaveKeyWithValue(providerLabel, "runtime-extension-capi-inplace"), "%s %s", o.GetKind(), o.GetName())
		}
	})

	It("puts every namespaced object into the one target namespace", func() {
		clusterScoped := map[string]bool{"Namespace": true, "CustomResourceDefinition": true, "ClusterRole": true, "ClusterRoleBinding": true, "ExtensionConfig": true,
			"ValidatingAdmissionPolicy": true, "ValidatingAdmissionPolicyBinding": true}
		for _, o := range objs {
			if clusterScoped[o.GetKind()] {
				Expect(o.GetNamespace()).To(BeEmpty(), "%s %s is cluster-scoped", o.GetKind(), o.GetName())
				continue
			}
			Expect(o.GetNamespace()).To(Equal("capi-inplace-system"), "%s %s", o.GetKind(), o.GetName())
		}
	})

	It("is accepted by a real API server (server-side dry run, strict field validation)", func() {
		strict := client.WithFieldValidation(env.Client, metav1.FieldValidationStrict)
		ns := findObject(objs, "Namespace", "capi-inplace-system")
		// config/capi-client-auth's spec may have created it already.
		Expect(client.IgnoreAlreadyExists(env.Client.Create(ctx, ns.DeepCopy()))).To(Succeed(), "the namespace is created for real so namespaced objects can be dry-run into it")
		for _, o := range objs {
			if o.GetKind() == "Namespace" {
				continue
			}
			err := strict.Apply(ctx, client.ApplyConfigurationFromUnstructured(o.DeepCopy()),
				client.DryRunAll, client.FieldOwner("capi-inplace-install-test"), client.ForceOwnership)
			Expect(err).NotTo(HaveOccurred(), "%s %s", o.GetKind(), o.GetName())
		}
	})

	It("runs the manager non-root, read-only, without capabilities, with limits and probes", func() {
		dep := convert(findObject(objs, "Deployment", "capi-inplace-controller-manager"), &appsv1.Deployment{})
		pod := dep.Spec.Template.Spec
		Expect(pod.SecurityContext.RunAsNonRoot).To(HaveValue(BeTrue()))
		Expect(pod.SecurityContext.SeccompProfile.Type).To(Equal(corev1.SeccompProfileTypeRuntimeDefault))
		Expect(pod.ServiceAccountName).To(Equal("capi-inplace-manager"))
		Expect(pod.Containers).To(HaveLen(1))
		c := pod.Containers[0]
		Expect(c.SecurityContext.ReadOnlyRootFilesystem).To(HaveValue(BeTrue()))
		Expect(c.SecurityContext.AllowPrivilegeEscalation).To(HaveValue(BeFalse()))
		Expect(c.SecurityContext.Capabilities.Drop).To(ConsistOf(corev1.Capability("ALL")))
		Expect(c.Resources.Requests).To(HaveKey(corev1.ResourceMemory))
		Expect(c.Resources.Limits).To(HaveKey(corev1.ResourceMemory))
		Expect(c.LivenessProbe.HTTPGet.Path).To(Equal("/healthz"))
		Expect(c.ReadinessProbe.HTTPGet.Path).To(Equal("/readyz"))
		Expect(c.Args).To(ContainElements("--leader-elect", "--webhook-port=9443", "--external-hook-port=9444"))
		Expect(pod.Volumes).To(ContainElement(HaveField("VolumeSource.Secret.SecretName", "capi-inplace-webhook-service-cert")))
	})

	It("serves the certificate cert-manager writes, and points the ExtensionConfig at the hook Service with that CA", func() {
		cert := findObject(objs, "Certificate", "capi-inplace-serving-cert")
		secretName, _, _ := unstructured.NestedString(cert.Object, "spec", "secretName")
		Expect(secretName).To(Equal("capi-inplace-webhook-service-cert"))
		dnsNames, _, _ := unstructured.NestedStringSlice(cert.Object, "spec", "dnsNames")
		svc := findObject(objs, "Service", "capi-inplace-webhook-service")
		ext := findObject(objs, "Service", "capi-inplace-external-hook-service")
		Expect(dnsNames).To(ContainElements(svc.GetName()+"."+svc.GetNamespace()+".svc", ext.GetName()+"."+ext.GetNamespace()+".svc"))
		issuer, _, _ := unstructured.NestedString(cert.Object, "spec", "issuerRef", "name")
		findObject(objs, "Issuer", issuer)

		ec := findObject(objs, "ExtensionConfig", "capi-inplace")
		Expect(ec.GetAnnotations()).To(HaveKeyWithValue("runtime.cluster.x-k8s.io/inject-ca-from-secret", "capi-inplace-system/"+secretName))
		svcName, _, _ := unstructured.NestedString(ec.Object, "spec", "clientConfig", "service", "name")
		svcNamespace, _, _ := unstructured.NestedString(ec.Object, "spec", "clientConfig", "service", "namespace")
		Expect(svcName + "/" + svcNamespace).To(Equal(svc.GetName() + "/" + svc.GetNamespace()))
		Expect(svc.Object["spec"]).To(HaveKeyWithValue("ports", ContainElement(HaveKeyWithValue("targetPort", "capi-hooks"))))
	})

	It("admits only Cluster API's controllers (core and KubeadmControlPlane) to the CAPI hooks, and also the manager's namespace to ExternalUpgradeRequest; metrics and probes stay open", func() {
		np := convert(findObject(objs, "NetworkPolicy", "capi-inplace-hooks"), &networkingv1.NetworkPolicy{})
		dep := convert(findObject(objs, "Deployment", "capi-inplace-controller-manager"), &appsv1.Deployment{})
		Expect(np.Namespace).To(Equal(dep.Namespace))
		Expect(np.Spec.PodSelector.MatchLabels).To(Equal(dep.Spec.Template.Labels), "the policy selects the manager's pods")
		Expect(np.Spec.PolicyTypes).To(Equal([]networkingv1.PolicyType{networkingv1.PolicyTypeIngress}), "egress is not restricted")

		containerPorts := map[int32]string{}
		for _, p := range dep.Spec.Template.Spec.Containers[0].Ports {
			containerPorts[p.ContainerPort] = p.Name
		}
		// The Cluster API controllers that call the hooks, in the namespaces their own
		// default manifests put them (read from the module cache, so that a rename is
		// caught): core (CanUpdateMachineSet, UpdateMachine) and KubeadmControlPlane
		// (CanUpdateMachine).
		var callers []networkingv1.NetworkPolicyPeer
		for _, provider := range []string{"core", "controlplane/kubeadm"} {
			ns := providerNamespace(provider)
			callers = append(callers, networkingv1.NetworkPolicyPeer{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": ns}}})
		}
		ownNamespace := networkingv1.NetworkPolicyPeer{PodSelector: &metav1.LabelSelector{}}
		// Each port, who may reach it (nil: everyone).
		want := map[string][]networkingv1.NetworkPolicyPeer{
			"capi-hooks":    callers,
			"external-hook": append(append([]networkingv1.NetworkPolicyPeer{}, callers...), ownNamespace),
			"metrics":       nil,
			"healthz":       nil,
		}
		got := map[string][]networkingv1.NetworkPolicyPeer{}
		for _, rule := range np.Spec.Ingress {
			Expect(rule.Ports).NotTo(BeEmpty(), "a rule without ports would open every port")
			for _, p := range rule.Ports {
				Expect(p.Port.IntValue()).NotTo(BeZero(), "ports are numbers")
				name, ok := containerPorts[int32(p.Port.IntValue())]
				Expect(ok).To(BeTrue(), "port %d is a port of the manager", p.Port.IntValue())
				Expect(got).NotTo(HaveKey(name), "one rule per port")
				got[name] = rule.From
			}
		}
		Expect(got).To(Equal(want))
		Expect(containerPorts).To(HaveKeyWithValue(int32(9443), "capi-hooks"))
		Expect(containerPorts).To(HaveKeyWithValue(int32(9444), "external-hook"))
	})

	It("grants the manager exactly the reviewed permissions", func() {
		role := convert(findObject(objs, "ClusterRole", "capi-inplace-manager-role"), &rbacv1.ClusterRole{})
		var reviewed rbacv1.ClusterRole
		Expect(yaml.UnmarshalStrict(must(os.ReadFile(filepath.Join(env.RepoRoot, "test", "install", "testdata", "manager-role.reviewed.yaml"))), &reviewed)).To(Succeed())
		Expect(role.Rules).To(Equal(reviewed.Rules),
			"the manager's RBAC changed: review the change, then update test/install/testdata/manager-role.reviewed.yaml")
	})

	It("grants no wildcard verb, resource or API group", func() {
		for _, o := range objs {
			var rules []rbacv1.PolicyRule
			switch o.GetKind() {
			case "ClusterRole":
				rules = convert(o, &rbacv1.ClusterRole{}).Rules
			case "Role":
				rules = convert(o, &rbacv1.Role{}).Rules
			default:
				continue
			}
			for _, r := range rules {
				for _, field := range [][]string{r.Verbs, r.Resources, r.APIGroups} {
					Expect(field).NotTo(ContainElement("*"), "%s %s rule %+v", o.GetKind(), o.GetName(), r)
				}
			}
		}
	})
})

var _ = Describe("clusterctl", func() {
	It("gets a components file whose image is a variable clusterctl substitutes, and the metadata", func() {
		cmd := exec.Command("make", "-s", "release-manifests")
		cmd.Dir = env.RepoRoot
		out, err := cmd.CombinedOutput()
		Expect(err).NotTo(HaveOccurred(), string(out))
		components, err := os.ReadFile(filepath.Join(env.RepoRoot, "out", "runtime-extension-components.yaml"))
		Expect(err).NotTo(HaveOccurred())
		Expect(string(components)).To(ContainSubstring("image: ${CAPI_INPLACE_IMAGE:=ghcr.io/capi-inplace/capi-inplace:"))
		// The Harvester updater's node program runs the manager's image: a mirrored image
		// named by the variable is the nodes' too, not the binary's built-in default.
		Expect(string(components)).To(ContainSubstring("- --harvester-node-image=${CAPI_INPLACE_IMAGE:=ghcr.io/capi-inplace/capi-inplace:"))
		Expect(strings.Count(string(components), "kind: Namespace\n")).To(Equal(1), "clusterctl takes the one Namespace as the target namespace")

		meta := decodeObjects(must(os.ReadFile(filepath.Join(env.RepoRoot, "out", "metadata.yaml"))))
		Expect(meta).To(HaveLen(1))
		Expect(meta[0].GetAPIVersion()).To(Equal("clusterctl.cluster.x-k8s.io/v1alpha3"))
		Expect(meta[0].GetKind()).To(Equal("Metadata"))
		series, _, _ := unstructured.NestedSlice(meta[0].Object, "releaseSeries")
		Expect(series).NotTo(BeEmpty())
		Expect(series[0]).To(HaveKeyWithValue("contract", "v1beta2"))
	})
})

func must[T any](v T, err error) T {
	GinkgoHelper()
	Expect(err).NotTo(HaveOccurred())
	return v
}

func unstructuredSlice(obj map[string]any, fields ...string) ([]map[string]any, bool, error) {
	raw, found, err := unstructured.NestedSlice(obj, fields...)
	out := make([]map[string]any, 0, len(raw))
	for _, r := range raw {
		if m, ok := r.(map[string]any); ok {
			out = append(out, m)
		}
	}
	return out, found, err
}

// providerNamespace is the namespace the default manifests of a Cluster API provider
// (its directory in the cluster-api module: core, controlplane/kubeadm) install it in.
func providerNamespace(provider string) string {
	GinkgoHelper()
	dir := must(testenv.ModuleDir(env.RepoRoot, "sigs.k8s.io/cluster-api"))
	data := must(os.ReadFile(filepath.Join(dir, provider, "config", "default", "kustomization.yaml")))
	var k struct {
		Namespace string `json:"namespace"`
	}
	Expect(yaml.Unmarshal(data, &k)).To(Succeed())
	Expect(k.Namespace).NotTo(BeEmpty(), "%s's default kustomization names its namespace", provider)
	return k.Namespace
}

// managerArgs returns the args of the manager container of the rendered objects.
func managerArgs(objs []*unstructured.Unstructured) []string {
	GinkgoHelper()
	deployment := convert(findObject(objs, "Deployment", "capi-inplace-controller-manager"), &appsv1.Deployment{})
	return deployment.Spec.Template.Spec.Containers[0].Args
}

var _ = Describe("config/tilt-provider, Cluster API's Tilt dev loop", func() {
	It("serves Cluster API's hooks without a client CA (Cluster API's Tilt presents none) and keeps the ExternalUpgradeRequest token, where config/default requires both", func() {
		provider := kustomizeBuild("config/tilt-provider")
		Expect(managerArgs(provider)).NotTo(ContainElement(HavePrefix("--hook-client-ca")))
		Expect(managerArgs(provider)).To(ContainElement(HavePrefix("--external-hook-token-file=")))
		deployment := convert(findObject(provider, "Deployment", "capi-inplace-controller-manager"), &appsv1.Deployment{})
		for _, v := range deployment.Spec.Template.Spec.Volumes {
			Expect(v.Name).NotTo(Equal("hook-client-ca"), "a volume of a Secret nobody writes in the dev loop would hold the pod")
		}
		Expect(managerArgs(kustomizeBuild("config/default"))).To(ContainElement("--hook-client-ca=/etc/capi-inplace/hook-client-ca/ca.crt"))
	})
})
